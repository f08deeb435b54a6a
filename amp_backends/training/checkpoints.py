"""Checkpoints that never lose a run, and the run directories that keep runs apart.

**Run directories.** Each training run started by the examples (``--logdir runs/mnist``) writes into a
new ``runs/mnist/version_N`` (TensorBoard shows each version as its own run; earlier runs are never
touched). ``--resume`` continues the newest version that holds checkpoints (or the directory given, if
it holds them itself). `run_directory` implements this; workers of a multi-worker run agree on the
version before any of them creates it.

**Checkpoints** (`CheckpointStore`): TensorFlow writes a checkpoint's data, then swaps the
``checkpoint`` index, so a crash mid-save leaves the previous checkpoint the latest. On top of that:

* a store refuses to start a fresh run in a directory holding another run's checkpoints (the fix names
  ``resume``), so nothing is overwritten and no index mixes two runs;
* every checkpoint carries a signature of what it holds (each model's variables: names, shapes and
  dtypes; the batch size; the plan), so resuming another model's checkpoint gives an error naming what
  differs, not an assertion with hundreds of variables;
* restoring falls back to the newest intact checkpoint when the latest is unreadable (truncated, say),
  with a warning naming the broken one;
* non-finite weights are never saved;
* an object added to what a store saves (``optional``: the random layers' state) may be missing from a
  checkpoint written before: that checkpoint is restored without it, and `Restored` names it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import tensorflow as tf

from ..errors import AmpConfigError, CheckpointError, CheckpointMismatchError
from .saving import KEY as RANDOM_STATE
from .saving import saved_random_state

logger = logging.getLogger("amp_backends.train")

SIGNATURE_KEY = "signature/.ATTRIBUTES/VARIABLE_VALUE"
VERSION = re.compile(r"^version_(\d+)$")


# ------------------------------------------------------------------------------------ directories
def absolute(path: str | os.PathLike) -> str:
    """``path`` made absolute against the working directory now (``~`` expanded): a run keeps writing where it
    started, and the checkpoint index never holds a path relative to a folder that is joined again. URLs
    (``gs://...``) stay as they are."""
    text = os.fspath(path)
    return text if "://" in text else os.path.abspath(os.path.expanduser(text))


def check_no_file_in_the_way(path: str | os.PathLike, what: str) -> Path:
    """``path`` as an absolute ``Path``; `AmpConfigError` if it, or the nearest existing parent, is not a
    directory."""
    p = Path(absolute(path))
    for parent in [p, *p.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise AmpConfigError(f"{what} {str(p)!r} cannot be used: {str(parent)!r} is a file, not a "
                                     f"directory. Fix: choose another {what} (or move that file).")
            break
    return p


def ensure_directory(path: str | os.PathLike, what: str) -> Path:
    """Create ``path`` (and parents) or raise `AmpConfigError` (a file in the way, no permission)."""
    p = check_no_file_in_the_way(path, what)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AmpConfigError(f"{what} {str(p)!r} cannot be created: {exc.strerror or exc}. Fix: choose a {what} you "
                             "can write to.") from None
    if not os.access(p, os.W_OK):
        raise AmpConfigError(f"{what} {str(p)!r} is not writable. Fix: choose a {what} you can write to.")
    return p


def check_directory(path: str | os.PathLike, what: str) -> Path:
    """``path`` as an absolute ``Path``, checked as `ensure_directory` would be but not created (the first
    write makes it, so a run that fails before writing leaves no folder): no file in the way, the nearest
    existing folder writable; else `AmpConfigError`."""
    p = check_no_file_in_the_way(path, what)
    existing = next((q for q in [p, *p.parents] if q.exists()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise AmpConfigError(f"{what} {str(p)!r} cannot be written: {str(existing)!r} is not writable. Fix: choose a "
                             f"{what} you can write to.")
    return p


def has_checkpoints(directory: str | os.PathLike) -> bool:
    return tf.train.get_checkpoint_state(str(directory)) is not None


def versions(logdir: Path) -> dict[int, Path]:
    if not logdir.is_dir():
        return {}
    out = {}
    for child in logdir.iterdir():
        m = VERSION.match(child.name)
        if m and child.is_dir():
            out[int(m.group(1))] = child
    return out


@dataclass(frozen=True)
class RunDirectory:
    """Where one run writes: ``path`` (TensorBoard, profiles) and ``path/checkpoints``."""

    path: Path
    resumed: bool

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"


def propose_run_directory(logdir: str | os.PathLike, resume: bool) -> RunDirectory:
    """Decide (without creating anything) where a run writes under ``logdir``; see the module docstring."""
    root = check_no_file_in_the_way(logdir, "--logdir")
    found = versions(root)
    if resume:
        if has_checkpoints(root / "checkpoints"):
            return RunDirectory(root, True)
        for n in sorted(found, reverse=True):
            if has_checkpoints(found[n] / "checkpoints"):
                return RunDirectory(found[n], True)
        raise CheckpointError(
            f"--resume: there is no run to resume under {str(root)!r} (no checkpoints in {str(root / 'checkpoints')!r} "
            f"or in any {str(root / 'version_N' / 'checkpoints')!r}). Fix: drop --resume to start a new run, or point "
            "--logdir at the run to continue.")
    return RunDirectory(root / f"version_{max(found, default=-1) + 1}", False)


# The run directories this process reserved, each with the folders above it that the reservation created.
_RESERVED: list[tuple[Path, tuple[Path, ...]]] = []


def release_unused_run_directories() -> None:
    """Remove each run directory this process reserved and never wrote into, and the folders above it that the
    reservation made, if they are still empty (a full folder stays: ``rmdir`` refuses it). The examples call it
    when they end, by error or not; it also runs at exit.
    """
    while _RESERVED:
        path, made = _RESERVED.pop()
        for folder in (path, *made):
            try:
                folder.rmdir()
            except OSError:
                break


atexit.register(release_unused_run_directories)


def reserve_run_directory(logdir: str | os.PathLike) -> RunDirectory:
    """A new ``version_N`` under ``logdir``, reserved by creating it: ``mkdir`` fails for every process but one, so
    runs started together in one logdir each get their own number (the next free one). A reserved folder the run
    never writes into is removed when the program ends (`release_unused_run_directories`).

    Args:
        logdir: the folder that holds the runs' ``version_N`` folders (made if missing).

    Returns:
        The new run's `RunDirectory` (not resumed).

    Raises:
        AmpConfigError: ``logdir`` cannot be created or written.
    """
    wanted = check_no_file_in_the_way(logdir, "--logdir")
    made = tuple(p for p in [wanted, *wanted.parents] if not p.exists())
    root = ensure_directory(wanted, "--logdir")
    n = max(versions(root), default=-1) + 1
    while True:
        path = root / f"version_{n}"
        try:
            path.mkdir()
        except FileExistsError:
            n += 1
            continue
        except OSError as exc:
            raise AmpConfigError(f"--logdir {str(root)!r}: the run directory {str(path)!r} cannot be created: "
                                 f"{exc.strerror or exc}. Fix: choose a --logdir you can write to.") from None
        _RESERVED.append((path, made))
        return RunDirectory(path, False)


def run_directory(logdir: str | os.PathLike, resume: bool, strategy: Any = None) -> RunDirectory:
    """Decide the run's directory: a new ``version_N``, reserved at once (`reserve_run_directory`), or under
    ``resume`` the newest run holding checkpoints. Under several workers they agree on it first (and the first write
    makes it).

    Args:
        logdir: the folder of the runs (``--logdir``), relative or absolute.
        resume: continue the newest run that holds checkpoints instead of starting a new one.
        strategy: the ``tf.distribute`` strategy of a run over several workers, or ``None``.

    Returns:
        The `RunDirectory`.

    Raises:
        CheckpointError: ``resume`` and no run to resume, or workers that chose different directories.
        AmpConfigError: ``logdir`` cannot be created or written.
    """
    several = strategy is not None and getattr(strategy, "cluster_resolver", None) is not None
    if not resume and not several:
        return reserve_run_directory(logdir)
    run = propose_run_directory(logdir, resume)
    if several:
        from .distribute import gather_numbers

        mine = int(run.path.name.split("_")[1]) if VERSION.match(run.path.name) else -1
        seen = gather_numbers(strategy, mine)
        if len(set(seen)) > 1:
            raise CheckpointError(
                f"The workers chose different run directories under {str(logdir)!r} (versions {seen}): their --logdir "
                "views differ. Fix: give every worker the same --logdir on storage they all share.")
    check_directory(run.path, "--logdir")  # made by the run's first write
    return run


# ------------------------------------------------------------------------------------ signatures
def _variables_of(obj: Any) -> list[Any] | None:
    for attr in ("weights", "variables"):
        value = getattr(obj, attr, None)
        if value is not None and not callable(value):
            return list(value)
    return None


def _var_name(v: Any) -> str:
    name = getattr(v, "path", None) or getattr(v, "name", "?")
    return str(name).rsplit(":", 1)[0]


def signature(objects: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint holds: for each model or layer, its variables' names, shapes and dtypes, in order."""
    models = {}
    for key, obj in objects.items():
        variables = _variables_of(obj)
        if variables is None or hasattr(obj, "apply_gradients"):  # optimizers: their state follows the model's
            continue
        models[key] = [[_var_name(v), list(v.shape), v.dtype.name if hasattr(v.dtype, "name") else str(v.dtype)]
                       for v in variables]
    return {"format": 1, "objects": models, **dict(extra)}


def differences(stored: Mapping[str, Any], current: Mapping[str, Any], limit: int = 6) -> list[str]:
    """Human-readable differences between two signatures' objects (names are shown, shapes and dtypes compared)."""
    out: list[str] = []
    a, b = stored.get("objects", {}), current.get("objects", {})
    for key in sorted(set(a) | set(b)):
        if key not in b:
            out.append(f"the checkpoint holds {key!r}, which this run does not train")
        elif key not in a:
            out.append(f"this run trains {key!r}, which the checkpoint does not hold")
        elif len(a[key]) != len(b[key]):
            out.append(f"{key!r} has {len(a[key])} variables in the checkpoint, {len(b[key])} here")
        else:
            for (na, sa, da), (nb, sb, db) in zip(a[key], b[key], strict=True):
                if sa != sb or da != db:
                    out.append(f"{key!r} variable {nb}: the checkpoint has shape {tuple(sa)} {da} ({na}), this run "
                               f"{tuple(sb)} {db}")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


# ------------------------------------------------------------------------------------ the store
@dataclass(frozen=True)
class Restored:
    """The checkpoint restored, and the signature it was written with (``None`` for a foreign one)."""

    path: str
    stored: dict[str, Any] | None
    lacking: tuple[str, ...] = ()  # optional objects with variables the checkpoint does not hold (they keep theirs)


class CheckpointStore:
    """Saves and restores one ``tf.train.Checkpoint`` in a directory, by the rules in the module docstring."""

    def __init__(self, objects: Mapping[str, Any], directory: str | os.PathLike, *, step_counter: Any,
                 keep: int = 3, is_chief: bool = True, worker: str = "0",
                 extra: Mapping[str, Any] | None = None, optional: Mapping[str, Any] | None = None) -> None:
        self.directory = absolute(directory)
        check_directory(self.directory, "checkpoint directory")  # made by the first save (or the run's lock)
        self.is_chief, self.worker, self.keep = is_chief, worker, keep
        self._objects = {**dict(objects), **dict(optional or {})}
        self._optional = set(optional or {})
        self.signature = signature(self._objects, extra or {})
        self._signature_var = tf.Variable(json.dumps(self.signature), dtype=tf.string, trainable=False,
                                          name="signature")
        self.checkpoint = tf.train.Checkpoint(**self._objects, signature=self._signature_var)
        self.step_counter = step_counter
        # Under MultiWorkerMirroredStrategy every worker saves (saving is collective); only the chief's
        # files are kept, the others write to a scratch folder removed after each save.
        write_dir = self.directory if is_chief else os.path.join(self.directory, f".worker-{worker}")
        self.manager = tf.train.CheckpointManager(self.checkpoint, write_dir, max_to_keep=keep,
                                                  step_counter=step_counter)
        self.owned = False  # True once this store wrote or restored: its directory is this run's
        self.last_saved_step: int | None = None
        self.resumes_from = self  # the store a resumed run continues from (a sibling's: the store it sits in)

    def sibling(self, name: str, keep: int = 1) -> CheckpointStore:
        """A store of the same objects in the folder ``name`` inside this one (the best checkpoint's); a run resumes
        from this one, not from it."""
        extra = {k: v for k, v in self.signature.items() if k not in ("format", "objects")}
        store = CheckpointStore({k: v for k, v in self._objects.items() if k not in self._optional},
                                os.path.join(self.directory, name), step_counter=self.step_counter, keep=keep,
                                is_chief=self.is_chief, worker=self.worker, extra=extra,
                                optional={k: self._objects[k] for k in self._optional})
        store.resumes_from = self
        return store

    @property
    def latest(self) -> str | None:
        """The newest checkpoint whose files are there, else ``None``."""
        return next((p for p in self.paths() if tf.io.gfile.exists(p + ".index")), None)

    def paths(self) -> list[str]:
        """Checkpoints in the directory, newest first.

        TensorFlow has already joined the index's entries to the directory (joining them again doubled a
        relative directory: ``runs/x/runs/x/ckpt-8``). A checkpoint of this store is always in the directory
        itself, so each is named by its file name there, also where the index holds an absolute path that went
        stale when the run's folder was moved.
        """
        state = tf.train.get_checkpoint_state(self.directory)
        if state is None:
            return []
        paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
        paths = [os.path.join(self.directory, os.path.basename(p)) for p in paths]
        return sorted(set(paths), key=lambda p: int(p.rsplit("-", 1)[1]) if p.rsplit("-", 1)[1].isdigit() else -1,
                      reverse=True)

    def ensure_fresh(self) -> None:
        """Refuse to start a new run over another run's checkpoints."""
        if self.owned:
            return
        latest = self.latest
        if latest:
            raise CheckpointError(
                f"{self.directory!r} holds the checkpoints of an earlier run (latest: {os.path.basename(latest)}). "
                "Starting over there would overwrite them. Fix: continue that run with resume=True (--resume), or "
                "give this run its own directory (a new --logdir; the examples make a new version_N per run).")

    def annotate(self, key: str, value: Any) -> None:
        """Record ``key: value`` in the signature the next checkpoints are written with (a run's own decision,
        such as the measured precision, for its resume to follow)."""
        self.signature[key] = value
        self._signature_var.assign(json.dumps(self.signature))

    def read_signature(self, path: str) -> dict[str, Any] | None:
        reader = tf.train.load_checkpoint(path)
        if not reader.has_tensor(SIGNATURE_KEY):
            return None
        raw = reader.get_tensor(SIGNATURE_KEY)
        return json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))

    def restore(self) -> Restored | None:
        """Restore the newest intact checkpoint; ``None`` if there is none at all.

        An unreadable checkpoint is skipped with a warning; a checkpoint of other models raises
        `CheckpointMismatchError` (older ones of the same run would not match either).
        """
        paths = self.paths()
        if not paths:
            return None
        broken: list[tuple[str, str]] = []
        for path in paths:
            try:
                stored = self.read_signature(path)
            except Exception as exc:  # missing or truncated files
                broken.append((path, _short(exc)))
                continue
            absent, current, checkpoint = self._without_absent(stored)
            if stored is not None:
                diff = differences(stored, current)
                if diff:
                    raise CheckpointMismatchError(
                        f"The checkpoint {path} was written for other models than the ones being trained: "
                        + "; ".join(diff) + ". Fix: resume with the same model code and arguments, or start a new run "
                        "(without --resume, or with another --logdir).")
            try:
                checkpoint.restore(path).assert_existing_objects_matched()
            except (AssertionError, ValueError) as exc:
                if stored is None:
                    raise CheckpointMismatchError(
                        f"The checkpoint {path} does not match the models being trained (it was written by another "
                        f"program or another model): {_short(exc, 240)}. Fix: resume with the same model code and "
                        "arguments, or start a new run (without --resume, or with another --logdir).") from None
                broken.append((path, _short(exc)))
                continue
            except Exception as exc:  # truncated data: IndexError, DataLossError, ...
                broken.append((path, _short(exc)))
                continue
            for bad, why in broken:
                logger.warning(f"Checkpoint {bad} is unreadable ({why}); resumed from the newest intact one, {path}.")
            self._signature_var.assign(json.dumps(self.signature))  # later saves describe this run
            self.owned = True
            self.last_saved_step = int(self.step_counter.numpy())
            return Restored(path, stored, tuple(sorted(k for k in absent if self.signature["objects"].get(k))))
        reasons = "; ".join(f"{os.path.basename(p)}: {w}" for p, w in broken)
        raise CheckpointError(
            f"No intact checkpoint in {self.directory!r}: {reasons}. "
            "Fix: start a new run (without --resume, or with another --logdir).")

    def _without_absent(self, stored: dict[str, Any] | None) -> tuple[set[str], dict[str, Any], Any]:
        """The optional objects a checkpoint written before they were added does not hold, and this store's
        signature and checkpoint without them (to compare with and restore that checkpoint)."""
        absent = {k for k in self._optional if stored is not None and k not in stored.get("objects", {})}
        if not absent:
            return absent, self.signature, self.checkpoint
        kept = {k: v for k, v in self._objects.items() if k not in absent}
        return (absent, {**self.signature, "objects": {k: v for k, v in self.signature["objects"].items()
                                                       if k not in absent}},
                tf.train.Checkpoint(**kept, signature=self._signature_var))

    def save(self) -> str | None:
        """Write a checkpoint at the current step; returns its path (``None`` on non-chief workers)."""
        step = int(self.step_counter.numpy())
        path = self.manager.save(checkpoint_number=step)
        self.owned = True
        self.last_saved_step = step
        if not self.is_chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
            return None
        return path


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


# ------------------------------------------------------------------------------------ the trainer's store
def trainer_store(directory: str | os.PathLike, *, updates: Any, scalers: Mapping[str, Any], position: Any,
                  objects: Mapping[str, Any] | None, keep: int, is_chief: bool, worker: str,
                  plan_headline: str, settings: Mapping[str, Any] | None = None, models: Any = (),
                  metrics: Any = ()) -> CheckpointStore:
    """What a trainer's checkpoint holds: the given objects (default: the updates' variables and optimizers),
    each update's loss-scale state, the position (global step, epoch, sample in epoch, batch size) and the
    state of the random layers of ``models`` (`random_state`) and the training metrics' state (``metrics``:
    their variables); the signature also records ``settings`` (the run's seed and loss scaling, for a resume to
    compare)."""
    objects = dict(objects) if objects else {
        **{f"{u.name}_{i}_{part}": obj for u in updates for i, (vs, opt) in enumerate(u.groups)
           for part, obj in (("variables", list(vs)), ("optimizer", opt))},
        **{f"{u.name}_state": list(u.state) for u in updates if u.state}}
    scaler_state = {name: tf.train.Checkpoint(**s.variables()) for name, s in scalers.items()}
    return CheckpointStore(
        {**objects, "loss_scale": tf.train.Checkpoint(**scaler_state), "position": position.checkpoint()}, directory,
        step_counter=position.global_step, keep=keep, is_chief=is_chief, worker=worker,
        extra={"batch_size": position.batch_size, "plan": plan_headline, **dict(settings or {})},
        optional={RANDOM_STATE: saved_random_state(models, is_chief),
                  **({"metrics": _Variables(metrics)} if metrics else {})})


class _Variables(tf.Module):
    """Variables a checkpoint holds as one object (the training metrics' state)."""

    def __init__(self, variables: Any) -> None:
        super().__init__(name="metrics")
        self.state = list(variables)


def log_resume(restored: Restored, at: Any, then_batch: int, batch_size: int, *, updates: Any,
               scalers: Mapping[str, Any], plan_headline: str) -> None:
    """The resume line: where the run continues, and what differs from the run that wrote the checkpoint."""
    optimizers = {f"{u.name}[{i}]": int(opt.iterations.numpy()) for u in updates
                  for i, (_, opt) in enumerate(u.groups) if hasattr(opt, "iterations")}
    logger.info(f"Resumed from {restored.path}: global step {at.step}, epoch {at.epoch}, step in epoch "
                f"{at.offset // then_batch}, loss scales " + ", ".join(f"{n}={s.current:g}" for n, s in scalers.items())
                + ", optimizer iterations " + ", ".join(f"{k}={v}" for k, v in optimizers.items()))
    if then_batch != batch_size:
        logger.info(f"The checkpoint was written with batch size {then_batch}; this run uses {batch_size}: it "
                    f"continues at sample {at.offset} of epoch {at.epoch} (the position is kept in samples, so no "
                    "sample is read twice or skipped).")
    if RANDOM_STATE in restored.lacking:
        logger.warning(f"{restored.path} holds no state of the random layers (Dropout, noise, augmentation; it was "
                       "written before checkpoints kept it): they draw from the start of their sequences again, so "
                       "the losses from here on differ from an uninterrupted run's.")
    then = (restored.stored or {}).get("plan")
    if then and then != plan_headline:
        logger.info(f"The checkpoint was written under another plan ({then}); this run: {plan_headline}.")
