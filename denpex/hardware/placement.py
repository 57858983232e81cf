"""Where a rank ran: its host, GPU, PCIe path and pid, from the manifest and the telemetry.

The manifest says what it knows (host, local rank, PCI bus id, UUID, pid); the collector's GPU
records (and ``NVRM: GPU at PCI:... GPU-uuid`` lines) fill in the rest, so a manifest that only has
a UUID still matches a kernel Xid line that only has a PCI address.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict

from pydantic import BaseModel, ConfigDict

from denpex.evidence.manifest import JobManifest
from denpex.hardware.events import GpuIdentity, GpuRef

__all__ = ["RankPlacement", "GpuDirectory", "host_key", "same_gpu", "place_rank"]


def host_key(host: str | None, domain: str | None = None) -> str | None:
    """A host's comparison key: the name in lower case, with the operator's ``domain`` removed.

    Journals print the short host name while schedulers often know the FQDN, but a name from
    another domain is another machine: ``gpu-node-002.other-cluster.example`` must never match
    ``gpu-node-002``. So names match exactly, except that the one domain the operator configures
    is dropped: with ``domain="dc1.example"``, ``gpu-node-002.dc1.example`` -> ``gpu-node-002``;
    without it, the FQDN stays whole. An IP address is always kept whole.
    """
    if not host:
        return None
    text = host.strip().lower().rstrip(".")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        suffix = "." + domain.strip().lower().strip(".") if domain and domain.strip(". ") else None
        if suffix and text.endswith(suffix) and len(text) > len(suffix):
            return text[: -len(suffix)]
        return text or None
    return text


class RankPlacement(BaseModel):
    """One rank's host, GPU and process, as far as the evidence tells."""

    model_config = ConfigDict(frozen=True)

    rank: int
    host: str | None = None
    gpu: GpuRef | None = None
    pcie_path: tuple[str, ...] | None = None
    pid: int | None = None
    # True when the GPU index was taken from local_rank because the manifest named no GPU.
    gpu_from_local_rank: bool = False


class GpuDirectory:
    """GPU identities per host, to complete a partial ``GpuRef`` (PCI id <-> UUID <-> index)."""

    def __init__(self, identities: list[GpuIdentity], *, domain: str | None = None) -> None:
        self._domain = domain
        self._by_host: dict[str | None, list[GpuIdentity]] = defaultdict(list)
        for identity in identities:
            self._by_host[host_key(identity.host, domain)].append(identity)

    def complete(self, host: str | None, gpu: GpuRef | None) -> tuple[GpuRef | None, tuple[str, ...] | None]:
        """The fullest known ``GpuRef`` for ``gpu`` on ``host``, and the PCIe path above it if known."""
        if gpu is None:
            return None, None
        merged, path = gpu, None
        for identity in self._by_host.get(host_key(host, self._domain), []):
            if same_gpu(identity.gpu, merged) is True or _same_index_only(merged, identity.gpu):
                merged = GpuRef(
                    pci_bus_id=merged.pci_bus_id or identity.gpu.pci_bus_id,
                    uuid=merged.uuid or identity.gpu.uuid,
                    index=merged.index if merged.index is not None else identity.gpu.index,
                )
                path = path or identity.pcie_path
        return merged, path


def same_gpu(a: GpuRef | None, b: GpuRef | None) -> bool | None:
    """True or False when the two refs share an identifier to compare; None when they cannot be compared.

    The PCI address decides first, then the UUID; the index only when neither side has either,
    because NVML and CUDA may number GPUs differently.
    """
    if a is None or b is None:
        return None
    if a.pci_bus_id and b.pci_bus_id:
        return a.pci_bus_id == b.pci_bus_id
    if a.uuid and b.uuid:
        return _uuid_key(a.uuid) == _uuid_key(b.uuid)
    if a.index is not None and b.index is not None and not (a.pci_bus_id or a.uuid or b.pci_bus_id or b.uuid):
        return a.index == b.index
    return None


def _uuid_key(uuid: str) -> str:
    # NVML and the kernel log write "GPU-5d1e...", torch's device uuid just "5d1e...": one GPU.
    text = uuid.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _same_index_only(query: GpuRef, known: GpuRef) -> bool:
    # A manifest that gives only an index (or a local rank) is matched to NVML's index.
    return query.pci_bus_id is None and query.uuid is None and query.index is not None and query.index == known.index


def place_rank(
    rank: int, manifest: JobManifest | None, directory: GpuDirectory, *, fallback_host: str | None = None
) -> RankPlacement:
    """Map a rank to its host and GPU through the manifest, completed by the telemetry's GPU records."""
    identity = manifest.ranks.get(rank) if manifest is not None else None
    host = (identity.host if identity else None) or fallback_host
    if identity is None:
        return RankPlacement(rank=rank, host=host)
    gpu: GpuRef | None = None
    from_local_rank = False
    if identity.gpu_pci_bus_id or identity.gpu_uuid or identity.gpu_index is not None:
        try:
            gpu = GpuRef(pci_bus_id=identity.gpu_pci_bus_id, uuid=identity.gpu_uuid, index=identity.gpu_index)
        except ValueError:
            # An unreadable PCI id in the manifest: fall back to the UUID rather than fail triage.
            gpu = GpuRef(uuid=identity.gpu_uuid, index=identity.gpu_index)
    elif identity.local_rank is not None:
        # The common launcher default: local rank N drives GPU N. Flagged, since it is an assumption.
        gpu, from_local_rank = GpuRef(index=identity.local_rank), True
    gpu, path = directory.complete(host, gpu)
    return RankPlacement(
        rank=rank, host=host, gpu=gpu, pcie_path=path, pid=identity.pid, gpu_from_local_rank=from_local_rank
    )
