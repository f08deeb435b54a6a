"""Import TensorFlow without its start-up noise, unless the user chose a log level (the commands use it).

Importing TensorFlow writes about eight harmless but alarming lines to stderr (absl's pre-init notice, oneDNN
and cudart notices, ``cuInit`` errors; on 2.15 cuDNN/cuFFT/cuBLAS factory errors), before
``TF_CPP_MIN_LOG_LEVEL`` takes effect. Unless that variable is set, `quiet_tensorflow_logs` sets it and absl's
logger before the import, and `import_tensorflow` imports TensorFlow with stderr passed through a filter in a
child process that drops the known noise (`NOISE`) and keeps everything else, a crash's last words included.

The import allocates hundreds of thousands of long-lived objects: `import_tensorflow` pauses the cyclic garbage
collector while it runs (the collector would walk the growing heap again and again), and a process of the library's
own (a command, a worker) calls `exit_quickly` so that it ends without a last collection over them.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"

# Lines of TensorFlow's start-up that say nothing is wrong. Verbose regex, matched anywhere in a line.
NOISE = r"""
    ^WARNING:\ All\ log\ messages\ before\ absl::InitializeLog\(\)          # absl, before TF initialises logging
  | ^[IW]\d{4}\ [\d:.]+\s+\d+\ [\w./-]+:\d+\]                              # absl C++ INFO/WARNING (TF >= 2.16)
  | ^\d{4}-\d\d-\d\d\ [\d:.]+:\ [IW]\ [\w./-]+:\d+\]                       # TF's C++ INFO/WARNING (TF <= 2.15)
  | ^To\ enable\ the\ following\ instructions:                            # 2nd line of the CPU-feature notice
  | failed\ call\ to\ cuInit                                              # no GPU: CUDA cannot start
  | Unable\ to\ register\ cu(DNN|FFT|BLAS)\ factory                       # TF 2.15's duplicate registrations
  | TF-TRT\ Warning:\ Could\ not\ find\ TensorRT
"""

_FILTER = (
    "import re, sys\n"
    "noise = re.compile(sys.argv[1], re.X)\n"
    "out = sys.stdout.buffer\n"
    "for line in sys.stdin.buffer:\n"
    "    if not noise.search(line.decode('utf-8', 'replace')):\n"
    "        out.write(line); out.flush()\n"
)


def quiet_tensorflow_logs(environ: MutableMapping[str, str] | None = None) -> bool:
    """Before TensorFlow is imported: ``TF_CPP_MIN_LOG_LEVEL=2`` and absl's Python logger at ERROR, unless
    the user set ``TF_CPP_MIN_LOG_LEVEL``. Returns whether it quieted (then filter the import too)."""
    env = os.environ if environ is None else environ
    if LEVEL_VARIABLE in env:
        return False
    env[LEVEL_VARIABLE] = "2"
    logging.getLogger("absl").setLevel(logging.ERROR)
    return True


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Pass everything written to file descriptor 2 (C++ included) through the `NOISE` filter."""
    if os.name != "posix":
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        # a session of its own: a terminal's Ctrl-C is the parent's to handle, the filter runs until its pipe closes
        child = subprocess.Popen([sys.executable, "-S", "-E", "-c", _FILTER, NOISE], stdin=subprocess.PIPE,
                                 stdout=saved, stderr=saved, start_new_session=True)
    except OSError:
        os.close(saved)
        yield
        return
    assert child.stdin is not None
    os.dup2(child.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:  # something TensorFlow started still holds the pipe
            child.kill()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Cyclic garbage collection off for the block (as it was after: a collector the program turned off stays off)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def interrupt_held() -> Iterator[None]:
    """A first Ctrl-C during the block is held until the block ends, then raised (`KeyboardInterrupt`); a second
    one interrupts at once. An import stopped half-way leaves its modules half made, and CPython, interrupted
    while a C extension runs Python code (pybind11's), ends the process by SIGINT even after the program handled
    the interrupt and chose its exit status. Where the program set its own SIGINT handler, or off the main thread,
    nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or (
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    asked: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        asked.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (a second Ctrl-C: at once)
        with contextlib.suppress(OSError):  # (not print: the handler may interrupt a write to sys.stderr)
            os.write(2, b"\nCtrl-C: stopping as soon as TensorFlow has started (press it again to stop now)\n")

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if asked:
        raise KeyboardInterrupt


def import_tensorflow(quiet: bool) -> Any:
    """Import TensorFlow and start its devices (a Ctrl-C meanwhile stops the program when they have started:
    `interrupt_held`); with ``quiet``, its start-up noise filtered out."""
    if not quiet or "tensorflow" in sys.modules:
        with interrupt_held(), collector_paused():
            import tensorflow as tf

        return tf
    with interrupt_held(), filtered_stderr(), collector_paused():
        import tensorflow as tf

        with contextlib.suppress(Exception):  # (reported by whoever lists devices next)
            tf.config.list_physical_devices()  # device start-up (cuInit) logs here
    return tf


def exit_quickly() -> None:
    """In a process of the library's own: at its exit, move all objects to the permanent generation (`gc.freeze`),
    so that the interpreter ends without walking TensorFlow's objects once more. The other exit handlers still run
    (logging's flushes its handlers) and files are closed as usual; objects left in reference cycles are not
    finalized, which Python allows at exit."""
    atexit.register(gc.freeze)
