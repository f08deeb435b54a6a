"""Python programs the tests start, forked from a process that has already imported TensorFlow.

Each program a test starts (``python -m amp_backends.examples.mnist ...``, a documentation page's code) spends
about four seconds importing TensorFlow before it does anything, and the suite starts dozens. `run_python` and
`popen_python` start such a program as ``subprocess.run`` and ``subprocess.Popen`` would, but fork it from a *warm*
interpreter: one that imported TensorFlow (nothing of ours, and no TensorFlow runtime: no devices, no thread pools,
no ops run) and then waits. The child gets the test's argument list, environment, working folder, stdin, stdout and
stderr (the pipes themselves, passed over a Unix socket), runs the program as ``__main__`` and exits with its
status, as a fresh ``python`` would; signals reach it by its process id. `subprocess_module` gives a library
module's own children (the audit's child, the zoo's workers) the same start, in a test that sets it as that
module's ``subprocess``.

What a fresh interpreter reads once, at start or when TensorFlow is imported (``TF_*``, ``PYTHON*``, oneDNN's and
the thread libraries' variables, ...) cannot change in a fork: a warm interpreter serves only programs whose such
variables equal its own, and one is started per distinct set. A program whose start-up itself is under test
(TensorFlow's start-up noise, what is imported, whether TensorFlow starts at all) is started with ``subprocess``;
where TensorFlow cannot be imported under the environment given (a test that blocks it), so is the program.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from typing import IO, Any

# read by the interpreter or a library at start-up or at TensorFlow's import: a fork cannot change them
AT_START = ("TF_", "PYTHON", "ONEDNN_", "DNNL_", "ITEX_", "KERAS_", "CUDA_", "XLA_", "OMP_", "KMP_", "MKL_", "LD_",
            "NVIDIA_", "MALLOC_")
AT_RUN = frozenset({"TF_CONFIG"})  # (read when a distribution strategy is made)

SERVER = r'''
import json, os, runpy, select, signal, socket, sys, tempfile, traceback
import tensorflow  # noqa: F401  (the import a forked program is spared; if it fails, this process ends)

def child(req, fds):
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    if req.get("group"):
        os.setpgid(0, 0)  # (Popen's process_group=0: the program leads a process group of its own)
    tempfile.tempdir = None  # (TMPDIR is read again)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import numpy as np
    np.random.seed()  # (a fresh interpreter's NumPy generator is seeded from the OS, not inherited)
    argv = req["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    import atexit
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

sock = socket.socket(fileno=int(sys.argv[1]))
children = set()
while True:
    ready = select.select([sock], [], [], 0.02 if children else None)[0]
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            break
        children.discard(pid)
        sock.send(json.dumps({"ended": pid, "status": os.waitstatus_to_exitcode(status)}).encode())
    if ready:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:  # the tests' process ended
            os._exit(0)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            child(json.loads(msg), fds)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        sock.send(json.dumps({"started": pid}).encode())
'''


class _NoServer(Exception):
    """The warm interpreter ended: its TensorFlow import failed."""


class _Warm:
    """One warm interpreter: a server that forks a program per request and says when each ended."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=env, cwd=tempfile.gettempdir())
        theirs.close()
        self.sock = ours
        self.started: int | None = None
        self.ended: dict[int, int] = {}
        atexit.register(self.proc.kill)

    def _receive(self, timeout: float | None) -> bool:
        """Take one message of the server's (False if none came within ``timeout`` seconds)."""
        if not select.select([self.sock], [], [], timeout)[0]:
            return False
        try:
            msg = self.sock.recv(1 << 16)
        except ConnectionResetError as exc:
            raise _NoServer from exc
        if not msg:
            raise _NoServer
        answer = json.loads(msg)
        if "ended" in answer:
            self.ended[answer["ended"]] = answer["status"]
        else:
            self.started = answer["started"]
        return True

    def start(self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int], group: bool) -> int:
        """Fork ``argv`` with ``fds`` as its stdin, stdout and stderr (``group``: in a process group of its own);
        its process id."""
        try:
            socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env, "cwd": cwd, "group": group}).encode()],
                            fds)
        except OSError as exc:
            raise _NoServer from exc
        self.started = None
        while self.started is None:
            self._receive(None)
        return self.started

    def status(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit status, waiting up to ``timeout`` seconds for it (``None``: still running)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.ended:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._receive(left) and deadline is not None and time.monotonic() >= deadline:
                return None
        return self.ended[pid]


_WARM: dict[tuple, _Warm] = {}


class WarmProcess:
    """What ``subprocess.Popen`` gives for a program forked from a warm interpreter: ``pid``, the pipes asked for
    (``stdin``, ``stdout``, ``stderr``), ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``,
    ``terminate`` and ``kill``."""

    def __init__(self, warm: _Warm, argv: list[str], *, stdin: Any, stdout: Any, stderr: Any, text: bool,
                 env: dict[str, str], cwd: str, errors: str | None = None, group: bool = False) -> None:
        self.args = [sys.executable, *argv]
        self.returncode: int | None = None
        self._warm = warm
        theirs: list[int] = []
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        try:
            if stdin == subprocess.PIPE:
                r, w = os.pipe()
                theirs.append(r)
                self.stdin = open(w, "w" if text else "wb")  # noqa: SIM115  (closed by communicate, as Popen's)
            else:
                theirs.append(os.open(os.devnull, os.O_RDONLY))
            for i, kind in ((1, stdout), (2, stderr)):
                if i == 2 and kind == subprocess.STDOUT:
                    theirs.append(os.dup(theirs[1]))
                elif kind == subprocess.PIPE:
                    r, w = os.pipe()
                    theirs.append(w)
                    setattr(self, "stdout" if i == 1 else "stderr",
                            open(r, "r", errors=errors) if text else open(r, "rb"))  # noqa: SIM115
                elif kind == subprocess.DEVNULL:
                    theirs.append(os.open(os.devnull, os.O_WRONLY))
                else:  # None (this process's own), a file descriptor or a file
                    theirs.append(os.dup(i if kind is None else kind if isinstance(kind, int) else kind.fileno()))
            self.pid = warm.start(argv, env, cwd, theirs, group)
        except BaseException:
            for f in (self.stdin, self.stdout, self.stderr):
                if f is not None:
                    f.close()
            raise
        finally:
            for fd in theirs:
                os.close(fd)

    def poll(self) -> int | None:
        """The exit status, or ``None`` while it runs."""
        if self.returncode is None:
            self.returncode = self._warm.status(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the program to end; its exit status (``subprocess.TimeoutExpired`` after ``timeout`` s)."""
        if self.returncode is None:
            self.returncode = self._warm.status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Write ``input`` to stdin and close it, read stdout and stderr to their ends, wait: ``(stdout, stderr)``."""
        got: dict[str, Any] = {}

        def feed() -> None:
            assert self.stdin is not None
            try:
                if input:
                    self.stdin.write(input)
            except BrokenPipeError:
                pass
            finally:
                try:
                    self.stdin.close()
                except BrokenPipeError:
                    pass

        def drain(name: str, stream: IO[Any]) -> None:
            got[name] = stream.read()
            stream.close()

        threads = [threading.Thread(target=drain, args=(n, s), daemon=True)
                   for n, s in (("stdout", self.stdout), ("stderr", self.stderr)) if s is not None]
        threads += [threading.Thread(target=feed, daemon=True)] if self.stdin is not None else []
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.start()
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return got.get("stdout"), got.get("stderr")

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the program, if it still runs."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(15)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(9)

    def __enter__(self) -> WarmProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None and not f.closed:
                f.close()
        self.wait()


def popen_python(argv: list[Any], *, env: dict[str, str] | None = None, cwd: Any = None, stdin: Any = None,
                 stdout: Any = None, stderr: Any = None, text: bool = False, errors: str | None = None,
                 process_group: int | None = None) -> WarmProcess | subprocess.Popen:
    """``subprocess.Popen([sys.executable, *argv], ...)``, forked from a warm interpreter whose start-up variables
    (`AT_START`) are ``env``'s (a fresh interpreter where TensorFlow cannot be imported under ``env``). ``stdout`` and
    ``stderr`` take what Popen's do (a pipe, a file, ``None``); ``process_group=0``: a process group of its own."""
    env = dict(os.environ if env is None else env)
    argv, cwd = [str(a) for a in argv], str(cwd or os.getcwd())
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith(AT_START) and k not in AT_RUN))
    if key not in _WARM:
        _WARM[key] = _Warm(env)
    try:
        return WarmProcess(_WARM[key], argv, stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=env, cwd=cwd,
                           errors=errors, group=process_group == 0)
    except _NoServer:
        group: dict[str, Any] = {} if process_group is None else {"process_group": process_group}
        return subprocess.Popen([sys.executable, *argv], stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=env,
                                cwd=cwd, errors=errors, **group)


def run_python(argv: list[Any], *, env: dict[str, str] | None = None, cwd: Any = None, input: str | None = None,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)``, forked from a warm
    interpreter (`popen_python`)."""
    proc = popen_python(argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def subprocess_module() -> types.SimpleNamespace:
    """The ``subprocess`` module as a library's module sees it, but whose ``Popen`` forks ``[sys.executable, ...]``
    from a warm interpreter (`popen_python`; other programs start as before): set as a module's ``subprocess``
    attribute, that module's Python children are spared TensorFlow's import and the rest of it runs as it does."""
    def popen(cmd: list[Any], **kwargs: Any) -> WarmProcess | subprocess.Popen:
        if cmd[0] != sys.executable:
            return subprocess.Popen(cmd, **kwargs)
        kwargs.pop("bufsize", None)  # (a line-buffered stdin: the library flushes what it writes)
        return popen_python(cmd[1:], **kwargs)

    warm = types.SimpleNamespace(**{name: getattr(subprocess, name) for name in dir(subprocess)
                                    if not name.startswith("__")})
    warm.Popen = popen
    return warm
