"""MNIST for the examples and benchmarks: Keras's file format, Keras's cache, a clear error offline.

Arrays stay ``uint8`` images ``(N, 28, 28)`` and ``int64`` labels; the trainer scales to [0, 1] on the
device (``/255``, as the tutorials did), which keeps the resident data four times smaller.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

MNIST_KEYS = ("x_train", "y_train", "x_test", "y_test")


class DataUnavailableError(RuntimeError):
    """The dataset could not be found or read; the message says how to provide it."""


def keras_cache_path() -> Path:
    """Where ``keras.datasets.mnist.load_data()`` keeps its download (``$KERAS_HOME`` or ``~/.keras``)."""
    base = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return Path(base) / "datasets" / "mnist.npz"


def read_mnist_npz(path: str | os.PathLike) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Read an ``mnist.npz`` in Keras's format (arrays ``x_train, y_train, x_test, y_test``)."""
    p = Path(path)
    if not p.is_file():
        raise DataUnavailableError(
            f"--data must be an existing mnist.npz file (Keras's format: arrays {', '.join(MNIST_KEYS)}). "
            f"Received: {str(path)!r}, which does not exist. Fix: pass the path of a downloaded mnist.npz, or use --synthetic."
        )
    try:
        with np.load(p, allow_pickle=False) as f:
            missing = [k for k in MNIST_KEYS if k not in f.files]
            if missing:
                raise DataUnavailableError(
                    f"{str(p)!r} is not an MNIST file in Keras's format: expected arrays {', '.join(MNIST_KEYS)}, "
                    f"found {', '.join(f.files) or 'none'} (missing {', '.join(missing)})."
                )
            x_train, y_train, x_test, y_test = (f[k] for k in MNIST_KEYS)
    except DataUnavailableError:
        raise
    except Exception as exc:
        raise DataUnavailableError(f"Could not read {str(p)!r} as an .npz file: {type(exc).__name__}: {exc}.") from exc
    for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) != len(y):
            raise DataUnavailableError(
                f"{str(p)!r}: x_{name} must have shape (N, 28, 28) with N labels in y_{name}. "
                f"Received x_{name} {x.shape}, y_{name} {y.shape}."
            )
    return (x_train.astype(np.uint8), y_train.astype(np.int64)), (x_test.astype(np.uint8), y_test.astype(np.int64))


def load_mnist(path: str | os.PathLike | None = None, *, allow_download: bool = True) -> Any:
    """MNIST from ``path``, else Keras's cache, else a Keras download; offline and absent -> a clear error."""
    if path:
        return read_mnist_npz(path)
    cached = keras_cache_path()
    if cached.is_file():
        return read_mnist_npz(cached)
    reason = "downloads are off"
    if allow_download:
        try:
            import tensorflow as tf

            (x, y), (xt, yt) = tf.keras.datasets.mnist.load_data()
            return (x.astype(np.uint8), y.astype(np.int64)), (xt.astype(np.uint8), yt.astype(np.int64))
        except Exception as exc:  # offline: URLError, HTTP errors, ...
            reason = f"the download failed: {type(exc).__name__}: {str(exc)[:200]}"
    raise DataUnavailableError(
        f"MNIST is not in Keras's cache ({cached}) and {reason}. Fix: pass --data /path/to/mnist.npz (Keras's format), "
        "or --synthetic for random MNIST-shaped data (for benchmarks)."
    )


def synthetic_mnist(n_train: int = 60000, n_test: int = 10000, seed: int = 0) -> Any:
    """Random MNIST-shaped data: uint8 images (N, 28, 28) and labels 0..9. Throughput only; nothing to learn."""
    rng = np.random.default_rng(seed)
    return ((rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_train, dtype=np.int64)),
            (rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_test, dtype=np.int64)))


def digits_as_mnist(test_fraction: float = 0.2, seed: int = 0) -> Any:
    """scikit-learn's real handwritten digits (8x8, 1797 images, no download) upsampled to 28x28 uint8."""
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = np.kron(d.images, np.ones((3, 3)))  # 24x24
    imgs = np.pad(imgs, ((0, 0), (2, 2), (2, 2)))  # 28x28, as MNIST's centred digits
    imgs = np.round(imgs / 16.0 * 255.0).astype(np.uint8)
    labels = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (imgs[train], labels[train]), (imgs[test], labels[test])
