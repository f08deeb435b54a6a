"""float32_layers names a layer class that exists: a typo is an error naming the nearest classes, when the
override is parsed, before any work (it used to keep no layer in float32, silently)."""

from __future__ import annotations

import inspect

import pytest

from amp_backends.errors import AmpConfigError
from amp_backends.layer_names import KERAS_LAYERS, defined_layer_classes, unknown_layers
from amp_backends.request import build_request


def request(registry, environ=None, **kwargs):
    return build_request(registry.names(), environ=environ or {}, **kwargs)


def test_a_typo_names_the_nearest_keras_class_and_the_fix(registry):
    with pytest.raises(AmpConfigError) as err:
        request(registry, environ={"AMP_FLOAT32_LAYERS": "Conv2d"})
    text = str(err.value)
    assert "AMP_FLOAT32_LAYERS" in text and "'Conv2d' (did you mean Conv2D?)" in text
    assert "Fix: export AMP_FLOAT32_LAYERS=Conv2D" in text
    with pytest.raises(AmpConfigError, match=r"'lstm' \(did you mean LSTM\?\).*Fix: pass float32_layers='Dense,LSTM'"):
        request(registry, float32_layers="Dense,lstm")


def test_a_name_like_no_class_is_refused_and_never_answered_with_layer(registry):
    with pytest.raises(AmpConfigError) as err:
        request(registry, float32_layers="NoSuchLayer")
    text = str(err.value)
    assert "'NoSuchLayer' (nor anything like it)" in text and "Received: 'NoSuchLayer'" in text
    assert "float32_layers='Layer'" not in text  # every layer is a Layer: never offered as the fix
    assert "Fix: pass float32_layers='DepthwiseConv2D'" in text


def test_keras_names_and_their_base_classes_pass(registry):
    names = ("DepthwiseConv2D", "LSTM", "BaseConv", "LayerNormalization", "Conv1D", "EinsumDense")
    assert request(registry, float32_layers=",".join(names)).float32_layers == names
    assert unknown_layers(names) == {}


def test_the_table_holds_every_layer_class_of_the_installed_keras():
    tf = pytest.importorskip("tensorflow")
    layers = tf.keras.layers
    base = layers.Layer
    installed = {n for n in dir(layers) if inspect.isclass(getattr(layers, n)) and issubclass(getattr(layers, n), base)}
    installed |= {b.__name__ for n in installed for b in getattr(layers, n).__mro__ if issubclass(b, base)}
    public = {n for n in installed if not n.startswith("_")}  # Keras 2's _Merge: no one names a private base
    assert public - KERAS_LAYERS == set(), "add these to amp_backends.layer_names.KERAS_LAYERS"


def test_a_layer_class_of_your_own_counts_once_defined(registry):
    tf = pytest.importorskip("tensorflow")
    with pytest.raises(AmpConfigError, match="counts once its module is imported"):
        request(registry, float32_layers="GatedBlockForTheTest")

    class GatedBlockForTheTest(tf.keras.layers.Layer):
        pass

    assert "GatedBlockForTheTest" in defined_layer_classes()
    assert request(registry, float32_layers="GatedBlockForTheTest").float32_layers == ("GatedBlockForTheTest",)
