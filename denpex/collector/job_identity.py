"""What a rank knows about its job that a manifest would say: world size, groups, its GPU.

Read inside the training process at dump time, so that the dump's record (``DumpRecord``)
carries it and triage needs no manifest:

- process groups, by the name Flight Recorder records in ``process_group[0]``
  (``torch.distributed.distributed_c10d._world.pg_names``, the same name FR uses) with their
  global ranks (``get_process_group_ranks``) and desc. A rank only knows the groups it is a member
  of (non-members get no group object), so the job's groups are the union over its ranks' records;
- the current CUDA device's UUID and PCI address, when CUDA is initialized.

Every read is best effort: a failure leaves the field empty and never disturbs the job.

    >>> gpu_pci_bus_id(SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0))
    '0000:3b:00.0'
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

from denpex.evidence.manifest import ProcessGroupSpec

__all__ = ["JobIdentity", "read_job_identity", "gpu_pci_bus_id", "gpu_uuid"]

_log = logging.getLogger(__name__)


class JobIdentity(BaseModel):
    """The manifest facts one rank can see from inside the job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    world_size: int | None = None
    process_groups: dict[str, ProcessGroupSpec] = {}
    gpu_uuid: str | None = None
    gpu_pci_bus_id: str | None = None


def read_job_identity() -> JobIdentity:
    """This rank's view of its job; empty fields where torch cannot say."""
    try:
        import torch.distributed as dist
    except ImportError:
        return JobIdentity()
    world_size = None
    groups: dict[str, ProcessGroupSpec] = {}
    try:
        if dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size()
            groups = _process_groups(dist)
    except Exception:  # noqa: BLE001 - best effort inside a training job
        _log.exception("could not read the process groups for the dump record")
    uuid, pci = _current_gpu()
    return JobIdentity(world_size=world_size, process_groups=groups, gpu_uuid=uuid, gpu_pci_bus_id=pci)


def _process_groups(dist: Any) -> dict[str, ProcessGroupSpec]:
    from torch.distributed.distributed_c10d import _world

    groups = {}
    for group, name in list(_world.pg_names.items()):
        ranks = tuple(dist.get_process_group_ranks(group))
        desc = getattr(group, "group_desc", None)
        groups[str(name)] = ProcessGroupSpec(desc=desc if isinstance(desc, str) else None,
                                             ranks=tuple(sorted(ranks)))
    return dict(sorted(groups.items()))


def _current_gpu() -> tuple[str | None, str | None]:
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None, None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return gpu_uuid(props), gpu_pci_bus_id(props)
    except Exception:  # noqa: BLE001 - best effort inside a training job
        _log.exception("could not read the current GPU's identity for the dump record")
        return None, None


def gpu_uuid(props: Any) -> str | None:
    """NVML's spelling of the device UUID (``GPU-<uuid>``) from CUDA device properties."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def gpu_pci_bus_id(props: Any) -> str | None:
    """``domain:bus:device.0`` in lower-case hex, as the manifest and kernel logs write it."""
    domain, bus, device = (getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if not all(isinstance(v, int) for v in (domain, bus, device)):
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"
