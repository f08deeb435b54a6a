"""Multi-worker runs started by a launcher (mpiexec, srun) instead of TF_CONFIG: the launchers' variables parsed
(fake environments, no TensorFlow), malformed ones refused before TensorFlow starts, and real runs: Open MPI's
mpiexec, and Slurm's variables set by hand on two processes."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys

import pytest
from warm_python import run_python, popen_python

from amp_backends.errors import ClusterConfigError
from amp_backends.training.distribute import cluster_config
from amp_backends.training.launchers import Launch, base_port, expand_nodelist, expand_tasks_per_node, launcher_cluster
from conftest import NEUTRAL_CWD, tensorflow_blocked
from test_distribute import STEP, env, finish, free_ports, tf_config

OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "2083127297"}
SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_ID": "777",
         "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[02,01]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
         "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[01-08]"}


# --------------------------------------------------------------------------- parsing (no TensorFlow)
def test_open_mpi_on_one_host_ports_are_base_plus_rank():
    launch = launcher_cluster(OMPI | {"AMP_CLUSTER_PORT": "23456"})
    assert launch == Launch("Open MPI (mpiexec)", ("127.0.0.1:23456", "127.0.0.1:23457"), 1)
    assert launch.tf_config() == {"cluster": {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]},
                                  "task": {"type": "worker", "index": 1}}


def test_base_port_derived_from_the_job_id_is_shared_and_in_range():
    port = base_port({}, "2083127297", "x")
    assert port == 15000 + 2083127297 % 15000 and launcher_cluster(OMPI).workers[0] == f"127.0.0.1:{port}"
    assert 15000 <= base_port({}, "prterun-host-1234@1", "x") < 30000  # Open MPI 5's namespace: hashed
    assert base_port({}, None, "x") == 15000


def test_open_mpi_on_several_hosts_needs_the_host_list():
    several = OMPI | {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3"}
    with pytest.raises(ClusterConfigError, match="several hosts.*OMPI_COMM_WORLD_LOCAL_SIZE=2.*AMP_CLUSTER_HOSTS"):
        launcher_cluster(several)
    launch = launcher_cluster(several | {"AMP_CLUSTER_HOSTS": "h1,h2", "AMP_CLUSTER_PORT": "2000"})
    assert launch.workers == ("h1:2000", "h1:2001", "h2:2000", "h2:2001") and launch.rank == 3
    with pytest.raises(ClusterConfigError, match=r"sharing the 4 ranks equally \(2 on each.*Received: "
                                                 r"AMP_CLUSTER_HOSTS='h1,h2,h3'.*--map-by slot"):
        launcher_cluster(several | {"AMP_CLUSTER_HOSTS": "h1,h2,h3"})


def test_mpich_hydra():
    launch = launcher_cluster({"PMI_RANK": "0", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "3",
                               "AMP_CLUSTER_PORT": "3000"})
    assert launch == Launch("MPICH/Hydra (mpiexec)", ("127.0.0.1:3000", "127.0.0.1:3001", "127.0.0.1:3002"), 0)


def test_slurm_layout_is_slurm_cluster_resolvers():
    launch = launcher_cluster(SLURM)
    port = base_port({}, str(777 * 31 + 0), "x")  # the job and step: two steps of a job do not meet
    # hosts sorted, consecutive ranks per host, port = base + local rank (TensorFlow's SlurmClusterResolver)
    assert launch == Launch("Slurm (srun)", (f"gpu01:{port}", f"gpu01:{port + 1}", f"gpu02:{port}",
                                             f"gpu02:{port + 1}"), 3)


def test_slurm_minimal_variables_and_job_nodelist():
    launch = launcher_cluster({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]",
                               "SLURM_STEP_ID": "0", "AMP_CLUSTER_PORT": "5000"})
    assert launch.workers == ("n1:5000", "n2:5000") and launch.rank == 1  # one task a node, no tasks-per-node
    one = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_STEP_ID": "0"}
    assert launcher_cluster(one).size == 1 and cluster_config(one) is None  # one task: no cluster


def test_a_batch_scripts_own_process_is_alone():
    # sbatch -n 4 sets SLURM_PROCID=0 and SLURM_NTASKS=4 for the script, but only srun starts the 4 tasks
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert launcher_cluster(batch) is None and cluster_config(batch) is None


@pytest.mark.parametrize("text,hosts", [
    ("localhost", ["localhost"]), ("a,b", ["a", "b"]), ("n[01-03,07],login", ["n01", "n02", "n03", "n07", "login"]),
    ("gpu[8-10]-ib", ["gpu8-ib", "gpu9-ib", "gpu10-ib"]), ("r[1-2]n[1]", None), ("n[01-", None), ("n[a-b]", None),
    ("n[3-1]", None), ("", None), ("a,,b", None), ("n]", None), ("n[[1]]", None),
])
def test_nodelists(text, hosts):
    if hosts is None:
        with pytest.raises(ValueError):
            expand_nodelist(text)
    else:
        assert expand_nodelist(text) == hosts


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    for bad in ("2(x)", "x", "", "1,,2"):
        with pytest.raises(ValueError):
            expand_tasks_per_node(bad)


@pytest.mark.parametrize("environ,needle", [
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not.*Received: "
                                    "OMPI_COMM_WORLD_RANK='0' alone.*Fix: start every worker with the same mpiexec"),
    ({"PMI_SIZE": "2"}, "PMI_SIZE is set but PMI_RANK is not"),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"},
     r"expected 0 <= OMPI_COMM_WORLD_RANK < OMPI_COMM_WORLD_SIZE.*Received: OMPI_COMM_WORLD_RANK=2, "
     r"OMPI_COMM_WORLD_SIZE=2"),
    ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "PMI_SIZE >= 1"),
    ({"PMI_RANK": "one", "PMI_SIZE": "2"}, "PMI_RANK must be a whole number. Received: PMI_RANK='one'"),
    (OMPI | {"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, "rank 1 should be local rank 1.*OMPI_COMM_WORLD_LOCAL_RANK=0"),
    (OMPI | {"AMP_CLUSTER_PORT": "80"}, "AMP_CLUSTER_PORT must be a port number in 1024..65000.*Received: "
                                        "AMP_CLUSTER_PORT='80'"),
    (OMPI | {"AMP_CLUSTER_PORT": "x"}, "AMP_CLUSTER_PORT must be a port number"),
    (SLURM | {"SLURM_STEP_NODELIST": "gpu[01-"},
     r"SLURM_STEP_NODELIST must be a Slurm host list such as 'node\[01-04,07\],login1'. Received: "
     r"SLURM_STEP_NODELIST='gpu\[01-'"),
    (SLURM | {"SLURM_STEP_TASKS_PER_NODE": "2(x"}, "SLURM_STEP_TASKS_PER_NODE must look like"),
    (SLURM | {"SLURM_STEP_TASKS_PER_NODE": "3,2"}, r"SLURM_STEP_NUM_TASKS=4 tasks must be spread over the 2 node"),
    (SLURM | {"SLURM_STEP_NUM_TASKS": "5"}, "SLURM_STEP_NUM_TASKS=5 tasks must be spread"),
    (SLURM | {"SLURM_PROCID": "4"}, "expected 0 <= SLURM_PROCID < SLURM_STEP_NUM_TASKS"),
    (SLURM | {"SLURM_LOCALID": "0"}, r"rank 3 should be local rank 1.*SLURM_LOCALID=0.*--distribution=block"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"},
     "no node list: expected SLURM_STEP_NODELIST or SLURM_JOB_NODELIST"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "SLURM_PROCID is set but SLURM_NTASKS is not"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_JOB_NODELIST": "a,b", "SLURM_STEP_ID": "0"},
     "no SLURM_STEP_TASKS_PER_NODE"),
])
def test_malformed_launcher_environments(environ, needle):
    with pytest.raises(ClusterConfigError, match=needle):
        launcher_cluster(environ)


def test_tf_config_wins_over_a_launcher():
    text = tf_config([1234, 1235], 1)
    cfg, source = cluster_config(OMPI | {"OMPI_COMM_WORLD_RANK": "0", "TF_CONFIG": text})
    assert source == "TF_CONFIG" and cfg["task"]["index"] == 1 and cfg["cluster"]["worker"][0] == "127.0.0.1:1234"
    assert cluster_config(OMPI | {"OMPI_COMM_WORLD_SIZE": "x", "TF_CONFIG": text})[1] == "TF_CONFIG"  # not even read
    assert cluster_config(OMPI)[1] == "Open MPI (mpiexec)" and cluster_config({}) is None


# --------------------------------------------------------------------------- real runs
def run_example(extra_env, *args, timeout=120):
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", "--synthetic", "--no-progress", "--max-steps", "2",
           *args]
    return run_python(cmd[1:], timeout=timeout, cwd=NEUTRAL_CWD, env=env(**extra_env))


@pytest.mark.tensorflow
def test_a_partial_launcher_environment_fails_before_tensorflow_starts(tmp_path):
    out = run_example({"OMPI_COMM_WORLD_RANK": "0", **tensorflow_blocked(tmp_path.parent)}, "--logdir", str(tmp_path))
    assert out.returncode == 2 and "mnist: error: Open MPI (mpiexec): OMPI_COMM_WORLD_RANK is set but" in out.stderr
    assert "Traceback" not in out.stderr and not list(tmp_path.iterdir())


def consecutive_free_ports(n: int) -> int:
    for _ in range(50):
        base = free_ports(1)[0]
        if base + n >= 65000:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise AssertionError("no two consecutive free ports")


def example_args(logdir):
    return ["--digits", "--max-steps", "4", "--batch_size", "32", "--seed", "3", "--no-progress",
            "--logdir", str(logdir), "--cluster-timeout", "60", "--checkpoint-every", "2"]


def losses(out):
    return re.findall(r"- INFO - \(\d+, \d+\), Loss: ([0-9.]+)", out)


@pytest.fixture(scope="module")
def tf_config_losses(tmp_path_factory):
    """The losses of the same two-worker run with TF_CONFIG, which the launchers' runs must reproduce; in it, only
    the chief logs, says the plan and the summary, and keeps checkpoints (whole, no worker's temporary files)."""
    logdir, ports = tmp_path_factory.mktemp("tf_config"), free_ports(2)
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", *example_args(logdir)]
    procs = [popen_python(cmd[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=NEUTRAL_CWD,
                          env=env(TF_CONFIG=tf_config(ports, i))) for i in (0, 1)]
    chief, other = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], (chief[-2000:], other[-2000:])
    assert [int(m.group(2)) for m in STEP.finditer(chief)] == [0, 1, 2, 3]
    assert not STEP.search(other) and "Summary" not in other and "policy:" not in other
    assert "Summary: 4 steps" in chief and "policy: " in chief
    checkpoints = logdir / "version_0" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("ckpt-4")) == [
        "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".worker")]
    return losses(chief)


def one_run_folder(logdir):
    assert sorted(p.name for p in logdir.iterdir()) == ["version_0"]


@pytest.mark.slow
@pytest.mark.tensorflow
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec is not installed (apt-get install openmpi-bin)")
def test_mpiexec_trains_one_two_worker_run(tmp_path, tf_config_losses):
    cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-m",
           "amp_backends.examples.mnist", *example_args(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=NEUTRAL_CWD, env=env())
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    # both ranks joined one cluster (worker 0 the chief), trained the same steps as under TF_CONFIG: one run
    assert "Cluster from Open MPI (mpiexec): worker 0 of" in text and "worker 1 of" in text
    assert [int(m.group(2)) for m in STEP.finditer(text)] == [0, 1, 2, 3]  # logged once: by the chief
    assert losses(text) == tf_config_losses and text.count("Summary: 4 steps") == 1
    one_run_folder(tmp_path)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_srun_variables_train_one_two_worker_run(tmp_path, tf_config_losses):
    base = consecutive_free_ports(2)
    cmd = [sys.executable, "-m", "amp_backends.examples.mnist", *example_args(tmp_path)]
    slurm = {"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost",
             "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_ID": "99", "AMP_CLUSTER_PORT": str(base)}
    procs = [popen_python(cmd[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=NEUTRAL_CWD,
                          env=env(**slurm, SLURM_PROCID=str(i), SLURM_LOCALID=str(i))) for i in (0, 1)]
    chief, other = finish(procs)
    assert [p.returncode for p in procs] == [0, 0], (chief[-2000:], other[-2000:])
    assert f"Cluster from Slurm (srun): worker 1 of ['localhost:{base}', 'localhost:{base + 1}']" in other
    assert losses(chief) == tf_config_losses and not losses(other)
    one_run_folder(tmp_path)
