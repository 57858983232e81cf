"""Telemetry that travels with the evidence: kernel logs (``*.log``) and collector output
(``*.jsonl``) in the incident's store, at its top level or under ``telemetry/``, and the trusted
part of what the ingest service filed under ``telemetry.json``.

One rule for ``denpex triage FOLDER``, the incident flow and ``make demo``: a file is telemetry by
its suffix (``denpex.evidence.discovery.is_telemetry_name``), never a dump unless the manifest
names it as one. Read through the store (a folder or S3), never from the local disk only, so the
flow sees the same files whatever machine it runs on. A file over the cap is refused with its name.

Trust: the files in the store are the evidence's own (the operator's folder, or the incident the
service filed); what the ingest service filed under ``telemetry.json`` keeps its split, only a
node agent's events about its own host being used (``denpex.hardware.stored_telemetry``).
"""

from __future__ import annotations

from denpex.evidence.discovery import TELEMETRY_SUFFIXES, is_telemetry_name
from denpex.evidence.errors import EvidenceError
from denpex.evidence.store import EvidenceStore
from denpex.hardware.errors import TelemetryFileError
from denpex.hardware.events import TelemetryParseResult
from denpex.hardware.stored_telemetry import load_stored_telemetry
from denpex.hardware.telemetry import MAX_TELEMETRY_FILE_BYTES, parse_telemetry_lines

__all__ = ["TELEMETRY_SUFFIXES", "telemetry_names", "telemetry_files_in_store", "telemetry_in_store"]

_SUBFOLDER = "telemetry"


def telemetry_names(store: EvidenceStore) -> list[str]:
    """The telemetry files directly in ``store``."""
    return [o.name for o in store.list() if is_telemetry_name(o.name)]


def telemetry_files_in_store(store: EvidenceStore) -> TelemetryParseResult:
    """Parse the telemetry files at the store's top level and under ``telemetry/`` (each named in
    ``sources`` as ``STORE_URI/NAME``); bad lines are counted, never fatal."""
    result = TelemetryParseResult()
    try:
        sources = [store, store.folder(_SUBFOLDER)]
    except EvidenceError:  # a telemetry/ that is a link, not a folder of the store, is not read
        sources = [store]
    for source in sources:
        try:
            names = telemetry_names(source)
        except EvidenceError:  # a missing telemetry/ folder is normal
            continue
        for name in names:
            try:
                data = source.read(name, max_bytes=MAX_TELEMETRY_FILE_BYTES)
            except EvidenceError as exc:
                raise TelemetryFileError(f"{source.uri}/{name}: cannot read telemetry file: {exc}") from exc
            text = data.decode("utf-8-sig", errors="replace")
            result = result.merged(parse_telemetry_lines(text.splitlines(), source=f"{source.uri}/{name}"))
    return result


def telemetry_in_store(store: EvidenceStore) -> TelemetryParseResult:
    """Every telemetry file of the incident, and the trusted part of ``telemetry.json``."""
    result = telemetry_files_in_store(store)
    # Uploaded through the ingest service (telemetry.json): only a node agent's events about its
    # own host may support isolation; the rest is never used here (denpex.hardware.stored_telemetry).
    stored = load_stored_telemetry(store, shown=False)  # the flow shows none of the rest: it is not read
    if stored is not None:
        result = result.merged(stored.trusted)
    return result
