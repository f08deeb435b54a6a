"""Worker processes with time limits: a child that crashes or overruns is stopped and reported, never waited on.

`JsonWorker` is a long-lived child answering one JSON request per line (the model zoo's; the GPU suite in
``benchmarks/`` runs its workers with the same ``stop``). Children run in their own process group: stopping one stops
what it started.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from ...errors import TrainingInterrupted

PROTOCOL = "@@json "  # a worker's answer lines start with this; anything else it prints is log


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child ``python -m amp_backends...``: this package importable, output unbuffered."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])  # the folder holding amp_backends/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# a child's own process group, not a new session: whatever ends this run ends the child too
_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def stop(proc: subprocess.Popen) -> None:
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
            pass


def exit_reason(rc: int | None) -> str:
    """How a child process ended, from its return code: ``exit code 1``, ``killed by SIGKILL``.

    Args:
        rc: The process's return code (negative: the signal that ended it).

    Returns:
        The phrase.
    """
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


class WorkerFailed(RuntimeError):
    """A worker died, overran a request's time limit, or could not start; it has been stopped."""


class JsonWorker:
    """A child answering JSON requests, one per line, on its standard output; lines without `PROTOCOL` (and its
    standard error) go to ``log``. A request unanswered within its time limit stops it and raises `WorkerFailed`."""

    def __init__(self, cmd: list[str], log: IO[str], name: str, env: dict[str, str] | None = None) -> None:
        self.name, self.log = name, log
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     bufsize=1, env=env or child_env(), errors="replace", **_GROUP)
        self.tail: list[str] = []
        self.asked_to_quit = False
        # a thread reads the lines (waiting on the pipe itself would miss lines already in the stream's buffer)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name=f"worker-{name}").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, **request: Any) -> None:
        """Send one request, a line of JSON, without waiting for its answer (`receive` reads it).

        Args:
            **request: The request's fields (``op``: what the worker is asked to do).

        Raises:
            WorkerFailed: The worker ended before the request.
        """
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._failed("it ended before the request") from None

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the worker's next answer; the other lines it prints go to the log.

        Args:
            timeout_s: Seconds to wait before the worker is stopped.

        Returns:
            The answer.

        Raises:
            WorkerFailed: No answer within ``timeout_s`` (the worker has been stopped), or the worker ended.
        """
        deadline = time.time() + timeout_s
        while True:
            left = deadline - time.time()
            if left <= 0:
                stop(self.proc)
                raise self._failed(f"no answer within {timeout_s:.0f} s: stopped")
            try:
                line = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self.lines.put(None)  # it stays ended for later requests
                self.proc.wait()
                raise self._failed(f"it ended ({exit_reason(self.proc.returncode)})")
            if line.startswith(PROTOCOL):
                return dict(json.loads(line[len(PROTOCOL):]))
            self.tail = (self.tail + [line.rstrip()])[-20:]
            self.log.write(f"[{self.name}] {line}")

    def request(self, timeout_s: float, **request: Any) -> dict[str, Any]:
        """Send one request and wait for its answer (`send`, then `receive`).

        Args:
            timeout_s: Seconds to wait for the answer before the worker is stopped.
            **request: The request's fields (``op``: what the worker is asked to do).

        Returns:
            The answer.

        Raises:
            WorkerFailed: The worker ended, or gave no answer within ``timeout_s``.
        """
        self.send(**request)
        return self.receive(timeout_s)

    def _failed(self, why: str) -> WorkerFailed:
        return WorkerFailed(f"the {self.name} worker failed: {why}" + (f"; last output: {last_words(self.tail)}"
                                                                        if self.tail else ""))

    def alive(self) -> bool:
        """Whether the worker's process is still running.

        Returns:
            ``True`` while it runs.
        """
        return self.proc.poll() is None

    def close(self, wait: bool = True) -> None:
        """Ask the worker to quit and wait up to 15 s for it (then stop it); with ``wait=False`` only ask (a later
        ``close()`` waits): several workers then end side by side, each unloading TensorFlow.

        Args:
            wait: Whether to wait for it to end.
        """
        try:
            if self.alive() and not self.asked_to_quit:
                self.send(op="quit")
                self.asked_to_quit = True
            if wait:
                self.proc.wait(timeout=15)
        except (WorkerFailed, subprocess.TimeoutExpired):
            stop(self.proc)


def exit_with_parent() -> None:
    """In a worker: end this process when the process that started it ends (however it ended)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def terminate_as_exit() -> None:
    """SIGTERM stops this process as Ctrl-C does (`amp_backends.errors.TrainingInterrupted`, exit code 143):
    ``finally`` blocks run, workers are stopped, what finished is written."""
    def handler(signum: int, frame: Any) -> None:
        raise TrainingInterrupted(signum, 0, None, f"stopped by {signal.Signals(signum).name}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def answer(data: dict[str, Any]) -> None:
    """In a worker: write one answer line."""
    sys.stdout.write(PROTOCOL + json.dumps(data, default=str) + "\n")
    sys.stdout.flush()
