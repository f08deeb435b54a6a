"""The kernel audit's side of the backend interface: how a backend reads what actually ran.

Each backend answers `Backend.kernel_audit` with a `KernelAudit` (or ``None``: the audit says it was not measured):
the variables the audited process starts with, hooks around the measured steps, and a reader turning a `Capture`
into a `KernelReading` of `KernelRecord` values. Plain data only: no TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# What a record's ``shape`` describes, for matching it to layers (and the family the audit's warnings group it in).
CONVOLUTION, INNER_PRODUCT, MATMUL = "convolution", "inner_product", "matmul"


@dataclass(frozen=True)
class KernelRecord:
    """One kernel execution, as a backend read it.

    Attributes:
        kind: The kernel's kind as the vendor names it (``"convolution"``, ``"gemm"``, ``"reorder"``...).
        dtype: The dtype it computed in (``"bfloat16"``, ``"float32"``...; ``"unknown"`` when not said).
        unit: What executed it (``"AMX"``, ``"AVX512-BF16"``, ``"Tensor Cores"``...; ``"unknown"`` when not said).
        time_ms: Its time, in milliseconds.
        compute: Whether it did matrix work (counted in the compute time).
        reorder: Whether it was a layout copy (counted apart).
        matrix_unit: Whether it ran on the device's matrix units (``None``: not said).
        emulated: Whether it was reduced precision on hardware without instructions for it.
        problem: What ``shape`` describes (`CONVOLUTION`: ``kh``, ``kw``, ``kd``, ``ic``, ``oc``, ``g``;
            `INNER_PRODUCT`: ``mb``, ``ic``, ``oc`` and the source's ``ih``, ``iw``, ``id``; `MATMUL`: ``M``,
            ``K``, ``N``, ``batch``), and the family the audit's warnings group the kernel in; ``""``: neither.
        shape: The problem's sizes, to match the kernel to the layer that ran it (empty: not known).
        op: The TensorFlow op that ran it (``"model/dense/MatMul"``), to match it to a layer by name scope.
    """

    kind: str
    dtype: str
    unit: str
    time_ms: float
    compute: bool
    reorder: bool = False
    matrix_unit: bool | None = False
    emulated: bool = False
    problem: str = ""
    shape: Mapping[str, int] = field(default_factory=dict)
    op: str | None = None


@dataclass(frozen=True)
class Capture:
    """What the audit captured of a run, for `KernelAudit.read`.

    Attributes:
        lines: The measured steps' standard output (the child's, between its markers; the trainer's window).
        header: The standard output before the measured steps (a library's version banner).
        doc: What the process recorded: ``model``, ``plan`` (``backend``, ``policy``, ``compute_dtype``,
            ``xla``...), ``steps``, ``batch_size``, ``step_time_ms``, ``layers``, ``ops``, and ``facts`` (what
            `KernelAudit.facts` returned there).
        workdir: The folder `KernelAudit.begin` was given (``None`` in the trainer's process).
    """

    lines: tuple[str, ...] = ()
    header: tuple[str, ...] = ()
    doc: Mapping[str, Any] = field(default_factory=dict)
    workdir: str | None = None


@dataclass(frozen=True)
class KernelReading:
    """What a backend read of a run: its kernels, and what it says of them.

    Attributes:
        device: The device the kernels ran on, as the report names it (``"cpu"``, ``"nvidia"``).
        records: Each kernel execution (`KernelRecord`).
        source: Where the records came from, in words (``"oneDNN v3.7.3 verbose (57 records)"``).
        measured: Whether kernels were read at all.
        not_visible: Why the kernels that did the matrix work could not be seen (then no dtype is reported for
            them), or ``None``.
        notes: What else the backend says of the reading.
        warnings: The backend's own contradictions with the plan, each a dict with ``code``, ``what`` and
            ``fix`` (listed before the audit's generic ones).
    """

    device: str
    records: tuple[KernelRecord, ...] = ()
    source: str | None = None
    measured: bool = True
    not_visible: str | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[Mapping[str, str], ...] = ()


class KernelAudit:
    """How a backend reads the kernels that ran. Subclass it and override what applies; the defaults read nothing.

    Attributes:
        device: The device the report names (``"cpu"``, ``"nvidia"``, ``"xpu"``).
        environment: ``(name, value)`` variables the audited process must start with.
        record_prefix: The start of the lines the kernels print on standard output (the trainer's observer keeps
            those of its window and drops the others), or ``None``: nothing is printed.
        records_name: What those lines are, in words, for the observer's messages (``"oneDNN's verbose records"``).
        unavailable: Why nothing can be read on this backend's devices, or ``None``.
        reads_traces: Whether `read_trace` reads a profiler trace.
    """

    device: str = "?"
    environment: tuple[tuple[str, str], ...] = ()
    record_prefix: str | None = None
    records_name: str = "the kernels' records"
    unavailable: str | None = None
    reads_traces: bool = False

    def capturing(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether a process started with ``environ`` prints the records (default: it holds `environment`).

        Args:
            environ: The process's environment (default: this one's).

        Returns:
            True when the records are printed there.
        """
        env = os.environ if environ is None else environ
        return all(env.get(name) == value for name, value in self.environment)

    def begin(self, workdir: str) -> None:
        """Called in the audited process just before the measured steps.

        Args:
            workdir: An empty folder for what the backend records (a profiler's trace); `Capture.workdir`.
        """

    def end(self) -> None:
        """Called in the audited process just after the measured steps."""

    def facts(self) -> dict[str, Any]:
        """What the audited process records of itself for `read` (`Capture.doc` ``["facts"]``).

        Returns:
            Plain JSON data (none by default).
        """
        return {}

    def read(self, capture: Capture) -> KernelReading:
        """Read what was captured of a run.

        Args:
            capture: The run's standard output, its document and its work folder.

        Returns:
            The kernels that ran and what the backend says of them.

        Raises:
            NotImplementedError: The backend reads nothing (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} reads no kernels")

    def read_trace(self, path: str | os.PathLike[str]) -> KernelReading:
        """Read a profiler trace recorded elsewhere (where `reads_traces`).

        Args:
            path: A trace file, or the folder that holds one.

        Returns:
            The kernels of the trace.

        Raises:
            NotImplementedError: The backend reads no traces (the default).
            ValueError: ``path`` holds no trace the backend can read.
        """
        raise NotImplementedError(f"{type(self).__name__} reads no profiler traces")

