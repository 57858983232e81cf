"""Issue 29, section 2: the job's torch version travels with its dumps (additive fields)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import pytest
import torch
from pydantic import ValidationError

from denpex.collector.fr_watchdog import _torch_version, start_symbolizer_import, torch_release
from denpex.evidence.dump_record import DumpRecord, DumpTrigger
from denpex.ingest.identity import UploadIdentity


def test_the_dumper_records_the_jobs_torch_and_the_upload_carries_it() -> None:
    assert _torch_version() == torch.__version__
    record = DumpRecord(rank=1, pid=7, dumped_at=datetime.now(UTC), trigger=DumpTrigger.STALL, reason="stalled",
                        files=["rank_1.pkl"], dump_seconds=0.1, torch_version=_torch_version())
    assert DumpRecord.model_validate_json(record.model_dump_json()).torch_version == torch.__version__
    identity = UploadIdentity(job_id="job-1", incident_id="inc-1", rank=1, world_size=4,
                              torch_version=record.torch_version)
    assert identity.torch_version == torch.__version__
    # Older collectors send none: the field is optional.
    assert UploadIdentity(job_id="job-1", incident_id="inc-1", rank=1, world_size=4).torch_version is None
    with pytest.raises(ValidationError):
        UploadIdentity(job_id="job-1", incident_id="inc-1", rank=1, world_size=4, torch_version="x" * 65)


def test_the_symbolizer_import_is_paid_ahead_only_where_torch_needs_it() -> None:
    """torch 2.14 imports torch._inductor on its first dump with stacks (10 s and more); the
    dumper imports it in a daemon thread as it starts. Older releases need nothing."""
    assert torch_release("2.14.1+cu130") == (2, 14) > torch_release("2.13.0") == (2, 13)
    assert torch_release("nightly") == (0, 0)
    thread = start_symbolizer_import()
    if torch_release(torch.__version__) < (2, 14):
        assert thread is None  # the dev pin (2.13): nothing to pay ahead
    elif thread is not None:
        thread.join(120)
        assert "torch._inductor" in sys.modules
