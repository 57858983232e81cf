"""Rank -> node from a Kubernetes job's pods, when no rank registered where it runs (``host_source: derived``).

A distributed job on Kubernetes runs one pod per node rank: an Indexed Job or a JobSet labels each
pod ``batch.kubernetes.io/job-completion-index``; Kubeflow's PyTorchJob labels its pods
``training.kubeflow.org/replica-type`` (``master`` is node rank 0, ``worker`` i follows it) and
``training.kubeflow.org/replica-index``. Each pod runs ``world_size / pods`` ranks (torchrun's
``nproc_per_node``), node rank r holding ranks ``r * per_pod ..`` — the block layout torchrun's
static rendezvous gives. The pod's ``spec.nodeName`` is its node::

    pods 0 on gpu-node-003, 1 on gpu-node-007; world 16   -> 0-7: gpu-node-003, 8-15: gpu-node-007

It is a guess, for the same reasons as Slurm's (:mod:`denpex.isolation.slurm_layout`): an elastic
rendezvous may number node ranks in another order. So the host is marked ``derived`` and never
supports a drain without a fresh signal from that node's own agent. A pod created after the
incident is not where the rank ran, and a job name seen in two namespaces is another tenant's job
too: neither is guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

__all__ = ["JobPod", "node_rank_of", "derive_pod_hosts"]

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
KUBEFLOW_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_INDEX = "training.kubeflow.org/replica-index"
_FINISHED = ("Succeeded", "Failed")


class JobPod(BaseModel):
    """The part of a pod that places a job's ranks."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    node: str | None
    phase: str | None
    labels: dict[str, str]
    created: datetime | None = None


def node_rank_of(labels: Mapping[str, str], *, has_master: bool) -> int | None:
    """The pod's node rank from its labels; None when they do not say."""
    index = labels.get(COMPLETION_INDEX)
    if index is not None:
        return int(index) if index.isdigit() else None
    kind, replica = labels.get(KUBEFLOW_TYPE, "").lower(), labels.get(KUBEFLOW_INDEX, "")
    if not replica.isdigit():
        return None
    if kind == "master":
        return int(replica)
    if kind == "worker":
        # PyTorchJob sets RANK = replica index + 1 for workers when a master exists.
        return int(replica) + (1 if has_master else 0)
    return None


def derive_pod_hosts(pods: Sequence[JobPod], world_size: int, job_id: str,
                     as_of: datetime | None) -> tuple[dict[int, str], str | None]:
    """Rank -> node by the pods' node ranks, or ``({}, why not)``."""
    if as_of is not None:
        as_of = as_of if as_of.tzinfo else as_of.replace(tzinfo=UTC)  # a run started by hand, naive
        pods = [p for p in pods if p.created is None or _utc(p.created) <= as_of]
    # Only pods that could have held the ranks count: one another namespace made later, or never
    # placed, says nothing about this job (and must not block its derivation).
    pods = [p for p in pods if p.node]
    if not pods:
        return {}, f"job {job_id} has no pod placed on a node before the incident"
    namespaces = sorted({p.namespace for p in pods})
    if len(namespaces) > 1:
        return {}, (f"job {job_id} names pods in more than one namespace ({', '.join(namespaces[:4])}): "
                    "another tenant's job shares the name, so no layout is guessed")
    has_master = any(p.labels.get(KUBEFLOW_TYPE, "").lower() == "master" for p in pods)
    by_rank: dict[int, list[JobPod]] = {}
    for pod in pods:
        rank = node_rank_of(pod.labels, has_master=has_master)
        if rank is None:
            return {}, (f"pod {pod.namespace}/{pod.name} of job {job_id} has no completion or replica "
                        "index label, so its node rank is unknown and no layout is guessed")
        by_rank.setdefault(rank, []).append(pod)
    nodes: dict[int, str] = {}
    for rank, candidates in by_rank.items():
        node, why = _node_of(rank, candidates, job_id)
        if node is None:
            return {}, why
        nodes[rank] = node
    if sorted(nodes) != list(range(len(nodes))):
        return {}, f"job {job_id}'s pods hold node ranks {sorted(nodes)[:8]}, not 0..{len(nodes) - 1}"
    per_pod, rest = divmod(world_size, len(nodes))
    if rest or per_pod == 0:
        return {}, (f"job {job_id}: {world_size} ranks do not split evenly over its {len(nodes)} pods, "
                    "so no block layout is guessed")
    return {rank: nodes[rank // per_pod] for rank in range(world_size)}, None


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _node_of(rank: int, pods: list[JobPod], job_id: str) -> tuple[str | None, str | None]:
    """The node of one node rank: its only pod's, or the one pod still running, or the newest;
    pods of the same index on different nodes with nothing to choose between them are a guess too far."""
    live = [p for p in pods if p.phase not in _FINISHED]
    chosen = live if live else pods
    if len({p.node for p in chosen}) == 1:
        return chosen[0].node, None
    dated = sorted((p for p in chosen if p.created is not None), key=lambda p: p.created or 0)
    if len(dated) == len(chosen) and dated[-1].created != dated[-2].created:
        return dated[-1].node, None
    where = ", ".join(sorted({str(p.node) for p in chosen})[:4])
    return None, f"job {job_id}'s node rank {rank} has pods on {where}; which one held the ranks is not known"
