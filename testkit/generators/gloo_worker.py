"""One rank of a Gloo hang scenario: the program :mod:`testkit.generators.gloo_scenarios` launches 4 of.

    python -m testkit.generators.gloo_worker --rank R --work-dir DIR --scenario NAME --timeout-s 5
                                         --parent-pid PID [--long-stall] [--signal-store HOST:PORT]

The rank joins a FileStore rendezvous in ``DIR``, creates the scenario's process groups, runs
the healthy steps under the product's :class:`~denpex.collector.fr_watchdog.HangDumper`, takes
the warm-up dump, and then plays its scenario role in the hang step. It never exits on its own in
a hang scenario: it stays alive (so that it can answer dump requests) until the generator kills it.

Files it writes in ``DIR``: ``groups-<rank>.json`` (name, desc and ranks of its groups as FR names
them), ``markers/hang-<rank>`` (the time it reached the hang step), and the dumper's output under
``collected/``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from denpex.collector import DumpTrigger, EvidenceUploader, HangDumper, StoreDumpSignal, UploadTarget, write_atomic
from testkit.generators.gloo_catalog import (
    DP_GROUPS,
    DUMP_FORMATS,
    P2P_DST,
    SCENARIOS,
    TP_GROUPS,
    WORLD_SIZE,
    Role,
    host_name,
)

__all__ = ["run_rank", "main"]

POLL_INTERVAL = timedelta(seconds=0.25)


def run_rank(rank: int, work: Path, scenario_name: str, timeout: timedelta, steps: int,
             long_stall: bool, signal_store: str | None = None) -> int:
    """Play ``rank`` in the scenario; returns only in the healthy scenario."""
    import torch
    import torch.distributed as dist

    scenario = SCENARIOS[scenario_name]
    dist.init_process_group("gloo", store=dist.FileStore(str(work / "store"), WORLD_SIZE),
                            rank=rank, world_size=WORLD_SIZE, timeout=timeout)
    # new_group() defaults to a 30-minute timeout, not init_process_group's: pass it. Every rank
    # creates every group, in one order, so that FR names them "1".."4" everywhere.
    tp = [dist.new_group(list(r), timeout=timeout, group_desc="tp") for r in TP_GROUPS]
    dp = [dist.new_group(list(r), timeout=timeout, group_desc="dp") for r in DP_GROUPS]
    my_tp = next(g for g, r in zip(tp, TP_GROUPS) if rank in r)
    my_dp = next(g for g, r in zip(dp, DP_GROUPS) if rank in r)
    _write_groups(work, rank, [dist.group.WORLD, my_tp, my_dp])

    # The long stall must outlive the timeout before anyone dumps: no stall trigger, and a
    # failed collective is caught below instead of dumping on the way out.
    # With DENPEX_INGEST_* set, every dump also goes to the ingest service (spooled, retried).
    target = UploadTarget.from_env()
    uploader = (EvidenceUploader(target, dump_dir=work / "collected", spool_dir=work / "spool" / f"rank_{rank}",
                                 identity=_upload_identity(rank, target.job_id), attach_nvml=True).start()
                if target else None)
    dumper = HangDumper(work / "collected", rank=rank, collective_timeout=timeout,
                        host=host_name(rank), local_rank=0, formats=DUMP_FORMATS,
                        trigger_fraction=None if long_stall else 0.75, poll_interval=POLL_INTERVAL,
                        signal=_store_signal(signal_store, timeout) if signal_store else None,
                        after_dump=uploader.submit if uploader else None)
    tensor = torch.ones(16)

    def step(world_op: Role = Role.STEP) -> None:
        dist.all_reduce(tensor, group=my_tp)
        dist.all_reduce(tensor, group=my_dp)
        if world_op is Role.ALL_GATHER:
            # Same input as the others' all_reduce: a size mismatch would SIGABRT a receiver.
            dist.all_gather([torch.empty_like(tensor) for _ in range(WORLD_SIZE)], tensor)
        else:
            dist.all_reduce(tensor)

    with dumper:
        for _ in range(steps):
            step()
        logging.info("warm-up dump took %.2fs", dumper.warm_up())
        dist.barrier()  # nobody hangs before every rank is warm
        _mark(work, "hang", rank)
        role = scenario.role(rank)
        if role is Role.FINISH:
            step()
            dumper.dump_now(DumpTrigger.MANUAL, "end of a healthy run")
            return 0
        try:
            _hang_step(role, step, dist, tensor)
        except Exception as exc:  # noqa: BLE001 - the failed collective is the scenario
            if not long_stall:
                raise  # the dumper dumps on the way out and asks the other ranks to dump
            logging.info("collective raised (%s); staying hung until asked to dump", exc)
        # Alive, in no collective; the watchdog thread answers dump requests meanwhile.
        dumper.wait_dumped(timedelta(hours=1))
        while True:
            time.sleep(1.0)


def _upload_identity(rank: int, job_id: str) -> dict[str, object]:
    """The identity torch.distributed gives, with the scenario's host name for this rank."""
    from denpex.collector.uploader import torch_identity

    return {**torch_identity(job_id, ""), "host": host_name(rank), "local_rank": 0}


def _store_signal(address: str, timeout: timedelta) -> StoreDumpSignal:
    """A client of the launcher's TCPStore: the request survives any rank, unlike rank 0's store."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    return StoreDumpSignal(dist.TCPStore(host, int(port), is_master=False, timeout=timeout))


def _hang_step(role: Role, step: Callable[[Role], None], dist: Any, tensor: Any) -> None:
    if role is Role.IDLE:
        return
    if role is Role.WORLD:
        dist.all_reduce(tensor)
    elif role is Role.SEND:
        dist.send(tensor, dst=P2P_DST)
    else:
        step(role)
    logging.info("hang step %s returned", role.value)


def _write_groups(work: Path, rank: int, groups: list[Any]) -> None:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_process_group_name

    info = {_get_process_group_name(g): {"desc": g.group_desc, "ranks": dist.get_process_group_ranks(g)}
            for g in groups}
    write_atomic(work / f"groups-{rank}.json", json.dumps(info).encode())


def _mark(work: Path, phase: str, rank: int) -> None:
    write_atomic(work / "markers" / f"{phase}-{rank}", datetime.now(UTC).isoformat().encode())


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this rank when the generator dies, so that nothing is orphaned."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the generator died before prctl took effect
        os._exit(3)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testkit.generators.gloo_worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    p.add_argument("--timeout-s", type=float, required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--long-stall", action="store_true")
    p.add_argument("--signal-store", metavar="HOST:PORT",
                   help="send and receive dump requests through this TCPStore, not the shared folder")
    args = p.parse_args(argv)
    _die_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {args.rank} %(message)s")
    return run_rank(args.rank, args.work_dir, args.scenario, timedelta(seconds=args.timeout_s),
                    args.steps, args.long_stall, args.signal_store)


if __name__ == "__main__":
    raise SystemExit(main())
