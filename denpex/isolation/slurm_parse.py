"""Pure parsers for ``scontrol show node`` and ``squeue`` output (Slurm 22.05 and later).

``scontrol --json`` does not exist in 22.05 and ``sinfo`` hides DOWN behind ``drained`` and cuts
reasons, so ``scontrol show node`` text is the source of truth. Both the multi-line layout and the
one-line (``-o``) layout are accepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from denpex.isolation.facts import NodeFacts

__all__ = ["SlurmNode", "parse_show_node", "parse_job_ids", "node_not_found", "to_node_facts"]

_RECORD_START = re.compile(r"(?m)^(?=NodeName=)")
# The reason runs to the end of its line; Slurm appends " [user@time]" which we split off.
_REASON = re.compile(r"(?m)(?:^|[ \t])Reason=(?P<text>.*?)(?: \[(?P<user>[^@\]\s]+)@(?P<time>[^\]]+)\])?[ \t]*$")
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


def _parse_record(record: str) -> SlurmNode:
    reason = _REASON.search(record)
    rest = record
    if reason:
        rest = record[: reason.start()] + " " + record[reason.end():]
    flat = " ".join(rest.split())
    keys = list(_KEY.finditer(flat))
    fields: dict[str, str] = {}
    for here, after in zip(keys, [*keys[1:], None]):
        end = after.start() if after else len(flat)
        fields[here.group("key")] = flat[here.end():end].strip()
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


def node_not_found(output: str) -> bool:
    """``scontrol show node X`` says ``Node X not found`` (rc 1) for an unknown node."""
    return bool(re.search(r"\bNode \S+ not found\b", output))


def to_node_facts(node: SlurmNode, running_jobs: Iterable[str], opt_out_feature: str) -> NodeFacts:
    """The scheduler-neutral view the gates decide on."""
    return NodeFacts(
        name=node.name,
        exists=True,
        state=node.state,
        isolated=node.isolated,
        down=node.down,
        not_responding=node.not_responding,
        reason=node.reason,
        partitions=node.partitions,
        running_jobs=tuple(running_jobs),
        opted_out=opt_out_feature in node.features,
    )
