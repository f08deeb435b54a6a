"""The cluster of a multi-worker run, read from how it was started: ``TF_CONFIG``, ``mpiexec`` or ``srun``.

Pure functions over an environment, so a malformed one is a `ClusterConfigError` before TensorFlow starts.
``TF_CONFIG`` wins, then MPI (Open MPI, MPICH/Hydra: set per process, even inside Slurm), then an ``srun`` step.
Worker ``r`` listens on ``base + its local rank`` (`base_port`); hosts are laid out as TensorFlow's
``SlurmClusterResolver`` does (sorted, consecutive ranks); ``mpiexec`` names no other host, so several hosts need
``AMP_CLUSTER_HOSTS`` in rank order with as many ranks on each.
"""

from __future__ import annotations

import bisect
import itertools
import re
import zlib
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import AmpConfigError, ClusterConfigError

PORT_VARIABLE = "AMP_CLUSTER_PORT"
HOSTS_VARIABLE = "AMP_CLUSTER_HOSTS"
PORT_BASE, PORT_SPAN = 15000, 15000  # derived bases lie in [15000, 30000): below Linux's ephemeral ports (32768 on)
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class Launch:
    """This process's place in a cluster started by a launcher: every worker's address and its own rank."""

    source: str  # "Open MPI (mpiexec)", "MPICH/Hydra (mpiexec)", "Slurm (srun)"
    workers: tuple[str, ...]
    rank: int

    @property
    def size(self) -> int:
        """The number of workers."""
        return len(self.workers)

    def tf_config(self) -> dict[str, Any]:
        """The same cluster as a parsed ``TF_CONFIG``: every process a ``worker``, this one at its rank."""
        return {"cluster": {"worker": list(self.workers)}, "task": {"type": "worker", "index": self.rank}}


def _int(env: Mapping[str, str], name: str, source: str, fix: str) -> int | None:
    text = env.get(name)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise ClusterConfigError(f"{source}: {name} must be a whole number. Received: {name}={text!r}. Fix: {fix}."
                                 ) from None


def _rank_and_size(env: Mapping[str, str], rank_var: str, size_var: str, source: str, fix: str) -> tuple[int, int]:
    rank, size = _int(env, rank_var, source, fix), _int(env, size_var, source, fix)
    if rank is None or size is None:
        have, lack = (rank_var, size_var) if size is None else (size_var, rank_var)
        raise ClusterConfigError(f"{source}: {have} is set but {lack} is not; a worker needs both its rank and the "
                                 f"number of workers. Received: {have}={env[have]!r} alone. Fix: {fix}.")
    if size < 1 or not 0 <= rank < size:
        raise ClusterConfigError(f"{source}: expected 0 <= {rank_var} < {size_var} with {size_var} >= 1. Received: "
                                 f"{rank_var}={rank}, {size_var}={size}. Fix: {fix}.")
    return rank, size


def base_port(env: Mapping[str, str], job_id: str | None, source: str) -> int:
    """``AMP_CLUSTER_PORT`` when set, else ``15000 + job_id mod 15000`` (a stable hash of the id), else 15000."""
    text = env.get(PORT_VARIABLE)
    if text is not None:
        if not text.strip().isdigit() or not 1024 <= int(text) <= 65000:
            raise ClusterConfigError(f"{PORT_VARIABLE} must be a port number in 1024..65000 (worker r on a host "
                                     f"listens on it + its local rank). Received: {PORT_VARIABLE}={text!r}. Fix: set "
                                     "it to a free port such as 23456 for every worker, or unset it.")
        return int(text)
    if not job_id:
        return PORT_BASE
    key = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return PORT_BASE + key % PORT_SPAN


def _addresses(hosts: list[str], per_host: list[int], base: int) -> tuple[str, ...]:
    return tuple(f"{host}:{base + local}" for host, n in zip(hosts, per_host, strict=True) for local in range(n))


def _check_local(rank: int, local_rank: int | None, per_host: list[int], source: str, variable: str,
                 fix: str) -> None:
    """This process's local rank, where the launcher gives it, must match consecutive ranks per host."""
    host = bisect.bisect_right(list(itertools.accumulate(per_host)), rank)  # (the ranks before it: on earlier hosts)
    expected = rank - sum(per_host[:host])
    if local_rank is not None and local_rank != expected:
        raise ClusterConfigError(f"{source}: rank {rank} should be local rank {expected} with consecutive ranks on "
                                 f"each host. Received: {variable}={local_rank}. Fix: {fix}.")


def _mpi(env: Mapping[str, str], source: str, names: tuple[str, str, str, str], job_id: str | None) -> Launch:
    rank_var, size_var, local_rank_var, local_size_var = names
    fix = "start every worker with the same mpiexec (e.g. `mpiexec -np 2 python -m amp_backends.examples.mnist`)"
    rank, size = _rank_and_size(env, rank_var, size_var, source, fix)
    local_rank = _int(env, local_rank_var, source, fix)
    local_size = _int(env, local_size_var, source, fix)
    base = base_port(env, job_id, source)
    hosts_text = env.get(HOSTS_VARIABLE, "").strip()
    if hosts_text:
        hosts = [h.strip() for h in hosts_text.split(",")]
        hosts_fix = (f"list each host once, in rank order, with the same number of ranks on each: mpiexec -np {size} "
                     f"--map-by slot -x {HOSTS_VARIABLE}=host1,host2 ...")
        if not all(hosts) or size % len(hosts) or (local_size is not None and local_size * len(hosts) != size):
            raise ClusterConfigError(f"{source}: {HOSTS_VARIABLE} must list hosts sharing the {size} ranks equally"
                                     f"{f' ({local_size} on each, as {local_size_var} says)' if local_size else ''}. "
                                     f"Received: {HOSTS_VARIABLE}={hosts_text!r}. Fix: {hosts_fix}.")
        per_host = [size // len(hosts)] * len(hosts)
        _check_local(rank, local_rank, per_host, source, local_rank_var, hosts_fix)
        return Launch(source, _addresses(hosts, per_host, base), rank)
    if local_size is not None and local_size != size:
        raise ClusterConfigError(f"{source}: the {size} ranks run on several hosts ({local_size_var}={local_size}), "
                                 f"and mpiexec does not tell a process the other hosts' names. Received: no "
                                 f"{HOSTS_VARIABLE}. Fix: pass the hosts in rank order, with the same number of "
                                 f"ranks on each: mpiexec -np {size} --map-by slot -x {HOSTS_VARIABLE}=host1,host2 ...")
    _check_local(rank, local_rank, [size], source, local_rank_var, fix)
    return Launch(source, _addresses([LOCALHOST], [size], base), rank)


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list: ``n[01-03,07],login`` -> ``['n01', 'n02', 'n03', 'n07', 'login']``.
    (The format of TensorFlow's ``expand_hostlist``; a malformed list raises ``ValueError``.)"""
    hosts: list[str] = []
    for part in re.split(r",(?![^\[]*\])", text.strip()):  # (the commas outside brackets)
        m = re.fullmatch(r"([A-Za-z0-9_.\-]*)(?:\[([0-9,\-]+)\])?([A-Za-z0-9_.\-]*)", part)
        if m is None or not (m.group(1) or m.group(2)) or (m.group(3) and not m.group(2)):
            raise AmpConfigError(part)
        prefix, ranges, suffix = m.groups()
        if ranges is None:
            hosts.append(prefix)
            continue
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) < int(lo):
                raise AmpConfigError(part)
            hosts.extend(f"{prefix}{str(i).zfill(len(lo))}{suffix}" for i in range(int(lo), int(hi or lo) + 1))
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks per node: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise AmpConfigError(part)
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def _slurm(env: Mapping[str, str]) -> Launch:
    source = "Slurm (srun)"
    fix = "start the workers with srun inside the allocation (e.g. `srun -N 2 --ntasks-per-node 1 python ...`)"
    size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    rank, size = _rank_and_size(env, "SLURM_PROCID", size_var, source, fix)
    list_var = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)), None)
    if list_var is None:
        raise ClusterConfigError(f"{source}: SLURM_PROCID is set but no node list: expected SLURM_STEP_NODELIST or "
                                 f"SLURM_JOB_NODELIST (such as 'node[01-02]'). Received neither. Fix: {fix}.")
    try:
        hosts = expand_nodelist(env[list_var])
    except ValueError:
        raise ClusterConfigError(f"{source}: {list_var} must be a Slurm host list such as 'node[01-04,07],login1'. "
                                 f"Received: {list_var}={env[list_var]!r}. Fix: {fix}.") from None
    tpn_var = next((v for v in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if env.get(v)), None)
    if tpn_var is None:  # one task per node, or all on one node
        per_host = [1] * len(hosts) if len(hosts) == size else [size] if len(hosts) == 1 else []
        received = "no SLURM_STEP_TASKS_PER_NODE"
    else:
        try:
            per_host = expand_tasks_per_node(env[tpn_var])
        except ValueError:
            raise ClusterConfigError(f"{source}: {tpn_var} must look like '2(x3),1' (tasks on each node). Received: "
                                     f"{tpn_var}={env[tpn_var]!r}. Fix: {fix}.") from None
        received = f"{tpn_var}={env[tpn_var]!r}"
    if len(per_host) != len(hosts) or sum(per_host) != size:
        raise ClusterConfigError(f"{source}: {size_var}={size} tasks must be spread over the {len(hosts)} node(s) of "
                                 f"{list_var}={env[list_var]!r}. Received: {received}. Fix: {fix}.")
    order = sorted(range(len(hosts)), key=lambda i: hosts[i])  # SlurmClusterResolver's layout: hosts sorted
    hosts, per_host = [hosts[i] for i in order], [per_host[i] for i in order]
    _check_local(rank, _int(env, "SLURM_LOCALID", source, fix), per_host, source, "SLURM_LOCALID",
                 "use srun's block distribution (`srun --distribution=block`), which places consecutive ranks on "
                 "each node")
    job_id = env.get("SLURM_JOB_ID", env.get("SLURM_JOBID"))
    if job_id and env.get("SLURM_STEP_ID", "").isdigit():
        job_id = str(int(job_id) * 31 + int(env["SLURM_STEP_ID"])) if job_id.isdigit() else job_id
    return Launch(source, _addresses(hosts, per_host, base_port(env, job_id, source)), rank)


def launcher_cluster(env: Mapping[str, str]) -> Launch | None:
    """The cluster the launcher describes (``None``: no launcher's variables; ``TF_CONFIG`` is not read here)."""
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        return _mpi(env, "Open MPI (mpiexec)", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                    env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE"))
    if "PMI_RANK" in env or "PMI_SIZE" in env:
        return _mpi(env, "MPICH/Hydra (mpiexec)", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
                    env.get("PMI_JOBID") or env.get("PMIX_NAMESPACE"))
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEP_NUM_TASKS" in env):
        return _slurm(env)  # (a batch script's own process has SLURM_PROCID too, but no step: it is alone)
    return None
