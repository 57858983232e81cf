"""Record the bundled incident (`examples/incident-xid79/`) from a real job: 4 Gloo ranks of
`examples/job/train.py`, where rank 2's checkpoint write never returns.

    python -m testkit.generators.bundled_incident OUT [--job-root /workspace/job] [--venv /opt/venv]

The job runs from ``--job-root`` (the script copied there, its checkpoint folder and its dump
folder beside it) with the interpreter of ``--venv``, a link made to this environment, and
Denpex from ``<job-root>/deps``: the frames the dumps and stacks record then carry the paths of a
job's own machine, not this checkout's. Rank 2's shard is a FIFO nobody reads, so its ``open``
blocks in the kernel (the GIL free: its dumper answers), as a write to a hung filesystem would.
Its tensor-parallel peer, rank 3, waits in the next step's all_reduce; ranks 0 and 1 wait behind
them in the data-parallel one. Every rank's :class:`~denpex.collector.HangDumper` dumps once the
stall reaches 0.75 x the 5 s timeout.

``OUT`` receives what the demo uploads: ``rank_<r>.pkl``, ``collector/rank_<r>.stacks.json``, a
``manifest.json`` placing rank r on ``gpu-node-00{r+1}`` (GPU ``0000:3b:00.0``, with each rank's
pid and dump time) and a ``kernel.log`` whose Xid 79 names rank 2's pid 54 s before the dumps.
The dumps were recorded without a GPU: the kernel line is written, not observed.

``OUT`` and the job root are replaced whole, so each must be missing, empty or an earlier
recording's; ``--venv`` is created as a link when missing, and must otherwise be this
environment. The rank's FIFO is removed once the job is stopped.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from denpex.collector import DumpFormat, dump_path, read_dump_records, write_atomic
from denpex.evidence.dump_record import DumpRecord
from denpex.evidence.manifest import JobManifest, ProcessGroupSpec, RankIdentity
from testkit.services.net import free_port
from testkit.services.process_group import stop_process_group

__all__ = ["record", "main"]

ROOT = Path(__file__).resolve().parents[2]
JOB_SCRIPT = ROOT / "examples" / "job" / "train.py"
WORLD = 4
STALLED_RANK = 2
JOB_ID = "llm-train-0193"
GPU_BUS_ID = "0000:3b:00.0"
GROUPS = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("tp", (0, 1)), "2": ("tp", (2, 3)),
          "3": ("dp", (0, 2)), "4": ("dp", (1, 3))}
XID_BEFORE_DUMPS = timedelta(seconds=54)


def host(rank: int) -> str:
    return f"gpu-node-{rank + 1:03d}"


def record(out: Path, job_root: Path, venv: Path, cap: timedelta = timedelta(minutes=3)) -> None:
    """Run the job, wait until every rank has dumped, and write the incident folder ``out``."""
    _refuse_unless_ours(out, ("manifest.json", "kernel.log", "collector"))
    _refuse_unless_ours(job_root, ("train.py", "ckpt", "fr"))
    python = _job_python(venv)
    _prepare(job_root)
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs += [_launch(rank, job_root, python, port) for rank in range(WORLD)]
        records = _wait_for_dumps(job_root / "fr", procs, cap)
    finally:
        for proc in procs:
            stop_process_group(proc, sig=signal.SIGKILL)
        # Left behind, the FIFO would block whatever opens it next (a recursive grep).
        (job_root / "ckpt" / f"shard_{STALLED_RANK}.pt").unlink(missing_ok=True)
    _assemble(out, job_root / "fr", records, {r: p.pid for r, p in enumerate(procs)})


def _refuse_unless_ours(folder: Path, marks: tuple[str, ...]) -> None:
    """``folder`` is replaced whole: only when it is missing, empty, or an earlier recording's."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise SystemExit(f"{folder} is not a folder this recorder made; give another path")
    if folder.is_dir() and any(folder.iterdir()) and not all((folder / m).exists() for m in marks):
        raise SystemExit(f"{folder} holds files this recorder did not write; give a new or empty folder")


def _job_python(venv: Path) -> Path:
    """``venv``, a link to this interpreter's environment: the modules then load from under it."""
    if venv.is_symlink() and not venv.exists():
        raise SystemExit(f"{venv} is a dangling link; remove it or give --venv another path")
    if not venv.exists():
        venv.symlink_to(sys.prefix, target_is_directory=True)
    elif venv.resolve() != Path(sys.prefix).resolve():
        raise SystemExit(f"{venv} is another environment ({venv.resolve()}), not this one ({sys.prefix})")
    return venv / "bin" / "python"


def _prepare(job_root: Path) -> None:
    shutil.rmtree(job_root, ignore_errors=True)
    (job_root / "deps").mkdir(parents=True)
    (job_root / "deps" / "denpex").symlink_to(ROOT / "denpex", target_is_directory=True)
    shutil.copyfile(JOB_SCRIPT, job_root / "train.py")
    (job_root / "ckpt").mkdir()
    os.mkfifo(job_root / "ckpt" / f"shard_{STALLED_RANK}.pt")  # the write that never returns
    (job_root / "fr").mkdir()


def _launch(rank: int, job_root: Path, python: Path, port: int) -> subprocess.Popen[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(job_root),
           "PYTHONPATH": str(job_root / "deps"), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(WORLD), "NODE_NAME": host(rank),
           "TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    with open(job_root / f"rank_{rank}.log", "wb") as log:  # the child keeps its own copy
        return subprocess.Popen([str(python), str(job_root / "train.py"), "--checkpoint-dir",
                                 str(job_root / "ckpt"), "--dump-dir", str(job_root / "fr")], cwd=job_root,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _wait_for_dumps(folder: Path, procs: list[subprocess.Popen[bytes]], cap: timedelta) -> dict[int, DumpRecord]:
    deadline = time.monotonic() + cap.total_seconds()
    while True:
        records = read_dump_records(folder)
        if len(records) == WORLD and all(dump_path(folder, r, DumpFormat.PICKLE).is_file() for r in records):
            return records
        dead = {r: p.returncode for r, p in enumerate(procs) if p.poll() is not None}
        if dead or time.monotonic() > deadline:
            raise SystemExit(f"the job did not dump on every rank (exited: {dead}); see {folder.parent}/rank_*.log")
        time.sleep(0.2)


def _assemble(out: Path, folder: Path, records: dict[int, DumpRecord], pids: dict[int, int]) -> None:
    shutil.rmtree(out, ignore_errors=True)
    (out / "collector").mkdir(parents=True)
    for rank in range(WORLD):
        shutil.copyfile(dump_path(folder, rank, DumpFormat.PICKLE), out / f"rank_{rank}.pkl")
        shutil.copyfile(folder / "collector" / f"rank_{rank}.stacks.json", out / "collector" / f"rank_{rank}.stacks.json")
    ranks = {r: RankIdentity(host=host(r), local_rank=0, pid=pids[r], dumped_at=records[r].dumped_at,
                             gpu_pci_bus_id=GPU_BUS_ID) for r in range(WORLD)}
    groups = {name: ProcessGroupSpec(desc=desc, ranks=members) for name, (desc, members) in GROUPS.items()}
    manifest = JobManifest(job_id=JOB_ID, world_size=WORLD, ranks=ranks, process_groups=groups)
    write_atomic(out / "manifest.json", manifest.model_dump_json(indent=1, exclude_none=True).encode())
    xid_at = min(r.dumped_at for r in records.values()) - XID_BEFORE_DUMPS
    stamp = xid_at.strftime("%Y-%m-%dT%H:%M:%S+0000")
    nic = (xid_at + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S+0000")
    write_atomic(out / "kernel.log", (
        f"{stamp} {host(STALLED_RANK)} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid={pids[STALLED_RANK]}, "
        "GPU has fallen off the bus.\n"
        f"{nic} {host(0)} kernel: e1000e 0000:00:1f.6 eth0: NIC Link is Up 1000 Mbps Full Duplex\n").encode())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.generators.bundled_incident", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--job-root", type=Path, default=Path("/workspace/job"))
    parser.add_argument("--venv", type=Path, default=Path("/opt/venv"))
    args = parser.parse_args(argv)
    record(args.out.resolve(), args.job_root, args.venv)
    print(f"recorded {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
