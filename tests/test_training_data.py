"""The examples' MNIST loader: a file, Keras's cache, and errors that say what to do."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.tensorflow, pytest.mark.intel]
tf = pytest.importorskip("tensorflow")

from amp_backends.data import DataUnavailableError, load_mnist, read_mnist_npz  # noqa: E402


def write_npz(path, n=64, **override):
    arrays = dict(x_train=np.zeros((n, 28, 28), np.uint8), y_train=np.arange(n) % 10,
                  x_test=np.zeros((8, 28, 28), np.uint8), y_test=np.arange(8))
    arrays.update(override)
    np.savez(path, **arrays)
    return path


def test_mnist_loading_from_file_and_keras_cache(tmp_path, monkeypatch):
    (x, y), (xt, yt) = read_mnist_npz(write_npz(tmp_path / "m.npz"))
    assert x.shape == (64, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64 and xt.shape == (8, 28, 28)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "kh"))
    (tmp_path / "kh" / "datasets").mkdir(parents=True)
    write_npz(tmp_path / "kh" / "datasets" / "mnist.npz", n=32)
    assert load_mnist()[0][0].shape == (32, 28, 28)


def test_mnist_errors_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(DataUnavailableError, match="does not exist.*--synthetic"):
        load_mnist(tmp_path / "missing.npz")
    np.savez(tmp_path / "bad.npz", images=np.zeros(3))
    with pytest.raises(DataUnavailableError, match="expected arrays x_train, y_train, x_test, y_test"):
        load_mnist(tmp_path / "bad.npz")
    with pytest.raises(DataUnavailableError, match=r"shape \(N, 28, 28\)"):
        load_mnist(write_npz(tmp_path / "shape.npz", x_train=np.zeros((64, 32, 32), np.uint8)))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "empty"))

    def offline():
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(tf.keras.datasets.mnist, "load_data", offline)
    with pytest.raises(DataUnavailableError, match="download failed.*--data /path/to/mnist.npz.*--synthetic"):
        load_mnist()
