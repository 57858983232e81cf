"""Line hardware and host events up with the candidates of a triage.

``correlate`` returns a new ``TriageResult`` (the input is not changed) in which:

- every candidate's ``hardware`` lists the events on its host inside the hang window, each with a
  bearing and a sentence saying why (see ``denpex.hardware.bearing`` for the rules), and its
  ``reasons`` gain one line per event that bears on the decision;
- ``other_hardware`` lists events in the window on hosts that run no candidate;
- confidence and verdict follow the *elsewhere rule* below.

**Window.** From ``lead`` before the earliest ``enqueued_at`` of the stuck operations (default 5
min) to ``trail`` after ``as_of`` (the dumps; default 2 min, for clock skew and late log lines).
Without an enqueue time it starts ``default_lookback`` (15 min, torch's default NCCL timeout of
10 min plus margin) before ``as_of``. Without ``as_of`` either, every event counts, and a note
says so. A change seen between two readings (NVLink counters, remapped rows) counts when the span
between the readings meets the window.

**Elsewhere rule.** A *fault signal* (one that would support a hardware fault on its own device:
a supports-isolation Xid, a fatal SXid or AER, rising NVLink counters, a row-remap failure) in the
window but not on any candidate:

1. on a host or GPU the manifest assigns to a rank of this job: every candidate's confidence is
   multiplied by ``in_job_factor`` (0.5) and a ``localized`` verdict becomes ``ambiguous``, since
   the hang may have started on that rank;
2. on a host not known to run this job: confidence is multiplied by ``outside_job_factor`` (0.8);
   the verdict stays.

The stronger of the two applies once, however many such events there are. When some candidate's
host is unknown, events cannot be told apart from its own: they are reported, nothing is changed.
Application errors, corrected errors and OOM kills elsewhere are reported and change nothing.

**Tie rule** (:mod:`denpex.hardware.tie_break`). Members of an op the dumps cannot tell apart (a
``tied`` group) are separated by a fault on exactly one member's own GPU (an Xid matched to that
GPU, a fatal AER on its own PCI function) when every other member's GPU is named (PCI id or
UUID), its host's kernel log spans the hang, and nothing there could be its GPU's: that member alone is named and its groups become
``localized``. Not when a fault elsewhere in the job (rule 1) or an unknown host leaves doubt.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from denpex.analysis.models import (
    Candidate,
    CandidateHardware,
    HardwareBearing,
    TriageResult,
    Verdict,
)
from denpex.evidence.manifest import JobManifest
from denpex.hardware.bearing import Reading, is_fault_signal, read_elsewhere, read_for_candidate
from denpex.hardware.events import HardwareEvent, Severity, SignalKind, TelemetryParseResult
from denpex.hardware.pci import same_pci_device
from denpex.hardware.placement import GpuDirectory, RankPlacement, host_key, place_rank, same_gpu
from denpex.hardware.tie_break import MemberEvidence, separate_by_own_gpu
from denpex.hardware.xid_catalog import XidCatalog, default_xid_catalog

__all__ = ["CorrelationOptions", "HangWindow", "hang_window", "correlate", "supports_isolation"]

CAVEAT = "Hardware correlation informs the decision; it does not prove the cause."


class CorrelationOptions(BaseModel):
    """Tunable parts of the correlation. Defaults suit a production incident."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lead: timedelta = timedelta(minutes=5)
    default_lookback: timedelta = timedelta(minutes=15)
    trail: timedelta = timedelta(minutes=2)
    in_job_factor: float = Field(default=0.5, ge=0.0, le=1.0)
    outside_job_factor: float = Field(default=0.8, ge=0.0, le=1.0)
    # Process names a training rank has in OOM lines, used only when the manifest has no pid.
    training_comms: frozenset[str] = frozenset({"python", "python3", "pt_main_thread", "torchrun", "pt_elastic"})
    catalog: XidCatalog | None = None
    host_domain: str | None = None
    """The operator's DNS domain: ``gpu-node-002.<domain>`` and ``gpu-node-002`` are one host.
    Other names match exactly, so a host of another domain never lends a node its signals."""


class HangWindow(BaseModel):
    """The time span whose events are considered; an open end is ``None``."""

    model_config = ConfigDict(frozen=True)

    start: datetime | None
    end: datetime | None
    basis: str

    def contains(self, time: datetime) -> bool:
        """True when ``time`` lies inside the window (ends included)."""
        return (self.start is None or time >= self.start) and (self.end is None or time <= self.end)

    def holds(self, event: HardwareEvent) -> bool:
        """True when the event lies in the window.

        A change seen between two readings (``since`` to ``time``) happened somewhere in that span,
        so it counts when the span meets the window, e.g. a counter read before the dumps and again
        after them.
        """
        if event.since is None or event.since >= event.time:
            return self.contains(event.time)
        return (self.start is None or event.time >= self.start) and (self.end is None or event.since < self.end)


def hang_window(result: TriageResult, options: CorrelationOptions | None = None) -> HangWindow:
    """The window around the hang: shortly before the stuck op was enqueued, to the dumps."""
    options = options or CorrelationOptions()
    enqueued = [s.enqueued_at for s in result.stuck if s.enqueued_at is not None]
    end = result.as_of + options.trail if result.as_of else None
    if enqueued:
        return HangWindow(
            start=min(enqueued) - options.lead,
            end=end,
            basis=f"from {_minutes(options.lead)} before the stuck operation was enqueued to the dumps",
        )
    if result.as_of is not None:
        return HangWindow(
            start=result.as_of - options.default_lookback,
            end=end,
            basis=f"no enqueue time known: the {_minutes(options.default_lookback)} before the dumps",
        )
    return HangWindow(start=None, end=None, basis="no enqueue time and no as-of time: every event counts")


def supports_isolation(candidate: Candidate) -> bool:
    """True when at least one hardware event supports a hardware fault for this candidate.

    The isolation planner asks this before proposing a drain; it is support, not proof.
    """
    return any(h.bearing is HardwareBearing.SUPPORTS_HARDWARE_FAULT for h in candidate.hardware)


def correlate(
    result: TriageResult,
    manifest: JobManifest | None,
    telemetry: TelemetryParseResult | Sequence[HardwareEvent],
    *,
    options: CorrelationOptions | None = None,
) -> TriageResult:
    """A copy of ``result`` with ``candidates[].hardware``, ``other_hardware``, reasons and notes filled."""
    options = options or CorrelationOptions()
    catalog = options.catalog or default_xid_catalog()
    if not isinstance(telemetry, TelemetryParseResult):
        events = list(telemetry)
        telemetry = TelemetryParseResult(events=events, hosts=sorted({e.host for e in events if e.host}))
    window = hang_window(result, options)
    in_window = [e for e in telemetry.events if window.holds(e)]
    domain = options.host_domain
    directory = GpuDirectory(telemetry.gpus, domain=domain)
    placements = {
        c.rank: place_rank(c.rank, manifest, directory, fallback_host=c.host) for c in result.candidates
    }
    by_host: dict[str | None, list[HardwareEvent]] = defaultdict(list)
    for event in in_window:
        by_host[host_key(event.host, domain)].append(_completed(event, directory))
    covered = {host_key(h, domain) for h in telemetry.hosts}
    candidate_ranks = {c.rank for c in result.candidates}
    job = _JobMap(manifest, directory, domain)

    candidates: list[Candidate] = []
    members: dict[int, MemberEvidence] = {}
    elsewhere_in_job: list[str] = []
    for candidate in result.candidates:
        place = placements[candidate.rank]
        readings: list[tuple[HardwareEvent, Reading]] = []
        for event in by_host.get(host_key(place.host, domain), []) if place.host else []:
            reading = read_for_candidate(
                event, place, candidate.kind, catalog=catalog, training_comms=options.training_comms
            )
            owner = job.rank_of(event)
            if owner is not None and owner not in candidate_ranks and is_fault_signal(event, catalog):
                # A fault on another rank's GPU of this host: that rank may be where the hang began.
                elsewhere_in_job.append(f"{event.kind.value} on rank {owner}'s GPU on {event.host}")
            readings.append((event, reading))
        hardware = _aggregate(readings, host=place.host)
        members[candidate.rank] = _member_evidence(
            place, readings, telemetry, domain, named_gpu=_gpu_named(manifest, candidate.rank),
            needed=(window.start, result.as_of))
        reasons = list(candidate.reasons) + _reasons(hardware, place, telemetry, covered, domain)
        candidates.append(
            candidate.model_copy(
                update={"hardware": hardware, "reasons": reasons, "host": candidate.host or place.host}
            )
        )

    candidate_hosts = {host_key(p.host, domain) for p in placements.values() if p.host}
    hosts_unknown = any(p.host is None for p in placements.values())
    other_readings: list[tuple[HardwareEvent, Reading]] = []
    elsewhere_outside: list[str] = []
    for key, events in by_host.items():
        if key in candidate_hosts:
            continue
        for event in events:
            ranks = job.ranks_on(event.host)
            reading = read_elsewhere(event, catalog=catalog, owner=job.describe_owner(event, ranks))
            other_readings.append((event, reading))
            if is_fault_signal(event, catalog):
                label = f"{event.kind.value} on {event.host}"
                (elsewhere_in_job if ranks else elsewhere_outside).append(label)
    other = _aggregate(other_readings, host=None)

    notes = list(result.notes) + _notes(window, telemetry, len(telemetry.events) - len(in_window))
    if any(c.hardware for c in candidates) and CAVEAT not in notes:
        notes.append(CAVEAT)  # once for the report, not a reason of each candidate
    verdict, groups = result.verdict, result.groups
    if not elsewhere_in_job and not hosts_unknown:
        # A fault on another rank of the job may be where the hang began: then no tie is broken.
        separated = separate_by_own_gpu(groups, candidates, verdict, members)
        candidates, verdict, groups = separated.candidates, separated.verdict, separated.groups
        notes += separated.notes
    factor = 1.0
    if (elsewhere_in_job or elsewhere_outside) and hosts_unknown:
        notes.append(
            "Fault signals were seen on hosts that may or may not run a candidate (some candidates' hosts "
            "are unknown); confidence and verdict were left unchanged."
        )
    elif elsewhere_in_job:
        factor = options.in_job_factor
        if verdict is Verdict.LOCALIZED:
            verdict = Verdict.AMBIGUOUS
        notes.append(
            f"Fault signals on ranks of this job that are not candidates ({_first(elsewhere_in_job)}): the hang may "
            f"have started there; confidence x{factor:g}"
            + ("; verdict changed from localized to ambiguous." if result.verdict is Verdict.LOCALIZED else ".")
        )
    elif elsewhere_outside:
        factor = options.outside_job_factor
        notes.append(
            f"Fault signals on hosts not known to run this job ({_first(elsewhere_outside)}): "
            f"confidence x{factor:g}; verdict unchanged."
        )
    if factor < 1.0:
        lowered = (
            "A fault signal outside the candidates is consistent with the hang starting elsewhere; "
            f"confidence lowered x{factor:g}."
        )
        candidates = [
            c.model_copy(update={"confidence": round(c.confidence * factor, 4), "reasons": [*c.reasons, lowered]})
            for c in candidates
        ]
    if elsewhere_in_job and not hosts_unknown:
        # The isolation gates act per group: a group left localized would still drain its rank's
        # node though the hang may have started on the faulty rank outside it.
        groups = [g.model_copy(update={"verdict": Verdict.AMBIGUOUS}) if g.verdict is Verdict.LOCALIZED else g
                  for g in groups]
    return result.model_copy(
        update={"candidates": candidates, "other_hardware": other, "verdict": verdict, "notes": notes,
                "groups": groups}
    )


class _JobMap:
    """Which ranks of the job run on a host or GPU, from the manifest."""

    def __init__(self, manifest: JobManifest | None, directory: GpuDirectory, domain: str | None) -> None:
        self._domain = domain
        self._by_host: dict[str, list[RankPlacement]] = defaultdict(list)
        for rank in sorted(manifest.ranks) if manifest else []:
            place = place_rank(rank, manifest, directory)
            key = host_key(place.host, domain)
            if key is not None:
                self._by_host[key].append(place)

    def ranks_on(self, host: str | None) -> list[int]:
        key = host_key(host, self._domain)
        return [p.rank for p in self._by_host.get(key, [])] if key else []

    def rank_of(self, event: HardwareEvent) -> int | None:
        """The rank whose GPU the event names: by GPU identity, or an AER line's device address."""
        key = host_key(event.host, self._domain)
        for place in self._by_host.get(key, []) if key else []:
            if same_gpu(event.gpu, place.gpu) is True:
                return place.rank
            if event.gpu is None and place.gpu is not None and same_pci_device(event.device_pci, place.gpu.pci_bus_id):
                return place.rank
        return None

    def describe_owner(self, event: HardwareEvent, ranks: list[int]) -> str:
        if not ranks:
            return f"{event.host} (not known to run this job)"
        owner = self.rank_of(event)
        shown = ", ".join(str(r) for r in ranks[:8]) + (" ..." if len(ranks) > 8 else "")
        gpu = f", rank {owner}'s GPU" if owner is not None else ""
        return f"{event.host} (ranks {shown}{gpu}, no candidate)"


def _member_evidence(place: RankPlacement, readings: list[tuple[HardwareEvent, Reading]],
                     telemetry: TelemetryParseResult, domain: str | None, *, named_gpu: bool,
                     needed: tuple[datetime | None, datetime | None]) -> MemberEvidence:
    """Whether the evidence shows a fault on this rank's own GPU, or shows that GPU clean (the tie rule).

    Clean needs more than no event seen: the manifest names the GPU (PCI id or UUID: an index may
    count GPUs another way than NVML), the host's kernel log spans the hang (from the window's
    start to the dumps), no source is marked unavailable there, nothing supports a fault, and no
    GPU event or fatal AER on the host is left that could be this GPU's.
    """
    if place.host is None or place.gpu is None or place.gpu_from_local_rank or not named_gpu:
        return MemberEvidence()
    supporting = [(e, r) for e, r in readings if r.bearing is HardwareBearing.SUPPORTS_HARDWARE_FAULT]
    own = next((r.summary for e, r in supporting if _on_own_gpu(e, place)), None)
    host = host_key(place.host, domain)
    gaps = any(host_key(g.host, domain) == host and (g.gpu is None or same_gpu(g.gpu, place.gpu) is not False)
               for g in telemetry.unavailable)
    unmatched = any(_maybe_this_gpu(e, place) for e, _ in readings)
    spans = [span for h, span in telemetry.kernel_log_spans.items() if host_key(h, domain) == host]
    start, as_of = needed
    heard = start is not None and as_of is not None and any(
        first <= start and last >= as_of for first, last in spans)
    return MemberEvidence(own_fault=own, shown_clean=heard and not gaps and not unmatched and not supporting)


def _maybe_this_gpu(event: HardwareEvent, place: RankPlacement) -> bool:
    """A GPU event not matched to any GPU, or a fatal AER not proven off this GPU's PCIe path."""
    if event.kind in (SignalKind.XID, SignalKind.NVLINK):
        return same_gpu(event.gpu, place.gpu) is None
    if event.kind is SignalKind.PCIE_AER and event.severity is Severity.FATAL:
        return place.pcie_path is None or event.device_pci is None or event.device_pci in place.pcie_path
    return False


def _gpu_named(manifest: JobManifest | None, rank: int) -> bool:
    """Whether the manifest names the rank's GPU by PCI id or UUID."""
    identity = manifest.ranks.get(rank) if manifest is not None else None
    return identity is not None and bool(identity.gpu_pci_bus_id or identity.gpu_uuid)


def _on_own_gpu(event: HardwareEvent, place: RankPlacement) -> bool:
    """An Xid matched to the GPU itself (not by pid), or an AER on the GPU's own PCI function."""
    if place.gpu is None:
        return False
    if event.kind is SignalKind.XID:
        return same_gpu(event.gpu, place.gpu) is True
    if event.kind is SignalKind.PCIE_AER:
        bus = place.gpu.pci_bus_id
        return event.device_pci is not None and bus is not None and same_pci_device(event.device_pci, bus)
    return False


def _completed(event: HardwareEvent, directory: GpuDirectory) -> HardwareEvent:
    """The event with its GPU reference completed from the GPU records of its host."""
    if event.gpu is None:
        return event
    gpu, _ = directory.complete(event.host, event.gpu)
    return event if gpu == event.gpu else event.model_copy(update={"gpu": gpu})


def _aggregate(readings: list[tuple[HardwareEvent, Reading]], *, host: str | None) -> list[CandidateHardware]:
    """One entry per distinct signal; repeats (e.g. corrected AER bursts) are counted, not listed."""
    groups: dict[tuple[object, ...], list[tuple[HardwareEvent, Reading]]] = {}
    for event, reading in readings:
        key = (event.host, event.kind, event.code, event.severity, event.gpu, event.device_pci, event.link,
               event.pid, reading.bearing, reading.summary)
        groups.setdefault(key, []).append((event, reading))
    hardware = []
    for members in groups.values():
        first, reading = members[0]
        last = members[-1][0]
        summary = reading.summary
        if len(members) > 1:
            summary += f" ({len(members)} times, {_iso(first.time)} to {_iso(last.time)})"
        hardware.append(
            CandidateHardware(
                kind=first.kind.value,
                code=first.code,
                time=first.time,
                summary=summary,
                bearing=reading.bearing,
                # A candidate's entries carry its host as the manifest spells it (often the FQDN
                # where journals print the short name), so planners can compare hosts exactly.
                host=host or first.host,
                gpu=first.gpu.label() if first.gpu else first.device_pci,
            )
        )
    order = [
        HardwareBearing.SUPPORTS_HARDWARE_FAULT,
        HardwareBearing.EXPLAINS_MISSING_DUMP,
        HardwareBearing.POINTS_AT_APPLICATION,
        HardwareBearing.UNRELATED,
    ]
    return sorted(hardware, key=lambda h: (order.index(h.bearing), h.time.timestamp() if h.time else 0.0))


def _reasons(
    hardware: list[CandidateHardware], place: RankPlacement, telemetry: TelemetryParseResult, covered: set[str | None],
    domain: str | None,
) -> list[str]:
    reasons = [h.summary for h in hardware if h.bearing is not HardwareBearing.UNRELATED]
    if place.host is None:
        reasons.append("This rank's host is not known (no host in the manifest): no hardware signal can be tied to it.")
    elif host_key(place.host, domain) not in covered:
        reasons.append(
            f"No telemetry covers {place.host}: the absence of hardware signals says nothing about its health."
        )
    if place.gpu_from_local_rank:
        reasons.append(
            "This rank's GPU was taken as index = local_rank (no GPU named in the manifest); an assumption."
        )
    for gap in telemetry.unavailable:
        if host_key(gap.host, domain) == host_key(place.host, domain) and (gap.gpu is None or same_gpu(gap.gpu, place.gpu) is not False):
            link = f" link {gap.link}" if gap.link is not None else ""
            reasons.append(f"{gap.what}{link} was not available on {place.host} ({gap.detail}): not available, not healthy.")
    return list(dict.fromkeys(reasons))


def _notes(window: HangWindow, telemetry: TelemetryParseResult, outside: int) -> list[str]:
    span = f"{_iso(window.start) if window.start else 'open'} to {_iso(window.end) if window.end else 'open'}"
    notes = [f"Hardware window {span} ({window.basis})."]
    if outside:
        notes.append(f"{outside} hardware event(s) outside the window were not considered.")
    if telemetry.rejected:
        reasons = ", ".join(f"{reason.value} {count}" for reason, count in sorted(telemetry.rejects.items()))
        notes.append(f"Telemetry: {telemetry.lines_read} lines read, {telemetry.rejected} without a usable signal ({reasons}).")
    return notes


def _first(labels: list[str]) -> str:
    distinct = list(dict.fromkeys(labels))
    shown = "; ".join(distinct[:3])
    return shown + (f"; and {len(distinct) - 3} more" if len(distinct) > 3 else "")


def _iso(time: datetime) -> str:
    return time.isoformat().replace("+00:00", "Z")


def _minutes(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 60:g} min"
