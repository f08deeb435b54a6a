"""Reference models for benchmarks and tests: architectures built from configs, without weights, small.

Each `ZooModel` is a builder (under the dtype policy in force, float32 outputs), a synthetic-data maker, its Keras
loss, a per-example loss for the trainer and the unit a sample is counted in; sizes fit a 2-core CPU (``gpu_batch``:
a GPU's). The models: ``mnist_cnn`` and ``gan`` (the tutorials'; the GAN's ``train_step`` makes both updates, ``fit``
as a user writes it), ``bert`` and ``gpt2`` (keras_hub backbones), ``mobilenet_v3``, ``resnet50``, ``efficientnet``
(``keras.applications``), ``lstm`` and ``two_heads`` (BatchNormalization, two outputs); each ``title`` says more.
Importing this module imports neither TensorFlow nor keras_hub; `unavailable` says why a model cannot be built here.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .models import NOISE_DIM, gan_discriminator, gan_generator, gan_losses, mnist_cnn
from .errors import AmpConfigError

VOCAB = 8192
SEQ = 128
# the keras_hub backbones' size
HUB_SIZE = dict(vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=128, intermediate_dim=512,
                max_sequence_length=SEQ)


def _tf() -> Any:
    import tensorflow as tf

    return tf


@dataclass(frozen=True)
class ZooModel:
    """One reference model: how it is built, its synthetic data, its losses and the unit its samples are counted in.

    Attributes:
        name: The model's name, its key in `ZOO`.
        title: What it is, in a few words (``"ResNet50 64x64, 10 classes"``).
        unit: What one sample is: ``"images"``, ``"sequences"``.
        batch: Its batch size on a 2-core CPU.
        gpu_batch: Its batch size on a GPU.
        build: Builds the model, under the dtype policy in force.
        data: ``(samples, seed)`` -> ``(x, y)``, NumPy arrays; ``y`` is ``None`` for the GAN.
        loss: Makes the loss(es) for ``model.compile``.
        per_example: Makes the per-example loss (`example_loss`) where it is not the Keras loss's ``call``; ``None``:
            it is.
        requires: The packages it needs beyond TensorFlow (``("keras_hub",)``; `unavailable` checks them).
        per_sample: Samples counted per batch row (the GAN counts real and generated images: 2).
        gan: Whether it is the GAN (its ``train_step`` makes both updates).
    """

    name: str
    title: str
    unit: str  # what one sample is: "images", "sequences"
    batch: int  # on a 2-core CPU
    gpu_batch: int
    build: Callable[[], Any]  # under the dtype policy in force
    data: Callable[[int, int], tuple[Any, Any]]  # (samples, seed) -> (x, y); numpy; y is None for the GAN
    loss: Callable[[], Any]  # the loss(es) for model.compile
    per_example: Callable[[], Callable[[Any, Any], Any]] | None = None  # `example_loss`, where not the loss's call
    requires: tuple[str, ...] = ()
    per_sample: int = 1  # samples counted per batch row (the GAN counts real and generated images: 2)
    gan: bool = False

    def example_loss(self) -> Callable[[Any, Any], Any]:
        """``(y, pred)`` -> one loss per example, for the trainer (by default the ``call`` of the Keras loss)."""
        return self.per_example() if self.per_example is not None else self.loss().call

    def evaluate(self, model: Any, x: Any, y: Any) -> float:
        """The mean loss on ``(x, y)`` in inference mode, in float32 (the parity check's figure)."""
        tf = _tf()
        if self.gan:
            noise = tf.random.stateless_uniform([len(x), NOISE_DIM], seed=[1, 2], minval=-1.0, maxval=1.0)
            return float(gan_losses(model.generator, model.discriminator, tf.constant(x), noise, training=False)[1])
        pred = model(x, training=False)
        pred = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), pred)
        return float(tf.reduce_mean(tf.cast(self.example_loss()(y, pred), tf.float32)))


def unavailable(entry: ZooModel) -> str | None:
    """Why ``entry`` cannot be built here, or None. Reads package metadata only (imports nothing heavy)."""
    if "keras_hub" in entry.requires:
        if importlib.util.find_spec("keras_hub") is None:
            return "keras_hub is not installed (pip install 'keras-hub>=0.32'; it needs TensorFlow >= 2.16, Keras 3)"
        try:
            from importlib.metadata import version

            if int(version("keras").split(".")[0]) < 3:
                return f"keras_hub needs Keras 3; Keras {version('keras')} is installed"
        except Exception as exc:
            return f"the Keras version could not be read ({type(exc).__name__}: {exc})"
    return None


# ---------------------------------------------------------------------------------------------- data
def _images(shape: tuple[int, ...], classes: int, scale: float = 1.0) -> Callable[[int, int], tuple[Any, Any]]:
    def make(n: int, seed: int) -> tuple[Any, Any]:
        rng = np.random.default_rng(seed)
        y = rng.integers(0, classes, n).astype("int32")
        x = rng.random((n, *shape), dtype=np.float32) * scale
        x[np.arange(n), ..., 0] += (y[:, None, None] / classes).astype("float32") * scale  # something to learn
        return x, y

    return make


def _tokens(n: int, seed: int, seq: int = SEQ, vocab: int = VOCAB) -> Any:
    return np.random.default_rng(seed).integers(1, vocab, (n, seq)).astype("int32")


def _bert_data(n: int, seed: int) -> tuple[Any, Any]:
    ids = _tokens(n, seed)
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}
    return x, (ids[:, 0] % 2).astype("int32")


def _gpt2_data(n: int, seed: int) -> tuple[Any, Any]:
    ids = _tokens(n, seed, SEQ + 1)
    return {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}, ids[:, 1:]


def _lstm_data(n: int, seed: int) -> tuple[Any, Any]:
    ids = _tokens(n, seed, 64, 5000)
    return ids, (ids[:, -1] % 2).astype("int32")


def _two_heads_data(n: int, seed: int) -> tuple[Any, Any]:
    x, y = _images((32, 32, 3), 10)(n, seed)
    return x, {"class": y, "value": x.mean(axis=(1, 2, 3))[:, None].astype("float32")}


def _gan_data(n: int, seed: int) -> tuple[Any, Any]:
    return np.random.default_rng(seed).random((n, 28, 28, 1), dtype=np.float32), None


# ---------------------------------------------------------------------------------------------- losses
def _sparse(from_logits: bool = False) -> Callable[[], Any]:
    return lambda: _tf().keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def _two_heads_per_example() -> Callable[[Any, Any], Any]:
    tf = _tf()
    ce = tf.keras.losses.SparseCategoricalCrossentropy()

    def loss(y: Any, pred: Any) -> Any:
        return ce.call(y["class"], pred["class"]) + tf.reduce_mean(tf.square(y["value"] - pred["value"]), axis=-1)

    return loss


def _gan_per_example() -> Callable[[Any, Any], Any]:
    raise AmpConfigError("the GAN has two updates of its own (amp_backends.training.gan_updates), not one loss")


# ---------------------------------------------------------------------------------------------- builders
def _gan() -> Any:
    tf = _tf()
    keras = tf.keras
    model_base: Any = keras.Model

    class GanPair(model_base):
        """The tutorials' GAN for ``fit``: ``compile(optimizer=...)`` trains the generator, the discriminator has its
        own RMSprop(1e-4); batches are real images, ``fit`` logs ``g_loss`` and ``d_loss``."""

        def __init__(self) -> None:
            super().__init__(name="gan")
            self.generator, self.discriminator = gan_generator(), gan_discriminator()
            self.d_optimizer = keras.optimizers.RMSprop(1e-4)
            self.d_optimizer.build(self.discriminator.trainable_variables)
            self.built = True  # its two models are built from their inputs

        def call(self, x: Any, training: bool = False) -> Any:
            return self.discriminator(x, training=training)

        def train_step(self, data: Any) -> Any:
            real = data[0] if isinstance(data, (tuple, list)) else data

            def losses() -> tuple[Any, Any]:
                noise = tf.random.uniform([tf.shape(real)[0], NOISE_DIM], -1.0, 1.0)
                return gan_losses(self.generator, self.discriminator, real, noise)

            logs = {}
            pairs = ((self.generator, self.optimizer), (self.discriminator, self.d_optimizer))
            for i, (model, opt) in enumerate(pairs):
                with tf.GradientTape() as tape:
                    loss = losses()[i]
                    scaled = opt.scale_loss(loss) if hasattr(opt, "scale_loss") else loss
                grads = tape.gradient(scaled, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
                logs[("g_loss", "d_loss")[i]] = loss
            return logs  # not "loss": Keras 3 would report its own (unused) loss tracker under that name

    return GanPair()


def _hub_classifier() -> Any:
    tf = _tf()
    import keras_hub

    backbone = keras_hub.models.BertBackbone(**HUB_SIZE)
    logits = tf.keras.layers.Dense(2, dtype="float32", name="head")(backbone.output["pooled_output"])
    return tf.keras.Model(backbone.input, logits, name="bert_classifier")


def _hub_causal_lm() -> Any:
    tf = _tf()
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(**HUB_SIZE)
    # The LM head computes under the policy (70% of the model's FLOPs); only its logits are cast to float32.
    logits = tf.keras.layers.Dense(VOCAB, name="lm_head")(backbone.output)
    logits = tf.keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return tf.keras.Model(backbone.input, logits, name="gpt2_causal_lm")


def _application(name: str, size: int) -> Callable[[], Any]:
    def build() -> Any:
        tf = _tf()
        base = getattr(tf.keras.applications, name)(weights=None, include_top=False, input_shape=(size, size, 3),
                                                   pooling="avg")
        out = tf.keras.layers.Dense(10, activation="softmax", dtype="float32", name="predictions")(base.output)
        return tf.keras.Model(base.input, out, name=name.lower())

    return build


def _lstm() -> Any:
    k = _tf().keras
    L = k.layers
    return k.Sequential([k.Input((64,), dtype="int32"), L.Embedding(5000, 64), L.LSTM(128),
                         L.Dense(2, activation="softmax", dtype="float32")], name="lstm")


def _two_heads() -> Any:
    k = _tf().keras
    L = k.layers
    inp = k.Input((32, 32, 3))
    h = inp
    for filters, stride in ((32, 1), (64, 2), (64, 2)):
        h = L.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(h)
        h = L.ReLU()(L.BatchNormalization()(h))
    h = L.GlobalAveragePooling2D()(h)
    cls = L.Dense(10, activation="softmax", dtype="float32", name="class")(h)
    value = L.Dense(1, dtype="float32", name="value")(L.Dense(32, activation="relu")(h))
    return k.Model(inp, {"class": cls, "value": value}, name="two_heads")


def _two_heads_loss() -> Any:
    tf = _tf()
    return {"class": tf.keras.losses.SparseCategoricalCrossentropy(), "value": tf.keras.losses.MeanSquaredError()}


ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("mnist_cnn", "the tutorials' MNIST CNN, 28x28x1", "images", 256, 1024, mnist_cnn,
             _images((28, 28, 1), 10), _sparse()),
    ZooModel("gan", "the tutorials' GAN (generator + discriminator), 28x28x1", "images", 128, 4096, _gan, _gan_data,
             lambda: None, _gan_per_example, per_sample=2, gan=True),
    ZooModel("bert", "keras_hub BertBackbone 2x128, seq 128, + 2-class head", "sequences", 32, 256, _hub_classifier,
             _bert_data, _sparse(True), requires=("keras_hub",)),
    ZooModel("gpt2", "keras_hub GPT2Backbone 2x128, seq 128, + LM head (vocabulary 8192)", "sequences", 16, 256,
             _hub_causal_lm, _gpt2_data, _sparse(True), requires=("keras_hub",)),
    ZooModel("mobilenet_v3", "MobileNetV3Small 96x96, 10 classes", "images", 64, 512,
             _application("MobileNetV3Small", 96), _images((96, 96, 3), 10, 255.0), _sparse()),
    ZooModel("resnet50", "ResNet50 64x64, 10 classes", "images", 16, 512, _application("ResNet50", 64),
             _images((64, 64, 3), 10, 255.0), _sparse()),
    ZooModel("efficientnet", "EfficientNetB0 64x64, 10 classes", "images", 32, 512, _application("EfficientNetB0", 64),
             _images((64, 64, 3), 10, 255.0), _sparse()),
    ZooModel("lstm", "Embedding + LSTM(128), 64 tokens, 2 classes", "sequences", 128, 1024, _lstm, _lstm_data,
             _sparse()),
    ZooModel("two_heads", "CNN with BatchNormalization, two heads (10 classes + regression), 32x32x3", "images", 128,
             2048, _two_heads, _two_heads_data, _two_heads_loss, _two_heads_per_example),
)}


def get(name: str) -> ZooModel:
    """The zoo model ``name``.

    Args:
        name: A key of `ZOO`.

    Returns:
        The model.

    Raises:
        KeyError: No zoo model has that name (the message lists them).
    """
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"No zoo model named {name!r}. Known: {', '.join(ZOO)}.") from None
