#!/usr/bin/env python
"""The GPU run: the benchmark at its default sizes, then the experiments that decide how the trainer's
compiled call should run on a GPU, then a profiler trace of the auto plan. One command, a time budget,
every figure written the moment it exists.

    python benchmarks/gpu_session.py                      # on the GPU machine: results under $OUT
    python benchmarks/gpu_session.py --tiny --out /tmp/x  # smoke run on a CPU: tiny sizes, seconds
    python benchmarks/gpu_session.py --list               # the experiments, their order and time limits

Experiments, in order of value (each has a time limit; ``--budget-s`` caps the whole run, and what no
longer fits is recorded as skipped): ``bench`` (``python -m amp_backends.bench`` at its defaults, a
subprocess), ``mnist_steps_per_call``, ``mnist_unroll``, ``mnist_fit_per_epoch``, ``mnist_placement``,
``mnist_dropout_rng``, ``mnist_policy``, ``loss_fetch``, ``gan``, ``keras_fit``, ``profile``.
``--only``/``--skip`` pick a subset (for a second, targeted run).

Figures: images per second of the median timed epoch after one warm-up epoch (tracing, XLA compilation),
images counted as the tutorials counted them (MNIST: the batch per step; GAN: 2 x batch). For the
trainer, an epoch's time runs from the end of the previous epoch's last call to the end of its own last
call, inside one ``fit`` (the trainer's own overhead between calls included, the data upload of ``fit``
excluded: ``mnist_fit_per_epoch`` measures that); "per call" is the median of the calls' own step times.
A trainer configuration on resident MNIST arrays that an earlier experiment already measured (the same
plan, steps per call, unrolling and model; on the GPU the auto plan is the XLA one) is not compiled again:
its row repeats those figures and says where they come from.

The experiments run in a worker process that the main process watches: a worker that crashes or
overruns an experiment's limit is stopped, that experiment is recorded as failed or timed out, and a
fresh worker goes on with the rest. Written under ``--out``: ``gpu_session.json`` (rewritten after every
event), ``gpu_session.md`` (tables), ``gpu_session.log`` (everything printed), ``bench/`` (the
benchmark's JSON, chart and log), ``profile/`` (the trace, gzipped, and its op statistics): at most
8 files, at most two folders down.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# ------------------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class Experiment:
    name: str
    limit_s: float  # time limit on the GPU
    tiny_limit_s: float  # time limit in a --tiny run
    min_s: float  # not started with less time than this left in the budget
    title: str


EXPERIMENTS = [
    Experiment("bench", 250, 60, 60, "python -m amp_backends.bench at its default sizes (subprocess)"),
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

FULL = dict(samples=60000, mnist_batch=1024, gan_batch=4096, timed_epochs=5, profiled_epochs=2, lr=0.01)
TINY = dict(samples=8, mnist_batch=4, gan_batch=4, timed_epochs=2, profiled_epochs=1, lr=0.01)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Clock:
    def __init__(self) -> None:
        self.t0 = time.time()

    def stamp(self) -> str:
        return f"[{time.strftime('%H:%M:%S')} +{time.time() - self.t0:6.1f}s]"


# ------------------------------------------------------------------------------------------------ main process
class Run:
    """The main process: device facts, the benchmark, the workers, the JSON/Markdown/log files."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.clock = Clock()
        self.deadline = self.clock.t0 + args.budget_s
        self.log_file = open(self.out / "gpu_session.log", "a", buffering=1, encoding="utf-8")
        self.lock = threading.Lock()
        selected = [e.name for e in EXPERIMENTS]
        if args.only:
            selected = [n for n in selected if n in args.only]
        if args.skip:
            selected = [n for n in selected if n not in args.skip]
        self.selected = selected
        self.state: dict[str, Any] = {
            "what": "the GPU run: benchmark, trainer call experiments, profile",
            "date": now_iso(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
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
        tmp = self.out / ".gpu_session.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=2, default=str))
        os.replace(tmp, self.out / "gpu_session.json")
        tmp = self.out / ".gpu_session.md.tmp"
        tmp.write_text(markdown(self.state))
        os.replace(tmp, self.out / "gpu_session.md")

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
            facts["nvidia_smi"] = [dict(zip(query.split(","), (v.strip() for v in line.split(","))))
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
                        gpus.append({"name": s(pynvml.nvmlDeviceGetName(h)),
                                     "compute_capability": ".".join(map(str, pynvml.nvmlDeviceGetCudaComputeCapability(h))),
                                     "memory_gib": round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1)})
                    cuda = pynvml.nvmlSystemGetCudaDriverVersion()
                    facts["nvml"] = {"driver": s(pynvml.nvmlSystemGetDriverVersion()),
                                     "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}", "gpus": gpus}
                finally:
                    pynvml.nvmlShutdown()
            except Exception as exc:
                facts["nvml"] = f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
            try:
                import amp_backends

                facts["amp_backends"] = amp_backends.__version__
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

    # -- children --------------------------------------------------------------------------------
    def run_child(self, cmd: list[str], prefix: str, kill_at: Callable[[], float], on_poll: Callable[[], None],
                  extra_log: Path | None = None, env: dict[str, str] | None = None) -> tuple[int | None, list[str]]:
        """Run ``cmd`` with its output echoed (and kept); stop its process group when ``kill_at()`` passes.

        Returns ``(returncode, last lines)``; the return code is ``None`` when it was stopped.
        """
        tail: list[str] = []
        side = open(extra_log, "a", buffering=1, encoding="utf-8") if extra_log else None
        # its own process group, not a new process session: whatever ends this run ends the child too
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=env, errors="replace", **group)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                del tail[:-40]
                self.echo(line, prefix)
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
                    self._stop(proc)
                    break
                time.sleep(0.25)
            proc.wait()
            reader.join(timeout=5)
            on_poll()
        except BaseException:  # interrupted (SIGTERM, Ctrl-C): the child goes too
            self._stop(proc)
            raise
        finally:
            if side:
                side.close()
        return (None if stopped else proc.returncode), list(tail)

    def _stop(self, proc: subprocess.Popen) -> None:
        """SIGTERM to the child's process group, SIGKILL after 5 s (the child leads its own group: nothing else is hit)."""
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

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
        rc, tail = self.run_child(cmd, "  bench | ", lambda: t0 + limit, lambda: None, extra_log=bench_dir / "bench.log")
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
        folder = tempfile.mkdtemp(prefix="gpu-run-")
        try:
            self._experiments(names, Path(folder) / "events.jsonl")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _experiments(self, names: list[str], events: Path) -> None:
        events.touch()
        pending = list(names)
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        while pending:
            if self.left() < min(BY_NAME[n].min_s for n in pending):
                for n in pending:
                    self.skip(n, f"only {max(self.left(), 0):.0f} s left in the budget")
                return
            current: dict[str, Any] = {"name": None, "kill_at": None}
            progress = {"started": 0}
            offset = {"pos": events.stat().st_size}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--out", str(self.out),
                   "--events", str(events), "--deadline", str(self.deadline - FINAL_MARGIN_S),
                   "--only", ",".join(pending)] + (["--tiny"] if self.args.tiny else [])
            self.say(f"-- worker for: {', '.join(pending)}")

            def poll() -> None:
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

            def kill_at() -> float:
                at = self.deadline
                if current["kill_at"] is not None:
                    at = min(at, current["kill_at"])
                return at

            rc, tail = self.run_child(cmd, "  | ", kill_at, poll, env=env)
            name = current["name"]
            if name is not None:  # it was inside an experiment when it ended
                rec = self.state["experiments"][name]
                rec["elapsed_s"] = round(time.time() - rec.get("_t0", time.time()), 1)
                rec.pop("_t0", None)
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

    def event(self, ev: dict[str, Any], current: dict[str, Any], pending: list[str], progress: dict[str, int]) -> None:
        kind = ev.get("event")
        name = ev.get("name")
        rec = self.state["experiments"].get(name) if name else None
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
        self.say(f"GPU run: {len(self.selected)} experiment(s), budget {self.args.budget_s:.0f} s, "
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
            check_returnable(self.out, self.say)
            self.say("done: " + ", ".join(f"{n} {self.state['experiments'][n]['status']}" for n in self.selected))
            print(markdown(self.state, brief=True), flush=True)
        return 0


def exit_reason(rc: int | None) -> str:
    if rc is not None and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def last_words(tail: list[str], n: int = 8) -> str:
    """A dead worker's last lines, without its own progress lines."""
    lines = [t.strip() for t in tail if t.strip() and not re.match(r"^\[\d\d:\d\d:\d\d ", t.strip())]
    return " / ".join(lines[-n:])[-1200:] or "(no output)"


def check_returnable(out: Path, say: Callable[[str], None]) -> None:
    """Say whether the files under ``out`` fit what the GPU machine returns (8 files, 16 MiB, 2 folders down)."""
    files = [p for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")]
    for p in out.rglob(".*"):
        if p.is_file():
            p.unlink()
    problems = []
    if len(files) > 8:
        problems.append(f"{len(files)} files (8 come back)")
    for p in files:
        rel = p.relative_to(out)
        if len(rel.parts) > 3:
            problems.append(f"{rel} is too deep")
        if p.stat().st_size > 16 * 2**20:
            problems.append(f"{rel} is {p.stat().st_size / 2**20:.1f} MiB")
        if not re.fullmatch(r"[A-Za-z0-9._/-]+", str(rel)):
            problems.append(f"{rel} has characters that do not come back")
    say(f"files: {len(files)} under {out}" + (f"; NOT ALL COME BACK: {'; '.join(problems)}" if problems else ""))


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


# ------------------------------------------------------------------------------------------------ reports
def fmt_rate(v: Any) -> str:
    return f"{v:,.0f}" if isinstance(v, (int, float)) and v else "-"


def markdown(state: dict[str, Any], brief: bool = False) -> str:
    sw = state.get("software") or {}
    dev = state.get("device") or {}
    smi = dev.get("nvidia_smi")
    gpu = (f"{smi[0].get('name')}, driver {smi[0].get('driver_version')}" if isinstance(smi, list) and smi
           else ", ".join(sw.get("gpus_tf") or []) or "no GPU")
    lines = [f"# GPU run: {gpu}", "",
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
            lines.append(f"| {name} | {r.get('label')} | {fmt_rate(rate)} | {ratio} | {fmt_rate(r.get('call_img_per_s'))} "
                         f"| {warm if warm is not None else '-'} | {str(note).replace('|', '/').replace(chr(10), ' ')[:160]} |")
    if brief:
        return "\n".join(lines)
    lines += ["", "## Experiments", "", "| experiment | status | time s | limit s | what |", "|---|---|---:|---:|---|"]
    for name, rec in state["experiments"].items():
        lines.append(f"| {name} | {rec['status']} | {rec.get('elapsed_s', '-')} | {rec.get('effective_limit_s', rec['limit_s'])}"
                     f" | {rec['title']} |")
    for name, rec in state["experiments"].items():
        for note in rec.get("notes", []):
            lines.append(f"- {name}: {note}")
    prof = state["experiments"].get("profile", {})
    if prof.get("op_summary"):
        lines += ["", "## Profile", "", "```", prof["op_summary"], "```"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ worker process
class TimeUp(Exception):
    """An experiment's time limit passed inside a measurement: what was measured is kept."""


class Worker:
    """Runs experiments in this process (TensorFlow imported here) and reports each event as a JSON line."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.events = open(args.events, "a", buffering=1, encoding="utf-8")
        self.deadline = float(args.deadline)
        self.sizes = TINY if args.tiny else FULL
        self.clock = Clock()
        self.exp_deadline = self.deadline
        self.current = ""
        self.measured: dict[Any, tuple[str, dict[str, Any]]] = {}  # resident MNIST configurations measured so far

    def emit(self, **ev: Any) -> None:
        self.events.write(json.dumps(ev, default=str) + "\n")
        self.events.flush()

    def say(self, text: str) -> None:
        print(f"{self.clock.stamp()} {text}", flush=True)

    def left(self) -> float:
        return self.exp_deadline - time.time()

    # -- setup -----------------------------------------------------------------------------------
    def start(self) -> None:
        import logging

        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("amp_backends").setLevel(logging.WARNING)
        import numpy as np
        import tensorflow as tf

        import amp_backends
        from amp_backends.data import synthetic_mnist

        self.np, self.tf, self.amp = np, tf, amp_backends
        sw: dict[str, Any] = {"tensorflow": tf.__version__, "keras": getattr(tf.keras, "__version__", None)}
        try:
            import keras

            sw["keras"] = keras.__version__
        except Exception:
            pass
        try:
            info = tf.sysconfig.get_build_info()
            sw["cuda_build"], sw["cudnn_build"] = info.get("cuda_version"), info.get("cudnn_version")
        except Exception:
            pass
        gpus = tf.config.list_physical_devices("GPU")
        details = []
        for g in gpus:
            try:
                d = tf.config.experimental.get_device_details(g)
                details.append(f"{d.get('device_name', g.name)} (CC {'.'.join(map(str, d.get('compute_capability', ())))})")
            except Exception:
                details.append(g.name)
        sw["gpus_tf"] = details
        sw["tf32_default"] = tf.config.experimental.tensor_float_32_execution_enabled()
        self.emit(event="software", data=sw)
        self.say(f"TensorFlow {sw['tensorflow']}, Keras {sw['keras']}, GPUs: {details or 'none'}")
        s = self.sizes
        (self.x, self.y), _ = synthetic_mnist(s["samples"], 8)
        self.E = s["samples"] // s["mnist_batch"]  # MNIST steps per epoch (58)
        self.G = s["samples"] // s["gan_batch"]  # GAN steps per epoch (14)
        from amp_backends.training.step import UNROLL_LIMIT

        self.unroll_limit = UNROLL_LIMIT
        for label, overrides in (("auto", {}), ("auto, XLA forced on", {"xla": "on"})):
            try:
                self.emit(event="plan", label=label, data=self.plan(**overrides).summary())
            except Exception as exc:
                self.emit(event="plan", label=label, data=f"failed: {type(exc).__name__}: {exc}")

    def fresh(self) -> None:
        """A fresh Keras session (it also resets Keras's global dtype policy) and no plan applied."""
        import gc

        self.tf.keras.backend.clear_session()
        gc.collect()
        self.amp.reset()

    def plan(self, **overrides: Any) -> Any:
        """A fresh Keras session and the plan applied again."""
        self.fresh()
        return self.amp.auto_configure(verbose=False, **overrides)

    # -- measuring -------------------------------------------------------------------------------
    def spc_list(self, values: tuple[int, ...]) -> list[int]:
        seen: list[int] = []
        for v in values:
            v = min(v, self.E) if not self.args.tiny else min({1: 1, 8: 2, 16: 3}.get(v, v), self.E)
            if v not in seen:
                seen.append(v)
        return seen

    def row(self, label: str, fn: Callable[[], dict[str, Any]], min_left: float = 2.0, smoke: bool = True,
            **config: Any) -> None:
        """Measure one configuration; any error is recorded on its row and the experiment goes on.

        ``smoke=False``: left out of a --tiny run (another row there runs the same code path).
        """
        if self.args.tiny and not smoke:
            r = {"label": label, "config": config, "status": "skipped", "img_per_s": None,
                 "error": "left out of the tiny run (another row runs the same code)"}
        elif self.left() < min_left:
            r = {"label": label, "config": config, "status": "skipped", "img_per_s": None,
                 "error": "the experiment's time limit was reached"}
        else:
            self.say(f"   {self.current}: {label} ...")
            t0 = time.time()
            try:
                r = {"label": label, "config": config, "status": "ok", **fn()}
            except TimeUp as exc:
                r = {"label": label, "config": config, "status": "partial", "img_per_s": None, "error": str(exc)}
            except Exception as exc:
                tb = traceback.format_exc().strip().splitlines()
                r = {"label": label, "config": config, "status": "failed", "img_per_s": None,
                     "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}",
                     "traceback": tb[-12:]}
            r["seconds"] = round(time.time() - t0, 1)
        if r.get("status") == "partial" and r.get("epoch_img_per_s"):
            r["img_per_s"] = statistics.median(r["epoch_img_per_s"])
        self.say(f"   {self.current}: {label}: "
                 + (f"{r['img_per_s']:,.0f} img/s" if r.get("img_per_s") else f"{r['status']}: {r.get('error')}")
                 + (f" (per call {r['call_img_per_s']:,.0f})" if r.get("call_img_per_s") else "")
                 + (f", warm-up {r['warmup_s']} s" if r.get("warmup_s") is not None else ""))
        self.emit(event="row", name=self.current, row=r)

    def timer(self, per_step: int, stop_at_deadline: bool = True) -> Any:
        from amp_backends.training import Observer

        worker = self

        class EpochTimer(Observer):
            def __init__(self) -> None:
                self.calls: list[tuple[float, int, int, float]] = []
                self.t_start: float | None = None

            def on_fit_start(self, start_step: int, total_steps: int | None) -> None:
                if self.t_start is None:
                    self.t_start = time.perf_counter()

            def after_call(self, r: Any) -> None:
                self.calls.append((time.perf_counter(), int(r.epoch), int(r.steps), float(r.step_time)))
                if stop_at_deadline and time.time() > worker.exp_deadline:
                    raise TimeUp(f"time limit reached at epoch {r.epoch}")

            def stats(self, steps_per_epoch: int) -> dict[str, Any]:
                ends: dict[int, list[float]] = {}
                per_call: dict[int, list[float]] = {}
                for t, e, steps, step_time in self.calls:
                    ends.setdefault(e, [t, 0])
                    ends[e][0] = t
                    ends[e][1] += steps
                    per_call.setdefault(e, []).append(per_step / step_time)
                epochs = sorted(ends)
                if not epochs:
                    return {"epoch_img_per_s": []}
                first = epochs[0]
                rates, calls = [], []
                prev = ends[first][0]
                for e in epochs[1:]:
                    t, steps = ends[e]
                    if steps == steps_per_epoch:
                        rates.append(steps * per_step / (t - prev))
                        calls += per_call[e]
                    prev = t
                return {"epoch_img_per_s": [round(v, 1) for v in rates],
                        "img_per_s": statistics.median(rates) if rates else None,
                        "call_img_per_s": statistics.median(calls) if calls else None,
                        "warmup_s": round(ends[first][0] - (self.t_start or ends[first][0]), 2),
                        "calls_per_epoch": len(per_call[epochs[-1]])}

        return EpochTimer()

    def trainer_fit(self, make_updates: Callable[[], Any], plan: Any, *, batch: int, per_step: int, spc: int,
                    unroll: bool | None, data: Any = "arrays", steps_per_epoch: int, epochs: int | None = None) -> dict:
        """Build a Trainer, fit 1 + N epochs in one call, time each epoch and call."""
        from amp_backends import Trainer
        from amp_backends.training import mnist_batch_fn

        timer = self.timer(per_step)
        stream = not isinstance(data, str)
        trainer = Trainer(make_updates(), plan, batch_size=batch, steps_per_call=spc, unroll_steps=unroll,
                          log_every=10**9, progress=False, batch_fn=None if stream else mnist_batch_fn,
                          images_per_step=per_step, observers=[timer], check_models=False)
        n = 1 + (epochs or self.sizes["timed_epochs"])
        t0 = time.perf_counter()
        try:
            if stream:
                trainer.fit(data, epochs=n)
            else:
                trainer.fit(self.x, self.y if data == "arrays" else None, epochs=n)
        except TimeUp:
            s = timer.stats(steps_per_epoch)
            if not s.get("img_per_s"):
                raise TimeUp(f"time limit reached before a timed epoch ended (warm-up "
                             f"{s.get('warmup_s', round(time.perf_counter() - t0, 1))} s)") from None
            s.update(status="partial", error="time limit reached: fewer timed epochs")
            return s
        s = timer.stats(steps_per_epoch)
        s["fit_setup_s"] = round((timer.t_start or t0) - t0, 3)
        s["unrolled"] = trainer.program.unrolled(spc) if not stream else None
        return s

    # -- models ----------------------------------------------------------------------------------
    def mnist_updates(self, no_dropout: bool = False) -> Callable[[], Any]:
        def make() -> Any:
            from amp_backends.models import mnist_cnn
            from amp_backends.training import classifier_updates

            model = mnist_cnn_without_dropout(self.tf) if no_dropout else mnist_cnn()
            return classifier_updates(model, self.tf.keras.optimizers.Adam(self.sizes["lr"]))

        return make

    def gan_updates(self) -> Any:
        from amp_backends.models import gan_discriminator, gan_generator
        from amp_backends.training import gan_updates

        tf = self.tf
        return gan_updates(gan_generator(), gan_discriminator(), tf.keras.optimizers.Adam(1e-3),
                           tf.keras.optimizers.RMSprop(1e-4))

    def mnist_row(self, label: str, overrides: dict[str, Any], spc: int, unroll: bool | None = None,
                  no_dropout: bool = False, data: Any = "arrays", min_left: float = 2.0, smoke: bool = True) -> None:
        B = self.sizes["mnist_batch"]

        def run() -> dict[str, Any]:
            plan = self.plan(**overrides)
            unrolled = (plan.xla and spc <= self.unroll_limit) if unroll is None else unroll
            key = (plan.training_key(), spc, unrolled, no_dropout) if data == "arrays" else None
            if key in self.measured:  # the same configuration, already measured in this run: not compiled again
                where, r = self.measured[key]
                return {**r, "note": f"the figures of {where} (the same configuration; measured once)", "reused": where}
            d = data() if callable(data) else data
            r = self.trainer_fit(self.mnist_updates(no_dropout), plan, batch=B, per_step=B, spc=spc, unroll=unroll,
                                 data=d, steps_per_epoch=self.E)
            r["plan"] = plan_line(plan)
            if key is not None and r.get("img_per_s") and r.get("status") != "partial":
                self.measured[key] = (f"{self.current}: {label}", r)
            return r

        self.row(label, run, min_left=min_left, smoke=smoke, model="mnist", batch=B, steps_per_call=spc,
                 unroll_steps=unroll, plan_overrides=overrides, data=data if isinstance(data, str) else "tf.data",
                 dropout=not no_dropout)

    # -- the experiments -------------------------------------------------------------------------
    XLA = {"xla": "on"}  # on the GPU the auto plan has XLA on anyway; on a CPU this forces it (with a warning)
    AUTO: dict[str, Any] = {}  # the auto plan as it is

    def exp_mnist_steps_per_call(self) -> None:
        self.note(f"auto plan with XLA forced on; default unrolling: unrolled up to UNROLL_LIMIT={self.unroll_limit} "
                  "steps, a tf.range loop above")
        for spc in self.spc_list((self.E, 16, 8, 1)):
            label = f"{spc} step{'s' if spc > 1 else ''}/call" + (" (one epoch)" if spc == self.E else "")
            self.mnist_row(label, self.XLA, spc, smoke=spc == self.E)

    def exp_mnist_unroll(self) -> None:
        self.note("complements mnist_steps_per_call (its rows use the default unrolling): each row here is the other "
                  "mode; the unrolled epoch-long call comes last (longest compilation)")
        spcs = self.spc_list((16, 8, self.E))
        spcs = [s for s in spcs if s != self.E] + ([self.E] if self.E in spcs else [])
        for spc in spcs:
            default_unrolled = spc <= self.unroll_limit
            unroll = not default_unrolled
            self.mnist_row(f"{spc} steps/call, {'unrolled' if unroll else 'loop'}", self.XLA, spc, unroll=unroll)

    def exp_mnist_fit_per_epoch(self) -> None:
        B, E = self.sizes["mnist_batch"], self.E
        self.mnist_row(f"one fit, {E} steps/call", self.AUTO, E)

        def per_epoch() -> dict[str, Any]:
            from amp_backends import Trainer
            from amp_backends.training import mnist_batch_fn

            plan = self.plan(**self.AUTO)
            timer = self.timer(B, stop_at_deadline=False)
            trainer = Trainer(self.mnist_updates()(), plan, batch_size=B, steps_per_call=E, log_every=10**9,
                              progress=False, batch_fn=mnist_batch_fn, observers=[timer], check_models=False)
            rates, setups = [], []
            for e in range(1, 2 + self.sizes["timed_epochs"]):
                timer.t_start = None
                t0 = time.perf_counter()
                trainer.fit(self.x, self.y, epochs=e)
                dt = time.perf_counter() - t0
                if e > 1:
                    rates.append(E * B / dt)
                    setups.append((timer.t_start or t0) - t0)
                if time.time() > self.exp_deadline and rates:
                    break
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "fit_setup_s": round(statistics.median(setups), 3), "plan": plan_line(plan),
                    "note": f"fit(x, y, epochs=e) per epoch, as the benchmark; setup (upload, checks) "
                            f"{statistics.median(setups) * 1e3:.1f} ms per fit"}

        self.row("one fit per epoch (as the benchmark)", per_epoch, model="mnist", batch=B, steps_per_call=E)

    def exp_mnist_placement(self) -> None:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        self.mnist_row(f"resident arrays, {E} steps/call", self.AUTO, E, smoke=False)

        def dataset() -> Any:
            ds = tf.data.Dataset.from_tensor_slices((self.x, self.y)).shuffle(len(self.x), seed=0)
            ds = ds.batch(B, drop_remainder=True).map(
                lambda a, b: (tf.reshape(tf.cast(a, tf.float32) / 255.0, [-1, 28, 28, 1]), b),
                num_parallel_calls=tf.data.AUTOTUNE)
            return ds

        self.mnist_row(f"tf.data pipeline (fit(dataset), prefetched to the device), {E} steps/call", self.AUTO, E,
                       data=dataset)
        self.mnist_row("tf.data pipeline, 1 step/call", self.AUTO, 1, data=dataset, smoke=False)
        k = self.spc_list((8,))[0]

        def host_per_call() -> dict[str, Any]:
            from amp_backends import Trainer
            from amp_backends.training import mnist_batch_fn

            plan = self.plan(**self.AUTO)
            trainer = Trainer(self.mnist_updates()(), plan, batch_size=B, steps_per_call=k, log_every=10**9,
                              progress=False, batch_fn=mnist_batch_fn, check_models=False)
            chunk = k * B
            chunks = [(self.x[i:i + chunk], self.y[i:i + chunk]) for i in range(0, (len(self.x) // chunk) * chunk, chunk)]
            fits = 0
            rates = []
            for epoch in range(1 + self.sizes["timed_epochs"]):
                t0 = time.perf_counter()
                for xc, yc in chunks:
                    fits += 1
                    trainer.fit(xc, yc, epochs=fits)
                if epoch:
                    rates.append(len(chunks) * chunk / (time.perf_counter() - t0))
                    if time.time() > self.exp_deadline:
                        break
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "plan": plan_line(plan),
                    "note": f"{len(chunks)} fit() calls per pass, each on {k} batches of host numpy "
                            f"({len(chunks) * k} of {E} steps per pass)"}

        self.row(f"host numpy fed per call ({k} steps/call: fit() per chunk)", host_per_call, model="mnist",
                 batch=B, steps_per_call=k, data="host numpy per call")

    def exp_mnist_dropout_rng(self) -> None:
        E = self.E
        self.mnist_row(f"Dropout as in the model, {E} steps/call", self.AUTO, E, smoke=False)
        self.mnist_row(f"Dropout rates 0 (no random numbers), {E} steps/call", self.AUTO, E, no_dropout=True)

    def exp_mnist_policy(self) -> None:
        E = self.E
        self.mnist_row("auto plan", self.AUTO, E, smoke=False)
        forced = {**self.AUTO, "force": True}  # a policy slow here is honoured all the same (not downgraded)
        self.mnist_row("mixed_bfloat16", {**forced, "policy": "mixed_bfloat16"}, E)
        self.mnist_row("mixed_float16, no loss scaling", {**forced, "policy": "mixed_float16", "loss_scale": "none"}, E)
        self.mnist_row("float32 (TF32 as planned)", {**forced, "policy": "float32"}, E, smoke=False)

    def exp_loss_fetch(self) -> None:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        self.note("hand-written: one jit-compiled step per tf.function call, data resident on the device and gathered "
                  "in the step, the plan's dtype policy, no loss scaling")

        def run(fetch: bool) -> dict[str, Any]:
            from amp_backends.models import mnist_cnn

            plan = self.plan(**self.AUTO)
            with tf.device(plan.device):
                xd, yd = tf.constant(self.x), tf.constant(self.y)
            model = mnist_cnn()
            opt = tf.keras.optimizers.Adam(self.sizes["lr"])
            loss_obj = tf.keras.losses.SparseCategoricalCrossentropy()

            @tf.function(jit_compile=plan.xla)
            def step(i):
                idx = i * B + tf.range(B)
                xb = tf.reshape(tf.cast(tf.gather(xd, idx), tf.float32) / 255.0, [-1, 28, 28, 1])
                with tf.GradientTape() as tape:
                    loss = loss_obj(tf.gather(yd, idx), model(xb, training=True))
                opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
                return loss

            idx = [tf.constant(i, tf.int32) for i in range(E)]

            def epoch() -> None:
                loss = None
                for i in idx:
                    loss = step(i)
                    if fetch:
                        float(loss)
                float(loss)  # one fetch at the end of the epoch: the work is done

            t0 = time.perf_counter()
            epoch()
            warm = time.perf_counter() - t0
            rates = []
            for _ in range(self.sizes["timed_epochs"]):
                t0 = time.perf_counter()
                epoch()
                rates.append(E * B / (time.perf_counter() - t0))
                if time.time() > self.exp_deadline:
                    break
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "warmup_s": round(warm, 2), "plan": plan_line(plan)}

        self.row("no fetch (one sync per epoch)", lambda: run(False), model="mnist", batch=B, fetch_every_step=False)
        self.row("float(loss) every step", lambda: run(True), model="mnist", batch=B, fetch_every_step=True)

    def exp_gan(self) -> None:
        B, G = self.sizes["gan_batch"], self.G
        self.note(f"{G} steps per epoch of batch {B}; 2 x batch images per step")
        overrides = self.XLA
        if self.args.tiny:  # compiling the GAN's steps for a CPU takes most of a minute: the smoke run checks the rest
            overrides = self.AUTO
            self.note("tiny run: the auto plan as it is (no XLA forced on a CPU)")

        def one(spc: int, unroll: bool | None) -> Callable[[], dict[str, Any]]:
            def run() -> dict[str, Any]:
                plan = self.plan(**overrides)
                r = self.trainer_fit(self.gan_updates, plan, batch=B, per_step=2 * B, spc=spc, unroll=unroll,
                                     data="images", steps_per_epoch=G)
                r["plan"] = plan_line(plan)
                return r

            return run

        default_unrolled = G <= self.unroll_limit
        rows = [(f"one epoch ({G} steps/call), default ({'unrolled' if default_unrolled else 'loop'})", G, None),
                ("1 step/call", 1, None),
                (f"one epoch ({G} steps/call), {'loop' if default_unrolled else 'unrolled'}", G, not default_unrolled)]
        for i, (label, spc, unroll) in enumerate(rows):
            self.row(label, one(spc, unroll), smoke=i == 0, model="gan", batch=B, steps_per_call=spc,
                     unroll_steps=unroll)

    def exp_keras_fit(self) -> None:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        n = E * B
        xf = (self.x[:n].astype("float32") / 255.0).reshape(-1, 28, 28, 1)
        yy = self.y[:n]
        worker = self

        class EpochTimes(tf.keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.times: list[float] = []

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.t = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.times.append(time.perf_counter() - self.t)
                if time.time() > worker.exp_deadline and len(self.times) > 1:
                    self.model.stop_training = True

        def run(user: bool, steps_per_execution: int | None = None) -> dict[str, Any]:
            from amp_backends.models import mnist_cnn

            if user:
                self.fresh()  # and undo what earlier plans changed: as a script without auto_configure()
                tf.keras.mixed_precision.set_global_policy("float32")
                tf.config.experimental.enable_tensor_float_32_execution(True)  # TensorFlow's default
                kwargs: dict[str, Any] = {}
                where = "float32, compile() defaults (jit_compile='auto')"
            else:
                plan = self.plan()
                kwargs = dict(plan.compile_kwargs())
                where = plan_line(plan) + f", compile({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            if steps_per_execution:
                kwargs["steps_per_execution"] = steps_per_execution
            model = mnist_cnn()
            model.compile(optimizer=tf.keras.optimizers.Adam(self.sizes["lr"]), loss="sparse_categorical_crossentropy",
                          **kwargs)
            cb = EpochTimes()
            model.fit(xf, yy, batch_size=B, epochs=1 + self.sizes["timed_epochs"], verbose=0, shuffle=True,
                      callbacks=[cb])
            rates = [n / t for t in cb.times[1:]]
            return {"img_per_s": statistics.median(rates), "epoch_img_per_s": [round(v, 1) for v in rates],
                    "warmup_s": round(cb.times[0], 2), "plan": where}

        self.row("as users write it (float32, default compile)", lambda: run(True), model="mnist", batch=B)
        self.row("under auto_configure(), compile(**plan.compile_kwargs())", lambda: run(False), smoke=False,
                 model="mnist", batch=B)
        self.row(f"under auto_configure(), steps_per_execution={E}", lambda: run(False, E), model="mnist", batch=B,
                 steps_per_execution=E)

    def exp_profile(self) -> dict[str, Any]:
        tf, B, E = self.tf, self.sizes["mnist_batch"], self.E
        logdir = tempfile.mkdtemp(prefix="gpu-run-trace-")
        traced = self.sizes["profiled_epochs"]
        from amp_backends.training import Observer

        class Window(Observer):
            """Trace the calls of the epochs after two untraced ones (warm-up, steady state)."""

            def __init__(self) -> None:
                self.on = False
                self.calls = 0

            def before_call(self, step: int, steps: int) -> None:
                if not self.on and step >= 2 * E and step < (2 + traced) * E:
                    tf.profiler.experimental.start(logdir)
                    self.on = True

            def after_call(self, r: Any) -> None:
                if self.on:
                    self.calls += 1
                    if r.step >= (2 + traced) * E:
                        tf.profiler.experimental.stop()
                        self.on = False

        extra: dict[str, Any] = {}

        def run() -> dict[str, Any]:
            from amp_backends import Trainer

            from amp_backends.training import mnist_batch_fn

            plan = self.plan()
            window = Window()
            timer = self.timer(B)
            trainer = Trainer(self.mnist_updates()(), plan, batch_size=B, steps_per_call=E, log_every=10**9,
                              progress=False, batch_fn=mnist_batch_fn, observers=[timer, window], check_models=False)
            try:
                trainer.fit(self.x, self.y, epochs=2 + traced)
            finally:
                if window.on:
                    tf.profiler.experimental.stop()
            r = timer.stats(E)
            r["plan"] = plan_line(plan)
            r["traced_calls"] = window.calls
            r["traced_steps"] = traced * E
            summary = summarize_trace(logdir, self.out / "profile", traced * E, self.say, batch=B)
            extra["op_summary"] = summary.pop("text")
            r["profile"] = summary
            r["note"] = f"{window.calls} call(s), {traced * E} steps traced (timing includes the profiler)"
            return r

        self.row(f"auto plan, {E} steps/call, trace of {traced} epoch(s)", run, model="mnist", batch=B, steps_per_call=E)
        shutil.rmtree(logdir, ignore_errors=True)
        return extra

    def note(self, text: str) -> None:
        self.emit(event="note", name=self.current, text=text)

    # -- the loop --------------------------------------------------------------------------------
    def main(self) -> int:
        names = [n for n in (e.name for e in EXPERIMENTS) if n in self.args.only and n != "bench"]
        self.start()
        for name in names:
            exp = BY_NAME[name]
            left = self.deadline - time.time()
            if left < exp.min_s:
                self.emit(event="skip", name=name, why=f"only {max(left, 0):.0f} s left in the budget")
                self.say(f"== {name}: skipped, {left:.0f} s left")
                continue
            limit = min(exp.tiny_limit_s if self.args.tiny else exp.limit_s, left)
            self.current = name
            self.exp_deadline = time.time() + limit
            self.emit(event="start", name=name, limit_s=limit)
            self.say(f"== {name} (limit {limit:.0f} s): {exp.title}")
            t0 = time.time()
            status, error, extra = "done", None, None
            fault = dict(f.split(":", 1) for f in os.environ.get("GPU_RUN_FAULTS", "").split(",") if ":" in f)
            try:
                if name in fault:  # for testing this script's recovery: GPU_RUN_FAULTS=gan:crash,profile:hang
                    {"crash": os.abort, "hang": lambda: time.sleep(10**6)}.get(fault[name], lambda: 1 / 0)()
                extra = getattr(self, f"exp_{name}")()
            except Exception as exc:
                status, error = "failed", f"{type(exc).__name__}: {exc}"[:600] + " | " + " / ".join(
                    traceback.format_exc().strip().splitlines()[-6:])
            self.emit(event="done", name=name, status=status, error=error, elapsed_s=round(time.time() - t0, 1),
                      extra=extra)
            self.say(f"== {name}: {status} in {time.time() - t0:.1f} s" + (f": {error}" if error else ""))
        return 0


def plan_line(plan: Any) -> str:
    ls = getattr(plan.loss_scale, "mode", plan.loss_scale)
    return f"{plan.policy}, XLA {'on' if plan.xla else 'off'}, TF32 {'on' if plan.tf32 else 'off'}, loss scale {ls}, {plan.device}"


def mnist_cnn_without_dropout(tf: Any) -> Any:
    """models.mnist_cnn with every Dropout rate 0 (Keras then draws no random numbers): same layers, same parameters."""
    from amp_backends.models import mnist_cnn

    base = mnist_cnn()
    config = base.get_config()
    changed = 0
    for layer in config["layers"]:
        if layer.get("class_name") == "Dropout":
            layer["config"]["rate"] = 0.0
            changed += 1
    model = tf.keras.Sequential.from_config(config)
    if changed == 0 or model.count_params() != base.count_params():
        raise RuntimeError(f"the copy without dropout differs: {changed} Dropout layers changed, "
                           f"{model.count_params()} vs {base.count_params()} parameters")
    return model


# ------------------------------------------------------------------------------------------------ profile summary
def summarize_trace(logdir: str, dest: Path, steps: int, say: Callable[[str], None], batch: int = 0) -> dict[str, Any]:
    """Copy the trace (gzipped) to ``dest`` and derive op statistics from its XPlane (TensorFlow's own protobuf)."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))
    if not paths:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}")
    path = paths[-1]
    kept = dest / "trace.xplane.pb.gz"
    with open(path, "rb") as f, gzip.open(kept, "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    result: dict[str, Any] = {"xplane_mib": round(path.stat().st_size / 2**20, 2)}
    if kept.stat().st_size > 15 * 2**20:  # what the GPU machine returns: 16 MiB a file
        kept.unlink()
        result["trace"] = f"not kept: {kept.stat().st_size / 2**20:.0f} MiB gzipped is too large to return"
    else:
        result["trace"] = f"profile/{kept.name} (gunzip, then open with TensorBoard's profile plugin)"
    lines = [f"trace: {path.name}, {result['xplane_mib']} MiB, {steps} training steps traced"]

    def table(agg: dict[str, list[float]], n: int) -> list[str]:
        total = sum(us for _, us in agg.values()) or 1.0
        top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:n]
        return [f"  {us / total:6.1%} {us:11.0f} {int(c):7d}  {name[:120]}" for name, (c, us) in top]

    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        streams: dict[str, list[float]] = {}  # kernel name -> [count, us], over the GPU's streams
        spans: list[tuple[int, int]] = []
        device_lines: list[tuple[str, dict[str, list[float]]]] = []
        host: dict[str, list[float]] = {}
        for plane in space.planes:
            meta = {k: v.name for k, v in plane.event_metadata.items()}
            gpu = plane.name.startswith("/device:GPU")
            if not gpu and not plane.name.startswith("/host:CPU"):
                continue
            for line in plane.lines:
                name = line.display_name or line.name
                kernels = gpu and line.name.startswith("Stream")
                agg = streams if kernels else (host if not gpu else {})
                for ev in line.events:
                    a = agg.setdefault(meta.get(ev.metadata_id, str(ev.metadata_id)), [0, 0.0])
                    a[0] += 1
                    a[1] += ev.duration_ps / 1e6
                    if kernels:
                        start = line.timestamp_ns * 1000 + ev.offset_ps
                        spans.append((start, start + ev.duration_ps))
                if gpu and not kernels and agg:
                    device_lines.append((f"{plane.name} / {name}", agg))
        if spans:
            spans.sort()
            busy, (cur_s, cur_e) = 0, spans[0]
            for s, e in spans[1:]:
                if s > cur_e:
                    busy += cur_e - cur_s
                    cur_s, cur_e = s, e
                else:
                    cur_e = max(cur_e, e)
            busy += cur_e - cur_s
            span = max(e for _, e in spans) - spans[0][0]
            kernels = int(sum(c for c, _ in streams.values()))
            result.update(gpu_busy_fraction=round(busy / span, 3) if span else None, gpu_span_ms=round(span / 1e9, 2),
                          gpu_busy_ms=round(busy / 1e9, 2), kernels=kernels, kernels_per_step=round(kernels / steps, 1),
                          gpu_busy_us_per_step=round(busy / 1e6 / steps, 1))
            lines.append(f"GPU kernels: busy {busy / 1e9:.1f} ms of the {span / 1e9:.1f} ms from first to last kernel "
                         f"({100 * busy / max(span, 1):.0f}%); {kernels} kernels, {kernels / steps:.1f} per step; "
                         f"{busy / 1e6 / steps:.1f} us of kernel time per step")
            if batch and busy:
                bound = batch * steps / (busy / 1e12)
                result["kernel_bound_img_per_s"] = round(bound)
                lines.append(f"if the GPU were never idle: {bound:,.0f} img/s at batch {batch} (1.5 M img/s needs "
                             f"{batch / 1.5e6 * 1e6:.0f} us per step)")
            total = sum(us for _, us in streams.values()) or 1.0
            result["top_kernels"] = [{"name": n[:160], "count": int(c), "us": round(us, 1), "share": round(us / total, 3)}
                                     for n, (c, us) in sorted(streams.items(), key=lambda kv: -kv[1][1])[:25]]
            lines += ["top GPU kernels, all streams:   share    total us   count  name"] + table(streams, 25)
        else:
            lines.append("no GPU kernels in the trace (a CPU run)")
        for label, agg in device_lines:
            if any(k in label for k in ("XLA Ops", "XLA Modules", "TensorFlow Ops", "Steps", "Launch")):
                lines += [f"{label}: {int(sum(c for c, _ in agg.values()))} events"] + table(agg, 12)
        if host:
            lines += [f"host threads, all: {int(sum(c for c, _ in host.values()))} events (nested: shares overlap)"]
            lines += table(host, 20)
    except Exception as exc:
        lines.append(f"op statistics could not be derived from the XPlane ({type(exc).__name__}: {exc}); "
                     "the trace is kept: open it with TensorBoard's profile plugin")
    try:  # TensorFlow's own converter (what TensorBoard's profile plugin calls), when it answers
        from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin

        data, ok = plugin.xspace_to_tools_data([str(path)], "framework_op_stats", {})
        rows = framework_op_table(data) if ok and data else []
        if rows:
            lines += ["framework_op_stats (TensorFlow's converter), top 20 by self time:"] + rows
        result["framework_op_stats"] = "converted" if rows else "the converter returned nothing readable"
    except Exception as exc:
        result["framework_op_stats"] = f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
    text = "\n".join(lines)
    (dest / "op_stats.txt").write_text(text + "\n")
    say("   profile: " + (lines[1] if len(lines) > 1 else lines[0]))
    result["text"] = text
    return result


def framework_op_table(data: Any) -> list[str]:
    """The top rows of framework_op_stats' table (a Google Charts DataTable in JSON), or [] if unreadable."""
    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        parsed = json.loads(data)
        table = parsed[0] if isinstance(parsed, list) else parsed
        cols = [c.get("id") or c.get("label") for c in table["cols"]]
        rows = [[cell.get("v") if isinstance(cell, dict) else None for cell in r["c"]] for r in table["rows"]]
        want = [c for c in ("host_or_device", "type", "operation", "occurrences", "total_self_time",
                            "device_total_self_time_percent", "total_self_time_percent") if c in cols]
        if "total_self_time" in cols:
            rows.sort(key=lambda r: -(r[cols.index("total_self_time")] or 0))
        out = ["  " + " | ".join(want)]
        for r in rows[:20]:
            out.append("  " + " | ".join(str(r[cols.index(c)])[:60] for c in want))
        return out
    except Exception:
        return []


# ------------------------------------------------------------------------------------------------ entry
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    default_out = os.environ.get("OUT") or "gpu-session-results"
    p = argparse.ArgumentParser(description="The GPU run: benchmark, trainer call experiments, profile.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="experiments, in order (limit s on the GPU / in --tiny):\n" + "\n".join(
                                    f"  {e.name:22s} {e.limit_s:4.0f} / {e.tiny_limit_s:3.0f}  {e.title}"
                                    for e in EXPERIMENTS))
    p.add_argument("--out", default=default_out, help="folder for the results (default: $OUT, else ./gpu-session-results)")
    p.add_argument("--budget-s", type=float, default=520.0, help="wall-clock budget of the whole run; experiments that "
                   "no longer fit are recorded as skipped (default 520)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny sizes, a couple of steps")
    p.add_argument("--only", type=lambda s: [n.strip() for n in s.split(",") if n.strip()], default=None,
                   help="comma-separated experiments to run (default: all)")
    p.add_argument("--skip", type=lambda s: [n.strip() for n in s.split(",") if n.strip()], default=None,
                   help="comma-separated experiments to leave out")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    p.add_argument("--deadline", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [n for n in (args.only or []) + (args.skip or []) if n not in BY_NAME]
    if unknown:
        p.error(f"unknown experiment(s) {unknown}; valid: {', '.join(BY_NAME)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.list:
        for e in EXPERIMENTS:
            print(f"{e.name:22s} limit {e.limit_s:4.0f} s (tiny {e.tiny_limit_s:3.0f} s)  {e.title}")
        return 0
    if args.worker:
        return Worker(args).main()
    return Run(args).main()


if __name__ == "__main__":
    sys.exit(main())
