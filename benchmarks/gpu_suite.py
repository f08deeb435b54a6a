"""The GPU suite: the benchmark at its default sizes, then the experiments that decide how the trainer's
compiled call should run on a GPU, then a profiler trace of the auto plan. One command, a time budget,
every figure written the moment it exists::

    python benchmarks/gpu_suite.py --out DIR            # on a machine with a GPU, from a checkout
    python benchmarks/gpu_suite.py --tiny --out DIR     # smoke run on a CPU: tiny sizes
    python benchmarks/gpu_suite.py --list               # the experiments, their order and limits

Experiments, in order of value (each has a time limit; ``--budget-s`` caps the whole run, and what no
longer fits is recorded as skipped): ``bench`` (``python -m amp_backends.bench`` at its defaults, a
subprocess), then the experiments of ``gpu_suite_experiments.py``, run by a worker process that this
process watches (``amp_backends.commands.bench.supervisor``, which the model zoo uses too): a worker that
crashes or overruns an experiment's limit is stopped, that experiment is recorded as failed or timed out,
and a fresh worker goes on with the rest.

Written under ``--out``: ``gpu_suite.json`` (rewritten after every event), ``gpu_suite.md`` (tables),
``gpu_suite.log`` (everything printed), ``bench/`` (the benchmark's JSON, chart and log), ``profile/``
(the trace, gzipped, and its op statistics).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from amp_backends.commands.bench.output import now_iso, write_json
from amp_backends.commands.bench.supervisor import child_env, exit_reason, last_words, stop

HERE = Path(__file__).resolve().parent
# a child leads its own process group (not a new session): stopping it stops what it started
GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def run_child(cmd: list[str], echo: Callable[[str], None], kill_at: Callable[[], float], on_poll: Callable[[], None],
              extra_log: Path | None = None, env: dict[str, str] | None = None) -> tuple[int | None, list[str]]:
    """Run ``cmd`` with its output echoed (and kept); stop its process group when ``kill_at()`` passes. Returns
    ``(returncode, last lines)``, the return code ``None`` when it was stopped."""
    tail: list[str] = []
    side = open(extra_log, "a", buffering=1, encoding="utf-8") if extra_log else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=env or child_env(), errors="replace", **GROUP)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            del tail[:-40]
            echo(line)
            if side:
                side.write(line + "\n")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stopped = False
    try:
        while proc.poll() is None:
            on_poll()
            if time.time() > kill_at():
                stopped = True
                stop(proc)
                break
            time.sleep(0.25)
        proc.wait()
        reader.join(timeout=5)
        on_poll()
    except BaseException:  # interrupted (SIGTERM, Ctrl-C): the child goes too
        stop(proc)
        raise
    finally:
        if side:
            side.close()
    return (None if stopped else proc.returncode), list(tail)

@dataclass(frozen=True)
class Experiment:
    name: str
    limit_s: float  # time limit on the GPU
    tiny_limit_s: float  # time limit in a --tiny run
    min_s: float  # not started with less time than this left in the budget
    title: str


EXPERIMENTS = [
    Experiment("bench", 330, 60, 60, "python -m amp_backends.bench at its default sizes (subprocess)"),
    Experiment("mnist_steps_per_call", 70, 40, 15, "MNIST CNN, trainer: steps per compiled call (default unrolling)"),
    Experiment("mnist_unroll", 90, 40, 15, "MNIST CNN, trainer under XLA: unrolled steps vs a loop"),
    Experiment("mnist_fit_per_epoch", 25, 20, 8, "MNIST CNN, trainer: one fit for all epochs vs one fit per epoch "
                                                 "(as the benchmark times it)"),
    Experiment("mnist_placement", 60, 30, 10, "MNIST CNN, trainer: data placement"),
    Experiment("mnist_dropout_rng", 35, 20, 8, "MNIST CNN, trainer: the cost of dropout's random numbers"),
    Experiment("mnist_policy", 40, 30, 10, "MNIST CNN, trainer: dtype policy (XLA as the auto plan has it)"),
    Experiment("loss_fetch", 30, 20, 8, "MNIST CNN, hand-written tf.function loop: fetching the loss every step"),
    Experiment("gan", 90, 40, 15, "GAN, trainer under XLA: steps per call and unrolling"),
    Experiment("keras_fit", 45, 30, 10, "MNIST CNN, Keras fit: as users write it vs under auto_configure()"),
    Experiment("profile", 45, 30, 10, "MNIST CNN, trainer under the auto plan: profiler trace"),
]
BY_NAME = {e.name: e for e in EXPERIMENTS}
KILL_GRACE_S = 20.0  # a worker still in an experiment this long past its limit is stopped (XLA compiles cannot be cut)
FINAL_MARGIN_S = 4.0  # kept at the end of the budget for the last writes

FULL: dict[str, Any] = dict(samples=60000, mnist_batch=1024, gan_batch=4096, timed_epochs=5, profiled_epochs=2, lr=0.01)
TINY: dict[str, Any] = dict(samples=8, mnist_batch=4, gan_batch=4, timed_epochs=2, profiled_epochs=1, lr=0.01)


class Clock:
    def __init__(self) -> None:
        self.t0 = time.time()

    def stamp(self) -> str:
        return f"[{time.strftime('%H:%M:%S')} +{time.time() - self.t0:6.1f}s]"


class Suite:
    """The main process: device facts, the benchmark, the workers, the JSON/Markdown/log files."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.clock = Clock()
        self.deadline = self.clock.t0 + args.budget_s
        self.log_file = open(self.out / "gpu_suite.log", "a", buffering=1, encoding="utf-8")
        self.lock = threading.Lock()
        selected = [e.name for e in EXPERIMENTS]
        if args.only:
            selected = [n for n in selected if n in args.only]
        if args.skip:
            selected = [n for n in selected if n not in args.skip]
        self.selected = selected
        self.state: dict[str, Any] = {
            "what": "the GPU suite: benchmark, trainer call experiments, profile",
            "date": now_iso(),
            "command": " ".join([Path(sys.executable).name, "benchmarks/gpu_suite.py", *sys.argv[1:]]),
            "settings": {"tiny": args.tiny, "budget_s": args.budget_s, "sizes": TINY if args.tiny else FULL,
                         "warmup_epochs": 1, "selected": selected,
                         "figure": "median timed epoch, images/s (MNIST: batch per step; GAN: 2 x batch per step)"},
            "host": {"node": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
                     "machine": platform.machine()},
            "device": {},
            "software": {},
            "plans": {},
            "experiments": {e.name: {"title": e.title, "status": "pending" if e.name in selected else "not selected",
                                     "limit_s": e.tiny_limit_s if args.tiny else e.limit_s, "rows": [], "notes": []}
                            for e in EXPERIMENTS},
            "elapsed_s": 0.0,
            "finished": False,
        }

    # -- output ----------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        line = f"{self.clock.stamp()} {text}"
        with self.lock:
            print(line, flush=True)
            self.log_file.write(line + "\n")

    def echo(self, line: str, prefix: str) -> None:
        with self.lock:
            print(prefix + line, flush=True)
            self.log_file.write(prefix + line + "\n")

    def save(self) -> None:
        self.state["elapsed_s"] = round(time.time() - self.clock.t0, 1)
        write_json(self.out / "gpu_suite.json", self.state)
        tmp = self.out / ".gpu_suite.md.tmp"
        tmp.write_text(gpu_markdown(self.state))
        os.replace(tmp, self.out / "gpu_suite.md")

    def left(self) -> float:
        return self.deadline - time.time()

    # -- device facts (no TensorFlow in this process: the GPU stays free for the children) -----------
    def device_facts(self, key: str = "device") -> None:
        facts: dict[str, Any] = {}
        query = "name,driver_version,memory.total,pci.bus_id,clocks.sm,clocks.max.sm,power.draw,power.limit," \
                "temperature.gpu,utilization.gpu,pstate"
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=20)
            facts["nvidia_smi"] = [dict(zip(query.split(","), (v.strip() for v in line.split(",")), strict=True))
                                   for line in r.stdout.strip().splitlines()] if r.returncode == 0 else \
                f"rc {r.returncode}: {(r.stderr or r.stdout).strip()[:300]}"
        except Exception as exc:
            facts["nvidia_smi"] = f"unavailable: {type(exc).__name__}: {exc}"
        if key == "device":
            try:
                import pynvml

                pynvml.nvmlInit()
                try:
                    def s(v: Any) -> str:
                        return v.decode() if isinstance(v, bytes) else str(v)

                    gpus = []
                    for i in range(pynvml.nvmlDeviceGetCount()):
                        h = pynvml.nvmlDeviceGetHandleByIndex(i)
                        capability = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                        gpus.append({"name": s(pynvml.nvmlDeviceGetName(h)),
                                     "compute_capability": ".".join(map(str, capability)),
                                     "memory_gib": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1)})
                    cuda = pynvml.nvmlSystemGetCudaDriverVersion()
                    facts["nvml"] = {"driver": s(pynvml.nvmlSystemGetDriverVersion()),
                                     "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}", "gpus": gpus}
                finally:
                    pynvml.nvmlShutdown()
            except Exception as exc:
                facts["nvml"] = f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
            try:
                from importlib.metadata import version

                facts["amp_backends"] = version("amp-backends")
            except Exception as exc:
                facts["amp_backends"] = f"{type(exc).__name__}: {exc}"
            try:
                here = Path(__file__).resolve().parent
                r = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True, timeout=10)
                facts["git_commit"] = r.stdout.strip() if r.returncode == 0 else None
            except Exception:
                facts["git_commit"] = None
        self.state[key] = facts
        self.save()

    # -- the benchmark ---------------------------------------------------------------------------
    def bench(self) -> None:
        exp = BY_NAME["bench"]
        rec = self.state["experiments"]["bench"]
        if self.left() < exp.min_s:
            return self.skip("bench", f"only {self.left():.0f} s left in the budget")
        limit = min(rec["limit_s"], self.left() - FINAL_MARGIN_S)
        bench_dir = self.out / "bench"
        bench_dir.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "amp_backends.bench", "--out", str(bench_dir)]
        if self.args.tiny:
            cmd += ["--models", "mnist", "--configs", "fp32", "--no-fit", "--samples", "8", "--mnist-batch", "4",
                    "--epochs", "1"]
        rec.update(status="running", started=now_iso(), effective_limit_s=round(limit, 1), command=" ".join(cmd[1:]))
        self.save()
        self.say(f"== bench: {' '.join(cmd[1:])} (limit {limit:.0f} s)")
        t0 = time.time()
        rc, tail = run_child(cmd, lambda line: self.echo(line, "  bench | "), lambda: t0 + limit, lambda: None,
                             extra_log=bench_dir / "bench.log")
        rec["elapsed_s"] = round(time.time() - t0, 1)
        rows = bench_rows(bench_dir, (bench_dir / "bench.log").read_text(errors="replace")
                          if (bench_dir / "bench.log").exists() else "")
        rec["rows"] = rows
        if rc == 0:
            rec["status"] = "done"
        elif rc is None:
            rec.update(status="timed out", error=f"stopped after {limit:.0f} s; rows parsed from its log")
        else:
            rec.update(status="failed", error=f"{exit_reason(rc)}: " + last_words(tail))
        self.say(f"== bench: {rec['status']} in {rec['elapsed_s']} s, {len(rows)} figures")
        self.save()

    def skip(self, name: str, why: str) -> None:
        rec = self.state["experiments"][name]
        rec.update(status="skipped", error=why)
        self.say(f"== {name}: skipped ({why})")
        self.save()

    # -- the worker ------------------------------------------------------------------------------
    def experiments(self, names: list[str]) -> None:
        folder = tempfile.mkdtemp(prefix="gpu-suite-")
        try:
            self._experiments(names, Path(folder) / "events.jsonl")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _experiments(self, names: list[str], events: Path) -> None:
        events.touch()
        pending = list(names)
        env = child_env()
        while pending:
            if self.left() < min(BY_NAME[n].min_s for n in pending):
                for n in pending:
                    self.skip(n, f"only {max(self.left(), 0):.0f} s left in the budget")
                return
            current: dict[str, Any] = {"name": None, "kill_at": None, "overran": None}
            progress = {"started": 0}
            offset = {"pos": events.stat().st_size}
            cmd = [sys.executable, str(HERE / "gpu_suite_experiments.py"), "--out", str(self.out),
                   "--events", str(events), "--deadline", str(self.deadline - FINAL_MARGIN_S),
                   "--only", ",".join(pending)] + (["--tiny"] if self.args.tiny else [])
            self.say(f"-- worker for: {', '.join(pending)}")

            # Bound to this worker's own state (not closures over the loop's variables).
            poll = functools.partial(self.read_events, events, offset, current, pending, progress)
            kill_at = functools.partial(self.kill_time, current)
            rc, tail = run_child(cmd, lambda line: self.echo(line, "  | "), kill_at, poll, env=env)
            name = current["name"]
            if rc is None and current["overran"] not in (None, name):
                # the worker moved on while it was being stopped: the stop is the overrunning experiment's, and one
                # it had just started runs again in a fresh worker
                if name is not None:
                    rec = self.state["experiments"][name]
                    rec.update(status="pending", rows=[], notes=[])
                    rec.pop("_t0", None)
                name = current["overran"]
            if name is not None:  # it was inside an experiment when it ended
                rec = self.state["experiments"][name]
                if "_t0" in rec:  # (an experiment that had reported its end keeps its time)
                    rec["elapsed_s"] = round(time.time() - rec.pop("_t0"), 1)
                if rc is None:
                    over_budget = time.time() >= self.deadline
                    rec.update(status="timed out", error=(
                        "the run's budget ended" if over_budget else
                        f"still running {KILL_GRACE_S:.0f} s past its {rec.get('effective_limit_s')} s limit "
                        "(inside a compilation or a call that cannot be cut): the worker was stopped"))
                else:
                    rec.update(status="failed", error=f"the worker died ({exit_reason(rc)}): " + last_words(tail))
                self.say(f"== {name}: {rec['status']}: {rec['error'][:300]}")
                if name in pending:
                    pending.remove(name)
                self.save()
                continue
            if rc is None:  # stopped between experiments: the budget is spent
                for n in list(pending):
                    self.skip(n, "the run's budget ended")
                return
            if pending:
                why = f"the worker ended ({exit_reason(rc)}) before it: " + last_words(tail)
                if progress["started"] == 0:  # it could not even start one: another worker would fail alike
                    for n in list(pending):
                        rec = self.state["experiments"][n]
                        rec.update(status="failed", error=why)
                        self.say(f"== {n}: failed: {why[:300]}")
                    self.save()
                    return
                continue  # some ran: a fresh worker takes the rest

    def read_events(self, events: Path, offset: dict[str, int], current: dict[str, Any], pending: list[str],
                    progress: dict[str, int]) -> None:
        """Hand the worker's complete event lines written since ``offset["pos"]`` to :meth:`event`."""
        with open(events, "rb") as f:
            f.seek(offset["pos"])
            chunk = f.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        offset["pos"] += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            try:
                ev = json.loads(line)
            except ValueError:  # a line cut short by a stopped worker
                continue
            self.event(ev, current, pending, progress)

    def kill_time(self, current: dict[str, Any]) -> float:
        """When to stop the worker: the budget's end, or sooner the running experiment's own limit."""
        at = self.deadline
        if current["kill_at"] is not None:
            at = min(at, current["kill_at"])
        current["overran"] = current["name"]  # whose limit this is: the last asked before a stop is the one stopped
        return at

    def event(self, ev: dict[str, Any], current: dict[str, Any], pending: list[str], progress: dict[str, int]) -> None:
        kind = ev.get("event")
        name = ev.get("name")
        rec: Any = self.state["experiments"].get(name) if name else None
        if kind == "software":
            self.state["software"] = ev["data"]
        elif kind == "plan":
            self.state["plans"][ev["label"]] = ev["data"]
        elif kind == "start":
            progress["started"] += 1
            current["name"] = name
            current["kill_at"] = time.time() + ev["limit_s"] + KILL_GRACE_S
            rec.update(status="running", started=now_iso(), effective_limit_s=round(ev["limit_s"], 1), _t0=time.time())
        elif kind == "row":
            rec["rows"].append(ev["row"])
        elif kind == "note":
            rec["notes"].append(ev["text"])
        elif kind == "skip":
            rec.update(status="skipped", error=ev["why"])
            if name in pending:
                pending.remove(name)
        elif kind == "done":
            rec.update(status=ev["status"], elapsed_s=ev["elapsed_s"])
            if ev.get("error"):
                rec["error"] = ev["error"]
            if ev.get("extra"):
                rec.update(ev["extra"])
            rec.pop("_t0", None)
            current["name"], current["kill_at"] = None, None
            if name in pending:
                pending.remove(name)
        self.save()

    # -- the whole run ---------------------------------------------------------------------------
    def main(self) -> int:
        def terminated(signum: int, frame: Any) -> None:
            raise SystemExit(f"stopped by {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, terminated)  # a timeout from outside: stop the child, write what we have
        self.say(f"GPU suite: {len(self.selected)} experiment(s), budget {self.args.budget_s:.0f} s, "
                 f"{'tiny sizes' if self.args.tiny else 'full sizes'}, results in {self.out}")
        self.device_facts()
        self.say("device: " + json.dumps(self.state["device"].get("nvidia_smi"))[:400])
        try:
            if "bench" in self.selected:
                self.bench()
            rest = [n for n in self.selected if n != "bench"]
            if rest:
                self.experiments(rest)
        finally:
            for n in self.selected:  # left unfinished by an interruption
                rec = self.state["experiments"][n]
                if rec["status"] in ("running", "pending"):
                    rec.update(status="interrupted" if rec["status"] == "running" else "skipped",
                               error="the run was stopped before it ended")
                    rec.pop("_t0", None)
            self.device_facts("device_after")
            self.state["finished"] = True
            self.save()
            self.say("done: " + ", ".join(f"{n} {self.state['experiments'][n]['status']}" for n in self.selected))
            print(gpu_markdown(self.state, brief=True), flush=True)
        return 0


def bench_rows(bench_dir: Path, log: str) -> list[dict[str, Any]]:
    """The benchmark's figures: from bench.json when it finished, else from the lines it printed."""
    path = bench_dir / "bench.json"
    if path.exists():
        try:
            report = json.loads(path.read_text())
            return [{"label": f"{r['model']}: {r['config']}", "model": r["model"], "kind": r["kind"],
                     "img_per_s": r["img_per_s"], "epoch_img_per_s": r.get("epoch_img_per_s"),
                     "ratio_to_best_manual": r.get("ratio_to_best_manual"), "error": r.get("error"),
                     "note": r.get("detail", ""), "status": "ok" if r["img_per_s"] else "failed"}
                    for r in report["results"]]
        except Exception as exc:
            return [{"label": "bench.json", "status": "failed", "error": f"unreadable: {exc}"}]
    rows = []
    for m in re.finditer(r"^\s+(mnist|gan)\s+(.+?)\s+(?:([\d,]+) img/s|failed: (.*))\s*$", log, re.M):
        model, config, rate, error = m.groups()
        rows.append({"label": f"{model}: {config.strip()}", "model": model,
                     "img_per_s": float(rate.replace(",", "")) if rate else None, "error": error,
                     "status": "ok" if rate else "failed", "note": "parsed from the log"})
    return rows


def run_suite(out: Path, budget_s: float, tiny: bool, only: list[str] | None, skip: list[str] | None) -> int:
    """Run the GPU suite into ``out`` (relative to the working directory, or absolute)."""
    args = argparse.Namespace(out=str(out), budget_s=budget_s, tiny=tiny, only=only, skip=skip)
    return Suite(args).main()


def fmt_rate(v: Any) -> str:
    return f"{v:,.0f}" if isinstance(v, (int, float)) and v else "-"


def gpu_markdown(state: dict[str, Any], brief: bool = False) -> str:
    sw = state.get("software") or {}
    dev = state.get("device") or {}
    smi = dev.get("nvidia_smi")
    gpu = (f"{smi[0].get('name')}, driver {smi[0].get('driver_version')}" if isinstance(smi, list) and smi
           else ", ".join(sw.get("gpus_tf") or []) or "no GPU")
    lines = [f"# GPU suite: {gpu}", "",
             f"{state['date']} - TensorFlow {sw.get('tensorflow', '?')}, Keras {sw.get('keras', '?')}, "
             f"CUDA build {sw.get('cuda_build', '?')}, cuDNN {sw.get('cudnn_build', '?')} - "
             f"`{state['command']}` - {state['elapsed_s']} s of {state['settings']['budget_s']} s"
             + (" - TINY SIZES (smoke run)" if state["settings"]["tiny"] else ""), ""]
    for label, plan in (state.get("plans") or {}).items():
        lines.append(f"- plan {label}: {plan}")
    lines += ["", "Images/s of the median timed epoch (after one warm-up epoch); 'x ref' against the "
              "experiment's first row; 'per call': the median call's own rate.", "",
              "| experiment | configuration | img/s | x ref | per call img/s | warm-up s | note |",
              "|---|---|---:|---:|---:|---:|---|"]
    for name, rec in state["experiments"].items():
        if rec["status"] == "not selected":
            continue
        rows = rec["rows"]
        ref = next((r.get("img_per_s") for r in rows if r.get("img_per_s")), None)
        if not rows or rec["status"] not in ("done",):
            error = str(rec.get("error") or "").replace("|", "/").replace("\n", " ")
            lines.append(f"| {name} | ({rec['status']}) | | | | | {error[:200]} |")
        for r in rows:
            rate = r.get("img_per_s")
            ratio = f"{rate / ref:.2f}" if rate and ref else "-"
            note = r.get("error") or r.get("note") or ""
            if r.get("status") not in (None, "ok"):
                note = f"{r.get('status')}: {note}"
            warm = r.get("warmup_s")
            note = str(note).replace("|", "/").replace("\n", " ")[:160]
            lines.append(f"| {name} | {r.get('label')} | {fmt_rate(rate)} | {ratio} | "
                         f"{fmt_rate(r.get('call_img_per_s'))} | {warm if warm is not None else '-'} | {note} |")
    if brief:
        return "\n".join(lines)
    lines += ["", "## Experiments", "", "| experiment | status | time s | limit s | what |", "|---|---|---:|---:|---|"]
    for name, rec in state["experiments"].items():
        limit = rec.get("effective_limit_s", rec["limit_s"])
        lines.append(f"| {name} | {rec['status']} | {rec.get('elapsed_s', '-')} | {limit} | {rec['title']} |")
    for name, rec in state["experiments"].items():
        for note in rec.get("notes", []):
            lines.append(f"- {name}: {note}")
    prof = state["experiments"].get("profile", {})
    if prof.get("op_summary"):
        lines += ["", "## Profile", "", "```", prof["op_summary"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/gpu_suite.py``: parse the command line and run the suite (or list its experiments)."""
    names = [e.name for e in EXPERIMENTS]
    parser = argparse.ArgumentParser(description="The GPU suite: the tutorials' benchmark, then the experiments that "
                                                 "decide how the trainer's compiled call should run on a GPU, under a "
                                                 "time budget.")
    parser.add_argument("--out", default="gpu-suite-results", help="folder for the results (made if missing)")
    parser.add_argument("--budget-s", type=float, default=520.0,
                        help="wall-clock budget; what no longer fits is recorded as skipped (default 520)")
    parser.add_argument("--only", help=f"experiments to run, comma-separated: {', '.join(names)}")
    parser.add_argument("--skip", help="experiments to leave out, comma-separated")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (a smoke run on a CPU)")
    parser.add_argument("--list", action="store_true", help="list the experiments and exit")
    args = parser.parse_args(argv)
    if args.list:
        for e in EXPERIMENTS:
            print(f"{e.name:22s} limit {e.limit_s:4.0f} s (tiny {e.tiny_limit_s:3.0f} s)  {e.title}")
        return 0
    if args.budget_s < 10:
        parser.error(f"--budget-s takes at least 10 seconds. Received: {args.budget_s:g}.")
    only, skip = ([n.strip() for n in v.split(",") if n.strip()] if v else None for v in (args.only, args.skip))
    unknown = [n for n in (only or []) + (skip or []) if n not in names]
    if unknown:
        parser.error(f"unknown experiment(s) {unknown}; valid: {', '.join(names)}.")
    return run_suite(Path(args.out), args.budget_s, args.tiny, only, skip)


if __name__ == "__main__":
    sys.exit(main())
