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
    with pytest.raises(DataUnavailableError, match="does not exist.*--digits .*--synthetic"):
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
    with pytest.raises(DataUnavailableError, match="download failed.*Fix: pass --digits to train offline on real "
                                                   "handwritten digits.*--data /path/to/mnist.npz.*--synthetic"):
        load_mnist()


def test_a_directory_is_named_as_one_and_the_npz_inside_is_offered(tmp_path):
    with pytest.raises(DataUnavailableError, match=r"which is a directory, not a file\. Fix: .*--synthetic"):
        load_mnist(tmp_path)
    write_npz(tmp_path / "mnist.npz")
    with pytest.raises(DataUnavailableError, match=r"is a directory, not a file \(it holds mnist\.npz\)\. Fix: pass "
                                                   r"the path of a downloaded mnist\.npz, such as '.*mnist\.npz'"):
        load_mnist(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.0])
def test_a_truncated_file_is_named_damaged_with_what_to_do(tmp_path, keep):
    whole = write_npz(tmp_path / "whole.npz").read_bytes()
    cut = tmp_path / "mnist.npz"
    cut.write_bytes(whole[: int(len(whole) * keep)])
    with pytest.raises(DataUnavailableError) as err:
        load_mnist(cut)
    text = str(err.value)
    assert f"{str(cut)!r} is damaged" in text and "Fix: download or copy it again" in text and "--synthetic" in text


def test_a_damaged_file_in_keras_cache_says_to_delete_it(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / "mnist.npz").write_bytes(b"PK\x03\x04 half a download")
    with pytest.raises(DataUnavailableError, match=r"is damaged.*Fix: delete it .* and let Keras download it again"):
        load_mnist()


def test_a_file_that_is_no_npz_archive_is_called_so_not_damaged_or_pickled(tmp_path):
    """A text file named .npz was said to hold pickled arrays; an .npy array to be a download stopped part-way."""
    text, array = tmp_path / "notes.npz", tmp_path / "images.npy"
    text.write_text("x_train,y_train\n1,2\n")
    np.save(array, np.zeros((4, 28, 28), "uint8"))
    for path, what in ((text, "no zip archive"), (array, r"one NumPy array \(an \.npy file\)")):
        with pytest.raises(DataUnavailableError, match=rf"--data must be an \.npz archive.*which is {what}\. Fix: "
                                                       r"np\.savez\(path, x_train="):
            load_mnist(path)


def test_pickled_arrays_are_refused_with_the_reason(tmp_path):
    path = write_npz(tmp_path / "objects.npz", y_test=np.array([object()] * 8))
    with pytest.raises(DataUnavailableError, match="holds Python objects"):
        load_mnist(path)


def test_the_digits_ship_with_the_package_as_recorded_and_need_no_scikit_learn(tmp_path):
    """--digits' data: the file its README names (sha256), every digit present, read with scikit-learn absent
    (an ``sklearn`` that fails on import, first on the path)."""
    import hashlib
    import os
    import subprocess
    import sys
    from importlib import resources

    from amp_backends.data import digits_as_mnist
    from conftest import NEUTRAL_CWD

    folder = resources.files("amp_backends").joinpath("datasets")
    digest = hashlib.sha256(folder.joinpath("digits.csv.gz").read_bytes()).hexdigest()
    assert digest in folder.joinpath("README.md").read_text(encoding="utf-8")
    (x, y), (xt, yt) = digits_as_mnist()
    assert x.shape == (1438, 28, 28) and xt.shape == (359, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
    assert set(np.unique(np.concatenate([y, yt]))) == set(range(10)) and int(x.max()) == 255
    assert not x[:, :2].any() and not x[:, :, -2:].any()  # centred, as MNIST's digits
    (x2, _), _ = digits_as_mnist(seed=1)
    assert not np.array_equal(x, x2)  # the seed shuffles the split
    shadow = tmp_path / "no_sklearn" / "sklearn"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("scikit-learn was imported")\n')
    code = "from amp_backends.data import digits_as_mnist; (x, y), _ = digits_as_mnist(); print(x.shape, int(y.sum()))"
    path = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=NEUTRAL_CWD,
                         env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 0 and out.stdout.split()[:3] == ["(1438,", "28,", "28)"], out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) == int(y.sum())
