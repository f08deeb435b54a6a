"""What watches training: the profile window's steps, the Keras fit callback's tutorial line."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.training import ThroughputLogger, parse_profile_steps  # noqa: E402


@pytest.mark.parametrize("text,expected", [("20:30", (20, 30)), ("", None), (None, None)])
def test_profile_steps(text, expected):
    assert parse_profile_steps(text) == expected


@pytest.mark.parametrize("text", ["30:20", "a:b", "5"])
def test_bad_profile_steps(text):
    with pytest.raises(ValueError, match=f"START:STOP.*Received: {text!r}. Fix: "):
        parse_profile_steps(text)


def test_keras_fit_callback_logs_the_tutorial_line_and_says_the_loss_is_the_epoch_mean(caplog):
    caplog.set_level("INFO", logger="amp_backends.train")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    cb = ThroughputLogger(batch_size=8)
    m.fit(np.ones((32, 4)), np.ones((32, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    lines = [r.message for r in caplog.records if r.name == "amp_backends.train"]
    assert re.match(r"\(0, 0\), Loss \(epoch mean\): \d+\.\d{5}, step_time: \d+\.\d{5}, throughput: .* img/s\.",
                    lines[0])
    assert len(cb.throughputs) == 4


def test_keras_fit_callback_counts_every_step_of_an_execution(caplog):
    """With steps_per_execution=4 Keras calls back once per 4 steps: the line covers 4 steps, step_time is per step."""
    caplog.set_level("INFO", logger="amp_backends.train")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    m.compile("sgd", "mse", steps_per_execution=4)
    cb = ThroughputLogger(batch_size=8)
    m.fit(np.ones((64, 4)), np.ones((64, 1)), batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    lines = [r.message for r in caplog.records if r.name == "amp_backends.train" and "Loss" in r.message]
    assert [line.split(")")[0] for line in lines] == ["(0, 3", "(0, 7"]
    assert len(cb.throughputs) == 2
