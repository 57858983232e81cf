"""What one hardware event means for one candidate, or for a host that runs no candidate.

The rules (a correlation informs the decision; it never proves a cause):

- supports a hardware fault: an Xid the catalog marks ``supports_isolation`` on the rank's GPU (for
  Xid 154, when the recovery action it names is a reset, reboot or drain), a
  fatal SXid on its host's NVSwitch, NVLink error counters that rose (or a link that went down) on
  its GPU, a fatal PCIe AER on its PCIe path (the GPU or a bridge above it), a row-remap failure or
  new uncorrectable rows on its GPU;
- points at the application: an Xid the catalog marks ``application_error`` (13, 31, 43, ...) on
  its GPU, or the OOM killer taking its process while its dump exists;
- explains a missing dump: the OOM killer took the rank's pid (or, when the manifest has no pid, a
  process named like a training process on its host) and the rank stopped reporting;
- unrelated: everything else on its host in the window, each with the reason why.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from denpex.analysis.models import CandidateKind, HardwareBearing
from denpex.hardware.events import HardwareEvent, Severity, SignalKind
from denpex.hardware.pci import same_pci_device
from denpex.hardware.placement import RankPlacement, same_gpu
from denpex.hardware.xid_catalog import XidCatalog

__all__ = ["Reading", "describe_event", "is_fault_signal", "read_for_candidate", "read_elsewhere"]


class Reading(BaseModel):
    """The bearing of one event and the sentence that says why."""

    model_config = ConfigDict(frozen=True)

    bearing: HardwareBearing
    summary: str


def describe_event(event: HardwareEvent, catalog: XidCatalog) -> str:
    """What happened, in a few words: ``Xid 79 (GPU has fallen off the bus; reboot_node)``."""
    if event.kind is SignalKind.XID:
        entry = catalog.lookup(event.code) if event.code is not None else None
        if entry is None:
            what = f"Xid {event.code} (not in Denpex's Xid catalog)"
        else:
            action = entry.action_phrase(event.recovery_action)
            what = f"Xid {event.code} ({entry.name}; {entry.bucket.value}{f'; {action}' if action else ''})"
        return what + (f" for pid {event.pid}" if event.pid is not None else "")
    if event.kind is SignalKind.SXID:
        link = f", link {event.link}" if event.link is not None else ""
        return f"{_severity_word(event.severity)} SXid {event.code} on NVSwitch {event.device_pci}{link}"
    if event.kind is SignalKind.NVLINK:
        return f"NVLink {event.detail}"
    if event.kind is SignalKind.PCIE_AER:
        reporter = f" (reported by {event.reporter_pci})" if event.reporter_pci else ""
        return f"{_severity_word(event.severity)} PCIe AER on {event.device_pci or 'an unnamed device'}{reporter}"
    if event.kind is SignalKind.OOM:
        comm = f" ({event.comm})" if event.comm else ""
        return f"{event.detail or 'OOM kill'} of pid {event.pid}{comm}"
    return f"row remapper: {event.detail}"


def is_fault_signal(event: HardwareEvent, catalog: XidCatalog) -> bool:
    """True when the event, on whatever device it names, is the kind that supports a hardware fault."""
    if event.kind is SignalKind.XID:
        entry = catalog.lookup(event.code) if event.code is not None else None
        return entry is not None and entry.supports_isolation_for(event.recovery_action)
    if event.kind in (SignalKind.SXID, SignalKind.PCIE_AER):
        return event.severity is Severity.FATAL
    if event.kind is SignalKind.NVLINK:
        return True
    if event.kind is SignalKind.ROW_REMAP:
        return event.severity in (Severity.FATAL, Severity.NON_FATAL)
    return False


def read_for_candidate(
    event: HardwareEvent,
    place: RankPlacement,
    kind: CandidateKind,
    *,
    catalog: XidCatalog,
    training_comms: frozenset[str],
) -> Reading:
    """The bearing of an event on the candidate's host for that candidate."""
    what = describe_event(event, catalog)
    if event.kind is SignalKind.OOM:
        return _read_oom(event, place, kind, what, training_comms)
    if event.kind is SignalKind.SXID:
        if event.severity is Severity.FATAL:
            return _supports(f"{what} on this rank's host: consistent with a fault in the node's NVLink fabric")
        return _unrelated(f"{what} on this rank's host: not fatal, so it does not support isolation by itself")
    if event.kind is SignalKind.PCIE_AER:
        return _read_aer(event, place, what)
    on_gpu = same_gpu(event.gpu, place.gpu)
    if event.kind is SignalKind.XID and on_gpu is None and event.pid is not None and event.pid == place.pid:
        on_gpu = True  # the Xid names this rank's process
    if on_gpu is not True:
        return _unrelated(f"{what} {_other_gpu_phrase(event, place, on_gpu)}")
    gpu = place.gpu.label() if place.gpu else "its GPU"
    if event.kind is SignalKind.XID:
        entry = catalog.lookup(event.code) if event.code is not None else None
        if entry is None:
            return _unrelated(f"{what} on this rank's GPU {gpu}: unknown code, so it is not counted for isolation; check NVIDIA's Xid catalog")
        if entry.supports_isolation_for(event.recovery_action):
            return _supports(f"{what} on this rank's GPU {gpu}: consistent with a hardware fault")
        if entry.recovery_actions:
            return _unrelated(
                f"{what} on this rank's GPU {gpu}: this recovery action does not support isolation by itself"
            )
        if entry.application_error:
            return Reading(
                bearing=HardwareBearing.POINTS_AT_APPLICATION,
                summary=f"{what} on this rank's GPU {gpu}: consistent with an application error, not a reason to drain the node",
            )
        return _unrelated(f"{what} on this rank's GPU {gpu}: a watch-level Xid; it does not support isolation by itself")
    if is_fault_signal(event, catalog):
        return _supports(f"{what} on this rank's GPU {gpu}: consistent with a hardware fault")
    return _unrelated(f"{what} on this rank's GPU {gpu}: does not support isolation by itself")


def read_elsewhere(event: HardwareEvent, *, catalog: XidCatalog, owner: str) -> Reading:
    """The bearing of an event on a host (or GPU) that runs no candidate; ``owner`` names what runs there."""
    what = describe_event(event, catalog)
    if is_fault_signal(event, catalog):
        return _supports(
            f"{what} on {owner}: consistent with a hardware fault outside the candidates, so the hang may have started there"
        )
    if event.kind is SignalKind.XID:
        entry = catalog.lookup(event.code) if event.code is not None else None
        if entry is not None and entry.application_error:
            return Reading(
                bearing=HardwareBearing.POINTS_AT_APPLICATION,
                summary=f"{what} on {owner}: consistent with an application error there",
            )
    return _unrelated(f"{what} on {owner}: does not point at a hardware fault")


def _read_oom(
    event: HardwareEvent, place: RankPlacement, kind: CandidateKind, what: str, training_comms: frozenset[str]
) -> Reading:
    if place.pid is not None:
        if event.pid != place.pid:
            return _unrelated(f"{what} on this rank's host; this rank's pid is {place.pid}")
        if kind is CandidateKind.STOPPED_REPORTING:
            return Reading(
                bearing=HardwareBearing.EXPLAINS_MISSING_DUMP,
                summary=f"{what}, this rank's process: consistent with its missing dump (host memory, not a GPU fault)",
            )
        return Reading(
            bearing=HardwareBearing.POINTS_AT_APPLICATION,
            summary=f"{what}, this rank's process: consistent with host memory exhaustion by the job, not a GPU fault",
        )
    if kind is CandidateKind.STOPPED_REPORTING and event.comm is not None and event.comm in training_comms:
        return Reading(
            bearing=HardwareBearing.EXPLAINS_MISSING_DUMP,
            summary=(
                f"{what} on this rank's host: the manifest has no pid for this rank, so it may be another "
                "process; if it was this rank's, it is consistent with its missing dump"
            ),
        )
    return _unrelated(f"{what} on this rank's host; add the rank's pid to the manifest to tie OOM kills to it")


def _read_aer(event: HardwareEvent, place: RankPlacement, what: str) -> Reading:
    gpu_pci = place.gpu.pci_bus_id if place.gpu else None
    device = event.device_pci
    on_path = device is not None and (
        same_pci_device(device, gpu_pci) or device in (place.pcie_path or ())
    )
    if not on_path:
        path_note = "" if place.pcie_path is not None else "; the bridges above its GPU are not known (collect-telemetry records them)"
        return _unrelated(f"{what}: not on this rank's known PCIe path{path_note}")
    if event.severity is Severity.FATAL:
        return _supports(f"{what} on this rank's PCIe path: consistent with a PCIe fault")
    return _unrelated(f"{what} on this rank's PCIe path: not fatal, so it does not support isolation by itself")


def _other_gpu_phrase(event: HardwareEvent, place: RankPlacement, on_gpu: bool | None) -> str:
    where = f"GPU {event.gpu.label()}" if event.gpu else "an unnamed GPU"
    if on_gpu is False:
        return f"on {where} of this host, not this rank's GPU"
    if place.gpu is None:
        return (
            f"on {where} of this host; this rank's GPU is not known (add gpu_pci_bus_id to the manifest), "
            "so it is not tied to this rank"
        )
    return f"on {where} of this host; it cannot be matched to this rank's GPU {place.gpu.label()}"


def _supports(summary: str) -> Reading:
    return Reading(bearing=HardwareBearing.SUPPORTS_HARDWARE_FAULT, summary=summary)


def _unrelated(summary: str) -> Reading:
    return Reading(bearing=HardwareBearing.UNRELATED, summary=summary)


def _severity_word(severity: Severity) -> str:
    return {
        Severity.FATAL: "fatal",
        Severity.NON_FATAL: "non-fatal",
        Severity.CORRECTABLE: "corrected",
        Severity.UNKNOWN: "unclassified",
    }[severity]
