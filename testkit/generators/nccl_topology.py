"""The shape of a simulated 3D-parallel job: ranks, hosts and process groups as NCCL names them.

Global ranks follow Megatron's order, tensor-parallel fastest, then data-parallel, then the
pipeline stage::

    rank = stage * (dp * tp) + dp_index * tp + tp_index

    tp=4, pp=4, dp=4 (64 ranks, 8 per host):
      tp group  (stage 1, dp 0)      -> [16, 17, 18, 19]      one host
      dp group  (stage 1, tp 2)      -> [18, 22, 26, 30]      two hosts
      pp group  (dp 0, tp 2)         -> [2, 18, 34, 50]       group-local rank == stage
      embedding (dp 0, tp 2)         -> [2, 50]               first and last stage only

Two naming styles, both as torch 2.13 records them in ``process_group[0]``:

- ``MEGATRON``: ``new_group`` without hashing names groups by a global counter (``"1"``, ``"2"``,
  ...) that every rank advances for every group, member or not; descs are Megatron's
  (``TENSOR_MODEL_PARALLEL_GROUP`` ...). Every rank creates its groups in the same order, so
  rank-local ``pg_id``\\ s happen to agree.
- ``MESH``: ``init_device_mesh`` names groups by a SHA-1 of their ranks and describes them
  ``mesh_pp``/``mesh_dp``/``mesh_tp``. The first- and last-stage ranks create their embedding
  group *before* the mesh, so the same pp group has ``pg_id`` 2 on some members and 1 on others:
  only the name identifies a group across ranks.

The default group is always named ``"0"`` with desc ``default_pg`` and ``pg_id`` 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "GroupKind",
    "NamingStyle",
    "ProcessGroupInfo",
    "Layout",
    "Topology",
    "build_topology",
    "megatron_desc",
]


class GroupKind(StrEnum):
    """The role of a process group in the job."""

    DEFAULT = "default"
    """The world group ``"0"``; used once, for the start-up barrier."""
    TP = "tp"
    """Tensor parallel: collectives inside one pipeline stage."""
    PP = "pp"
    """Pipeline parallel: point-to-point sends and recvs between neighbouring stages only."""
    DP = "dp"
    """Data parallel: parameter all-gather at step start, gradient all-reduce at step end."""
    EMBEDDING = "embedding"
    """First and last stage of one pipeline: the tied-embedding gradient all-reduce (2 ranks)."""
    EP = "ep"
    """Expert parallel (MoE): the token dispatch and combine ``all_to_all`` inside a stage."""
    EXPERT_TP = "expert_tp"
    """Expert tensor parallel: the experts' own all-gather / reduce-scatter."""
    EXPERT_DP = "expert_dp"
    """Expert data parallel: expert parameter gather and gradient reduce-scatter."""


class NamingStyle(StrEnum):
    """How group names and descs look in the dumps."""

    MEGATRON = "megatron"
    """Sequential names from ``new_group`` and Megatron's ``*_GROUP`` descs."""
    MESH = "mesh"
    """SHA-1 names from ``init_device_mesh`` and ``mesh_*`` descs."""


_MEGATRON_DESC = {
    GroupKind.TP: "TENSOR_MODEL_PARALLEL_GROUP",
    GroupKind.PP: "PIPELINE_MODEL_PARALLEL_GROUP",
    GroupKind.DP: "DATA_PARALLEL_GROUP",
    GroupKind.EMBEDDING: "EMBEDDING_GROUP",
    GroupKind.EP: "EXPERT_MODEL_PARALLEL_GROUP",
    GroupKind.EXPERT_TP: "EXPERT_TENSOR_PARALLEL_GROUP",
    GroupKind.EXPERT_DP: "EXPERT_DATA_PARALLEL_GROUP",
}
_MESH_DESC = {
    GroupKind.TP: "mesh_tp",
    GroupKind.PP: "mesh_pp",
    GroupKind.DP: "mesh_dp",
    GroupKind.EMBEDDING: "embedding_group",
}


@dataclass(frozen=True, slots=True)
class ProcessGroupInfo:
    """One process group: its FR identity and its global ranks in group-rank order."""

    name: str
    desc: str
    kind: GroupKind
    ranks: tuple[int, ...]

    def group_rank(self, global_rank: int) -> int:
        """The group-local rank NCCL uses in ``nccl:send 0->1``; ranks are sorted by torch."""
        return self.ranks.index(global_rank)

    def ranks_str(self) -> str:
        """``pg_config``'s form: ``"[0, 1, 2]"`` (``ranks_str`` in TraceUtils.h)."""
        return "[" + ", ".join(str(r) for r in self.ranks) + "]"


@dataclass(frozen=True, slots=True)
class Layout:
    """Parallel degrees and host packing of the job."""

    tp: int = 4
    pp: int = 4
    dp: int = 4
    ranks_per_host: int = 8
    naming: NamingStyle = NamingStyle.MEGATRON

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def rank_of(self, stage: int, dp_index: int, tp_index: int) -> int:
        return stage * self.dp * self.tp + dp_index * self.tp + tp_index

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(stage, dp_index, tp_index)`` of a global rank."""
        stage, rest = divmod(rank, self.dp * self.tp)
        dp_index, tp_index = divmod(rest, self.tp)
        return stage, dp_index, tp_index

    def host_of(self, rank: int) -> str:
        return f"gpu-node-{rank // self.ranks_per_host + 1:03d}"

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_host


@dataclass(frozen=True, slots=True)
class Topology:
    """Every group of the job, and each rank's groups in the order it created them."""

    layout: Layout
    groups: dict[str, ProcessGroupInfo]
    # rank -> group names in creation order; the index is the rank-local pg_id.
    creation_order: dict[int, tuple[str, ...]] = field(repr=False)

    def pg_id(self, rank: int, group: str) -> int:
        """The rank-local ``pg_id`` (ProcessGroupNCCL's per-process ``local_id_``)."""
        return self.creation_order[rank].index(group)

    def group_of(self, rank: int, kind: GroupKind) -> ProcessGroupInfo | None:
        for name in self.creation_order[rank]:
            info = self.groups[name]
            if info.kind is kind:
                return info
        return None

    def groups_of(self, rank: int) -> list[ProcessGroupInfo]:
        return [self.groups[name] for name in self.creation_order[rank]]


def build_topology(layout: Layout) -> Topology:
    """Name and order every group as torch would for ``layout``."""
    tp_groups = [
        tuple(layout.rank_of(s, d, t) for t in range(layout.tp))
        for s in range(layout.pp) for d in range(layout.dp)
    ]
    dp_groups = [
        tuple(layout.rank_of(s, d, t) for d in range(layout.dp))
        for s in range(layout.pp) for t in range(layout.tp)
    ]
    pp_groups = [
        tuple(layout.rank_of(s, d, t) for s in range(layout.pp))
        for d in range(layout.dp) for t in range(layout.tp)
    ]
    embedding_groups = [(ranks[0], ranks[-1]) for ranks in pp_groups] if layout.pp > 1 else []
    if layout.naming is NamingStyle.MEGATRON:
        ordered = _megatron_order(dp_groups, tp_groups, pp_groups, embedding_groups)
    else:
        ordered = _mesh_order(dp_groups, tp_groups, pp_groups, embedding_groups)
    default = ProcessGroupInfo("0", "default_pg", GroupKind.DEFAULT, tuple(range(layout.world_size)))
    groups = {default.name: default}
    groups.update({info.name: info for info in ordered})
    creation_order = {
        rank: ("0", *(info.name for info in ordered if rank in info.ranks))
        for rank in range(layout.world_size)
    }
    return Topology(layout=layout, groups=groups, creation_order=creation_order)


def megatron_desc(kind: GroupKind) -> str:
    """The desc Megatron's ``initialize_model_parallel`` gives a group of ``kind``."""
    return "default_pg" if kind is GroupKind.DEFAULT else _MEGATRON_DESC[kind]


def _megatron_order(dp_groups: Sequence[tuple[int, ...]], tp_groups: Sequence[tuple[int, ...]],
                    pp_groups: Sequence[tuple[int, ...]], embedding_groups: Sequence[tuple[int, ...]]
                    ) -> list[ProcessGroupInfo]:
    """``initialize_model_parallel``: dp, then tp, then each pp group followed by its embedding
    group. ``_world.group_count`` starts at 1 after the default group."""
    planned: list[tuple[GroupKind, tuple[int, ...]]] = [(GroupKind.DP, g) for g in dp_groups]
    planned += [(GroupKind.TP, g) for g in tp_groups]
    for index, ranks in enumerate(pp_groups):
        planned.append((GroupKind.PP, ranks))
        if embedding_groups:
            planned.append((GroupKind.EMBEDDING, embedding_groups[index]))
    return [
        ProcessGroupInfo(str(counter), _MEGATRON_DESC[kind], kind, ranks)
        for counter, (kind, ranks) in enumerate(planned, start=1)
    ]


def _mesh_order(dp_groups: Sequence[tuple[int, ...]], tp_groups: Sequence[tuple[int, ...]],
                pp_groups: Sequence[tuple[int, ...]], embedding_groups: Sequence[tuple[int, ...]]
                ) -> list[ProcessGroupInfo]:
    """Embedding groups first (first/last-stage ranks only), then mesh dims pp, dp, tp."""
    planned: list[tuple[GroupKind, tuple[int, ...]]] = [(GroupKind.EMBEDDING, g) for g in embedding_groups]
    planned += [(GroupKind.PP, g) for g in pp_groups]
    planned += [(GroupKind.DP, g) for g in dp_groups]
    planned += [(GroupKind.TP, g) for g in tp_groups]
    return [
        ProcessGroupInfo(_hashed_name(ranks, index), _MESH_DESC[kind], kind, ranks)
        for index, (kind, ranks) in enumerate(planned, start=1)
    ]


def _hashed_name(ranks: tuple[int, ...], groups_before: int) -> str:
    """``_hash_ranks_to_str`` in distributed_c10d.py: SHA-1 of the ranks and a group count."""
    text = "_".join(map(str, ranks)) + "_" + str(groups_before)
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()
