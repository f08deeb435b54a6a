"""The backend interface and the registry that finds vendor backends.

A backend probes its hardware (`Backend.probe`: never initialising CUDA), judges that probe purely
(`Backend.assess`: which policies and settings are native, functional, emulated or unsafe there, and which it
prefers), adds its report rows, names and applies its own settings (`Backend.vendor_settings`, `Backend.apply`),
describes its catalogue devices and reads its kernels (`Backend.kernel_audit`). Backends register through the
``amp_backends.backends`` entry point group; `BackendRegistry` keeps them (and why any failed to load) in an
object, so tests can build their own. A backend that fails never breaks the others.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Iterator

from .assessment import Assessment, VendorSetting
from .errors import AmpConfigError, BackendError
from .hardware import BackendProbe, Hardware, KnownDevice
from .kernel_audit import KernelAudit

if TYPE_CHECKING:  # pragma: no cover
    from .plan import Plan

ENTRY_POINT_GROUP = "amp_backends.backends"


class Backend(abc.ABC):
    """One vendor: a subclass, registered in the ``amp_backends.backends`` entry point group (see the
    documentation's "Writing a backend"). It implements `probe` and `assess`; the rest is optional.

    Attributes:
        name: The backend's name, as ``backend=`` and ``AMP_BACKEND`` take it (``"nvidia"``).
        priority: Among the available backends the highest plans (the shipped ones: nvidia 300, intel 200, cpu 100).
        tf_device_type: The device type TensorFlow lists for it (``"GPU"``, ``"XPU"``), or ``None`` (the CPU's
            backend: always there). Where TensorFlow is consulted (``auto_configure``, ``amp-backends info``), a
            backend whose probe finds hardware that TensorFlow does not list as this type is not available.
    """

    name: ClassVar[str]
    priority: ClassVar[int]
    tf_device_type: ClassVar[str | None] = None

    @abc.abstractmethod
    def probe(self, *, use_tensorflow: bool = False) -> BackendProbe:
        """Look at the machine: never initialise CUDA or another device runtime (a probe must stay cheap and must not
        change the process).

        Args:
            use_tensorflow: Whether TensorFlow may be imported to look (else read drivers, files, package metadata).

        Returns:
            The probe: available with its devices, or not available with the reason.
        """

    @abc.abstractmethod
    def assess(self, probe: BackendProbe, hardware: Hardware) -> Assessment:
        """Judge an available probe: each dtype policy's support with its reason, TF32, XLA, loss scaling.

        Pure (no I/O), so tests can pass fake hardware; an exception here is recorded as this backend's failure and
        the next backend plans.

        Args:
            probe: This backend's probe, available.
            hardware: The whole machine, every backend's probe (for what another one found).

        Returns:
            The assessment the planner decides from (every policy of `amp_backends.assessment.POLICIES` judged).
        """

    def report_rows(self, probe: BackendProbe) -> list[tuple[str, str]]:
        """Rows ``(label, value)`` for the hardware part of the capability report (``amp-backends info``); where the
        probe is not available and the rows have no ``status``, the report puts that row first.

        Args:
            probe: This backend's probe.

        Returns:
            The rows (by default: status, summary, the probe's details).
        """
        rows = [("status", "available" if probe.available else f"not available: {probe.reason}")]
        if probe.available:
            rows.append(("summary", probe.reason))
        rows.extend((k.replace("_", " "), v) for k, v in probe.details)
        return rows

    def software_rows(self) -> list[tuple[str, str]]:
        """Rows ``(label, value)`` for the software this backend relies on (nvidia-ml-py, ITEX).

        Returns:
            The rows (none by default).
        """
        return []

    def vendor_settings(self, plan: "Plan") -> tuple[VendorSetting, ...]:
        """The backend's own settings for a resolved plan (pure). `apply` reads them back.

        Args:
            plan: The plan, every other setting decided (this backend's).

        Returns:
            The settings, each with its value and why (none by default).
        """
        return ()

    def apply(self, plan: "Plan", tf: Any) -> list[str]:
        """Apply the plan's vendor settings beyond the Keras policy, TF32 and XLA (`Plan.vendor_setting` reads each).

        Args:
            plan: The plan being applied (this backend's).
            tf: The imported ``tensorflow`` module.

        Returns:
            Notes for the log, one per setting changed (none by default).
        """
        return []

    def peers(self, probe: BackendProbe) -> tuple[Peer, ...]:
        """What a user of this hardware would pick instead of the plan, for the model zoo to run beside it.

        Args:
            probe: This backend's probe of the machine.

        Returns:
            The peers that apply here (none by default).
        """
        return ()

    def catalogue(self) -> tuple["KnownDevice", ...]:
        """This vendor's devices in the device catalogue, each with the sources of its figures.

        Returns:
            The entries (none by default).
        """
        return ()

    def describe(self, device: "KnownDevice") -> BackendProbe:
        """The probe this backend would give on a machine with ``device`` alone (pure: no I/O). The catalogue adds
        where the entry's figures come from (`KnownDevice.cite`).

        Args:
            device: One of this backend's `catalogue` entries.

        Returns:
            An available probe of the device.

        Raises:
            NotImplementedError: The backend implements no ``describe`` (needed where it lists a catalogue).
        """
        raise NotImplementedError(f"the {self.name} backend lists {device.name!r} in its catalogue but does not "
                                  "describe it: it implements no describe(device)")

    def kernel_audit(self) -> KernelAudit | None:
        """How the audit reads the kernels that ran under this backend's plans (a fresh object each call).

        Returns:
            A `KernelAudit`, or ``None`` (the default): the audit then says the kernels were not measured.
        """
        return None


@dataclass(frozen=True)
class Peer:
    """A configuration a user would pick instead of the plan (float32 with another math library, a graph rewrite),
    set up the way it must be.

    Attributes:
        name: The configuration's name in the zoo's tables, without commas (``"fp32 oneDNN-off"``).
        why: What it is, and who would pick it.
        env: Environment variables its process starts with.
        rewrite: A grappler rewrite to turn on (``"auto_mixed_precision_onednn_bfloat16"``), or ``None``.
    """

    name: str
    why: str
    env: tuple[tuple[str, str], ...] = ()
    rewrite: str | None = None


class BackendRegistry:
    """Backends by name, ordered by priority, plus the reason any backend failed to load.

    Args:
        backends: Backends to register at once, as `register` does.

    Attributes:
        load_errors: Why each entry point that failed to load failed, by entry point name.
    """

    def __init__(self, backends: Iterable[Backend] = ()) -> None:
        self._backends: dict[str, Backend] = {}
        self.load_errors: dict[str, str] = {}
        for backend in backends:
            self.register(backend)

    def register(self, backend: Backend) -> None:
        """Add a backend.

        Args:
            backend: A `Backend` instance with its ``name`` and ``priority``.

        Raises:
            AmpConfigError: ``backend`` is no `Backend`, lacks its name or priority, or has a registered name.
        """
        if not isinstance(backend, Backend):
            raise AmpConfigError(f"register() takes a Backend instance. Received: {backend!r} (of type "
                                 f"{type(backend).__name__}).")
        name, priority = getattr(backend, "name", None), getattr(backend, "priority", None)
        if not (isinstance(name, str) and name.strip()) or isinstance(priority, bool) or not isinstance(priority, int):
            raise AmpConfigError(
                f"A Backend sets name (a str, as backend= takes it) and priority (an int: the highest available "
                f"backend plans; the shipped ones: nvidia 300, intel 200, cpu 100). Received: {type(backend).__name__}"
                f" with name={name!r}, priority={priority!r}. Fix: set both as class attributes of "
                f"{type(backend).__name__}.")
        if backend.name in self._backends:
            raise AmpConfigError(f"A backend named {backend.name!r} is already registered.")
        self._backends[backend.name] = backend

    def names(self) -> tuple[str, ...]:
        """Registered names, highest priority first."""
        return tuple(b.name for b in self)

    def known_names(self) -> tuple[str, ...]:
        """The names a request may use: registered backends, then those that failed to load (asking for one
        of those gives an error that says why it failed)."""
        return self.names() + tuple(n for n in self.load_errors if n not in self._backends)

    def get(self, name: str) -> Backend:
        """The registered backend ``name``.

        Args:
            name: A backend's name.

        Returns:
            The backend.

        Raises:
            KeyError: No backend of that name is registered (the message lists those that are).
        """
        try:
            return self._backends[name]
        except KeyError:
            raise KeyError(f"No backend named {name!r}. Registered: {', '.join(self.names()) or 'none'}.") from None

    def kernel_audit(self, name: str) -> KernelAudit | None:
        """The kernel audit of the backend ``name`` (`Backend.kernel_audit`).

        Args:
            name: A backend's name.

        Returns:
            Its `KernelAudit`, or ``None`` when it offers none or is not registered.

        Raises:
            BackendError: Its ``kernel_audit()`` raised or returned something else.
        """
        backend = self._backends.get(name)
        return None if backend is None else call_backend(backend, "kernel_audit", (KernelAudit, type(None)),
                                                         "a KernelAudit or None")

    def audit_environment(self) -> dict[str, str]:
        """The variables an audited process starts with before it knows its plan: every backend's
        `KernelAudit.environment`.

        Returns:
            Name -> value, the higher-priority backend's value first; a failing audit adds nothing.
        """
        env: dict[str, str] = {}
        for backend in self:
            try:
                audit = self.kernel_audit(backend.name)
                pairs = [(str(name), str(value)) for name, value in (audit.environment if audit else ())]
            except Exception:  # a broken third-party backend must not break the others' audits
                continue
            for name, value in pairs:
                env.setdefault(name, value)
        return env

    def __iter__(self) -> Iterator[Backend]:
        return iter(sorted(self._backends.values(), key=lambda b: -b.priority))

    def __len__(self) -> int:
        return len(self._backends)

    @classmethod
    def from_entry_points(cls, group: str = ENTRY_POINT_GROUP) -> "BackendRegistry":
        """The backends installed in the entry point group ``group``; one that fails to load, or that names itself
        otherwise than its entry point (it could take a shipped backend's place), is in `load_errors`.

        Args:
            group: The entry point group.

        Returns:
            The registry.

        Raises:
            BackendError: No backend is installed there (the package's metadata is missing).
        """
        registry = cls()  # the shipped backends first: an installed package cannot take their names
        for ep in sorted(metadata.entry_points(group=group), key=lambda ep: not ep.value.startswith("amp_backends.")):
            try:
                obj = ep.load()
                backend = obj() if isinstance(obj, type) else obj
                name = getattr(backend, "name", None)
                if isinstance(backend, Backend) and isinstance(name, str) and name != ep.name:
                    raise BackendError(f"the entry point {ep.name!r} ({ep.value}) loads a backend named {name!r}; "
                                       "a backend is named as its entry point, the name backend= takes. Fix: "
                                       f"{AT_FAULT} (its package must give its entry point and its backend one name, "
                                       "which no other installed backend has).")
                registry.register(backend)
            except Exception as exc:  # a broken third-party backend must not break the others
                registry.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
        if not len(registry):
            raise BackendError(f"No amp_backends backends are registered under the entry point group {group!r}. The "
                               "package metadata is missing: install the project (pip install . or pip install -e .).")
        return registry


AT_FAULT = "that backend is at fault: update or uninstall its package"  # (a fix of a backend's fault)
PLAN_ANOTHER = f"{AT_FAULT}, or pass backend= to plan with another"


def method_of(backend: Backend, method: str) -> str:
    """A backend's method as its faults name it: ``the acme backend's probe() (acme_amp.AcmeBackend)``.

    Args:
        backend: A registered backend.
        method: The name of one of its `Backend` methods.

    Returns:
        The words.
    """
    return f"the {backend.name} backend's {method}() ({type(backend).__module__}.{type(backend).__qualname__})"


def call_backend(backend: Backend, method: str, expected: type | tuple[type, ...], what: str, *args: Any,
                 then: str = "", fix: str = PLAN_ANOTHER) -> Any:
    """``backend.<method>(*args)``, what a backend's method gives the library checked, as our error.

    Args:
        backend: A registered backend (shipped or a third party's).
        method: The name of the `Backend` method to call.
        expected: The types its result may have.
        what: Those types, as the error says them (``"a tuple of KnownDevice"``).
        *args: The method's arguments.
        then: What follows from the fault, as the error says it after the fault (``": its devices are left out"``).
        fix: The error's fix.

    Returns:
        The method's result.

    Raises:
        BackendError: The method raised (the exception is its ``__cause__``) or returned none of ``expected``; the
            message names the backend, its class and the method.
    """
    where = method_of(backend, method)
    try:
        result = getattr(backend, method)(*args)
    except Exception as exc:
        raise BackendError(f"{where} raised {type(exc).__name__}: {exc}{then}. Fix: {fix}.") from exc
    if not isinstance(result, expected):
        raise BackendError(f"{where} returned {type(result).__name__} ({str(result)[:80]!r}); expected {what}{then}. "
                           f"Fix: {fix}.")
    return result


@functools.lru_cache(maxsize=1)
def default_registry() -> BackendRegistry:
    """The registry of installed backends (built once per process).

    Returns:
        The backends installed through the ``amp_backends.backends`` entry point group.
    """
    return BackendRegistry.from_entry_points()


def registry_or_default(registry: BackendRegistry | None) -> BackendRegistry:
    """``registry`` as a caller passed it (empty or not), or `default_registry` where it passed ``None``; anything
    else is an `AmpConfigError`."""
    if registry is None:
        return default_registry()
    if not isinstance(registry, BackendRegistry):
        raise AmpConfigError(f"registry must be a BackendRegistry or None. Received: {registry!r} (of type "
                             f"{type(registry).__name__}). Fix: leave registry out to plan with the installed "
                             "backends, or pass BackendRegistry([...]) with the backends to plan with.")
    return registry
