"""The ingest check of a dump, without building it (issue 30, §3: the JSON decode budget).

A check worker allowed itself 256 MiB + 12x a JSON dump's size on top of the dump's bytes, about
3.5 GiB at the 256 MiB cap. The check now holds the dump's text and little more: the memory tests
run the worker's own function (``denpex.ingest.dump_check.check_dump``) in a child process whose
data segment is capped, as a worker's would be, at what a real dump of that size needs.
"""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.evidence.dump_envelope import DumpEnvelope, check_envelope
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import DumpEncoding, decode_dump

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "gloo").glob("*/rank_*.*"))
MiB = 1 << 20


@pytest.mark.parametrize("path", FIXTURES[:24], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_envelope_is_what_the_whole_decode_says(path: Path) -> None:
    data = path.read_bytes()
    decoded = decode_dump(data, source=path.name)
    entries = decoded.raw.get("entries", [])
    assert check_envelope(data, source=path.name) == DumpEnvelope(encoding=decoded.encoding, version=decoded.version,
                                                                  entries=len(entries))


@pytest.mark.parametrize("data", [
    pytest.param(b"", id="empty"),
    pytest.param(b'{"version": "2.10", "entries": [', id="cut-short"),
    pytest.param(b"not json at all", id="not-json"),
    pytest.param(b"[1, 2, 3]", id="top-level-list"),
    pytest.param(b'{"entries": []}', id="no-version"),
    pytest.param(b'{"version": "3.0"}', id="unsupported-version"),
    pytest.param(b'{"version": "2.10", "entries": {}}', id="entries-not-a-list"),
    pytest.param(b'{"version": "2.10", "pg_config": []}', id="pg-config-not-a-mapping"),
    pytest.param(b"[" * 100_000, id="deep"),
    pytest.param(b'{"version": "2.10", "entries": [{"record_id": ' + b"9" * 5000 + b"}]}", id="huge-number"),
    pytest.param(b'\xff\xfe{"version"', id="not-utf8"),
    pytest.param(pickle.dumps([1, 2, 3], protocol=2), id="pickle-list"),
])
def test_a_refusal_says_what_the_whole_decode_says(data: bytes) -> None:
    with pytest.raises(DumpError) as whole:
        decode_dump(data, source="r.json")
    with pytest.raises(DumpError) as checked:
        check_envelope(data, source="r.json")
    assert str(checked.value) == str(whole.value)


def test_a_flood_of_empty_objects_is_refused() -> None:
    flood = json.dumps({"version": "2.10", "entries": [{}] * 200_000}).encode()
    with pytest.raises(DumpError, match="a flood of empty objects"):
        check_envelope(flood, source="r.json")


def _coalesced_dump(size: int) -> bytes:
    """A JSON dump shaped as torch writes one, whose coalesced ops list 64 tensor sizes each: the
    kind of real dump whose whole decode takes the most (about 9.5x its size)."""
    template = json.loads((ROOT / "tests" / "fixtures" / "gloo" / "withheld_one" / "rank_0.json").read_text())
    entries, total = [], 0
    while total < size:
        entry = copy.deepcopy(template["entries"][len(entries) % len(template["entries"])])
        entry |= {"record_id": len(entries), "time_created_ns": entry["time_created_ns"] + len(entries),
                  "input_sizes": [[4096 + len(entries) % 7, 8192]] * 64, "input_dtypes": ["Float"] * 64}
        entry |= {"output_sizes": entry["input_sizes"], "output_dtypes": entry["input_dtypes"]}
        entries.append(entry)
        total += len(json.dumps(entry))
    return json.dumps(template | {"entries": entries}).encode()


_CHECK_UNDER_A_CAP = """
import resource, sys
from pathlib import Path
from denpex.ingest.dump_check import check_dump
path, extra = Path(sys.argv[1]), int(sys.argv[2])
data = [l for l in open("/proc/self/status") if l.startswith("VmData:")][0].split()[1]
cap = int(data) * 1024 + extra
resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
outcome = check_dump(path, path.name)
print("refused: " + outcome if isinstance(outcome, str) else f"checked: {outcome.entries} entries")
"""


def test_a_check_worker_holds_what_a_real_dump_of_that_size_needs(tmp_path: Path) -> None:
    """A 16 MiB real-shaped JSON dump is checked within its bytes, its text and 64 MiB + 2x more
    (the worker's whole data segment, capped past its start-up size); the whole decode needed 9.5x."""
    dump = tmp_path / "rank_0.json"
    dump.write_bytes(_coalesced_dump(16 * MiB))
    size = dump.stat().st_size
    extra = 2 * size + 64 * MiB + 2 * size  # its bytes and text, then the check's own budget
    out = subprocess.run([sys.executable, "-c", _CHECK_UNDER_A_CAP, str(dump), str(extra)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.stdout.startswith("checked:"), (out.stdout + out.stderr)[-2000:]
    assert check_envelope(dump.read_bytes(), source=dump.name).encoding is DumpEncoding.JSON
