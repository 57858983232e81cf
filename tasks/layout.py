"""Where the job's ranks ran, from the scheduler, for ranks nobody placed (``host_source: derived``)."""

from __future__ import annotations

from prefect import task
from prefect.logging import get_run_logger

from denpex.analysis.triage import EvidenceInventory
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import IsolationError
from denpex.isolation.slurm import SlurmAdapter
from denpex.isolation.slurm_layout import derive_hosts, with_derived_hosts
from denpex.isolation.ssh import SshRunner

__all__ = ["derive_slurm_layout"]


@task(name="derive-layout")
def derive_slurm_layout(inventory: EvidenceInventory, settings: IsolationSettings, job_id: str) -> EvidenceInventory:
    """The inventory whose manifest places every rank without a host by Slurm's job record; the
    inventory unchanged (with a note saying why) when Slurm cannot tell."""
    known = inventory.manifest.ranks if inventory.manifest else {}
    if all(known.get(r) is not None and known[r].host for r in range(inventory.world_size)):
        return inventory
    if settings.ssh is None:
        return _noted(inventory, "no SSH settings for the Slurm target: the job's layout was not asked for")
    try:
        with SshRunner(settings.ssh) as runner:
            layout = SlurmAdapter(runner, backoff=settings.ssh.backoff).job_layout(job_id)
    except (IsolationError, OSError) as exc:
        return _noted(inventory, f"Slurm's record of job {job_id} could not be read ({exc}); no layout derived")
    if layout is None:
        return _noted(inventory, f"Slurm has no job {job_id}; no layout derived")
    hosts, why = derive_hosts(layout, inventory.world_size)
    manifest, filled, refused = with_derived_hosts(inventory.manifest, inventory.world_size, hosts)
    if why or refused:
        return _noted(inventory, why or refused or "")
    if not filled:
        return inventory
    note = (f"rank(s) {', '.join(map(str, filled[:16]))}{' ...' if len(filled) > 16 else ''}: host derived from "
            f"Slurm job {job_id}'s record (nodes {', '.join(layout.nodes[:8])}), a guess")
    get_run_logger().info("%s", note)
    return inventory.model_copy(update={"manifest": manifest, "notes": [*inventory.notes, note]})


def _noted(inventory: EvidenceInventory, note: str) -> EvidenceInventory:
    get_run_logger().info("%s", note)
    return inventory.model_copy(update={"notes": [*inventory.notes, note]})
