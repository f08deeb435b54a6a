"""The layer class names ``float32_layers`` accepts, known without importing TensorFlow or Keras.

A name no layer class bears (a typo: ``Conv2d``) would keep no layer in float32, without a word:
`unknown_layers` finds such names and the nearest known ones when the override is parsed. Known are
`KERAS_LAYERS` (``keras.layers`` of Keras 3 and Keras 2 with their base classes; ``tests/test_layer_names.py``
checks it) and the layer classes of the Keras modules already imported (nothing is imported here).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from typing import Any

KERAS_LAYERS = frozenset("""
Activation ActivityRegularization AdaptiveAveragePooling1D AdaptiveAveragePooling2D AdaptiveAveragePooling3D
AdaptiveMaxPooling1D AdaptiveMaxPooling2D AdaptiveMaxPooling3D Add AdditiveAttention AlphaDropout Attention AugMix
AutoContrast Average AveragePooling1D AveragePooling2D AveragePooling3D AvgPool1D AvgPool2D AvgPool3D
BatchNormalization Bidirectional CategoryEncoding CenterCrop Concatenate ContrastLimitedAdaptiveHistogramEqualization
Conv1D Conv1DTranspose Conv2D Conv2DTranspose Conv3D Conv3DTranspose ConvLSTM1D ConvLSTM2D ConvLSTM3D Convolution1D
Convolution1DTranspose Convolution2D Convolution2DTranspose Convolution3D Convolution3DTranspose Cropping1D Cropping2D
Cropping3D CutMix Dense DepthwiseConv1D DepthwiseConv2D Discretization Dot Dropout ELU EinsumDense Embedding
Equalization Flatten FlaxLayer GRU GRUCell GaussianDropout GaussianNoise GlobalAveragePooling1D GlobalAveragePooling2D
GlobalAveragePooling3D GlobalAvgPool1D GlobalAvgPool2D GlobalAvgPool3D GlobalMaxPool1D GlobalMaxPool2D GlobalMaxPool3D
GlobalMaxPooling1D GlobalMaxPooling2D GlobalMaxPooling3D GroupNormalization GroupQueryAttention HashedCrossing Hashing
Identity InputLayer IntegerLookup JaxLayer LSTM LSTMCell Lambda Layer LayerNormalization LeakyReLU Masking
MaxNumBoundingBoxes MaxPool1D MaxPool2D MaxPool3D MaxPooling1D MaxPooling2D MaxPooling3D Maximum MelSpectrogram Minimum
MixUp MultiHeadAttention Multiply Normalization PReLU Permute Pipeline RMSNormalization RNN RandAugment
RandomBrightness RandomColorDegeneration RandomColorJitter RandomContrast RandomCrop RandomElasticTransform
RandomErasing RandomFlip RandomGaussianBlur RandomGrayscale RandomHue RandomInvert RandomPerspective
RandomPosterization RandomRotation RandomSaturation RandomSharpness RandomShear RandomTranslation RandomZoom ReLU
RepeatVector Rescaling Reshape Resizing ReversibleEmbedding STFTSpectrogram SeparableConv1D SeparableConv2D
SeparableConvolution1D SeparableConvolution2D SimpleRNN SimpleRNNCell Softmax Solarization SpatialDropout1D
SpatialDropout2D SpatialDropout3D SpectralNormalization StackedRNNCells StringLookup Subtract TFSMLayer
TextVectorization TimeDistributed TorchModuleWrapper UnitNormalization UpSampling1D UpSampling2D UpSampling3D Wrapper
ZeroPadding1D ZeroPadding2D ZeroPadding3D
BaseAdaptiveAveragePooling BaseAdaptiveMaxPooling BaseAdaptivePooling BaseConv BaseConvTranspose BaseDepthwiseConv
BaseGlobalPooling BaseImagePreprocessingLayer BasePooling BaseSeparableConv BaseSpatialDropout ConvLSTM DataLayer
Functional GroupedQueryAttention IndexLookup Merge Model Sequential
AbstractRNNCell BaseDenseAttention BaseRandomLayer BatchNormalizationBase Conv ConvLSTMCell ConvRNN CuDNNGRU CuDNNLSTM
DenseFeatures DepthwiseConv GlobalPooling1D GlobalPooling2D GlobalPooling3D LocallyConnected1D LocallyConnected2D
Pooling1D Pooling2D Pooling3D PreprocessingLayer RandomFourierFeatures RandomHeight RandomWidth SeparableConv
SlicingOpLambda SyncBatchNormalization TFOpLambda TensorFlowOpLayer ThresholdedReLU
""".split())


def defined_layer_classes() -> set[str]:
    """The names of the layer classes defined so far, from the Keras modules this process has imported (none
    imported: none)."""
    names: set[str] = set()
    for module in ("keras", "tf_keras"):
        layers = getattr(sys.modules.get(module), "layers", None)
        base = getattr(layers, "Layer", None)
        todo = [base] if isinstance(base, type) else []
        while todo:
            cls = todo.pop()
            if cls.__name__ not in names:
                names.add(cls.__name__)
                todo.extend(cls.__subclasses__())
    return names


GENERIC = frozenset({"Layer", "Model", "Functional", "Sequential"})  # valid, but every layer bears them: never offered


def unknown_layers(names: Iterable[str]) -> dict[str, list[str]]:
    """The ``names`` no layer class bears, each with the nearest known names (best first; empty: none close)."""
    unknown = [name for name in names if name not in KERAS_LAYERS]
    known = sorted(KERAS_LAYERS | defined_layer_classes()) if unknown else []
    offered = [k for k in known if k not in GENERIC]
    return {name: [k for k in known if k.lower() == name.lower()]
            or difflib.get_close_matches(name, offered, n=3, cutoff=0.65) for name in unknown if name not in known}


def describe_unknown(unknown: dict[str, list[str]]) -> str:
    """``: no layer class is named 'Conv2d' (did you mean Conv2D?) or 'NoSuchLayer' (nor anything like it)...``;
    ``""`` when nothing is unknown."""
    if not unknown:
        return ""
    names = " or ".join(f"{name!r} (did you mean {' or '.join(near)}?)" if near else f"{name!r} (nor anything like "
                        "it)" for name, near in unknown.items())
    return (f": no layer class is named {names}; a layer class of your own counts once its module is imported, "
            "before the plan is made")


def corrected(names: Iterable[str], unknown: dict[str, list[str]]) -> str:
    """``names`` with each unknown one replaced by its nearest known name where that is surely what was meant
    (the same name in other case, or nearly the same), else left out."""
    def sure(name: str) -> str | None:
        near = unknown[name][0] if unknown.get(name) else None
        if near and (near.lower() == name.lower() or difflib.SequenceMatcher(None, name, near).ratio() >= 0.8):
            return near
        return None

    fixed = [n if n not in unknown else sure(n) for n in names]
    return ",".join(dict.fromkeys(n for n in fixed if n))


def layer_geometry(layer: Any) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """A Keras layer's class names (its class and bases; an RNN layer adds its cells' kinds: ``RNN(LSTMCell)`` is an
    ``LSTM``), strides and kernel size, as `amp_backends.assessment.Float32Layer` matches them (``()`` where it
    has none)."""

    def ints(value: Any) -> tuple[int, ...]:
        if value is None:
            return ()
        values = value if isinstance(value, (tuple, list)) else (value,)
        return tuple(int(v) for v in values if isinstance(v, int))

    cell = getattr(layer, "cell", None)  # keras.layers.RNN(LSTMCell(...)) is an LSTM: its cells' kinds count
    cells = list(getattr(cell, "cells", None) or ([cell] if cell is not None else []))
    kinds = [c.__name__[:-4] for one in cells for c in type(one).__mro__ if c.__name__.endswith("Cell")]
    return (tuple(dict.fromkeys([c.__name__ for c in type(layer).__mro__] + kinds)),
            ints(getattr(layer, "strides", None)), ints(getattr(layer, "kernel_size", None)))


def kept_in_float32(rules: Iterable[Any], layer: Any) -> bool:
    """Whether one of ``rules`` (`amp_backends.assessment.Float32Layer` entries) keeps this Keras layer in float32."""
    classes, strides, kernel = layer_geometry(layer)
    return any(r.matches(classes, strides, kernel) for r in rules)
