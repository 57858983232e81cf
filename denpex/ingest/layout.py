"""Where an incident's evidence lands in the store (a folder or an S3 prefix).

    {tenant}/{cluster}/{job_id}/{incident_id}/
        rank_<r>.pkl | rank_<r>.json           the newest version of each rank's dump (what triage reads)
        manifest.json                          built from the uploads' identities
        telemetry.json                         which telemetry files are trusted (denpex.hardware.stored_telemetry)
        versions/rank_<r>/v<N>.pkl | .json     every version ever accepted, never overwritten
        telemetry/trusted/<host>-<sha12>.log   from a node agent's key bound to that host
        telemetry/untrusted/<sha12>.log        from a job's key: shown, never supports a drain
        collector/rank_<r>.stacks.json         the newest version's stacks, as the collector wrote them
        collector/rank_<r>.py-spy.stacks.json  the same read by the py-spy sidecar (denpex.evidence.stacks)
        versions/rank_<r>/v<N>.stacks.json | v<N>.py-spy.stacks.json   each version's stacks, kept

``denpex triage {store}/{tenant}/{cluster}/{job_id}/{incident_id}`` reads it as is: it lists only
the files directly in the folder, so ``versions/`` and ``telemetry/`` never look like dumps.
"""

from __future__ import annotations

from denpex.evidence.fr_dump import DumpEncoding
from denpex.evidence.stacks import STACKS_DIR, StackSource, stacks_file_name

__all__ = ["incident_prefix", "current_dump_name", "current_stacks_name", "version_name", "stacks_version_name",
           "telemetry_name", "join_uri"]

def incident_prefix(tenant: str, cluster: str, job_id: str, incident_id: str) -> str:
    """``acme/c1/job-123/fr-20261201T130914Z``."""
    return f"{tenant}/{cluster}/{job_id}/{incident_id}"


def _suffix(encoding: DumpEncoding) -> str:
    return ".json" if encoding is DumpEncoding.JSON else ".pkl"


def current_dump_name(rank: int, encoding: DumpEncoding) -> str:
    """``rank_3.pkl``: the name triage finds, whose trailing number is the rank."""
    return f"rank_{rank}{_suffix(encoding)}"


def version_name(rank: int, version: int, encoding: DumpEncoding) -> str:
    """``versions/rank_3/v2.pkl``: one immutable object per accepted version."""
    return f"versions/rank_{rank}/v{version}{_suffix(encoding)}"


def current_stacks_name(rank: int, source: StackSource) -> str:
    """``collector/rank_3.stacks.json``: where :func:`denpex.evidence.stacks.read_stack_evidence` looks."""
    return f"{STACKS_DIR}/{stacks_file_name(rank, source)}"


def stacks_version_name(rank: int, version: int, source: StackSource) -> str:
    """``versions/rank_3/v2.stacks.json`` (or ``v2.py-spy.stacks.json``): the stacks of dump version 2."""
    return f"versions/rank_{rank}/v{version}{stacks_file_name(rank, source).removeprefix(f'rank_{rank}')}"


def telemetry_name(sha256: str, trusted_host: str | None) -> str:
    """Trusted telemetry is filed under its host; untrusted under its hash only."""
    if trusted_host is not None:
        return f"telemetry/trusted/{trusted_host}-{sha256[:12]}.log"
    return f"telemetry/untrusted/{sha256[:12]}.log"


def join_uri(store_uri: str, prefix: str) -> str:
    """The URI of ``prefix`` inside the store at ``store_uri``."""
    return f"{store_uri.rstrip('/')}/{prefix}"
