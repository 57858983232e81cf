"""A tiny hostile pickle cannot make the decoder allocate gigabytes (the memo-table bomb)."""

from __future__ import annotations

import json
import pickle
import resource
import struct
import subprocess
import sys

import pytest

from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import decode_dump
from denpex.evidence.memory_budget import memory_budget
from denpex.evidence.safe_pickle import safe_loads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA budget is Linux-only")


def memo_bomb(slot: int) -> bytes:
    """Protocol 2: an empty dict stored in memo slot ``slot``: 9 bytes."""
    return b"\x80\x02}r" + struct.pack("<I", slot) + b"."


@pytest.mark.parametrize("slot", [1 << 26, 1 << 30], ids=["1GiB-memo", "16GiB-memo"])
def test_memo_bomb_is_refused_without_taking_the_memory(slot: int) -> None:
    # A fresh process, so that its peak RSS shows what decoding the bomb cost.
    code = (
        "import json\n"
        "from denpex.evidence.safe_pickle import safe_loads\n"
        "from denpex.evidence.errors import DumpError\n"
        "try:\n"
        f"    safe_loads({memo_bomb(slot)!r})\n"
        "    outcome = 'loaded'\n"
        "except DumpError as exc:\n"
        "    outcome = str(exc)\n"
        # VmHWM, not ru_maxrss: the latter keeps the forking pytest process's size across exec.
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "print(json.dumps({'outcome': outcome, 'peak_mib': int(hwm.split()[1]) >> 10}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(done.stdout)
    assert "hostile or corrupt" in report["outcome"] and "9 bytes" in report["outcome"]
    assert report["peak_mib"] < 200, report  # without the budget: 1,035 MiB for the 2**26 slot


def test_decode_reports_the_bomb_per_file() -> None:
    with pytest.raises(DumpError, match="needs more than the 256 MiB"):
        decode_dump(memo_bomb(1 << 27), source="rank_3.pkl")


def test_the_limit_is_restored_and_a_real_dump_still_loads() -> None:
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with pytest.raises(DumpError):
        safe_loads(memo_bomb(1 << 27))
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert safe_loads(b"\x80\x02}q\x00X\x07\x00\x00\x00versionq\x01X\x04\x00\x00\x002.10q\x02s.") == {
        "version": "2.10"}
    big = bytearray(300 << 20)  # more than the decode budget: the cap is gone again
    assert len(big) == 300 << 20


def test_an_enclosing_lower_cap_is_kept() -> None:
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with memory_budget(64 << 20):
        outer = resource.getrlimit(resource.RLIMIT_DATA)[0]
        with memory_budget(1 << 30):
            assert resource.getrlimit(resource.RLIMIT_DATA)[0] == outer
        with pytest.raises(MemoryError):
            bytearray(512 << 20)
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


def test_a_decode_that_met_another_threads_allocation_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is process-wide: another thread's allocation during a decode can exhaust it. That
    once refused a healthy 3.7 KB dump as hostile under load; a real memo bomb fails every try."""
    import contextlib
    from collections.abc import Iterator

    from denpex.evidence import memory_budget as budget_module
    from denpex.evidence import safe_pickle

    entered: list[int] = []

    @contextlib.contextmanager
    def crowded_once(extra: int) -> Iterator[None]:
        entered.append(extra)
        if len(entered) == 1:
            raise MemoryError  # as if a thread started meanwhile took the headroom
        yield

    monkeypatch.setattr(budget_module, "memory_budget", crowded_once)
    assert safe_pickle.safe_loads(pickle.dumps({"entries": []}, protocol=2)) == {"entries": []}
    assert len(entered) == 2
