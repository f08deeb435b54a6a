"""The backend interface and the registry that finds vendor backends.

A backend answers a handful of questions:

* :meth:`Backend.probe` — what is there (without initialising CUDA; TensorFlow only if allowed),
* :meth:`Backend.assess` — a *pure* judgement of that probe: which dtype policies, TF32 and XLA are
  native, merely functional, emulated (slow) or unsafe there, and which the backend prefers and why,
* :meth:`Backend.report_rows` — its rows in the capability report,
* :meth:`Backend.apply` — vendor-specific settings beyond Keras and ``tf.config`` (ITEX's config).

Backends are registered through the ``amp_backends.backends`` entry point group, so a new vendor is
one new folder plus one registration; :class:`BackendRegistry` keeps them (and the reasons any failed
to load) in an object, never in module globals, so tests can build their own.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping

from .hardware import BackendProbe, Hardware

if TYPE_CHECKING:  # pragma: no cover
    from .plan import Plan

ENTRY_POINT_GROUP = "amp_backends.backends"

# How well a device supports a setting. Only "native" is chosen automatically.
NATIVE = "native"  # fast hardware support
FUNCTIONAL = "functional"  # runs correctly, little or no speed-up: honoured with a warning when asked for
EMULATED = "emulated"  # runs, but slower than float32: downgraded unless force
UNSAFE = "unsafe"  # known to crash or corrupt: always refused
UNSUPPORTED = "unsupported"  # does not exist here (TF32 on a CPU): downgraded
LEVELS = (NATIVE, FUNCTIONAL, EMULATED, UNSAFE, UNSUPPORTED)


@dataclass(frozen=True)
class Support:
    """How a device supports one setting, and why."""

    level: str
    why: str

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"Support level must be one of {LEVELS}. Received: {self.level!r}.")


@dataclass(frozen=True)
class Assessment:
    """A backend's judgement of its probe, from which the planner builds a :class:`~amp_backends.plan.Plan`.

    ``preference`` lists dtype policies best first; the planner takes the first one whose support is
    ``native``. ``policies`` must hold an entry for each of ``float32``, ``mixed_float16`` and
    ``mixed_bfloat16``.
    """

    backend: str
    devices: tuple[str, ...]
    policies: Mapping[str, Support]
    preference: tuple[str, ...]
    tf32: Support
    xla: Support
    xla_default: bool
    tf32_default: bool = True
    itex_amp: Support = Support(UNSUPPORTED, "ITEX auto mixed precision needs an Intel XPU with ITEX")
    math_mode: str | None = None  # ITEX_FP32_MATH_MODE to use when the TF32 equivalent is on
    notes: tuple[str, ...] = field(default=())


class Backend(abc.ABC):
    """One vendor. Subclasses set ``name``, ``priority`` (higher wins) and ``tf_device_type``."""

    name: ClassVar[str]
    priority: ClassVar[int]
    title: ClassVar[str]
    # The device type TensorFlow lists for this backend ("GPU", "XPU"), or None (the CPU is always there).
    tf_device_type: ClassVar[str | None] = None

    @abc.abstractmethod
    def probe(self, *, use_tensorflow: bool = False) -> BackendProbe:
        """Look at the machine. Never initialise CUDA; import TensorFlow only if ``use_tensorflow``."""

    @abc.abstractmethod
    def assess(self, probe: BackendProbe, hardware: Hardware) -> Assessment:
        """Judge an *available* probe. Pure: no I/O, so tests can pass fake hardware."""

    def report_rows(self, probe: BackendProbe) -> list[tuple[str, str]]:
        """Rows ``(label, value)`` for the capability report."""
        rows = [("status", "available" if probe.available else f"not available: {probe.reason}")]
        if probe.available:
            rows.append(("summary", probe.reason))
        rows.extend((k.replace("_", " "), v) for k, v in probe.details)
        return rows

    def apply(self, plan: "Plan", tf: Any) -> list[str]:
        """Vendor settings beyond the Keras policy, TF32 and XLA. Returns notes for the log."""
        return []


class BackendRegistry:
    """Backends by name, ordered by priority, plus the reason any backend failed to load."""

    def __init__(self, backends: Iterable[Backend] = ()) -> None:
        self._backends: dict[str, Backend] = {}
        self.load_errors: dict[str, str] = {}
        for backend in backends:
            self.register(backend)

    def register(self, backend: Backend) -> None:
        if not isinstance(backend, Backend):
            raise TypeError(
                f"register() takes a Backend instance. Received: {backend!r} (of type {type(backend).__name__})."
            )
        if backend.name in self._backends:
            raise ValueError(f"A backend named {backend.name!r} is already registered.")
        self._backends[backend.name] = backend

    def names(self) -> tuple[str, ...]:
        """Registered names, highest priority first."""
        return tuple(b.name for b in self)

    def get(self, name: str) -> Backend:
        try:
            return self._backends[name]
        except KeyError:
            raise KeyError(f"No backend named {name!r}. Registered: {', '.join(self.names()) or 'none'}.") from None

    def __iter__(self):
        return iter(sorted(self._backends.values(), key=lambda b: -b.priority))

    def __len__(self) -> int:
        return len(self._backends)

    @classmethod
    def from_entry_points(cls, group: str = ENTRY_POINT_GROUP) -> "BackendRegistry":
        registry = cls()
        for ep in metadata.entry_points(group=group):
            try:
                obj = ep.load()
                registry.register(obj() if isinstance(obj, type) else obj)
            except Exception as exc:  # a broken third-party backend must not break the others
                registry.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
        if not len(registry):
            raise RuntimeError(
                f"No amp_backends backends are registered under the entry point group {group!r}. "
                "The package metadata is missing: install the project (pip install . or pip install -e .)."
            )
        return registry


@functools.lru_cache(maxsize=1)
def default_registry() -> BackendRegistry:
    """The registry of installed backends (built once per process)."""
    return BackendRegistry.from_entry_points()
