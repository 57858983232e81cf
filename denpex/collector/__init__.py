"""Code that runs inside a training job: the Flight Recorder hang dumper, its files and their upload."""

from denpex.collector.dump_signal import (
    DumpRequest,
    DumpSignal,
    FileDumpSignal,
    StoreDumpSignal,
    request_dump,
)
from denpex.collector.flight_recorder import (
    DumpFormat,
    FlightRecorderSource,
    GroupProgress,
    InFlightOp,
    TorchFlightRecorder,
)
from denpex.collector.fr_watchdog import HangDumper
from denpex.collector.layout import dump_path, record_path, request_path, write_atomic
from denpex.collector.moved_past import MovedPast
from denpex.collector.spool import Spool, SpoolEntry
from denpex.collector.stall import BlockedOp, StallWatch, stall_threshold
from denpex.collector.uploader import Backoff, EvidenceUploader, UploadTarget, incident_id_for
# The records' format is the evidence's (the analysis reads it); the job's code finds it here too.
from denpex.evidence.dump_record import DumpRecord, DumpTrigger, rank_identities, read_dump_records

__all__ = [
    "Backoff",
    "BlockedOp",
    "DumpFormat",
    "DumpRecord",
    "DumpRequest",
    "DumpSignal",
    "DumpTrigger",
    "EvidenceUploader",
    "FileDumpSignal",
    "FlightRecorderSource",
    "GroupProgress",
    "HangDumper",
    "InFlightOp",
    "MovedPast",
    "Spool",
    "SpoolEntry",
    "StallWatch",
    "StoreDumpSignal",
    "TorchFlightRecorder",
    "UploadTarget",
    "dump_path",
    "incident_id_for",
    "rank_identities",
    "read_dump_records",
    "record_path",
    "request_dump",
    "request_path",
    "stall_threshold",
    "write_atomic",
]
