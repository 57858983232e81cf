"""The manifest facts a rank records beside its dump (issue 9, family 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from denpex.collector import DumpFormat, DumpTrigger, HangDumper, read_dump_records
from denpex.collector.job_identity import JobIdentity, gpu_pci_bus_id, gpu_uuid, read_job_identity
from denpex.evidence.manifest import ProcessGroupSpec


def test_gpu_identity_is_spelled_as_nvml_and_the_manifest_spell_it() -> None:
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0,
                            uuid="8b4ab2b4-4e34-8a6a-1e0c-2f1c6fbc0c11")
    assert gpu_pci_bus_id(props) == "0000:3b:00.0"
    assert gpu_uuid(props) == "GPU-8b4ab2b4-4e34-8a6a-1e0c-2f1c6fbc0c11"
    assert gpu_uuid(SimpleNamespace(uuid="GPU-x")) == "GPU-x"
    assert gpu_pci_bus_id(SimpleNamespace()) is None and gpu_uuid(SimpleNamespace()) is None


def test_outside_a_job_the_identity_is_empty() -> None:
    assert not dist.is_initialized()
    assert read_job_identity() == JobIdentity()


_ONE_RANK_JOB = """
import sys
from datetime import timedelta
import torch, torch.distributed as dist
from denpex.collector.job_identity import read_job_identity
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1,
                        timeout=timedelta(seconds=30))
pair = dist.new_group([0], group_desc="pair", timeout=timedelta(seconds=30))
dist.all_reduce(torch.ones(2), group=pair)
entries = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
print(read_job_identity().model_dump_json())
print(entries.decode() if isinstance(entries, bytes) else entries)
"""


def test_a_real_gloo_job_names_its_groups_as_flight_recorder_does(tmp_path: Path) -> None:
    # Its own process: a process group left behind (even destroyed) changes later tests' pg ids.
    done = subprocess.run([sys.executable, "-c", _ONE_RANK_JOB, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120, check=True)
    identity_line, fr_json = done.stdout.splitlines()[:2]
    identity = JobIdentity.model_validate_json(identity_line)
    assert identity.world_size == 1
    assert identity.process_groups == {"0": ProcessGroupSpec(desc="default_pg", ranks=(0,)),
                                       "1": ProcessGroupSpec(desc="pair", ranks=(0,))}
    # The names are the ones Flight Recorder records in process_group[0].
    recorded = {e["process_group"][0] for e in json.loads(fr_json)["entries"]}
    assert recorded <= set(identity.process_groups) and "1" in recorded


class _Recorder:
    def progress(self) -> dict[str, object]:
        return {}

    def in_flight_op(self, pg_id: str, seq: int) -> None:
        return None

    def dump(self, fmt: DumpFormat) -> bytes:
        return b"dump"


@pytest.mark.parametrize("fields", [
    {},
    {"world_size": 8, "gpu_uuid": "GPU-1", "gpu_pci_bus_id": "0000:3b:00.0",
     "process_groups": {"0": ProcessGroupSpec(desc="default_pg", ranks=tuple(range(8)))}},
], ids=["nothing-known", "everything-known"])
def test_the_record_carries_what_the_rank_knows(tmp_path: Path, fields: dict[str, object]) -> None:
    dumper = HangDumper(tmp_path, rank=3, collective_timeout=timedelta(seconds=4), host="node-4",
                        local_rank=3, recorder=_Recorder(),  # type: ignore[arg-type]
                        identity=lambda: JobIdentity.model_validate(fields))
    dumper.dump_now(DumpTrigger.MANUAL, "test")
    [record] = read_dump_records(tmp_path).values()
    assert record.model_dump(include=set(fields)) == JobIdentity.model_validate(fields).model_dump(
        include=set(fields))
    identity = record.identity()
    assert (identity.host, identity.local_rank, identity.gpu_uuid) == ("node-4", 3, fields.get("gpu_uuid"))
    # Older records, without the new fields, still read.
    raw = json.loads(record.model_dump_json())
    for key in ("world_size", "process_groups", "gpu_uuid", "gpu_pci_bus_id"):
        raw.pop(key)
    (tmp_path / "collector" / "rank_3.record.json").write_text(json.dumps(raw))
    assert read_dump_records(tmp_path)[3].process_groups == {}
