"""What the MNIST and GAN examples share: their options, the plan, the data, the run directory, the trainer.

Plain library code: nothing here parses a command line or exits (``amp_backends.commands.train_command`` does).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import AmpConfigError, CheckpointMismatchError


@dataclass
class RunOptions:
    """How an example trains: the tutorials' settings, the plan's overrides (``auto_configure`` keywords; one left out
    is decided by its ``AMP_*`` variable, else by the plan), the trainer's and the run's. Build one with keywords, or
    with `from_parsed`."""

    epochs: int = 1
    batch_size: int = 64
    lr: float = 0.01
    data: str | None = None
    synthetic: bool = False
    digits: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)
    steps_per_call: int = 1
    log_every: int = 1
    logdir: str = "runs"
    checkpoint_every: int | None = None
    resume: bool = False
    profile: bool = False
    profile_steps: str | None = None
    max_steps: int | None = None
    seed: int | None = None  # None: 0 for a new run; a resumed run keeps its own
    progress: bool | None = None
    distribute: str = "auto"
    cluster_timeout: float = 60.0
    tune: bool = False
    deterministic: bool = False
    audit: bool = False

    @classmethod
    def from_parsed(cls, parsed: Mapping[str, Any]) -> RunOptions:
        """The options among ``parsed`` (a command's parsed options, by name); other names are ignored."""
        return cls(**{f.name: parsed[f.name] for f in fields(cls) if f.name in parsed})


def preflight(opts: RunOptions) -> None:
    """What the examples refuse before TensorFlow starts: a wrong cluster (`training.distribute.check_cluster`), a
    ``--logdir`` below a file, two sources of data, a ``--profile-steps`` that is no window, and in one process a
    ``--resume`` with no run to resume or of a run another process is training now.

    Args:
        opts: The parsed options.

    Raises:
        AmpConfigError: ``--logdir`` cannot be a folder, ``--distribute`` is unknown, ``--profile-steps`` is not
            ``START:STOP`` with ``0 <= START < STOP`` or starts at or after ``--max-steps``, or more than one of
            ``--data``, ``--synthetic`` and ``--digits`` is given.
        ClusterConfigError: The cluster is described wrongly, or this worker's port is taken.
        CheckpointError: ``--resume`` finds no run, or one another process holds.
    """
    from ..training.distribute import check_cluster
    from ..training.runs import check_no_file_in_the_way, parse_profile_steps, propose_run_directory, refuse_if_held

    sources = [flag for flag, on in (("--data", opts.data), ("--synthetic", opts.synthetic), ("--digits", opts.digits))
               if on]
    if len(sources) > 1:
        raise AmpConfigError(f"--data, --synthetic and --digits each choose the training data: one at most. Received: "
                             f"{' and '.join(sources)}. Fix: keep the one to train on.")
    several = check_cluster(opts.distribute) is not None
    window = parse_profile_steps(opts.profile_steps)
    if window and opts.max_steps is not None and window[0] >= opts.max_steps:
        raise AmpConfigError(f"--profile-steps {opts.profile_steps} starts at step {window[0]}, and --max-steps "
                             f"{opts.max_steps} ends the run before it: nothing would be traced. Expected a window "
                             f"that starts before step {opts.max_steps}. Fix: --profile-steps "
                             f"{max(0, opts.max_steps - 10)}:{opts.max_steps}, or a larger --max-steps.")
    check_no_file_in_the_way(opts.logdir, "--logdir")
    if opts.resume and not several:  # (the workers of a cluster agree on their run first: `choose_run`)
        refuse_if_held(propose_run_directory(opts.logdir, True).checkpoints)


def profile_window(opts: RunOptions) -> tuple[int, int] | None:
    """``--profile-steps A:B`` (steps of the whole run); ``--profile`` alone: 10 steps after the two warm-up
    (compiling) calls, counted from the step the fit starts at (`trainer_options`)."""
    from ..training.runs import parse_profile_steps

    if opts.profile_steps:
        return parse_profile_steps(opts.profile_steps)
    if opts.profile:
        start = 2 * opts.steps_per_call
        return start, start + max(10, opts.steps_per_call)
    return None


def choose_run(opts: RunOptions, strategy: Any) -> tuple[RunOptions, Any]:
    """The run directory (a new ``version_N``, or the one ``--resume`` continues) and the options with the run's seed,
    decided before the data it draws or splits. A resumed run keeps its checkpoints' seed: another ``--seed`` is
    refused (`CheckpointMismatchError`), and so is a run another process is training now (`CheckpointError`)."""
    from ..training.distribute import is_chief
    from ..training.resume import run_seed
    from ..training.runs import refuse_if_held, run_directory

    run = run_directory(opts.logdir, opts.resume, strategy)
    seed = 0 if opts.seed is None else opts.seed
    chief = strategy is None or is_chief(strategy)
    if run.resumed:
        if chief:  # (the chief holds the lock while it trains: another worker would find it held by its chief)
            refuse_if_held(run.checkpoints)
        theirs = run_seed(run.checkpoints)
        if theirs is not None and opts.seed is not None and opts.seed != theirs:
            raise CheckpointMismatchError(
                f"--seed {opts.seed}: the run in {str(run.path)!r} was started with seed {theirs}, and it orders each "
                "epoch's samples (and splits --digits, draws --synthetic): continuing it with another seed would "
                "read samples of the epoch in progress twice and skip others. Fix: drop --seed (a resumed run keeps "
                f"its own), or start a new run with --seed {opts.seed} (without --resume, or with another --logdir).")
        seed = seed if theirs is None else theirs
    if chief:
        kind = f"resumed, its seed {seed}" if run.resumed else "new run"
        print(f"Run directory: {run.path} ({kind}; tensorboard --logdir {opts.logdir})", flush=True)
    return replace(opts, seed=seed), run


def start(opts: RunOptions) -> tuple[RunOptions, Any, Any, Any, Any]:
    """The tf.distribute strategy (first: multi-worker collectives are set up before any op), this worker's plan
    (compared with the other workers' plans), a ``--data`` file read, then `choose_run` (the options get the run's
    seed), then the data drawn or split with that seed.

    Returns:
        ``(opts, strategy, plan, run, data)``.
    """
    from ..configure import auto_configure
    from ..data import digits_as_mnist, load_mnist, synthetic_mnist
    from ..training.distribute import check_plan_agreement, make_strategy

    strategy = make_strategy(opts.distribute, timeout_s=opts.cluster_timeout)
    if opts.tune and strategy is not None:
        raise AmpConfigError("--tune times plans in a single process; it cannot run under a distribution strategy. "
                             "Fix: tune once without --distribute (the choice is cached), then train distributed.")
    plan = auto_configure(**opts.overrides, verbose=False)
    check_plan_agreement(strategy, plan, strict=bool(opts.overrides.get("strict")))
    data = None if opts.synthetic or opts.digits else load_mnist(opts.data)  # (refused before a run is announced)
    opts, run = choose_run(opts, strategy)
    seed = opts.seed or 0  # the run's (choose_run sets it): what it draws or splits
    data = synthetic_mnist(seed=seed) if opts.synthetic else digits_as_mnist(seed=seed) if opts.digits else data
    return opts, strategy, plan, run, data


def prepare_models(plan: Any, *models: Any, strategy: Any = None, steps_per_call: int | None = None) -> None:
    """The plan applied to each model (its float32 layers; float8 with fp8 on), then printed by the chief as it stands
    for these models and the trainer's ``steps_per_call`` (with fp8 on, what float8 did to each)."""
    from ..prepare import prepare_model
    from ..training.distribute import is_chief

    preps = [prepare_model(model, plan) for model in models]
    if strategy is not None and not is_chief(strategy):
        return
    kept = [path for prep in preps if prep.layer_plan for path in prep.layer_plan.paths("float32", "float32_layers")]
    # (the plan's float32 layer kinds; a head is the layer plan's)
    print(plan.brief(model_float32=kept, steps_per_call=steps_per_call), flush=True)
    for prep in preps:
        if plan.fp8:
            print(prep, flush=True)


def trainer_options(opts: RunOptions, run: Any, strategy: Any) -> dict[str, Any]:
    """The Trainer's keyword arguments the options decide."""
    from ..training.observers import ProfilerWindow
    from ..training.tasks import mnist_batch_fn

    window = profile_window(opts)  # --profile alone: after this fit's warm-up, a resumed run's too
    observers: list[Any] = []
    if window and not opts.profile_steps:
        observers.append(ProfilerWindow(os.path.abspath(run.path), window, after_fit_start=True))
    return dict(batch_size=opts.batch_size, steps_per_call=opts.steps_per_call, log_every=opts.log_every,
                logdir=str(run.path), checkpoint_dir=str(run.checkpoints), checkpoint_every=opts.checkpoint_every,
                profile_steps=None if observers else window, progress=opts.progress, seed=opts.seed,
                batch_fn=mnist_batch_fn, strategy=strategy, audit=opts.audit, observers=observers)


def final_plan(opts: RunOptions, plan: Any, build: Any, x: Any, y: Any, images_per_step: int | None = None) -> Any:
    """The plan to train with: with ``tune``, the candidate plans timed on this model (or the cached choice), printed.
    Everything is then seeded, before the models are built (after the tuning, whose draws would move their weights).

    Returns:
        The plan: the tuned one with ``tune``, else ``plan``.
    """
    from ..seeds import seed_everything

    if opts.tune:
        from ..autotune import tune
        from ..training.tasks import mnist_batch_fn

        plan = tune(build, x, y, batch_size=opts.batch_size, images_per_step=images_per_step, batch_fn=mnist_batch_fn,
                    overrides=opts.overrides)
        print(f"autotuned plan: {plan.headline}", flush=True)
    seed_everything(0 if opts.seed is None else opts.seed, deterministic=opts.deterministic)
    return plan


def scope(strategy: Any) -> Any:
    """The context the models and optimizers are made in: the strategy's scope, or one that does nothing.

    Args:
        strategy: A ``tf.distribute`` strategy, or ``None``.

    Returns:
        The context manager.
    """
    return strategy.scope() if strategy is not None else contextlib.nullcontext()
