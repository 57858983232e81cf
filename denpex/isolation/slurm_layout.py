"""Rank -> node from Slurm's job record, when no rank registered where it runs (``host_source: derived``).

``scontrol -o show job -d JOB`` gives the job's nodes in allocation order and its task count; under
``srun``'s default block distribution, ``SLURM_PROCID`` fills the first node's tasks, then the
next node's::

    NodeList=gpu-node-[001-004] NumNodes=4 NumTasks=4      world 4 -> 0:001 1:002 2:003 3:004
    NodeList=gpu-node-[001-002] NumNodes=2 NumTasks=2      world 16 (torchrun, 8 per node)
                                                           -> 0-7: 001, 8-15: 002

It is a guess: a rendezvous (torchrun) may number node ranks in another order, and a job may
use a cyclic distribution. So a derived host never supports a drain on its own
(:mod:`denpex.isolation.gates` asks for hardware evidence from that host's node agent), the plan,
the report and the approval form say "derived", and a derivation that contradicts a host a rank
named itself is not used at all.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from denpex.analysis.models import TriageResult
from denpex.evidence.manifest import HostSource, JobManifest, RankIdentity
from denpex.isolation.slurm_parse import hosts_of, record_fields

__all__ = ["SlurmJobLayout", "parse_job_layout", "derive_hosts", "with_derived_hosts", "mark_derived_candidates",
           "DERIVED_NOTE"]

DERIVED_NOTE = ("derived from the scheduler's job record (block distribution), a guess: it supports a drain "
                "only with a hardware signal from that node's own agent")


_PLACING = ("JobId", "JobState", "NodeList", "NumTasks")


class SlurmJobLayout(BaseModel):
    """The part of a Slurm job record that places its tasks."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    state: str
    nodes: tuple[str, ...]
    tasks: int | None


def parse_job_layout(text: str) -> SlurmJobLayout | None:
    """``scontrol -o show job -d J`` -> its nodes (allocation order) and task count; None without a
    record. UnreadableRecordError when the record cannot be read safely (a field named twice, a hostile node list)."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), None)
    if line is None:
        return None
    fields = record_fields(line, _PLACING)
    # A value ends at the next "Key="; "CPUs/Task=1" is not one (a "/" precedes it), so keep the first word.
    tasks = next(iter(fields.get("NumTasks", "").split()), "")
    return SlurmJobLayout(job_id=fields.get("JobId", ""), state=fields.get("JobState", ""),
                          nodes=hosts_of(fields, "NodeList"),
                          tasks=int(tasks) if re.fullmatch(r"[0-9]{1,9}", tasks) else None)


def derive_hosts(layout: SlurmJobLayout, world_size: int) -> tuple[dict[int, str], str | None]:
    """Rank -> node by block distribution, or ``({}, why not)``.

    The world is split into equal contiguous blocks, one per node: ``world_size`` tasks on
    ``len(nodes)`` nodes. A world that does not divide evenly is not guessed at.
    """
    if not layout.nodes:
        return {}, f"Slurm job {layout.job_id} has no nodes (state {layout.state or 'unknown'})"
    per_node, rest = divmod(world_size, len(layout.nodes))
    if rest or per_node == 0:
        return {}, (f"Slurm job {layout.job_id}: {world_size} ranks do not split evenly over its "
                    f"{len(layout.nodes)} nodes, so no block layout is guessed")
    return {rank: layout.nodes[rank // per_node] for rank in range(world_size)}, None


def with_derived_hosts(manifest: JobManifest | None, world_size: int,
                       derived: dict[int, str]) -> tuple[JobManifest | None, list[int], str | None]:
    """The manifest with a derived host for each rank that has none: (manifest, ranks filled, why not).

    A rank that named its host (registered, uploaded or in a written manifest) keeps it; when any
    such host disagrees with the derivation, the derivation is wrong for this job (another
    distribution, a rendezvous order) and nothing is filled.
    """
    known = manifest.ranks if manifest is not None else {}
    disagree = [r for r, e in known.items() if e.host and not e.host_is_derived and derived.get(r) not in (None, e.host)]
    if disagree:
        rank = disagree[0]
        return manifest, [], (f"the scheduler's block layout puts rank {rank} on {derived[rank]}, but it ran on "
                              f"{known[rank].host}; the layout is not derived")
    filled = [r for r in range(world_size) if r in derived and not (known.get(r) and known[r].host)]
    if not filled:
        return manifest, [], None
    ranks = dict(known)
    for rank in filled:
        base = known.get(rank)
        fields = base.model_dump(exclude_none=True) if base is not None else {}
        ranks[rank] = RankIdentity(**{**fields, "host": derived[rank], "host_source": HostSource.DERIVED})
    if manifest is None:
        return JobManifest(world_size=world_size, ranks=ranks), filled, None
    return manifest.model_copy(update={"ranks": dict(sorted(ranks.items()))}), filled, None


def mark_derived_candidates(result: TriageResult, manifest: JobManifest | None) -> TriageResult:
    """Each candidate on a derived host says so in its reasons (the report and the form show them)."""
    if manifest is None:
        return result
    marked = []
    for candidate in result.candidates:
        identity = manifest.ranks.get(candidate.rank)
        if identity is not None and identity.host_is_derived and identity.host:
            note = f"host {identity.host} is {DERIVED_NOTE}"
            if note not in candidate.reasons:
                candidate = candidate.model_copy(update={"reasons": [*candidate.reasons, note]})
        marked.append(candidate)
    return result.model_copy(update={"candidates": marked})
