"""MNIST for the examples and benchmarks: Keras's file format, Keras's cache, a clear error offline.

Arrays stay ``uint8`` images ``(N, 28, 28)`` (the trainer scales to [0, 1] on the device, four times less resident
data) and ``int64`` labels. Files are read as people save MNIST (uint8 or float pixels in [0, 1] or [0, 255]; shapes
``(N, 28, 28)``, ``(N, 28, 28, 1)``, ``(N, 784)``; class ids or one-hot labels); anything else is refused with the
reason before training starts.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataUnavailableError
from .labels import class_ids

logger = logging.getLogger("amp_backends.data")

MNIST_KEYS = ("x_train", "y_train", "x_test", "y_test")
CLASSES = 10


def keras_cache_path() -> Path:
    """Where ``keras.datasets.mnist.load_data()`` keeps its download (``$KERAS_HOME`` or ``~/.keras``)."""
    base = os.environ.get("KERAS_HOME") or os.path.join("~", ".keras")
    return Path(os.path.abspath(os.path.expanduser(base))) / "datasets" / "mnist.npz"


def read_mnist_npz(path: str | os.PathLike) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Read an ``mnist.npz`` in Keras's format (arrays ``x_train, y_train, x_test, y_test``); ``path`` may be
    relative (to the working directory) or start with ``~``."""
    p = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if not p.is_file():
        raise _not_a_file(path, p)
    with contextlib.suppress(OSError), open(p, "rb") as opened:  # (unreadable: said below)
        if (head := opened.read(6)) and not head.startswith(b"PK"):  # an .npz is a zip archive (empty: cut off)
            what = "one NumPy array (an .npy file)" if head == b"\x93NUMPY" else "no zip archive"
            raise DataUnavailableError(
                f"--data must be an .npz archive of arrays {', '.join(MNIST_KEYS)} (Keras's mnist.npz). Received: "
                f"{str(p)!r}, which is {what}. Fix: np.savez(path, x_train=..., y_train=..., x_test=..., "
                "y_test=...), or use --synthetic or --digits.")
    try:
        with np.load(p, allow_pickle=False) as f:
            missing = [k for k in MNIST_KEYS if k not in f.files]
            if missing:
                raise DataUnavailableError(
                    f"{str(p)!r} is not an MNIST file in Keras's format: expected arrays {', '.join(MNIST_KEYS)}, "
                    f"found {', '.join(f.files) or 'none'} (missing {', '.join(missing)}). Fix: save the four arrays "
                    "under those names (np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)), or use "
                    "--synthetic or --digits.")
            x_train, y_train, x_test, y_test = (f[k] for k in MNIST_KEYS)
    except DataUnavailableError:
        raise
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise _damaged(p, exc) from None
        raise DataUnavailableError(f"{str(p)!r} holds Python objects (pickled arrays), which are not loaded: loading "
                                   "them could run code. Fix: save the arrays as plain numbers (np.savez with "
                                   "numeric arrays).") from None
    except PermissionError as exc:
        raise DataUnavailableError(f"{str(p)!r} cannot be read: {exc.strerror}. Fix: make the file readable "
                                   "(chmod u+r), or pass a copy you can read.") from None
    except Exception as exc:  # a truncated or overwritten file: BadZipFile, zlib.error, EOFError
        raise _damaged(p, exc) from None
    train, test = ((normalize_images(x, f"{p}: x_{name}"),
                    class_ids(y, CLASSES, f"{p}: y_{name}", one_hot="convert", error=DataUnavailableError))
                   for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)))
    for name, (x, y) in (("train", train), ("test", test)):
        if len(x) != len(y):
            raise DataUnavailableError(f"{str(p)!r}: x_{name} has {len(x)} images but y_{name} {len(y)} labels: "
                                       "expected one label per image.")
    return train, test


def _not_a_file(given: str | os.PathLike, p: Path) -> DataUnavailableError:
    """The error for a ``--data`` that is missing, a directory (naming the ``.npz`` files in it) or no file."""
    resolved = "" if str(p) == str(given) else f" ({p})"
    inside = sorted(c.name for c in p.glob("*.npz")) if p.is_dir() else []
    if p.is_dir():
        what = "is a directory, not a file" + (f" (it holds {', '.join(inside[:5])})" if inside else "")
    else:
        what = "is not a regular file" if p.exists() else "does not exist"
    such_as = f", such as {str(Path(given) / inside[0])!r}" if inside else ""
    return DataUnavailableError(
        f"--data must be an existing mnist.npz file (Keras's format: arrays {', '.join(MNIST_KEYS)}). "
        f"Received: {str(given)!r}{resolved}, which {what}. "
        f"Fix: pass the path of a downloaded mnist.npz{such_as}, or use --digits (real digits, shipped with the "
        "package) or --synthetic.")


def _damaged(p: Path, exc: BaseException) -> DataUnavailableError:
    again = (f"delete it ({str(p)!r}) and let Keras download it again" if p == keras_cache_path()
             else "download or copy it again")
    return DataUnavailableError(
        f"{str(p)!r} is damaged: it cannot be read as an .npz file ({type(exc).__name__}: {exc}); a download or "
        f"copy that stopped part-way leaves such a file. Fix: {again}, or use --synthetic (random data) or "
        "--digits (real handwritten digits shipped with the package) meanwhile.")


def normalize_images(x: np.ndarray, where: str) -> np.ndarray:
    """MNIST images as ``uint8`` ``(N, 28, 28)``, from the layouts and value ranges people save them in."""
    x = np.asarray(x)
    if x.ndim == 4 and x.shape[-1] == 1:
        x = x[..., 0]
    elif x.ndim == 2 and x.shape[1] == 784:
        x = x.reshape(-1, 28, 28)
    if x.ndim != 3 or x.shape[1:] != (28, 28):
        raise DataUnavailableError(f"{where} must have shape (N, 28, 28) (or (N, 28, 28, 1), (N, 784)). Received "
                                   f"{x.shape}.")
    if x.dtype == np.uint8:
        return x
    if x.dtype.kind not in "iuf":
        raise DataUnavailableError(f"{where} must hold numbers (uint8 0..255 or floats in [0, 1]). "
                                   f"Received dtype {x.dtype}.")
    if x.size and not np.isfinite(x).all():
        raise DataUnavailableError(f"{where} contains NaN or Inf ({int((~np.isfinite(x)).sum())} values). "
                                   "Fix: clean the file; MNIST images are 0..255 or 0..1.")
    low, high = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if low < 0 or high > 255:
        raise DataUnavailableError(
            f"{where} has values in [{low:g}, {high:g}]; expected MNIST pixels in [0, 255] (uint8) "
            "or [0, 1] (floats). Standardised or otherwise transformed images cannot be reused as MNIST. "
            "Fix: save the raw pixels.")
    if x.dtype.kind == "f" and high <= 1.0:
        logger.info(f"{where}: float pixels in [0, 1], converted to uint8 0..255 "
                    "(the trainer scales them back by /255).")
        return np.round(x * 255.0).astype(np.uint8)
    if x.dtype.kind == "f" and not np.array_equal(x, np.round(x)):
        raise DataUnavailableError(f"{where}: float pixels in [{low:g}, {high:g}] that are not whole numbers: "
                                   "expected [0, 1] floats or 0..255 values. "
                                   "Fix: save them as uint8 0..255 or floats in [0, 1].")
    return x.astype(np.uint8)


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
        f"MNIST is not in Keras's cache ({cached}) and {reason}. Fix: pass --digits to train offline on real "
        "handwritten digits (shipped with the package), --data /path/to/mnist.npz (Keras's format), or --synthetic "
        "for random MNIST-shaped data (for benchmarks).")


def synthetic_mnist(n_train: int = 60000, n_test: int = 10000, seed: int = 0) -> Any:
    """Random MNIST-shaped data: uint8 images (N, 28, 28) and labels 0..9. Throughput only; nothing to learn."""
    rng = np.random.default_rng(seed)
    return ((rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_train, dtype=np.int64)),
            (rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_test, dtype=np.int64)))


def digits_as_mnist(test_fraction: float = 0.2, seed: int = 0) -> Any:
    """Real handwritten digits (UCI's 8x8, 1,797 images, scikit-learn's ``load_digits``; shipped with the package)
    upsampled to 28x28 uint8, as MNIST.

    Args:
        test_fraction: The share of the images held out as the test split.
        seed: The seed of the shuffle that splits them.

    Returns:
        ``((x_train, y_train), (x_test, y_test))``: uint8 images ``(N, 28, 28)``, int64 labels 0..9.
    """
    with resources.files("amp_backends").joinpath("datasets/digits.csv.gz").open("rb") as f:
        rows = np.loadtxt(gzip.open(f), delimiter=",")
    images, target = rows[:, :-1].reshape(-1, 8, 8), rows[:, -1]
    imgs = np.pad(np.kron(images, np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))  # 24x24, centred in 28x28 as MNIST's
    imgs = np.round(imgs / 16.0 * 255.0).astype(np.uint8)
    labels = target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (imgs[train], labels[train]), (imgs[test], labels[test])
