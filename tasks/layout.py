"""Where the job's ranks ran, from the scheduler, for ranks nobody placed (``host_source: derived``)."""

from __future__ import annotations

from datetime import datetime

from prefect import task
from prefect.logging import get_run_logger

from denpex.analysis.triage import EvidenceInventory
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import IsolationError
from denpex.isolation.k8s_layout import derive_pod_hosts
from denpex.isolation.kubernetes import KubernetesAdapter
from denpex.isolation.policy import SafetyLimits, Scheduler
from denpex.isolation.slurm import SlurmAdapter
from denpex.isolation.slurm_layout import derive_hosts, with_derived_hosts
from denpex.isolation.ssh import SshRunner
from tasks.options import NOT_CACHED

__all__ = ["derive_layout"]


@task(name="derive-layout", **NOT_CACHED)
def derive_layout(inventory: EvidenceInventory, scheduler: Scheduler, settings: IsolationSettings, job_id: str,
                  as_of: datetime | None) -> EvidenceInventory:
    """The inventory whose manifest places every rank without a host by the scheduler's record of
    the job (Slurm's job record, or the Kubernetes job's pods); unchanged, with a note saying why,
    when the scheduler cannot tell."""
    known = inventory.manifest.ranks if inventory.manifest else {}
    if all(known.get(r) is not None and known[r].host for r in range(inventory.world_size)):
        return inventory
    if scheduler is Scheduler.SLURM:
        hosts, source = _from_slurm(inventory, settings, job_id)
    else:
        hosts, source = _from_kubernetes(inventory, settings, job_id, as_of)
    if hosts is None:
        return _noted(inventory, source)
    manifest, filled, refused = with_derived_hosts(inventory.manifest, inventory.world_size, hosts)
    if refused:
        return _noted(inventory, refused)
    if not filled:
        return inventory
    note = (f"rank(s) {', '.join(map(str, filled[:16]))}{' ...' if len(filled) > 16 else ''}: host derived from "
            f"{source}, a guess")
    get_run_logger().info("%s", note)
    return inventory.model_copy(update={"manifest": manifest, "notes": [*inventory.notes, note]})


def _from_slurm(inventory: EvidenceInventory, settings: IsolationSettings,
                job_id: str) -> tuple[dict[int, str] | None, str]:
    """(rank -> node, where from) or (None, why not)."""
    if settings.ssh is None:
        return None, "no SSH settings for the Slurm target: the job's layout was not asked for"
    try:
        with SshRunner(settings.ssh) as runner:
            layout = SlurmAdapter(runner, backoff=settings.ssh.backoff).job_layout(job_id)
    except (IsolationError, OSError) as exc:
        return None, f"Slurm's record of job {job_id} could not be read ({exc}); no layout derived"
    if layout is None:
        return None, f"Slurm has no job {job_id}; no layout derived"
    hosts, why = derive_hosts(layout, inventory.world_size)
    if why:
        return None, why
    return hosts, f"Slurm job {job_id}'s record (nodes {', '.join(layout.nodes[:8])})"


def _from_kubernetes(inventory: EvidenceInventory, settings: IsolationSettings, job_id: str,
                     as_of: datetime | None) -> tuple[dict[int, str] | None, str]:
    if settings.kubernetes is None:
        return None, "no Kubernetes settings for the target: the job's pods were not asked for"
    try:
        with KubernetesAdapter.connect(settings.kubernetes, opt_out_label=SafetyLimits().opt_out_label) as adapter:
            pods = adapter.job_pods(job_id)
    except (IsolationError, OSError) as exc:
        return None, f"the pods of job {job_id} could not be listed ({exc}); no layout derived"
    hosts, why = derive_pod_hosts(pods, inventory.world_size, job_id, as_of)
    if why:
        return None, f"{why}; no layout derived"
    nodes = sorted(set(hosts.values()))
    return hosts, f"Kubernetes job {job_id}'s pods (nodes {', '.join(nodes[:8])})"


def _noted(inventory: EvidenceInventory, note: str) -> EvidenceInventory:
    get_run_logger().info("%s", note)
    return inventory.model_copy(update={"notes": [*inventory.notes, note]})
