"""Every path the trainer, the examples, the MNIST loader and autotune take works relative and absolute,
and a run saved from one working directory resumes from another."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import applied_plan, classification_data, mlp

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

from amp_backends import autotune  # noqa: E402
from amp_backends.data import load_mnist  # noqa: E402
from amp_backends.training import Trainer, classifier_updates, run_directory  # noqa: E402


def trainer(checkpoint_dir, logdir=None):
    m = mlp(hidden=None)
    opt = tf.keras.optimizers.SGD(0.1)
    return Trainer(classifier_updates(m, opt), applied_plan(), batch_size=8, checkpoint_objects={"m": m, "opt": opt},
                   checkpoint_dir=checkpoint_dir, logdir=logdir, progress=False, check_models=False)


@pytest.mark.intel
def test_a_relative_checkpoint_dir_resumes_in_the_same_and_from_another_working_directory(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    x, y = classification_data(32)
    monkeypatch.chdir(tmp_path / "a")
    first = trainer("rel/checkpoints", logdir="rel")
    assert first.fit(x, y, max_steps=2).steps == 2
    assert first.checkpoint_dir == str(tmp_path / "a" / "rel" / "checkpoints")
    # the same relative path, in the same folder
    again = trainer("rel/checkpoints")
    assert again.fit(x, y, max_steps=3, resume=True).steps == 3
    # and from another folder, through another relative path
    monkeypatch.chdir(tmp_path / "b")
    other = trainer("../a/rel/checkpoints")
    assert other.fit(x, y, max_steps=4, resume=True).steps == 4
    assert tf.train.latest_checkpoint(str(tmp_path / "a" / "rel" / "checkpoints")).endswith("ckpt-4")


@pytest.mark.intel
def test_a_trainer_keeps_writing_where_it_started_when_the_working_directory_changes(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    x, y = classification_data(32)
    monkeypatch.chdir(tmp_path / "a")
    t = trainer("rel/checkpoints", logdir="rel")
    t.fit(x, y, max_steps=1)
    monkeypatch.chdir(tmp_path)
    t.fit(x, y, max_steps=2)
    assert sorted(p.name for p in (tmp_path / "a" / "rel" / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-1.index", "ckpt-2.index"]
    assert not (tmp_path / "rel").exists()


@pytest.mark.intel
def test_run_directories_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = run_directory("runs/x", resume=False)
    assert run.path.is_absolute() and run.path == tmp_path / "runs" / "x" / "version_0"


@pytest.mark.intel
def test_the_mnist_file_and_the_autotune_cache_take_relative_and_home_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    arrays = dict(x_train=np.zeros((16, 28, 28), np.uint8), y_train=np.arange(16) % 10,
                  x_test=np.zeros((8, 28, 28), np.uint8), y_test=np.arange(8))
    np.savez(tmp_path / "m.npz", **arrays)
    assert load_mnist("~/m.npz")[0][0].shape == (16, 28, 28)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert load_mnist("../m.npz")[0][0].shape == (16, 28, 28)
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", "~/tune.json")
    assert autotune.cache_path() == tmp_path / "tune.json"
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", "cache/tune.json")
    assert autotune.cache_path() == tmp_path / "sub" / "cache" / "tune.json"
    autotune.store("k", {"policy": "float32"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMP_AUTOTUNE_CACHE", "sub/cache/tune.json")
    assert autotune.load_cache() == {"k": {"policy": "float32"}}


def test_a_logdir_that_is_a_runs_own_folder_warns_with_the_two_fixes(tmp_path):
    """``--logdir runs/version_0`` (a run that saved) without --resume nests a new run inside it: said, with the
    fixes (continue it, or start beside it); a folder named so that holds no checkpoint is just a folder."""
    from amp_backends.errors import AmpWarning
    run = tmp_path / "runs" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AmpWarning)
        assert run_directory(run, resume=False).path == run / "version_0"  # no warning: nothing saved there
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    with pytest.warns(AmpWarning, match=r"is a run's own folder: this run starts in a version_N inside it\. Fix: pass "
                                        rf"--resume to continue that run, or --logdir '{tmp_path / 'runs'}' to start"):
        assert run_directory(run, resume=False).path == run / "version_1"
