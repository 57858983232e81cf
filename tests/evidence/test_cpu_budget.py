"""A small pathological dump cannot hold a decode worker for long, and JSON has a memory budget.

Issue 16, findings 6 (a 253 KiB pickle of colliding dict keys decoded for 9 s) and 7 (47 MiB of
``{"entries": [{}, {}, ...]}`` took a worker to 1.27 GiB).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from denpex.evidence.cpu_budget import CpuBudget, cpu_limit
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import decode_dump
from dumps import dump, history
from hostile_dumps import colliding_dict_pickle, write_empty_object_flood

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the budgets are Linux-only")

# Decodes the file in a fresh process, as a decode worker does (armed or not), and reports the
# outcome, the CPU the decode took and the process's peak resident memory.
_DECODE = """
import json, resource, sys, time
from pathlib import Path
from denpex.evidence.cpu_budget import CpuBudget, arm_cpu_limit
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import decode_dump
path, armed = Path(sys.argv[1]), sys.argv[2] == "armed"
if armed:
    arm_cpu_limit(CpuBudget(floor_s=1.0, per_mib_s=0.1))
data = path.read_bytes()
start = time.process_time()
try:
    decode_dump(data, source=path.name)
    outcome = "loaded"
except DumpError as exc:
    outcome = str(exc)
cpu = time.process_time() - start
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "cpu_s": cpu, "peak_mib": int(hwm.split()[1]) >> 10}))
"""


def _decode_in_a_fresh_process(path: Path, *, armed: bool) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _DECODE, str(path), "armed" if armed else "plain"],
                          capture_output=True, text=True, timeout=120, check=True)
    report: dict[str, object] = json.loads(done.stdout)
    return report


@pytest.mark.parametrize("keys", [2, 1001, 3000])
def test_the_colliding_pickle_is_what_pickle_writes(keys: int) -> None:
    """The hostile file is written directly (building the dict is quadratic): byte for byte what
    ``pickle.dumps`` writes of the same dict, at sizes small enough to build."""
    import pickle

    from hostile_dumps import _MODULUS

    assert colliding_dict_pickle(keys) == pickle.dumps({k * _MODULUS: None for k in range(keys)}, protocol=2)


def test_a_pickle_of_colliding_dict_keys_is_refused_within_its_cpu_budget(tmp_path: Path) -> None:
    hostile = tmp_path / "rank_0.pkl"
    hostile.write_bytes(colliding_dict_pickle(40_000))  # 507 KiB; unlimited: 7.7 s of CPU here
    report = _decode_in_a_fresh_process(hostile, armed=True)
    assert "s of CPU to decode" in str(report["outcome"]) and "hostile or pathological" in str(report["outcome"])
    # The budget for 507 KiB is 1.05 s; the soft limit rounds up to the next whole CPU second.
    assert float(str(report["cpu_s"])) < 3.0, report


def test_a_real_dump_decodes_under_the_armed_budget(tmp_path: Path) -> None:
    import pickle

    real = tmp_path / "rank_0.pkl"
    real.write_bytes(pickle.dumps(dump(history("0", 2000)), protocol=2))
    assert _decode_in_a_fresh_process(real, armed=True)["outcome"] == "loaded"


def test_the_limit_applies_only_in_an_armed_worker_and_is_restored() -> None:
    before = resource.getrlimit(resource.RLIMIT_CPU)
    with cpu_limit(1 << 20):  # not armed in the test process: nothing changes
        assert resource.getrlimit(resource.RLIMIT_CPU) == before
    assert CpuBudget(floor_s=2.0, per_mib_s=0.1).seconds_for(256 << 20) == pytest.approx(27.6)


def test_a_flood_of_empty_json_objects_is_refused_without_taking_the_memory(tmp_path: Path) -> None:
    flood = write_empty_object_flood(tmp_path / "rank_0.json", 47)
    report = _decode_in_a_fresh_process(flood, armed=False)
    assert "bytes of JSON needs more than the 814 MiB" in str(report["outcome"]), report
    # Without the budget this decode peaked at 1,250 MiB; the budget (256 MiB + 12 x 46.5 MiB)
    # stops it at 872 MiB.
    assert int(str(report["peak_mib"])) < 1000, report


def test_a_real_json_dump_still_decodes_under_the_budget() -> None:
    body = json.dumps(dump(history("0", 20_000))).encode()
    start = time.process_time()
    assert len(decode_dump(body, source="rank_0.json").raw["entries"]) == 20_000
    assert time.process_time() - start < 10


def test_json_over_its_budget_is_a_dump_error() -> None:
    from denpex.evidence import memory_budget

    # Built outside the budget, and big enough (tens of MiB decoded) that the heap's free space
    # left by earlier tests in this worker cannot hold it: no headroom means a refusal.
    body = json.dumps(dump(history("0", 60_000))).encode()
    with memory_budget.memory_budget(0):
        with pytest.raises(DumpError, match="bytes of JSON needs more than"):
            decode_dump(body, source="rank_0.json")
