"""Pure parsers for ``scontrol show node`` and ``squeue`` output (Slurm 22.05 and later).

``scontrol --json`` does not exist in 22.05 and ``sinfo`` hides DOWN behind ``drained`` and cuts
reasons, so ``scontrol show node`` text is the source of truth. Both the multi-line layout and the
one-line (``-o``) layout are accepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.isolation.errors import UnreadableRecordError
from denpex.isolation.facts import NodeFacts

__all__ = [
    "SlurmNode",
    "parse_show_node",
    "parse_job_ids",
    "parse_jobs_by_node",
    "expand_hostlist",
    "node_not_found",
    "ControllerFault",
    "controller_fault",
    "parse_cluster_name",
    "to_node_facts",
    "SlurmJob",
    "parse_show_job",
    "job_not_found",
]

_RECORD_START = re.compile(r"(?m)^(?=NodeName=)")
# The reason ends at Slurm's " [user@time]" suffix when the next field (or the line's end)
# follows it, else at the end of its line. In the one-line layout free-text fields (Comment=,
# Extra=) follow the reason on the same line and must not become part of it.
_REASON = re.compile(
    r"(?m)(?:^|[ \t])Reason=(?P<text>.*?)"
    r"(?: \[(?P<user>[^@\]\s]+)@(?P<time>[^\]]+)\](?=[ \t]+[A-Za-z][A-Za-z0-9_]*=|[ \t]*$)|[ \t]*$)"
)
_KEY = re.compile(r"(?:^|(?<=\s))(?P<key>[A-Za-z][A-Za-z0-9_]*)=")
_ISOLATING_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})
_NULL = "(null)"


class SlurmNode(BaseModel):
    """One node of ``scontrol show node``: the fields we decide on, plus all raw fields."""

    model_config = ConfigDict(frozen=True)

    name: str
    state: str
    base_state: str
    flags: tuple[str, ...]
    reason: str | None = None
    reason_user: str | None = None
    reason_time: str | None = None
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    fields: dict[str, str] = {}

    @property
    def isolated(self) -> bool:
        return self.base_state in _ISOLATING_FLAGS or bool(_ISOLATING_FLAGS.intersection(self.flags))

    @property
    def down(self) -> bool:
        return self.base_state == "DOWN" or "DOWN" in self.flags

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags


def _split_state(state: str) -> tuple[str, tuple[str, ...]]:
    """``"MIXED+DRAIN"`` -> ``("MIXED", ("DRAIN",))``; ``"IDLE*"`` -> ``("IDLE", ("NOT_RESPONDING",))``."""
    parts = [p for p in state.split("+") if p]
    if not parts:
        return "UNKNOWN", ()
    base, flags = parts[0], list(parts[1:])
    if base.endswith("*"):
        base = base.rstrip("*")
        flags.append("NOT_RESPONDING")
    return base, tuple(dict.fromkeys(flags))


def _list_field(value: str | None) -> tuple[str, ...]:
    if not value or value == _NULL:
        return ()
    return tuple(item for item in value.split(",") if item)


def record_fields(line: str, unique: tuple[str, ...]) -> dict[str, str]:
    """One ``scontrol -o`` record's fields; UnreadableRecordError when a field in ``unique`` appears
    twice. The job's name, comment, command and paths are the user's own text, printed among the
    fields: a name such as ``x NodeList=victim-[01-02]`` would otherwise choose the nodes."""
    flat = " ".join(line.split())
    named = [key for key in unique if len(re.findall(rf"(?:^|(?<=\s)){key}=", flat)) > 1]
    if named:
        raise UnreadableRecordError(
            f"Slurm's record of the job names {', '.join(named)} more than once (the job's name or comment holds "
            "such text), so it cannot be read safely")
    return _fields(flat)


def hosts_of(fields: dict[str, str], key: str) -> tuple[str, ...]:
    """The expanded host list of field ``key``; UnreadableRecordError when it is hostile."""
    value = next(iter(fields.get(key, "").split()), "")
    if not value or value == _NULL:
        return ()
    try:
        return tuple(expand_hostlist(value))
    except ValueError as exc:
        raise UnreadableRecordError(f"Slurm's {key} cannot be read: {exc}") from exc


def _fields(flat: str) -> dict[str, str]:
    keys = list(_KEY.finditer(flat))
    fields: dict[str, str] = {}
    for here, after in zip(keys, [*keys[1:], None], strict=True):
        end = after.start() if after else len(flat)
        fields.setdefault(here.group("key"), flat[here.end():end].strip())
    return fields


class SlurmJob(BaseModel):
    """One job of ``scontrol -o show job``: what a requeue is decided and verified on."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    """Where it runs (empty while pending)."""
    excluded: tuple[str, ...]
    """``ExcNodeList``, expanded."""
    held: bool
    """Held by ``scontrol requeuehold`` (``Reason=job_requeued_in_held_state``); a hold a person
    set (JobHeldUser, JobHeldAdmin) is theirs and is not counted here."""

    @property
    def active_on(self) -> tuple[str, ...]:
        """The nodes a running (or still completing) job occupies."""
        return self.nodes if self.state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED") else ()


def parse_show_job(text: str) -> SlurmJob | None:
    """``scontrol -o show job J`` -> the job; None when the text holds no job record.

    ``JobId=7 JobState=PENDING Reason=BeginTime ... ExcNodeList=gpu-node-[003-004] NodeList=(null)``
    -> ``SlurmJob(job_id="7", state="PENDING", reason="BeginTime", nodes=(), excluded=("gpu-node-003",
    "gpu-node-004"), held=False)``.
    """
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), None)
    if line is None:
        return None
    fields = record_fields(line, ("JobId", "JobState", "Reason", "NodeList", "ExcNodeList"))
    reason = fields.get("Reason", "")
    return SlurmJob(
        job_id=fields.get("JobId", ""), state=fields.get("JobState", ""), reason=reason,
        nodes=hosts_of(fields, "NodeList"), excluded=hosts_of(fields, "ExcNodeList"),
        held=reason == "job_requeued_in_held_state",
    )


def job_not_found(output: str) -> bool:
    """``scontrol show job J`` says ``Invalid job id specified`` (rc 1) for a job Slurm no longer has."""
    return "Invalid job id specified" in output


def _parse_record(record: str) -> SlurmNode:
    reason = _REASON.search(record)
    rest = record
    if reason:
        rest = record[: reason.start()] + " " + record[reason.end():]
    flat = " ".join(rest.split())
    keys = list(_KEY.finditer(flat))
    fields: dict[str, str] = {}
    for here, after in zip(keys, [*keys[1:], None], strict=True):
        end = after.start() if after else len(flat)
        # The first occurrence is the node's own field: Comment= and Extra= come last and hold
        # free text, where "State=IDLE" or "AvailableFeatures=gpu" must not replace the real one.
        fields.setdefault(here.group("key"), flat[here.end():end].strip())
    base, flags = _split_state(fields.get("State", ""))
    reason_text = reason.group("text").strip() if reason else None
    return SlurmNode(
        name=fields.get("NodeName", ""),
        state=fields.get("State", ""),
        base_state=base,
        flags=flags,
        reason=reason_text or None,
        reason_user=reason.group("user") if reason else None,
        reason_time=reason.group("time") if reason else None,
        partitions=_list_field(fields.get("Partitions")),
        features=_list_field(fields.get("AvailableFeatures")),
        fields=fields,
    )


def parse_show_node(text: str) -> list[SlurmNode]:
    """Parse ``scontrol show node`` (any number of nodes, either layout).

    Example (one line, shortened)::

        NodeName=gpu-node-002 CPUAlloc=1 State=MIXED+DRAIN Partitions=gpu
        Reason=denpex:inc-1 rank 1: xid 79 [root@2026-11-29T20:06:35]

    gives ``SlurmNode(name="gpu-node-002", base_state="MIXED", flags=("DRAIN",),
    reason="denpex:inc-1 rank 1: xid 79", reason_user="root",
    reason_time="2026-11-29T20:06:35", partitions=("gpu",))``.
    """
    records = [r for r in _RECORD_START.split(text) if r.strip().startswith("NodeName=")]
    return [_parse_record(r) for r in records]


def parse_job_ids(text: str) -> tuple[str, ...]:
    """``squeue -h -w NODE -o %i`` output -> job ids in order: ``"12\\n13\\n"`` -> ``("12", "13")``."""
    return tuple(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: ``"a[1,2],b"`` -> ``["a[1,2]", "b"]``."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (part.strip() for part in parts) if p]




MAX_HOSTLIST_NAMES = 65_536
"""More names than any cluster has: a longer list is hostile or broken (``n[0-999999999]``)."""
_NUMBER = re.compile(r"[0-9]+")


def expand_hostlist(text: str, *, limit: int = MAX_HOSTLIST_NAMES) -> list[str]:
    """Slurm host-list syntax to names, as ``scontrol show hostnames`` does.

    ``"gpu-node-[001-003,007],login1"`` -> ``["gpu-node-001", "gpu-node-002", "gpu-node-003",
    "gpu-node-007", "login1"]``; ``"r[1-2]n[1-2]"`` -> ``["r1n1", "r1n2", "r2n1", "r2n2"]``.
    A list of more than ``limit`` names is refused (ValueError) before it is built.
    """
    names: list[str] = []
    for part in _split_top_level(text.strip()):
        _expand_one(part, names, limit)
    return names


def _expand_one(expr: str, names: list[str], limit: int) -> None:
    match = re.search(r"\[([^\[\]]*)\]", expr)
    if match is None:
        if len(names) >= limit:
            raise ValueError(f"host list names more than {limit} nodes")
        names.append(expr)
        return
    head, tail = expr[: match.start()], expr[match.end():]
    for item in match.group(1).split(","):
        low, _, high = item.partition("-")
        if not _NUMBER.fullmatch(low) or (high and not _NUMBER.fullmatch(high)):
            raise ValueError(f"bad range {item!r} in host list {expr!r}")
        if int(high or low) - int(low) >= limit:
            raise ValueError(f"host list names more than {limit} nodes")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            _expand_one(f"{head}{number:0{width}d}{tail}", names, limit)


def parse_jobs_by_node(text: str) -> dict[str, tuple[str, ...]]:
    """``squeue -h -t RUNNING,COMPLETING -o "%i %N"`` -> node name to its job ids.

    ``"12 gpu-node-[001-002]\n13 gpu-node-002\n"`` -> ``{"gpu-node-001": ("12",),
    "gpu-node-002": ("12", "13")}``. Lines without a node list (pending jobs) are skipped.
    """
    jobs: dict[str, list[str]] = {}
    for line in text.splitlines():
        job, _, nodes = line.strip().partition(" ")
        if not job or not nodes.strip() or nodes.strip() == _NULL:
            continue
        for node in expand_hostlist(nodes):
            if job not in jobs.setdefault(node, []):
                jobs[node].append(job)
    return {node: tuple(ids) for node, ids in sorted(jobs.items())}


def parse_cluster_name(text: str) -> str | None:
    """``scontrol show config`` -> its ``ClusterName``: ``"ClusterName             = lab"`` -> ``"lab"``."""
    match = re.search(r"(?m)^ClusterName\s*=\s*(\S+)\s*$", text)
    return match.group(1) if match else None


def node_not_found(output: str) -> bool:
    """``scontrol show node X`` says ``Node X not found`` (rc 1) for an unknown node."""
    return bool(re.search(r"\bNode \S+ not found\b", output))


class ControllerFault(StrEnum):
    """How a Slurm client failed to talk to slurmctld: a passing fault, not a refused request."""

    NOT_SENT = "not_sent"
    """The connection was refused: the request never reached slurmctld, so sending it again is safe."""
    UNANSWERED = "unanswered"
    """The request may have reached slurmctld and its answer was lost: a change may have happened."""


# Slurm's own error texts (libslurm slurm_errno.c, 22.05), as the clients print them on stderr:
# ``slurm_load_node error: Socket timed out on send/recv operation``. Only the connect failure
# proves nothing was sent; "Unable to contact slurm controller (send|receive|shutdown failure)"
# and the socket errors can come after the request left.
_NOT_SENT = ("Unable to contact slurm controller (connect failure)",)
_UNANSWERED = (
    "Unable to contact slurm controller",
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
    "Unexpected missing socket error",
)


def controller_fault(stderr: str) -> ControllerFault | None:
    """Whether a failed ``scontrol``/``squeue`` could not reach slurmctld (None: it answered).

    ``"slurm_update error: Unable to contact slurm controller (connect failure)"`` -> NOT_SENT;
    ``"slurm_update error: Zero Bytes were transmitted or received"`` -> UNANSWERED;
    ``"slurm_update error: Invalid node state specified"`` -> None.
    """
    if any(text in stderr for text in _NOT_SENT):
        return ControllerFault.NOT_SENT
    if any(text in stderr for text in _UNANSWERED):
        return ControllerFault.UNANSWERED
    return None


def to_node_facts(node: SlurmNode, running_jobs: Iterable[str], opt_out_feature: str,
                  actor: str | None = None) -> NodeFacts:
    """The scheduler-neutral view the gates decide on. ``actor`` is the user Denpex's commands run
    as; a reason Slurm says another user set is never Denpex's, whatever its text."""
    return NodeFacts(
        name=node.name,
        exists=True,
        state=node.state,
        isolated=node.isolated,
        down=node.down,
        not_responding=node.not_responding,
        reason=node.reason,
        reason_user=node.reason_user,
        reason_set_by_other_user=bool(actor and node.reason_user and node.reason_user != actor),
        partitions=node.partitions,
        running_jobs=tuple(running_jobs),
        opted_out=opt_out_feature in node.features,
    )
