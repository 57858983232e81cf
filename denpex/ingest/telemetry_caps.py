"""How much telemetry one key may add to one incident, for every key.

A job's key (its telemetry is shown in the report and never supports a drain) and a node agent's
key (its telemetry about its own host may support one) each have a cap per incident, in files and
in bytes; a request that would pass it is refused whole (413), so nothing of it is stored:

    key                          files    bytes     why this much
    node agent's (bound to host)    64    64 MiB    `denpex node-agent` sends the newest 32 MiB of a
                                                    host's kernel log; room to send it twice
    job's (no host)              4,096    16 MiB    one NVML snapshot per rank (about 15 KiB for an
                                                    8-GPU host) for a thousand hosts

Before, a job's key had no cap at all: sixteen parts of 2 MiB of repeated Xid lines in two
uploads made ``denpex triage`` of that incident take 51 s and 781 MB. The collector's uploader
sends a dump again without its telemetry when the service refuses the telemetry, so a rank of a
large job never loses its dump to this cap. A host keeps at most 64 files per incident whatever
key sends them. Bytes are counted from the ``size`` the service records with each file (files
stored before it was recorded count as none).
"""

from __future__ import annotations

import hashlib

from denpex.ingest.auth import Caller
from denpex.ingest.errors import PayloadTooLargeError
from denpex.ingest.incidents import StoredTelemetry
from denpex.ingest.layout import telemetry_name

__all__ = ["MAX_TELEMETRY_FILES_PER_HOST", "MAX_TELEMETRY_BYTES_PER_HOST_KEY", "MAX_TELEMETRY_FILES_PER_JOB_KEY",
           "MAX_TELEMETRY_BYTES_PER_JOB_KEY", "new_telemetry", "telemetry_item"]

_MiB = 1 << 20
MAX_TELEMETRY_FILES_PER_HOST = 64
"""Telemetry files one host may add to one incident (whichever key of that host sends them)."""
MAX_TELEMETRY_BYTES_PER_HOST_KEY = 64 * _MiB
MAX_TELEMETRY_FILES_PER_JOB_KEY = 4096
MAX_TELEMETRY_BYTES_PER_JOB_KEY = 16 * _MiB


def telemetry_item(data: bytes, caller: Caller) -> StoredTelemetry:
    """Telemetry is trusted only from a key bound to a host (a node agent's key)."""
    sha256 = hashlib.sha256(data).hexdigest()
    return StoredTelemetry(sha256=sha256, object_name=telemetry_name(sha256, caller.host),
                           trusted=caller.host is not None, host=caller.host, key_id=caller.key_id, size=len(data))


def new_telemetry(telemetry: list[bytes], caller: Caller,
                  known: list[StoredTelemetry]) -> list[tuple[StoredTelemetry, bytes]]:
    """This request's telemetry files that the incident does not hold yet (each once), within the
    caps of the module docstring (413 past one: nothing of the request is stored)."""
    held = {t.object_name for t in known}
    out: dict[str, tuple[StoredTelemetry, bytes]] = {}
    for data in telemetry:
        item = telemetry_item(data, caller)
        if item.object_name not in held:
            out.setdefault(item.object_name, (item, data))
    if not out:
        return []
    if caller.host is not None:
        of_host = sum(1 for t in known if t.trusted and t.host == caller.host)
        if of_host + len(out) > MAX_TELEMETRY_FILES_PER_HOST:
            raise PayloadTooLargeError(f"host {caller.host!r} holds {of_host} telemetry files of this incident and "
                                       f"sent {len(out)} more; an incident keeps at most "
                                       f"{MAX_TELEMETRY_FILES_PER_HOST} telemetry files per host; nothing was stored")
    files, size = ((MAX_TELEMETRY_FILES_PER_HOST, MAX_TELEMETRY_BYTES_PER_HOST_KEY) if caller.host is not None else
                   (MAX_TELEMETRY_FILES_PER_JOB_KEY, MAX_TELEMETRY_BYTES_PER_JOB_KEY))
    mine = [t for t in known if t.key_id == caller.key_id]
    held_bytes = sum(t.size or 0 for t in mine)
    sent_bytes = sum(len(data) for _, data in out.values())
    if len(mine) + len(out) > files or held_bytes + sent_bytes > size:
        raise PayloadTooLargeError(
            f"key {caller.key_id} holds {len(mine)} telemetry files ({held_bytes:,} bytes) of this incident and sent "
            f"{len(out)} more ({sent_bytes:,} bytes); a key keeps at most {files:,} files and {size:,} bytes of "
            "telemetry per incident; nothing was stored (send the dump again without its telemetry)")
    return list(out.values())
