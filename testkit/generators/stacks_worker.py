"""One rank of a real Gloo job that hangs with each rank somewhere known, for the stacks tests.

    python -m testkit.generators.stacks_worker --rank R --world-size N --work-dir DIR
        --role collective|sleep|regex --timeout-s 6 --parent-pid PID [--trigger-fraction F]
        [--sidecar-deadline-s S] [--debug-port PORT]

The rank joins ``env://`` (``MASTER_ADDR``/``MASTER_PORT`` set by the launcher), runs one
all_reduce, warms the product's :class:`~denpex.collector.fr_watchdog.HangDumper` up (dump folder
``DIR/collected``), meets the others at a barrier, starts the dumper's watchdog, marks
``DIR/markers/hang-<rank>``, then plays its role:

- ``collective``: :func:`step`, an all_reduce the ``sleep``/``regex`` rank never joins;
- ``sleep``: :func:`sleep_in_data_loader`, ``time.sleep`` (the GIL is free: its dumper answers);
- ``regex``: :func:`wedge_in_regex`, a catastrophic backtracking ``re.match`` that holds the GIL
  in C: its dumper can never run.

With ``--sidecar-deadline-s`` the rank starts the py-spy sidecar at job start; with
``--debug-port`` it starts torch's debug server (rank 0 writes ``DIR/debug/stacks_<time>.txt``
every second). The rank never exits by itself: the launcher kills its process group.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from denpex.collector import HangDumper, write_atomic
from denpex.collector.pyspy_sidecar import start_stacks_sidecar

__all__ = ["main", "sleep_in_data_loader", "step", "wedge_in_regex"]


def step(tensor: Any) -> None:
    """The training step's collective."""
    import torch.distributed as dist

    dist.all_reduce(tensor)


def sleep_in_data_loader(seconds: float) -> None:
    """A rank stuck outside any collective, with its GIL free."""
    time.sleep(seconds)


def wedge_in_regex() -> object:
    """A rank whose interpreter is wedged: the regex engine holds the GIL for 2**40 steps."""
    return re.match(r"(a+)+$", "a" * 40 + "b")


def run_rank(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    work: Path = args.work_dir
    timeout = timedelta(seconds=args.timeout_s)
    if args.sidecar_deadline_s is not None:
        start_stacks_sidecar(work / "collected", args.rank, deadline=timedelta(seconds=args.sidecar_deadline_s),
                             log_file=work / f"sidecar-{args.rank}.log")
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size, timeout=timeout)
    if args.debug_port is not None:
        from torch.distributed.debug import start_debug_server

        (work / "debug").mkdir(exist_ok=True)
        start_debug_server(port=args.debug_port, dump_dir=str(work / "debug"), dump_interval=1.0,
                           enabled_dumps={"stacks"})
    dumper = HangDumper(work / "collected", rank=args.rank, collective_timeout=timeout,
                        trigger_fraction=args.trigger_fraction, poll_interval=timedelta(seconds=0.25))
    tensor = torch.ones(16)
    step(tensor)
    dumper.warm_up()
    # The watchdog starts after the barrier: a rank whose warm-up takes seconds (up to 6 s on two
    # loaded cores) keeps its peers in the barrier that long, which is no hang of the scenario's.
    dist.barrier()
    with dumper:
        write_atomic(work / "markers" / f"hang-{args.rank}", b"")
        if args.role == "collective":
            try:
                step(tensor)
            except Exception:  # noqa: BLE001 - the timeout is the scenario: stay alive, dumped
                pass
        elif args.role == "sleep":
            sleep_in_data_loader(3600)
        else:
            wedge_in_regex()
        while True:
            time.sleep(1.0)


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        raise SystemExit(3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testkit.generators.stacks_worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--role", choices=("collective", "sleep", "regex"), required=True)
    p.add_argument("--timeout-s", type=float, default=6.0)
    p.add_argument("--trigger-fraction", type=float, default=0.75)
    p.add_argument("--parent-pid", type=int, required=True)
    p.add_argument("--sidecar-deadline-s", type=float)
    p.add_argument("--debug-port", type=int)
    args = p.parse_args(argv)
    _die_with_parent(args.parent_pid)
    return run_rank(args)


if __name__ == "__main__":
    raise SystemExit(main())
