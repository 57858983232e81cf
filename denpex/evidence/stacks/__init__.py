"""Python stacks of the ranks as evidence: the model, its bounds, and one reader per source.

    model         RankStacks / ThreadStack / StackFrame, the sources and the limits
    bounds        untrusted bytes -> bounded, typed RankStacks
    records       Denpex's own stacks files (the collector's, the py-spy sidecar's)
    pyspy         ``py-spy dump --json`` output
    torch_debug   torch's debug server's ``stacks_<time>.txt``
    fr_callsite   a Flight Recorder entry's ``frames``
    folder        everything one dump folder holds
"""

from denpex.evidence.stacks.folder import StackEvidence, read_stack_evidence
from denpex.evidence.stacks.fr_callsite import FrCallsites, entry_callsite, fr_callsite_stacks, read_fr_callsites
from denpex.evidence.stacks.model import (
    FORMAT,
    MAX_BYTES,
    MAX_FRAMES,
    MAX_TEXT,
    MAX_THREADS,
    RankStacks,
    StackError,
    StackFrame,
    StackSource,
    ThreadStack,
    Unavailable,
)
from denpex.evidence.stacks.pyspy import parse_pyspy_dump
from denpex.evidence.stacks.records import (
    STACKS_DIR,
    CollectedStacks,
    parse_stacks_record,
    read_collected_stacks,
    read_stacks_record,
    stacks_file_name,
)
from denpex.evidence.stacks.torch_debug import (
    DebugStacks,
    DebugStacksFile,
    debug_stacks_files,
    nearest_debug_stacks,
    parse_debug_stacks,
    read_debug_stacks,
)

__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "MAX_FRAMES",
    "MAX_TEXT",
    "MAX_THREADS",
    "STACKS_DIR",
    "CollectedStacks",
    "DebugStacks",
    "DebugStacksFile",
    "FrCallsites",
    "RankStacks",
    "StackEvidence",
    "StackError",
    "StackFrame",
    "StackSource",
    "ThreadStack",
    "Unavailable",
    "debug_stacks_files",
    "entry_callsite",
    "fr_callsite_stacks",
    "nearest_debug_stacks",
    "parse_debug_stacks",
    "parse_pyspy_dump",
    "parse_stacks_record",
    "read_collected_stacks",
    "read_debug_stacks",
    "read_fr_callsites",
    "read_stack_evidence",
    "read_stacks_record",
    "stacks_file_name",
]
