"""tf.distribute for the trainer: choosing a strategy, validating the cluster, roles, plan agreement.

Several local devices -> ``MirroredStrategy``; several processes or hosts (``TF_CONFIG`` set, or several
workers started by ``mpiexec`` or ``srun``: `launchers`) -> ``MultiWorkerMirroredStrategy``. The cluster is
validated before TensorFlow sees it, this worker's own port is checked, and collectives get a timeout, so a
bad cluster fails with a clear error instead of hanging: a peer that never comes (or dies) surfaces after
``timeout_s`` seconds (default 60).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping

from ..errors import AmpConfigError, ClusterConfigError, DistributedFailure
from .launchers import PORT_VARIABLE, launcher_cluster

if TYPE_CHECKING:  # pragma: no cover
    from ..plan import Plan

logger = logging.getLogger("amp_backends.distribute")

STRATEGIES = ("auto", "none", "mirrored", "multiworker")
DEFAULT_TIMEOUT_S = 60


def parse_tf_config(text: str) -> dict[str, Any]:
    """Validate a ``TF_CONFIG`` JSON string; return it as a dict or raise `ClusterConfigError`."""
    example = ('{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}')

    def bad(said: str) -> ClusterConfigError:  # (each worker reads its own TF_CONFIG; a single process needs none)
        return ClusterConfigError(f"{said} Fix: set TF_CONFIG on every worker, such as {example} (the same cluster "
                                  "on each, and each worker its own task index), or unset it (unset TF_CONFIG) to "
                                  "train in one process.")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad(f"TF_CONFIG must be JSON such as {example}. Received: {text[:200]!r} ({exc.msg} at position "
                  f"{exc.pos}).") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("cluster"), dict) or not isinstance(cfg.get("task"), dict):
        raise bad(f"TF_CONFIG needs a 'cluster' object and a 'task' object, such as {example}. "
                  f"Received: {text[:200]!r}.")
    cluster, task = cfg["cluster"], cfg["task"]
    for job, addresses in cluster.items():
        if job not in ("chief", "worker", "evaluator"):
            raise bad(f"TF_CONFIG cluster jobs for MultiWorkerMirroredStrategy are 'chief' and 'worker'. Received "
                      f"job {job!r}.")
        if not isinstance(addresses, list) or not addresses:
            raise bad(f"TF_CONFIG cluster[{job!r}] must be a non-empty list of 'host:port'. "
                      f"Received: {addresses!r}.")
        for a in addresses:
            host, _, port = str(a).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise bad(f"TF_CONFIG cluster[{job!r}] has {a!r}: expected 'host:port' with a port "
                          "in 1..65535, such as 'localhost:12345'.")
    ttype, index = task.get("type"), task.get("index")
    if ttype not in cluster:
        raise bad(f"TF_CONFIG task type must be one of the cluster's jobs ({', '.join(cluster)}). "
                  f"Received: {ttype!r}.")
    if not isinstance(index, int) or not 0 <= index < len(cluster[ttype]):
        raise bad(f"TF_CONFIG task index must be an integer in 0..{len(cluster[ttype]) - 1} for job "
                  f"{ttype!r}. Received: {index!r}.")
    return cfg


def own_address(cfg: Mapping[str, Any]) -> str:
    """This task's own address in a parsed ``TF_CONFIG``.

    Args:
        cfg: ``TF_CONFIG`` as `parse_tf_config` returns it.

    Returns:
        ``"host:port"`` of the task ``cfg["task"]`` names.
    """
    return cfg["cluster"][cfg["task"]["type"]][cfg["task"]["index"]]


def check_port_free(address: str, source: str = "TF_CONFIG") -> None:
    """Raise `ClusterConfigError` if this worker's own port is taken (TensorFlow would abort)."""
    fix = ("choose a free port in TF_CONFIG for this task" if source == "TF_CONFIG" else f"set {PORT_VARIABLE} to a "
           "free base port for every worker (worker r on a host uses base + its local rank)")
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("" if host in ("localhost", "0.0.0.0") else host, int(port)))
        except OSError as exc:
            raise ClusterConfigError(
                f"This worker's address {address} (from {source}) cannot be bound: {exc.strerror or exc}. Another "
                f"process uses the port, or the host is not this machine. Fix: stop that process or {fix}."
            ) from None


def cluster_config(env: Mapping[str, str]) -> tuple[dict[str, Any], str] | None:
    """The cluster as a parsed ``TF_CONFIG`` and its source: ``TF_CONFIG``, else a launcher of several workers."""
    tf_config = env.get("TF_CONFIG", "").strip()
    if tf_config:
        return parse_tf_config(tf_config), "TF_CONFIG"
    launch = launcher_cluster(env)
    if launch is None or launch.size < 2:
        return None
    return launch.tf_config(), launch.source


def check_cluster(kind: str = "auto", environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any], str] | None:
    """What `make_strategy` refuses, checked before TensorFlow starts (its import takes seconds): the cluster the
    environment describes (``TF_CONFIG`` that is not JSON, a launcher's variables half set), this worker's port taken.

    Args:
        kind: The ``--distribute`` choice.
        environ: The environment (default: this process's).

    Returns:
        The cluster found for ``kind`` (`cluster_config`), or ``None``.

    Raises:
        AmpConfigError: ``kind`` is not a strategy this library makes.
        ClusterConfigError: The cluster is described wrongly, or this worker's port is taken.
    """
    if kind not in STRATEGIES:
        raise AmpConfigError(f"--distribute must be one of {', '.join(STRATEGIES)}. Received: {kind!r}. Fix: "
                             "--distribute auto (a cluster where TF_CONFIG or a launcher describes one, several GPUs "
                             "mirrored, else none), or name one of them.")
    found = cluster_config(os.environ if environ is None else environ) if kind in ("auto", "multiworker") else None
    if found is not None:
        check_port_free(own_address(found[0]), found[1])
    return found


def make_strategy(kind: str = "auto", *, timeout_s: float = DEFAULT_TIMEOUT_S,
                  environ: Mapping[str, str] | None = None) -> Any:
    """The strategy for ``kind``: auto (TF_CONFIG -> multiworker, several GPUs -> mirrored, else none)."""
    if kind in STRATEGIES and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise AmpConfigError(f"The cluster timeout must be a positive number of seconds. Received: {timeout_s!r}. "
                             "Fix: --cluster-timeout 60 (the default).")
    found = check_cluster(kind, environ)  # refused here, before TensorFlow
    import tensorflow as tf

    if kind == "auto":
        kind = "multiworker" if found else "mirrored" if len(tf.config.list_logical_devices("GPU")) > 1 else "none"
    if kind == "none":
        return None
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    if found is None:
        raise ClusterConfigError("--distribute multiworker needs a cluster: TF_CONFIG, such as "
                                 '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", '
                                 '"index": 0}}, or several workers started by mpiexec or srun. Received: TF_CONFIG is '
                                 "not set and no launcher started several workers.")
    cfg, source = found
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=float(timeout_s))
    peers = [a for job in cfg["cluster"].values() for a in job if a != own_address(cfg)]
    if source == "TF_CONFIG":
        resolver = None  # TensorFlow reads TF_CONFIG itself
    else:
        logger.info("Cluster from %s: worker %d of %s", source, cfg["task"]["index"], cfg["cluster"]["worker"])
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cfg["cluster"]), task_type="worker", task_id=cfg["task"]["index"], rpc_layer="grpc")
    return create_with_deadline(
        lambda: tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options),
        timeout_s, peers, source)


_WATCHDOG = r"""
import os, signal, socket, sys, time
timeout, pid, message = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
time.sleep(timeout)
silent = []
for address in sys.argv[4:]:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        silent.append(address)
detail = "no answer from " + ", ".join(silent) if silent else "every peer answers, but not all joined"
sys.stderr.write(message.replace("{detail}", detail) + "\n")
sys.stderr.flush()
os.kill(pid, signal.SIGKILL)
"""


def create_with_deadline(factory: Callable[[], Any], timeout_s: float, peers: list[str],
                         source: str = "TF_CONFIG") -> Any:
    """Build the strategy, or after ``timeout_s`` a watchdog process names the workers that do not answer and kills this
    one (exit 137): MultiWorkerMirroredStrategy's constructor waits holding Python's global lock."""
    import subprocess
    import sys

    message = (
        f"amp_backends: error: the cluster did not form within {timeout_s:g} s ({{detail}}). Fix: start every worker "
        + ("listed in TF_CONFIG (the same cluster, each with its own task index)" if source == "TF_CONFIG" else
           f"of the cluster {source} describes (every rank of the same launch)")
        + " within the timeout, or raise --cluster-timeout."
    )
    watchdog = subprocess.Popen(
        [sys.executable, "-I", "-c", _WATCHDOG, str(timeout_s), str(os.getpid()), message, *peers],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        return factory()
    finally:
        watchdog.kill()
        watchdog.wait()


def is_chief(strategy: Any) -> bool:
    """The worker that logs, writes TensorBoard and keeps checkpoints: 'chief', else worker 0."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or getattr(resolver, "task_type", None) in (None, "", "chief"):
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in (
        resolver.cluster_spec().as_dict() or {})


def worker_id(strategy: Any) -> str:
    """This worker as logs and errors name it.

    Args:
        strategy: The run's ``tf.distribute`` strategy.

    Returns:
        ``"worker-1"`` (its task type and index) under a multi-worker strategy, else ``"0"``.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return "0"
    return f"{resolver.task_type}-{resolver.task_id}"


def worker_names(strategy: Any) -> list[str]:
    """Every worker of the cluster, in the order of its number (chief first): ``chief-0``, ``worker-0``, ..."""
    jobs = strategy.cluster_resolver.cluster_spec().as_dict() or {}
    return [f"{job}-{i}" for job in ("chief", "worker") for i in range(len(jobs.get(job, [])))]


class StopAgreement:
    """Whether to stop (Ctrl-C, SIGTERM) at this call boundary, the same on every worker: a signal reaches one
    worker, so at every call boundary each worker's signal (or none) is gathered from all (one small gather)."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        resolver = getattr(strategy, "cluster_resolver", None)
        self.several = bool(getattr(resolver, "task_type", None))  # (a local MultiWorkerMirroredStrategy: one process)
        self._gather: Any = None
        self.by: str | None = None  # the worker the signal reached (``None`` in one process)

    def at(self, signum: int | None, together: ContextManager[None]) -> int | None:
        """At a call boundary, inside ``together`` (a failure of the gather says who to restart): the signal every
        worker stops on (the first worker's that got one, in worker order), else ``None``."""
        if not self.several:
            return signum
        import tensorflow as tf

        with together:
            if self._gather is None:
                names = worker_names(self.strategy)
                me = names.index(worker_id(self.strategy))
                strategy = self.strategy

                @tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
                def gather(sig: Any) -> Any:
                    mine = tf.stack([sig, tf.constant(me, tf.int64)])[None]
                    return strategy.gather(strategy.run(lambda: mine), axis=0)

                self._gather = gather
            rows = self._gather(tf.constant(signum or 0, tf.int64)).numpy().tolist()
        got = [(s, w) for s, w in rows if s]
        self.by = worker_names(self.strategy)[got[0][1]] if got else None
        return int(got[0][0]) if got else None

    def saved(self, step: int) -> None:
        """After the save on stopping: wait for every worker's, and check that all stopped at ``step``."""
        if not self.several:
            return
        steps = gather_numbers(self.strategy, step)
        if len(set(steps)) > 1:
            raise DistributedFailure(f"The workers stopped at different steps ({steps} by replica); their checkpoints "
                                     "do not match. Restart every worker with --resume from an earlier checkpoint.")


def gather_numbers(strategy: Any, number: int) -> list[int]:
    """Every replica's ``number`` (an integer each worker computed), in replica order: a barrier as well."""
    import tensorflow as tf

    @tf.function
    def gather():
        return strategy.gather(strategy.run(lambda: tf.constant([number], tf.int64)), axis=0)

    return gather().numpy().tolist()


def check_plan_agreement(strategy: Any, plan: Plan, *, strict: bool = False) -> list[str]:
    """Compare every worker's plan; a disagreement is logged on every worker (an error with ``strict``)."""
    if strategy is None or getattr(strategy, "cluster_resolver", None) is None:
        return []
    # a 28-bit number two workers share exactly when their plans train alike (``Plan.training_key``)
    gathered = gather_numbers(strategy, int(hashlib.sha256(plan.training_key().encode()).hexdigest()[:7], 16))
    if len(set(gathered)) <= 1:
        return []
    message = (
        f"The workers' plans differ (fingerprints by replica: {gathered}); this worker ({worker_id(strategy)}) has: "
        f"{plan.summary()}. Mixed plans train inconsistently (a worker without bf16 chose float32, say). Fix: give "
        "every worker the same overrides (AMP_POLICY=..., AMP_LOSS_SCALE=...) or the same hardware."
    )
    if strict:
        raise ClusterConfigError(message)
    logger.warning(message)
    return [message]


@contextlib.contextmanager
def collectives(strategy: Any, worker: str, step: int, latest: Callable[[], str | None]) -> Iterator[None]:
    """Work with the other workers: a failure says who to restart, from ``latest()``."""
    import tensorflow as tf

    try:
        yield
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.CancelledError,
            tf.errors.AbortedError, tf.errors.InternalError) as exc:
        if getattr(strategy, "cluster_resolver", None) is None:
            raise
        raise DistributedFailure(
            f"Worker {worker}: a collective with the other workers failed at step {step} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]}). Another worker died, hung past the "
            f"cluster timeout or cannot be reached. Restart every worker with --resume to continue from "
            f"{latest() or 'the start (no checkpoint yet)'}."
        ) from None
