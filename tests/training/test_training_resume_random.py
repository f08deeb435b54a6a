"""Resume is exact with random layers: after a resume, every loss equals the uninterrupted run's.

Each kind of random layer is trained in a tiny model for 6 steps in one go, and for 3 steps then resumed to
6 in a new trainer (a new process would build the same way: seed, model, trainer); the losses of steps 3..5
must be equal to the last bit. The MNIST example (two Dropout layers, the auto plan) is checked through its
command line.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
import sys

import numpy as np
import pytest
from warm_python import run_python
from conftest import NEUTRAL_CWD

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

import amp_backends  # noqa: E402
from amp_backends.errors import CheckpointMismatchError  # noqa: E402
from amp_backends.keras_compat import keras_info  # noqa: E402
from amp_backends.training import Observer, Trainer, classifier_updates, seed_everything  # noqa: E402

KERAS = keras_info(tf).generation
L = tf.keras.layers
STEPS, CUT = 6, 3


class Losses(Observer):
    """Each step's loss, by global step."""

    def __init__(self):
        self.by_step = {}

    def after_call(self, record):
        for i in range(record.steps):
            self.by_step[record.step - record.steps + i] = float(record.losses[i, 0])


def vectors():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)


def images():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 8, 8, 1)).astype("float32"), rng.integers(0, 3, 64)


def sequences():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 5, 8)).astype("float32"), rng.integers(0, 3, 64)


def head(shape, *layers):
    return tf.keras.Sequential([tf.keras.Input(shape), *layers, L.Flatten(), L.Dense(3)])


class OwnGenerator(L.Layer if KERAS == 3 else tf.keras.__internal__.layers.BaseRandomLayer):
    """A layer of one's own that adds noise from its own generator (Keras 3: a ``keras.random.SeedGenerator``;
    Keras 2: the ``RandomGenerator`` of a ``BaseRandomLayer``, as Keras 2's random layers have)."""

    def __init__(self, **kw):
        if KERAS == 3:
            super().__init__(**kw)
            import keras

            self.seeds = keras.random.SeedGenerator(7)
        else:
            super().__init__(seed=7, **kw)

    def call(self, x, training=False):
        if not training:
            return x
        if KERAS == 3:
            import keras

            return x + keras.random.normal(tf.shape(x), seed=self.seeds)
        return x + self._random_generator.random_normal(tf.shape(x))


class GlobalDraw(L.Layer):
    """A layer that draws from ``keras.random`` with no seed: Keras 3's global SeedGenerator."""

    def call(self, x, training=False):
        import keras

        return x + keras.random.normal(tf.shape(x)) if training else x


def keras3_only(what):
    return pytest.mark.skipif(KERAS != 3, reason=f"{what} is Keras 3 only; this tf.keras is Keras {KERAS}")


def transformer():
    if KERAS != 3:
        pytest.skip(f"keras_hub needs Keras 3; this tf.keras is Keras {KERAS}")
    keras_hub = pytest.importorskip("keras_hub", reason="keras_hub is not installed")
    encoder = keras_hub.layers.TransformerEncoder(intermediate_dim=8, num_heads=2, dropout=0.3)
    return head((5, 8), encoder)


MODELS = {
    "Dropout": (lambda: head((4,), L.Dense(16, activation="relu"), L.Dropout(0.5)), vectors),
    "SpatialDropout1D": (lambda: head((5, 8), L.SpatialDropout1D(0.5)), sequences),
    "SpatialDropout2D": (lambda: head((8, 8, 1), L.Conv2D(4, 3), L.SpatialDropout2D(0.5)), images),
    "GaussianDropout": (lambda: head((4,), L.Dense(16), L.GaussianDropout(0.5)), vectors),
    "GaussianNoise": (lambda: head((4,), L.GaussianNoise(0.5)), vectors),
    "AlphaDropout": (lambda: head((4,), L.Dense(16), L.AlphaDropout(0.5)), vectors),
    "RandomFlip": (lambda: head((8, 8, 1), L.RandomFlip()), images),
    "RandomRotation": (lambda: head((8, 8, 1), L.RandomRotation(0.3)), images),
    "RandomCrop": (lambda: tf.keras.Sequential([tf.keras.Input((8, 8, 1)), L.RandomCrop(6, 6), L.Conv2D(4, 3),
                                                L.GlobalAveragePooling2D(), L.Dense(3)]), images),
    "RandomZoom": (lambda: head((8, 8, 1), L.RandomZoom(0.3)), images),
    "own generator": (lambda: head((4,), OwnGenerator()), vectors),
    "global keras.random": (lambda: head((4,), GlobalDraw()), vectors),
    "keras_hub TransformerEncoder": (transformer, sequences),
}
ONLY_KERAS_3 = {"global keras.random": keras3_only("keras.random's global SeedGenerator")}


def train(directory, build, data, steps, resume=False, objects=True):
    """A run as a program makes it: seed, model, trainer; the losses of the steps it ran, by global step."""
    seed_everything(0)
    model = build()
    opt = tf.keras.optimizers.Adam(1e-2)
    losses = Losses()
    trainer = Trainer(classifier_updates(model, opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
                      amp_backends.auto_configure(verbose=False, policy="float32"), batch_size=8,
                      checkpoint_dir=str(directory), progress=False, observers=[losses],
                      checkpoint_objects={"model": model, "optimizer": opt} if objects else None)
    trainer.fit(*data(), max_steps=steps, resume=resume)
    return losses.by_step


def uninterrupted_and_resumed(tmp_path, build, data, **kw):
    whole = train(tmp_path / "whole", build, data, STEPS, **kw)
    train(tmp_path / "cut", build, data, CUT, **kw)
    resumed = train(tmp_path / "cut", build, data, STEPS, resume=True, **kw)
    return {s: whole[s] for s in range(CUT, STEPS)}, resumed


@pytest.mark.parametrize("kind", [pytest.param(k, marks=ONLY_KERAS_3.get(k, ())) for k in MODELS])
def test_every_loss_after_a_resume_equals_the_uninterrupted_runs(tmp_path, kind):
    build, data = MODELS[kind]
    whole, resumed = uninterrupted_and_resumed(tmp_path, build, data)
    assert resumed == whole


def test_the_default_checkpoint_objects_resume_random_layers_exactly_too(tmp_path):
    whole, resumed = uninterrupted_and_resumed(tmp_path, *MODELS["Dropout"], objects=False)
    assert resumed == whole


def test_a_checkpoint_without_the_random_state_resumes_with_a_warning(tmp_path, monkeypatch, caplog):
    """A checkpoint written before checkpoints kept the random layers' state still resumes (at its step)."""
    from amp_backends.training import resume

    build, data = MODELS["Dropout"]
    monkeypatch.setattr(resume, "saved_random_state", lambda *a: tf.train.Checkpoint())  # as before: none
    train(tmp_path, build, data, CUT)
    monkeypatch.undo()
    caplog.set_level(logging.INFO, logger="amp_backends.train")
    resumed = train(tmp_path, build, data, STEPS, resume=True)
    assert sorted(resumed) == list(range(CUT, STEPS))
    assert re.search(r"ckpt-3 holds no state of the random layers .* the losses from here on differ", caplog.text)


def test_resuming_with_other_random_layers_names_the_difference(tmp_path):
    train(tmp_path, MODELS["Dropout"][0], vectors, CUT)
    with pytest.raises(CheckpointMismatchError, match=r"'random_state' has \d+ variables in the checkpoint, \d+ here"):
        train(tmp_path, lambda: head((4,), L.Dense(16), L.Dropout(0.5), L.GaussianNoise(0.1)), vectors, STEPS,
              resume=True)


@pytest.mark.skipif(KERAS != 2, reason="Keras 3's random layers all draw from SeedGenerators, which checkpoints hold")
def test_keras2_layers_on_tensorflows_stateful_ops_are_named_in_a_warning(tmp_path, caplog):
    """Made before seed_everything switched Keras 2 to tf.random.Generator: no checkpoint can hold their draws."""
    tf.keras.backend.experimental.disable_tf_random_generator()
    try:
        model = head((4,), L.Dropout(0.5, name="legacy_dropout"))
    finally:
        tf.keras.backend.experimental.enable_tf_random_generator()
    caplog.set_level(logging.WARNING, logger="amp_backends.train")
    Trainer(classifier_updates(model, tf.keras.optimizers.SGD()), amp_backends.auto_configure(verbose=False,
            policy="float32"), batch_size=8, progress=False, checkpoint_dir=str(tmp_path),
            checkpoint_objects={"model": model})  # (the model trained and kept: named once, not twice)
    assert re.search(r"The random layers legacy_dropout draw from TensorFlow's stateful random ops.*Fix: call "
                     r".*seed_everything", caplog.text)


# --------------------------------------------------------------------------- the MNIST example
STEP_LINE = re.compile(r"\((\d+), (\d+)\), Loss: ([\d.]+),")


def mnist(logdir, *args, cwd=NEUTRAL_CWD):
    """The example's step losses by global step (``logdir`` ``None``: its default, ``runs/mnist`` under ``cwd``),
    and its output."""
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--digits", "--lr", "0.001", "--seed", "0",
           "--batch_size", "16", "--no-progress", "--log-every", "1", *args]
    cmd += ["--logdir", str(logdir)] if logdir is not None else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMP_")} | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    out = run_python(cmd[1:], env=env, timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    return {int(m.group(2)): m.group(3) for m in STEP_LINE.finditer(out.stdout + out.stderr)}, out.stdout + out.stderr


@pytest.mark.slow
def test_the_mnist_example_resumed_from_relative_logdirs_logs_the_uninterrupted_runs_losses(tmp_path):
    """Cut at step 8 under the default ``--logdir runs/mnist`` of a temporary working directory, resumed there to
    step 10, then from another working directory through ``../runs/mnist``: each step's loss is the uninterrupted
    run's."""
    whole, _ = mnist(tmp_path / "whole", "--max-steps", "11")
    (tmp_path / "elsewhere").mkdir()
    mnist(None, "--max-steps", "8", "--checkpoint-every", "4", cwd=tmp_path)
    checkpoints = tmp_path / "runs" / "mnist" / "version_0" / "checkpoints"
    assert tf.train.latest_checkpoint(str(checkpoints)).endswith("ckpt-8")
    resumed, out = mnist(None, "--max-steps", "10", "--resume", cwd=tmp_path)
    assert f"Resumed from {checkpoints / 'ckpt-8'}: global step 8" in out
    assert resumed == {s: whole[s] for s in (8, 9)}
    resumed, out = mnist("../runs/mnist", "--max-steps", "11", "--resume", cwd=tmp_path / "elsewhere")
    assert f"Resumed from {checkpoints / 'ckpt-10'}: global step 10" in out and resumed == {10: whole[10]}
    assert Path(tf.train.latest_checkpoint(str(checkpoints))).name == "ckpt-11"
