"""The upload spool read while another thread delivers from it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from denpex.collector.spool import Spool


def test_an_entry_delivered_while_the_spool_is_listed_is_left_out(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in the collector end-to-end test: a delivery thread acknowledged (removed) an entry
    between the listing of the spool and the read of the entry's files, and pending() raised
    FileNotFoundError instead of leaving the delivered entry out."""
    dump = tmp_path / "rank_0.pkl"
    dump.write_bytes(b"dump")
    spool = Spool(tmp_path / "spool")
    first = spool.put({"rank": 0}, dump, [])
    second = spool.put({"rank": 1}, dump, [])
    real_iterdir = Path.iterdir

    def acknowledged_meanwhile(path: Path):  # type: ignore[no-untyped-def]
        if path == first.path / "dump":
            shutil.rmtree(first.path)  # the delivery thread's done(), just after the listing
        return real_iterdir(path)

    monkeypatch.setattr(Path, "iterdir", acknowledged_meanwhile)
    assert [e.path for e in spool.pending()] == [second.path]
