"""Ranks grouped by where their stacks say they are, and the members that stand apart.

Pure functions over :class:`~denpex.evidence.stacks.RankStacks`. For each rank:

1. pick the thread that issues collectives (:func:`issuing_thread`): one whose frames are inside
   ``torch.distributed``'s collectives, else ``MainThread``, else the one holding the GIL;
   Denpex's own collector threads (``denpex-*``) never count;
2. reduce it to a signature (:func:`stack_signature`): the innermost frames of user code (torch,
   the standard library, site-packages and Denpex's collector are skipped), plus what that code
   is waiting in: the collective's name (``all_reduce``), or the library call it made
   (``re.match``, ``threading.Event.wait``);
3. group ranks by signature (:func:`group_by_stack`), and among the members of a stuck group
   name those whose signature differs from the majority's (:func:`stack_outliers`).

Example: ranks 0, 1, 3 blocked in ``dist.all_reduce`` called from ``train.py:88 step()`` and rank 2
sleeping in ``data.py:45 next_batch()`` give two groups, rendered as::

    ranks 0, 1, 3: `all_reduce` from `train.py:88 step()`
    rank 2: in `data.py:45 next_batch()`

and, for the group {0, 1, 2, 3}, rank 2 is the outlier. A stack never overrides FR progress: the
verdict decides, and an outlier is evidence it may use to tell members apart.

The models are what the triage JSON carries: :class:`CandidateStack` is a candidate's ``stack``
and :class:`StackGroup` one entry of ``stack_groups``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from denpex.analysis.wording import ranks_phrase
from denpex.evidence.stacks import RankStacks, StackFrame, StackSource, ThreadStack
from denpex.markdown_text import inline

__all__ = [
    "CandidateStack",
    "FrameRole",
    "SOURCE_PREFERENCE",
    "StackGroup",
    "StackGrouping",
    "StackOutlier",
    "StackSignature",
    "best_stacks",
    "candidate_stack",
    "frame_role",
    "group_by_stack",
    "issuing_thread",
    "render_outlier",
    "render_stack_groups",
    "stack_groups_markdown",
    "stack_outliers",
    "stack_signature",
]

USER_FRAMES = 3
"""How many innermost user frames make a signature: enough to tell two call sites apart."""
SOURCE_PREFERENCE = (StackSource.COLLECTOR, StackSource.PY_SPY, StackSource.TORCH_DEBUG, StackSource.FR_CALLSITE)
"""The collector's stacks are taken at the dump itself; py-spy's only when the rank could not dump;
the debug server's at its own interval; FR's call site says where the op began, not where the rank
is now."""

_COLLECTIVES_FILE = "torch/distributed/distributed_c10d.py"
_STDLIB = re.compile(r"/lib/python3\.\d+/")
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/denpex/collector/")
_OWN_THREAD_PREFIX = "denpex-"


class FrameRole(StrEnum):
    """What a frame's code is, judged from its file path."""

    USER = "user"
    """The job's own code: anything not below."""
    COLLECTIVE = "collective"
    """A ``torch.distributed`` collective (``distributed_c10d.py``): its function names the op."""
    LIBRARY = "library"
    """torch's other internals, the standard library, site-packages, Denpex's collector."""


def frame_role(frame: StackFrame) -> FrameRole:
    """``.../torch/distributed/distributed_c10d.py`` -> COLLECTIVE; ``/usr/lib/python3.11/re/__init__.py``,
    ``.../site-packages/x.py`` and ``<frozen runpy>`` -> LIBRARY; ``/job/train.py`` -> USER."""
    path = frame.file.replace("\\", "/")
    if path.endswith(_COLLECTIVES_FILE):
        return FrameRole.COLLECTIVE
    if path.startswith("<frozen") or any(m in path for m in _LIBRARY_MARKERS) or _in_stdlib(path):
        return FrameRole.LIBRARY
    return FrameRole.USER


def _in_stdlib(path: str) -> bool:
    match = _STDLIB.search(path)
    return match is not None and "/site-packages/" not in path[match.end():]


class StackSignature(BaseModel):
    """What identifies where a rank is: the call it waits in and the innermost user frames."""

    model_config = ConfigDict(frozen=True)

    waiting_in: StackFrame | None = None
    """The collective's frame, or the outermost library frame the user code called; None when the
    innermost frame is user code (a C call such as ``time.sleep`` leaves no Python frame)."""
    collective: str | None = None
    """The collective's name when ``waiting_in`` is one (``all_reduce``)."""
    user_frames: tuple[StackFrame, ...] = ()

    @property
    def frames(self) -> list[StackFrame]:
        """The short stack, innermost first: what it waits in, then the user frames."""
        return ([self.waiting_in] if self.waiting_in else []) + list(self.user_frames)

    def key(self) -> tuple[object, ...]:
        """Equal for ranks at the same place. A library frame counts by file and function only, so
        two ranks in ``Condition.wait`` a line apart still match; user frames count by line."""
        where = (self.waiting_in.file, self.waiting_in.function) if self.waiting_in else None
        return (where, tuple((f.file, f.line, f.function) for f in self.user_frames))

    def describe(self) -> str:
        """``\\`all_reduce\\` from \\`train.py:88 step()\\``` or ``\\`re.match\\` in \\`wedge.py:5 ...\\```."""
        user = f"`{self.user_frames[0].short()}`" if self.user_frames else "no frame of user code"
        if self.collective is not None:
            return f"`{self.collective}` from {user}"
        if self.waiting_in is not None:
            return f"`{_dotted(self.waiting_in)}` in {user}"
        return f"in {user}"


def _dotted(frame: StackFrame) -> str:
    """``/usr/lib/python3.11/re/__init__.py`` + ``match`` -> ``re.match``."""
    path = frame.file.replace("\\", "/")
    if path.startswith("<frozen "):
        module = path[len("<frozen "):].rstrip(">")
    else:
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                path = path.rsplit(marker, 1)[1]
                break
        else:
            match = _STDLIB.search(path)
            path = path[match.end():] if match else path.rsplit("/", 1)[-1]
        module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return f"{module}.{frame.function}"


class CandidateStack(BaseModel):
    """A candidate's ``stack`` in the triage JSON: the short stack, and the thread's whole stack."""

    model_config = ConfigDict(frozen=True)

    source: StackSource
    thread: str | None
    frames: list[StackFrame]
    """Innermost first: the call it waits in, then the innermost frames of user code."""
    all_frames: list[StackFrame] = Field(default_factory=list)
    """The thread's every frame (as bounded by the evidence), for whoever wants to see all."""
    summary: str = ""
    """:meth:`StackSignature.describe`, plain text with backticks."""


class StackGroup(BaseModel):
    """One entry of ``stack_groups``: ranks whose stacks have one signature."""

    model_config = ConfigDict(frozen=True)

    ranks: list[int]
    frames: list[StackFrame]
    collective: str | None = None
    summary: str = ""
    sources: list[StackSource] = Field(default_factory=list)


class StackGrouping(BaseModel):
    """Every rank with a usable stack, grouped; and why the others have none."""

    model_config = ConfigDict(frozen=True)

    groups: list[StackGroup]
    """Largest first, then by lowest rank."""
    without_stack: dict[int, str] = Field(default_factory=dict)
    """Rank -> why its evidence gives no stack (py-spy refused, process gone, no thread)."""

    def group_of(self, rank: int) -> StackGroup | None:
        """The group ``rank`` is in."""
        return next((g for g in self.groups if rank in g.ranks), None)


class StackOutlier(BaseModel):
    """A member of a stuck group whose stack differs from the group's reference stack."""

    model_config = ConfigDict(frozen=True)

    rank: int
    stack: StackGroup
    """The outlier's own group (its signature)."""
    majority: StackGroup
    """The reference: the members' majority, or (without one) the members inside the collective."""
    reason: str


def issuing_thread(stacks: RankStacks) -> ThreadStack | None:
    """The thread that issues collectives: one in a ``torch.distributed`` collective (MainThread
    first among several), else MainThread, else the one holding the GIL, else the first with frames."""
    threads = [t for t in stacks.threads
               if t.frames and not (t.name or "").startswith(_OWN_THREAD_PREFIX)]
    in_collective = [t for t in threads if any(f.file.endswith(_COLLECTIVES_FILE) for f in t.frames)]
    for pool in (in_collective, threads):
        main = next((t for t in pool if t.name == "MainThread"), None)
        if main is not None:
            return main
        if pool is in_collective and pool:
            return pool[0]
    return next((t for t in threads if t.holds_gil), threads[0] if threads else None)


def stack_signature(thread: ThreadStack) -> StackSignature:
    """The signature of one thread's frames (innermost first).

    ``[all_reduce (distributed_c10d.py), wrapper (c10d_logger.py), step (train.py:88), main (train.py:120)]``
    -> waiting_in ``all_reduce``, collective ``"all_reduce"``, user frames ``[step, main]``.
    """
    roles = [frame_role(f) for f in thread.frames]
    first_user = next((i for i, r in enumerate(roles) if r is FrameRole.USER), None)
    inner = thread.frames[:first_user] if first_user is not None else thread.frames
    inner_roles = roles[: len(inner)]
    collective = next((f for f, r in zip(inner, inner_roles) if r is FrameRole.COLLECTIVE), None)
    if collective is not None:
        waiting_in: StackFrame | None = collective
    elif first_user is None:
        waiting_in = thread.frames[0] if thread.frames else None
    else:
        waiting_in = inner[-1] if inner else None
    user = tuple(f for f, r in zip(thread.frames, roles) if r is FrameRole.USER)[:USER_FRAMES]
    return StackSignature(waiting_in=waiting_in, collective=collective.function if collective else None,
                          user_frames=user)


def best_stacks(evidence: Iterable[RankStacks]) -> dict[int, RankStacks]:
    """Per rank, the most telling usable record (:data:`SOURCE_PREFERENCE`); a rank with none
    usable keeps the record that says why (e.g. py-spy's ``ptrace_refused``)."""
    order = {s: i for i, s in enumerate(SOURCE_PREFERENCE)}
    chosen: dict[int, RankStacks] = {}
    for record in evidence:
        held = chosen.get(record.rank)
        usable = _usable(record)
        held_usable = held is not None and _usable(held)
        if held is None or (usable and not held_usable) or (
                usable == held_usable and order[record.source] < order[held.source]):
            chosen[record.rank] = record
    return dict(sorted(chosen.items()))


def _usable(record: RankStacks) -> bool:
    """Whether :func:`issuing_thread` finds a thread (without picking it)."""
    return record.unavailable is None and any(
        t.frames and not (t.name or "").startswith(_OWN_THREAD_PREFIX) for t in record.threads)


def candidate_stack(stacks: RankStacks) -> CandidateStack | None:
    """The ``stack`` a candidate carries, from its rank's record; None when it gives no thread."""
    thread = issuing_thread(stacks) if stacks.unavailable is None else None
    if thread is None:
        return None
    signature = stack_signature(thread)
    return CandidateStack(source=stacks.source, thread=thread.name, frames=signature.frames,
                          all_frames=list(thread.frames), summary=signature.describe())


def group_by_stack(stacks: Mapping[int, RankStacks]) -> StackGrouping:
    """Ranks grouped by :func:`stack_signature` of their :func:`issuing_thread` (one record per
    rank: see :func:`best_stacks`)."""
    members: dict[tuple[object, ...], list[int]] = {}
    signatures: dict[tuple[object, ...], StackSignature] = {}
    sources: dict[tuple[object, ...], set[StackSource]] = {}
    without: dict[int, str] = {}
    for rank, record in sorted(stacks.items()):
        thread = issuing_thread(record) if record.unavailable is None else None
        if thread is None:
            without[rank] = _why_none(record)
            continue
        signature = stack_signature(thread)
        key = signature.key()
        signatures.setdefault(key, signature)
        members.setdefault(key, []).append(rank)
        sources.setdefault(key, set()).add(record.source)
    groups = [StackGroup(ranks=ranks, frames=signatures[key].frames, collective=signatures[key].collective,
                         summary=signatures[key].describe(),
                         sources=[s for s in SOURCE_PREFERENCE if s in sources[key]])
              for key, ranks in members.items()]
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks[0]))
    return StackGrouping(groups=groups, without_stack=without)


def _why_none(record: RankStacks) -> str:
    if record.unavailable is not None:
        return f"{record.source.value}: {record.unavailable.value}" + (f" ({record.detail})" if record.detail else "")
    return f"{record.source.value}: no thread with Python frames"


def stack_outliers(grouping: StackGrouping, members: Iterable[int]) -> list[StackOutlier]:
    """Members of one stuck group whose stack differs from the reference stack.

    The reference is the signature a strict majority of the members with stacks share; without
    one, the only signature among them that is inside a collective (so in a pair, the member that
    is not in the collective its peer waits in stands out). Without either, nobody is named.
    Members without a stack are never outliers: no stack is no evidence.
    """
    wanted = set(members)
    by_rank = {r: g for g in grouping.groups for r in g.ranks if r in wanted}
    if len(by_rank) < 2:
        return []
    counts = Counter(id(g) for g in by_rank.values())
    groups = {id(g): g for g in by_rank.values()}
    top_id, top = counts.most_common(1)[0]
    reference: StackGroup | None = groups[top_id] if top * 2 > len(by_rank) else None
    how = "the majority of the group's members with stacks"
    if reference is None:
        collective = [g for g in groups.values() if g.collective is not None]
        reference = collective[0] if len(collective) == 1 else None
        how = "the members inside the collective"
    if reference is None:
        return []
    peers = sorted(r for r, g in by_rank.items() if g is reference)
    outliers = []
    for rank, group in sorted(by_rank.items()):
        if group is reference:
            continue
        reason = (f"its stack ({group.summary}) differs from {how}, {ranks_phrase(peers)} "
                  f"({reference.summary})")
        outliers.append(StackOutlier(rank=rank, stack=group, majority=reference, reason=reason))
    return outliers


def render_stack_groups(grouping: StackGrouping, *, limit: int = 16) -> list[str]:
    """Plain text, one line per group (and per rank without a stack):
    ``ranks 0, 1, 3: `all_reduce` from `train.py:88 step()```. For the text report, which the
    markdown builders fence; use :func:`stack_groups_markdown` for markdown."""
    lines = [f"{ranks_phrase(g.ranks)}: {g.summary}" for g in grouping.groups[:limit]]
    if len(grouping.groups) > limit:
        lines.append(f"... and {len(grouping.groups) - limit} more stack groups")
    for rank, why in list(grouping.without_stack.items())[:limit]:
        lines.append(f"rank {rank}: no stack ({why})")
    if len(grouping.without_stack) > limit:
        lines.append(f"... and {len(grouping.without_stack) - limit} more ranks without a stack")
    return lines


def stack_groups_markdown(grouping: StackGrouping, *, limit: int = 16) -> str:
    """:func:`render_stack_groups` as a markdown list, every line escaped (file and function names
    come from the job's evidence)."""
    return "\n".join(f"- {inline(line, limit=500)}" for line in render_stack_groups(grouping, limit=limit))


def render_outlier(outlier: StackOutlier, *, frames: int = USER_FRAMES + 1) -> list[str]:
    """The outlier's short stack beside the reference's, plain text, innermost first."""
    def column(title: str, shown: Sequence[StackFrame]) -> list[str]:
        return [title] + [f"    {f.short()}" for f in shown[:frames]]
    return (column(f"rank {outlier.rank}: {outlier.stack.summary}", outlier.stack.frames)
            + column(f"{ranks_phrase(outlier.majority.ranks)}: {outlier.majority.summary}",
                     outlier.majority.frames))
