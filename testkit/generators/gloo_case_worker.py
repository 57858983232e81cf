"""One rank of a Gloo triage-accuracy case: the program :mod:`testkit.generators.gloo_cases` launches.

    python -m testkit.generators.gloo_case_worker --rank R --world-size N --work-dir DIR --case NAME
                                              --timeout-s 6 --parent-pid PID

The rank joins a FileStore rendezvous in ``DIR``, creates the subgroup ``[0, 1]`` (FR names it
``"1"``), runs a few healthy world all_reduces under the product's
:class:`~denpex.collector.fr_watchdog.HangDumper` (which writes ``DIR/collected/rank_<r>.pkl`` and
its record), then plays its part of the case (:data:`PROGRAMS`). It never exits on its own: it
stays alive, answering dump requests, until the launcher kills it.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from denpex.collector import DumpFormat, HangDumper, write_atomic
from testkit.generators.gloo_worker import _die_with_parent

__all__ = ["CaseContext", "PROGRAMS", "host_of", "main"]

HEALTHY_STEPS = 2
SUBGROUP = (0, 1)


def host_of(rank: int) -> str:
    """The host name each rank reports to its HangDumper (one rank per node)."""
    return f"gloo-node-{rank:02d}"


@dataclass
class CaseContext:
    """What a case's program needs: the rank, torch's modules, the groups and the dump folder."""

    rank: int
    world_size: int
    torch: Any
    dist: Any
    subgroup: Any
    work: Path
    # The case's own subgroups (:data:`EXTRA_GROUPS`), by their member ranks; None where the rank
    # is not a member (c10d hands non-members ``GroupMember.NON_GROUP_MEMBER``).
    groups: dict[tuple[int, ...], Any] = field(default_factory=dict)

    def world_all_reduce(self) -> None:
        self.dist.all_reduce(self.torch.ones(16))

    def all_gather(self) -> None:
        tensor = self.torch.ones(16)
        self.dist.all_gather([self.torch.empty_like(tensor) for _ in range(self.world_size)], tensor)

    def old_dump(self) -> None:
        """An "old periodic dump": this rank's FR as it is now, kept aside from the final one."""
        c10d = self.torch._C._distributed_c10d
        pickled = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False,
                                      onlyActive=False)
        as_json = c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        write_atomic(self.work / "old" / f"rank_{self.rank}.pkl", pickled)
        write_atomic(self.work / "old" / f"rank_{self.rank}.json", as_json)


def _gather(ctx: CaseContext) -> None:
    # Only the root passes gather_list (c10d): its output sizes differ from the other ranks'.
    tensor = ctx.torch.full((4,), float(ctx.rank))
    out = [ctx.torch.empty(4) for _ in range(ctx.world_size)] if ctx.rank == 0 else None
    ctx.dist.gather(tensor, gather_list=out, dst=0)


def _scatter(ctx: CaseContext) -> None:
    out = ctx.torch.empty(4)
    chunks = [ctx.torch.full((4,), float(r)) for r in range(ctx.world_size)] if ctx.rank == 0 else None
    ctx.dist.scatter(out, scatter_list=chunks, src=0)


def _splits(rank: int, world: int) -> tuple[list[int], list[int]]:
    """Uneven all_to_all splits: rank r sends r + j + 1 elements to rank j (and receives alike)."""
    send = [rank + j + 1 for j in range(world)]
    recv = [j + rank + 1 for j in range(world)]
    return send, recv


def _all_to_all_single(ctx: CaseContext) -> None:
    send, recv = _splits(ctx.rank, ctx.world_size)
    ctx.dist.all_to_all_single(ctx.torch.zeros(sum(recv)), ctx.torch.ones(sum(send)),
                               output_split_sizes=recv, input_split_sizes=send)


def _idle(ctx: CaseContext) -> None:
    del ctx


def _sub_all_reduce(ctx: CaseContext) -> None:
    ctx.dist.all_reduce(ctx.torch.ones(16), group=ctx.subgroup)


def _pair_steps(ctx: CaseContext) -> None:
    """More pair all_reduces than the 64-entry ring holds: the world's entries wrap away."""
    for _ in range(70):
        ctx.dist.all_reduce(ctx.torch.ones(4), group=ctx.subgroup)


def _pair_steps_then_world(ctx: CaseContext) -> None:
    _pair_steps(ctx)
    ctx.world_all_reduce()


def _stale_then_world(ctx: CaseContext) -> None:
    """Take an old dump, then run three more steps: the final hang happens much later."""
    if ctx.rank == 2:
        ctx.old_dump()
    for _ in range(3):
        ctx.world_all_reduce()
    if ctx.rank != 1:
        ctx.world_all_reduce()


def _pair_steps_then_dump(ctx: CaseContext) -> None:
    """Healthy: a few all_reduces in each of the rank's own case subgroups, in one global order
    (no rank waits on a group its peers reach later), then a dump at once, right after the last
    op returned: as an on-demand dump of a running job catches it, Gloo's retire race included."""
    for _ in range(3):
        for ranks, group in ctx.groups.items():
            if ctx.rank in ranks:
                ctx.dist.all_reduce(ctx.torch.ones(16), group=group)
    ctx.old_dump()


# Elements of the pair [2, 3]'s last all_reduce in ``pairs_on_demand``: big enough (128 MB) that
# the dump, taken right after the call, finds it still in flight on both members.
IN_FLIGHT_ELEMENTS = 32 * 1024 * 1024


def _pairs_on_demand(ctx: CaseContext) -> None:
    """Healthy: each pair runs all_reduces in its own group; ranks 0, 1 dump right after theirs
    returned, ranks 2, 3 right after calling their last one (a large one, async) and before it
    returned, as an on-demand dump of a running job catches them; then it completes."""
    mine = next(g for ranks, g in ctx.groups.items() if ctx.rank in ranks)
    for _ in range(2):
        ctx.dist.all_reduce(ctx.torch.ones(16), group=mine)
    if ctx.rank in (0, 1):
        ctx.dist.all_reduce(ctx.torch.ones(16), group=mine)
        ctx.old_dump()
        return
    work = ctx.dist.all_reduce(ctx.torch.ones(IN_FLIGHT_ELEMENTS), group=mine, async_op=True)
    ctx.old_dump()
    work.wait()


def _roles(default: Callable[[CaseContext], None],
           **by_rank: Callable[[CaseContext], None]) -> Callable[[CaseContext], None]:
    def play(ctx: CaseContext) -> None:
        by_rank.get(f"r{ctx.rank}", default)(ctx)
    return play


def _world(ctx: CaseContext) -> None:
    ctx.world_all_reduce()


def _all_gather(ctx: CaseContext) -> None:
    ctx.all_gather()


PROGRAMS: dict[str, Callable[[CaseContext], None]] = {
    "gather_skip": _roles(_gather, r3=_idle),
    "scatter_skip": _roles(_scatter, r2=_idle),
    "all_to_all_single_skip": _roles(_all_to_all_single, r1=_idle),
    "stale_dump": _stale_then_world,
    "twins_differ": _stale_then_world,
    "restarted": _roles(_gather, r3=_idle),
    "mismatch_and_skip": _roles(_world, r3=_all_gather, r2=_idle),
    "tie_and_skip": _roles(_idle, r0=_world, r1=_all_gather),
    "subgroup_unknown": _roles(_world, r0=_sub_all_reduce, r1=_idle),
    "subgroup_skipped": _roles(_world, r0=_sub_all_reduce),
    "world_wrapped": _roles(_world, r0=_pair_steps_then_world, r1=_pair_steps),
    "slow_rank": _roles(_world, r3=_idle),
    "pairs_on_demand": _pairs_on_demand,
    "overlap_retire_race": _pair_steps_then_dump,
    "restart_withheld": _roles(_world, r1=_idle),
}

# Subgroups a case builds after the pair [0, 1] ("1"); every rank calls new_group for each, in
# this order, so FR names them "2", "3", ... on every rank.
EXTRA_GROUPS: dict[str, tuple[tuple[int, ...], ...]] = {
    "pairs_on_demand": ((2, 3),),
    "overlap_retire_race": ((1, 2), (2, 3)),
}

# Old seq ids that outrun the new incarnation's stuck op (#4: two healthy steps, the barrier, then
# the withheld all_reduce).
RESTART_OLD_STEPS = 8


def _first_incarnation(rank: int, world_size: int, work: Path, timeout: timedelta) -> None:
    """An in-process restart: run the default group up to #RESTART_OLD_STEPS, destroy it and
    build it again in the same process (a new store, as an elastic agent's next round would)."""
    import torch
    import torch.distributed as dist

    for _ in range(RESTART_OLD_STEPS):
        dist.all_reduce(torch.ones(16))
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.FileStore(str(work / "store-2"), world_size),
                            rank=rank, world_size=world_size, timeout=timeout)


def run_rank(rank: int, world_size: int, work: Path, case: str, timeout: timedelta) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(work / "store"), world_size),
                            rank=rank, world_size=world_size, timeout=timeout)
    if case == "restart_withheld":
        _first_incarnation(rank, world_size, work, timeout)
    # new_group() defaults to a 30-minute timeout, not init_process_group's: pass it.
    subgroup = dist.new_group(list(SUBGROUP), timeout=timeout, group_desc="pair")
    groups: dict[tuple[int, ...], Any] = {SUBGROUP: subgroup} if case in EXTRA_GROUPS else {}
    for ranks in EXTRA_GROUPS.get(case, ()):
        groups[ranks] = dist.new_group(list(ranks), timeout=timeout, group_desc="pair")
    ctx = CaseContext(rank, world_size, torch, dist, subgroup, work, groups)
    dumper = HangDumper(work / "collected", rank=rank, collective_timeout=timeout,
                        host=host_of(rank), local_rank=0, formats=(DumpFormat.PICKLE, DumpFormat.JSON),
                        poll_interval=timedelta(seconds=0.25))
    with dumper:
        for _ in range(HEALTHY_STEPS):
            ctx.world_all_reduce()
        dumper.warm_up()
        dist.barrier()  # nobody hangs before every rank is warm
        write_atomic(work / "markers" / f"hang-{rank}", b"")
        PROGRAMS[case](ctx)
        logging.info("case program returned; waiting to be asked to dump")
        dumper.wait_dumped(timedelta(hours=1))
        while True:
            time.sleep(1.0)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testkit.generators.gloo_case_worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--work-dir", type=Path, required=True)
    p.add_argument("--case", choices=sorted(PROGRAMS), required=True)
    p.add_argument("--timeout-s", type=float, required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    args = p.parse_args(argv)
    _die_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {args.rank} %(message)s")
    run_rank(args.rank, args.world_size, args.work_dir, args.case, timedelta(seconds=args.timeout_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
