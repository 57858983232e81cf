"""Code that runs inside a training job: the Flight Recorder hang dumper and its files."""

from denpex.collector.dump_record import DumpRecord, DumpTrigger, rank_identities, read_dump_records
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
from denpex.collector.stall import BlockedOp, StallWatch, stall_threshold

__all__ = [
    "BlockedOp",
    "DumpFormat",
    "DumpRecord",
    "DumpRequest",
    "DumpSignal",
    "DumpTrigger",
    "FileDumpSignal",
    "FlightRecorderSource",
    "GroupProgress",
    "HangDumper",
    "InFlightOp",
    "StallWatch",
    "StoreDumpSignal",
    "TorchFlightRecorder",
    "dump_path",
    "rank_identities",
    "read_dump_records",
    "record_path",
    "request_dump",
    "request_path",
    "stall_threshold",
    "write_atomic",
]
