"""One rank of a real 4-rank Gloo job that hangs because rank 2 is stopped, then recovers.

    python recovery_job.py --rank R --work DIR

Every rank runs the product's HangDumper into ``DIR/evidence`` (stall trigger 6 s, long collective
timeout so the job can still recover). After two healthy steps, a warm-up dump and a barrier (#3),
the watchdog starts, and rank 2 stops itself with a real SIGSTOP right before the world all_reduce
(#4); the others block in it and dump. When the test sends
SIGCONT, rank 2 enters, the all_reduce completes everywhere, and the dumpers dump again what they
see now (denpex.collector.moved_past).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

from denpex.collector import DumpFormat, HangDumper

WORLD = 4
STOPPED_RANK = 2
TIMEOUT = timedelta(seconds=600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--evidence", type=Path, help="where the dumps go (default: WORK/evidence)")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(args.work / "store"), WORLD), rank=args.rank,
                            world_size=WORLD, timeout=TIMEOUT)
    dumper = HangDumper(args.evidence or args.work / "evidence", rank=args.rank, collective_timeout=TIMEOUT,
                        host=f"gpu-node-{args.rank + 1:03d}", local_rank=0, formats=(DumpFormat.PICKLE,),
                        trigger_fraction=0.01, poll_interval=timedelta(seconds=0.25))
    tensor = torch.ones(16)
    for _ in range(2):
        dist.all_reduce(tensor)
    # Warm up before the watchdog starts: on a loaded machine one rank's first dump takes seconds,
    # and the others, waiting for it in the barrier, would dump a false stall (6 s trigger).
    dumper.warm_up()
    dist.barrier()
    with dumper:
        (args.work / f"ready-{args.rank}").write_text(str(os.getpid()))
        if args.rank == STOPPED_RANK:
            os.kill(os.getpid(), signal.SIGSTOP)  # stopped here until the test sends SIGCONT
        dist.all_reduce(tensor)
        (args.work / f"done-{args.rank}").write_text("ok")
        while True:  # training goes on, a step every 0.5 s, until the test kills the job; the
            time.sleep(0.5)  # next collective is what shows the dumpers the job recovered
            dist.all_reduce(tensor)


if __name__ == "__main__":
    main()
