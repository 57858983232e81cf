"""The triage entry point: evidence location in, TriageResult out.

    store -> manifest -> dumps per rank -> summaries (parallel) -> mislabel and staleness checks
          -> group membership -> comparison -> culprits and verdict

Staleness is judged against ``as_of``, which defaults to the newest timestamp in the evidence and
never to the wall clock, so that replaying an incident months later judges it as it stood then.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from denpex.analysis.attempts import earlier_attempts
from denpex.analysis.batch import DEFAULT_MAX_DUMP_BYTES
from denpex.analysis.workers import Progress, summarize_all
from denpex.analysis.collector_records import manifest_from_records
from denpex.analysis.incarnations import settle_incarnations
from denpex.analysis.compare import Comparison, compare_groups
from denpex.analysis.membership import GroupMembership, resolve_membership
from denpex.analysis.membership_guess import mark_guessed_members
from denpex.analysis.incomplete import incomplete_reason, one_dump_alone
from denpex.analysis.models import IncompleteReason, TriageResult, Verdict
from denpex.analysis.retire_race import race_notes, settle_retire_races
from denpex.analysis.stack_triage import attach_stacks
from denpex.analysis.stale_by_peers import stale_by_peers
from denpex.analysis.summary import RankSummary
from denpex.analysis.twins import newer, same_moment
from denpex.analysis.unknown_age import in_flight, in_flight_of_unknown_age, predates_alert_note, unknown_age_note
from denpex.analysis.verdict import Decision, decide
from denpex.analysis.wording import ranks_phrase
from denpex.evidence.discovery import discover_dumps, is_candidate_name, rank_from_file_name
from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.errors import EvidenceError, ManifestError
from denpex.evidence.manifest import MAX_WORLD_SIZE, JobManifest, load_manifest, parse_manifest_bytes
from denpex.evidence.skipped import SkippedFile
from denpex.evidence.store import EvidenceStore, StoredObject, open_store

__all__ = ["TriageOptions", "NoUsableEvidence", "MANIFEST_NAME", "EvidenceInventory", "resolve_manifest",
           "summarize_inventory", "take_inventory", "triage_path", "triage_store", "triage_outcomes", "triage_summaries"]

MANIFEST_NAME = "manifest.json"


class NoUsableEvidence(EvidenceError):
    """Not one usable dump was found; the message lists what was set aside and why."""


class TriageOptions(BaseModel):
    """How to read and judge the evidence. Defaults suit a production incident."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_dump_bytes: int = Field(default=DEFAULT_MAX_DUMP_BYTES, gt=0)
    # A dump whose collector time is this much older than the incident is stale. Without a
    # collector time, the newest entry must fall within the op's timeout plus this grace.
    stale_after: timedelta = timedelta(minutes=15)
    workers: int | None = Field(default=None, ge=1)
    # Read the Python stacks beside the dumps (denpex.analysis.stack_triage); off only to measure.
    stacks: bool = True


def triage_path(path: str | Path, *, world_size: int | None = None,
                manifest: JobManifest | Path | str | None = None, as_of: datetime | None = None,
                options: TriageOptions | None = None, progress: Progress | None = None) -> TriageResult:
    """Triage the dumps in a folder or ``s3://bucket/prefix``."""
    return triage_store(open_store(path), world_size=world_size, manifest=manifest, as_of=as_of,
                        options=options, progress=progress)


class EvidenceInventory(BaseModel):
    """What a store holds right now: the manifest, the world size and one dump reference per rank.

    The flow takes one while ranks are still uploading (coverage), then fans the references out.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    store_uri: str
    manifest: JobManifest | None = None
    world_size: int
    size_note: str | None = None
    """Set when the world size was inferred from file names (no manifest, none given)."""
    dumps: dict[int, DumpRef] = Field(default_factory=dict)
    twins: dict[int, DumpRef] = Field(default_factory=dict)
    """A rank's second copy (its JSON beside the pickle): compared with the dump used."""
    skipped: list[SkippedFile] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    """What the inventory itself found (e.g. the collector's records served as the manifest)."""


def take_inventory(store: EvidenceStore, *, world_size: int | None = None,
                   manifest: JobManifest | Path | str | None = None) -> EvidenceInventory:
    """List ``store`` once: the manifest, the world size and which rank each dump belongs to."""
    objects = store.list()
    job = resolve_manifest(store, manifest, objects)
    record_notes: list[str] = []
    if job is None:
        # No manifest: what Denpex's own collector recorded beside the dumps serves as one.
        from_records = manifest_from_records(store, world_size)
        job, record_notes = from_records.manifest, from_records.notes
    size, size_note = _world_size(world_size, job, objects)
    inventory = discover_dumps(store.uri, objects, job, size)
    return EvidenceInventory(store_uri=store.uri, manifest=job, world_size=size, size_note=size_note,
                             dumps=inventory.dumps, twins=inventory.twins, skipped=inventory.skipped,
                             notes=record_notes)


def triage_store(store: EvidenceStore, *, world_size: int | None = None,
                 manifest: JobManifest | Path | str | None = None, as_of: datetime | None = None,
                 options: TriageOptions | None = None, progress: Progress | None = None) -> TriageResult:
    """Triage every dump in ``store``; ``progress`` is told (dumps read, dumps in all)."""
    inventory = take_inventory(store, world_size=world_size, manifest=manifest)
    outcomes = summarize_inventory(store, inventory, options, progress=progress)
    return triage_outcomes(inventory, outcomes, as_of=as_of, options=options, store=store)


def summarize_inventory(store: EvidenceStore, inventory: EvidenceInventory,
                        options: TriageOptions | None = None,
                        progress: Progress | None = None) -> list[RankSummary | SkippedFile]:
    """Summarize every dump of the inventory on this machine (a process pool once there are many)."""
    options = options or TriageOptions()
    refs = list(inventory.dumps.values())
    return summarize_all(refs, max_bytes=options.max_dump_bytes, workers=options.workers,
                         store=store if len(refs) < 64 else None, progress=progress)


def triage_outcomes(inventory: EvidenceInventory, outcomes: Iterable[RankSummary | SkippedFile], *,
                    as_of: datetime | None = None, options: TriageOptions | None = None,
                    store: EvidenceStore | None = None) -> TriageResult:
    """Compare the summaries of an inventory's dumps (however they were fanned out).

    ``store`` is the inventory's own store where the caller holds it (its S3 client reused for the
    stacks); otherwise the store is reopened from ``inventory.store_uri``. Another store is a
    caller's mistake (its client must not read this inventory): ValueError.
    """
    options = options or TriageOptions()
    if store is not None and store.uri != inventory.store_uri:
        raise ValueError(f"the store given ({store.uri}) is not the inventory's ({inventory.store_uri})")
    skipped = list(inventory.skipped)
    summaries: dict[int, RankSummary] = {}
    for outcome in outcomes:
        if isinstance(outcome, SkippedFile):
            skipped.append(outcome)
        else:
            summaries[outcome.rank] = outcome
    twin_notes = _check_twins(inventory, summaries, skipped, options, store)
    if not summaries:
        raise NoUsableEvidence(_nothing_usable(inventory.store_uri, skipped))
    result = triage_summaries(summaries, world_size=inventory.world_size, manifest=inventory.manifest,
                              as_of=as_of, options=options, skipped=skipped)
    if inventory.size_note:
        result.notes.insert(0, inventory.size_note)
        result = one_dump_alone(result)
    result.notes[:0] = inventory.notes + twin_notes
    if options.stacks:
        # After the verdict, from the same store: the CLI and the flow's merge step both land here.
        result = attach_stacks(result, store or open_store(inventory.store_uri), inventory.dumps,
                               max_dump_bytes=options.max_dump_bytes)
    return result


def _check_twins(inventory: EvidenceInventory, summaries: dict[int, RankSummary],
                 skipped: list[SkippedFile], options: TriageOptions,
                 store: EvidenceStore | None) -> list[str]:
    """Compare each rank's JSON twin with the dump used; keep the newer when they differ.

    Twins are rare (a rank whose pickle and JSON both arrived); each is read through ``store`` (the
    inventory's own, when the caller holds it), else from its own store URI, so this works the
    same after a fanned-out parse.
    """
    twins = [ref for rank, ref in inventory.twins.items() if rank in summaries]
    if not twins:
        return []
    notes = []
    for outcome in summarize_all(twins, max_bytes=options.max_dump_bytes, workers=options.workers, store=store):
        if isinstance(outcome, SkippedFile):
            continue  # the pickle is used; the twin's flaw is already noted as a copy
        used = summaries[outcome.rank]
        if same_moment(used, outcome):
            continue
        keep = newer(used, outcome)
        older = outcome if keep is used else used
        summaries[outcome.rank] = keep
        skipped[:] = [s for s in skipped if not (s.rank == outcome.rank and s.copy_of)]
        why = (f"rank {outcome.rank}'s {older.source} and {keep.source} are different dumps (their "
               f"progress differs); the newer, {keep.source}, is used")
        skipped.append(SkippedFile(path=older.source, rank=outcome.rank, reason=why))
        notes.append(why)
    return notes


def triage_summaries(summaries: dict[int, RankSummary], *, world_size: int,
                     manifest: JobManifest | None = None, as_of: datetime | None = None,
                     options: TriageOptions | None = None,
                     skipped: list[SkippedFile] | None = None) -> TriageResult:
    """Compare already-built summaries (the merge step of a fanned-out triage)."""
    options = options or TriageOptions()
    skipped = list(skipped or [])
    summaries, incarnation_notes = settle_incarnations(summaries)
    membership = resolve_membership(summaries, manifest, world_size)
    summaries = _drop_mislabeled(summaries, membership, skipped)
    membership = resolve_membership(summaries, manifest, world_size)
    attempt_notes = _drop_earlier_attempts(summaries, membership, skipped)
    if attempt_notes:
        membership = resolve_membership(summaries, manifest, world_size)
    as_of_ns = _as_of_ns(as_of, summaries, manifest)
    stale = _stale_ranks(summaries, manifest, as_of_ns, options.stale_after)
    set_aside = {s.rank: s for s in reversed(skipped) if s.rank is not None and not s.copy_of}
    absent = {r: _why_no_dump(set_aside.get(r)) for r in range(world_size) if r not in summaries}
    outran = {r: why for r, why in stale_by_peers(summaries, membership).items() if r not in stale}
    comparison, fresh, missing = _compare(summaries, {**absent, **stale}, membership, as_of_ns, manifest,
                                             as_of is not None, world_size)
    # A dump its peers outran says nothing about where its rank stands now. Where it takes part
    # in a stuck op, the rank counts as unreported; elsewhere (ranks dumped a moment apart in a
    # running job) it changes nothing.
    involved = {r: outran[r] for b in comparison.blockages for r in (*b.targets, *b.waiting)
                if r in outran}
    if involved:
        stale.update(involved)
        comparison, fresh, missing = _compare(summaries, {**absent, **stale}, membership, as_of_ns,
                                              manifest, as_of is not None, world_size)
    decision = mark_guessed_members(decide(comparison, fresh, missing, membership, manifest),
                                    comparison.blockages)
    age_notes: list[str] = []
    reason: IncompleteReason | None = None
    if decision.verdict is Verdict.NO_HANG:
        unaged = in_flight_of_unknown_age(fresh, _dump_times(fresh, manifest), as_of_given=as_of is not None)
        # An alert says an op timed out; young ops in flight at its time contradict it.
        young = in_flight(fresh) if as_of is not None else []
        if unaged:
            reason, age_notes = IncompleteReason.AGE_UNKNOWN, [unknown_age_note(unaged)]
        elif young:
            reason, age_notes = IncompleteReason.EVIDENCE_PREDATES_ALERT, [predates_alert_note(young)]
        if reason is not None:
            decision = Decision(Verdict.INCOMPLETE, decision.candidates, decision.groups)
    elif decision.verdict is Verdict.INCOMPLETE:
        reason = incomplete_reason(decision.candidates, comparison.blockages)
    return TriageResult(
        verdict=decision.verdict,
        incomplete_reason=reason,
        world_size=world_size,
        ranks_with_evidence=sorted(fresh),
        missing_ranks=sorted(r for r in range(world_size) if r not in summaries),
        stale_ranks=sorted(stale),
        candidates=decision.candidates,
        groups=decision.groups,
        stuck=[b.as_stuck(membership.descs.get(b.group)) for b in comparison.blockages],
        skipped_files=skipped,
        as_of=datetime.fromtimestamp(as_of_ns / 1e9, UTC) if as_of_ns else None,
        notes=(attempt_notes + _clock_notes(as_of, summaries, {r: w for r, w in stale.items() if r not in outran})
               + _outran_notes({r: w for r, w in outran.items() if r not in stale}) + comparison.notes + _membership_notes(membership)
               + _unusable_entry_notes(summaries) + incarnation_notes + age_notes),
    )


def _compare(summaries: dict[int, RankSummary], missing: dict[int, str], membership: GroupMembership,
             as_of_ns: int | None, manifest: JobManifest | None, as_of_given: bool, world_size: int
             ) -> tuple[Comparison, dict[int, RankSummary], dict[int, str]]:
    """Compare the ranks whose dumps are usable; the others count as missing."""
    fresh = {r: s for r, s in summaries.items() if r not in missing}
    dump_times = _dump_times(fresh, manifest)
    fresh, races = settle_retire_races(fresh, set(missing), membership, as_of_ns, dump_times)
    comparison = compare_groups(fresh, set(missing), membership, as_of_ns, dump_times,
                                as_of_given=as_of_given, world_size=world_size)
    comparison.notes[:0] = race_notes(races)
    return comparison, fresh, missing


def _outran_notes(outran: dict[int, str]) -> list[str]:
    if not outran:
        return []
    ranks = sorted(outran)
    return [f"{ranks_phrase(ranks)} dumped before their peers completed later collectives (e.g. "
            f"{outran[ranks[0]]}); no stuck op involves them, so this changes nothing"]


def resolve_manifest(store: EvidenceStore, given: JobManifest | Path | str | None,
                     objects: list[StoredObject] | None = None) -> JobManifest | None:
    """The manifest to use: the one given (model or path), else ``manifest.json`` in the store."""
    if isinstance(given, JobManifest):
        return given
    if given is not None:
        return load_manifest(Path(given))
    if any(o.name == MANIFEST_NAME for o in (objects if objects is not None else store.list())):
        try:
            data = store.read(MANIFEST_NAME, max_bytes=64 * 1024 * 1024)
        except EvidenceError as exc:
            raise ManifestError(f"{store.uri}/{MANIFEST_NAME}: {exc}") from exc
        return parse_manifest_bytes(data, source=f"{store.uri}/{MANIFEST_NAME}")
    return None


def _world_size(given: int | None, manifest: JobManifest | None,
                objects: list[StoredObject]) -> tuple[int, str | None]:
    if given is not None and manifest is not None and given != manifest.world_size:
        raise ManifestError(
            f"--world-size {given} contradicts the manifest's world_size {manifest.world_size}; "
            "drop one of them")
    if given is not None:
        if not 0 < given <= MAX_WORLD_SIZE:
            raise ManifestError(f"--world-size must be between 1 and {MAX_WORLD_SIZE}, got {given}")
        return given, None
    if manifest is not None:
        return manifest.world_size, None
    named = [(r, o.name) for o in objects if is_candidate_name(o.name)
             and (r := rank_from_file_name(o.name)) is not None and r < MAX_WORLD_SIZE]
    if not named:
        return 0, None
    top, source = max(named)
    size = top + 1
    return size, (f"world size {size} was inferred from the largest trailing number in the file "
                  f"names ({source}); ranks above {size - 1} that left no dump cannot be seen. "
                  "Pass --world-size or a manifest.")


def _drop_mislabeled(summaries: dict[int, RankSummary], membership: GroupMembership,
                     skipped: list[SkippedFile]) -> dict[int, RankSummary]:
    """A dump that reports a group its rank is not in belongs to another rank: refuse it."""
    kept = {}
    for rank, summary in summaries.items():
        foreign = [
            name for name, group in summary.groups.items()
            if name not in membership.inferred and name in membership.members
            and not membership.has_member(name, rank) and (group.entry_count or group.config_ranks)
        ]
        if foreign:
            name = foreign[0]
            skipped.append(SkippedFile(
                path=summary.source, rank=rank,
                reason=f"mislabeled: it records process group {name!r}, whose members are "
                       f"{list(membership.members[name])[:16]}, so it is not rank {rank}'s dump"))
        else:
            kept[rank] = summary
    return kept


def _drop_earlier_attempts(summaries: dict[int, RankSummary], membership: GroupMembership,
                           skipped: list[SkippedFile]) -> list[str]:
    """Set aside the dumps of an earlier attempt (in place); the newest attempt is triaged."""
    older = earlier_attempts(summaries, membership)
    for rank, why in sorted(older.items()):
        skipped.append(SkippedFile(path=summaries.pop(rank).source, rank=rank, reason=why))
    if not older:
        return []
    return [f"the folder mixes dumps from more than one attempt of the job: {ranks_phrase(sorted(older))} "
            "dumped in an earlier one (see skipped_files); the newest attempt is triaged, and those "
            "ranks count as unreported"]


def _clock_notes(as_of: datetime | None, summaries: dict[int, RankSummary],
                 stale: dict[int, str]) -> list[str]:
    """Warn when a few ranks' times make most others look stale: a host clock off by hours does
    that, because the incident time defaults to the newest time in the evidence."""
    if as_of is not None or len(stale) * 2 < len(summaries) or len(summaries) < 2:
        return []
    fresh = sorted(r for r in summaries if r not in stale)
    return [f"{len(stale)} of {len(summaries)} dumps look stale against the newest time in the "
            f"evidence, which comes from {ranks_phrase(fresh)}. If a clock there runs ahead, pass "
            "--as-of with the real incident time."]


def _why_no_dump(skipped: SkippedFile | None) -> str:
    """Why a rank has no evidence, naming its file when there was one."""
    if skipped is None:
        return "no dump was found for it"
    return f"its dump {skipped.path} was set aside ({skipped.reason})"


def _as_of_ns(as_of: datetime | None, summaries: dict[int, RankSummary],
              manifest: JobManifest | None) -> int | None:
    if as_of is not None:
        if as_of.tzinfo is None:
            as_of = as_of.replace(tzinfo=UTC)
        return int(as_of.timestamp() * 1e9)
    times = [t for s in summaries.values() for t in (s.newest_time_ns, s.dumped_at_ns) if t]
    if manifest is not None:
        times += [int(i.dumped_at.timestamp() * 1e9) for i in manifest.ranks.values() if i.dumped_at]
    return max(times) if times else None


def _dump_times(summaries: dict[int, RankSummary], manifest: JobManifest | None) -> dict[int, int]:
    """Each rank's dump time: the collector's record, else what the dump itself shows."""
    times = {r: s.dumped_at_ns for r, s in summaries.items() if s.dumped_at_ns}
    if manifest is not None:
        times.update({r: int(i.dumped_at.timestamp() * 1e9) for r, i in manifest.ranks.items()
                      if i.dumped_at and r in summaries})
    return times


def _stale_ranks(summaries: dict[int, RankSummary], manifest: JobManifest | None,
                 as_of_ns: int | None, stale_after: timedelta) -> dict[int, str]:
    if as_of_ns is None:
        return {}
    grace_ns = int(stale_after.total_seconds() * 1e9)
    # The waiting ranks dump once the hung op times out (NCCL) and stamp it with that time, so a
    # healthy-but-idle rank's newest entry can be a whole timeout older than theirs: the window is
    # the job's longest timeout, not just the ones this rank has in flight.
    window = grace_ns + _longest_timeout_ns(summaries)
    stale = {}
    for rank, summary in summaries.items():
        identity = manifest.ranks.get(rank) if manifest else None
        if identity is not None and identity.dumped_at is not None:
            dumped_ns = int(identity.dumped_at.timestamp() * 1e9)
            if dumped_ns < as_of_ns - grace_ns:
                stale[rank] = f"its dump was written {_ago(as_of_ns - dumped_ns)} before the incident"
            continue
        if summary.newest_time_ns is None:
            continue
        if summary.newest_time_ns < as_of_ns - window:
            stale[rank] = (f"its newest entry is {_ago(as_of_ns - summary.newest_time_ns)} older than "
                           "the incident, beyond any op timeout: the dump is stale")
    return stale


def _longest_timeout_ns(summaries: dict[int, RankSummary]) -> int:
    """The longest op timeout in the evidence (NCCL's default, 10 min, when none is recorded)."""
    longest = 0
    for summary in summaries.values():
        for group in summary.groups.values():
            for op in (*group.pending, group.last_op):
                if op is not None and op.timeout_ms and op.timeout_ms > longest:
                    longest = op.timeout_ms
    return (longest or 600_000) * 1_000_000


def _ago(delta_ns: int) -> str:
    seconds = delta_ns / 1e9
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _membership_notes(membership: GroupMembership) -> list[str]:
    if not membership.inferred:
        return []
    names = ", ".join(repr(n) for n in sorted(membership.inferred)[:8])
    return [f"membership of process group(s) {names} was inferred from the dumps that mention them; "
            "a member that left no dump cannot be counted. A manifest with process_groups fixes this."]


def _unusable_entry_notes(summaries: dict[int, RankSummary], limit: int = 5) -> list[str]:
    """Say which dumps had entries that were set aside: the rank is judged on the rest."""
    ranks = sorted(r for r, s in summaries.items() if s.rejected_entries)
    notes = []
    for rank in ranks[:limit]:
        summary = summaries[rank]
        bad = sum(summary.rejected_entries.values())
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(summary.rejected_entries.items()))
        notes.append(f"rank {rank} ({summary.source}): {bad} of its {bad + summary.entry_count} entries "
                     f"are unusable ({why}); the rank is judged on the rest")
    if len(ranks) > limit:
        notes.append(f"... and {len(ranks) - limit} more ranks whose dumps have unusable entries")
    return notes


def _nothing_usable(uri: str, skipped: list[SkippedFile]) -> str:
    if not skipped:
        return f"{uri}: no Flight Recorder dumps found"
    shown = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:5])
    more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
    return f"{uri}: no usable Flight Recorder dump among {len(skipped)} files: {shown}{more}"
