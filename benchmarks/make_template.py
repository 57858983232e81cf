"""Record one real Flight Recorder ring to use as the template of the synthetic expansion.

Four Gloo processes on this machine's CPU run a small 3D-parallel-shaped job (world, two
"tensor-parallel" pairs, two "data-parallel" pairs) for more than 2,000 collectives, so that the
default 2,000-entry ring is full and has wrapped. Rank 0 then dumps its ring with
``_dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)`` and the
pickle bytes are written, gzip-compressed and unchanged, to ``--out``.

The expansion (``testkit.generators.expansion``) takes only the *shape* from this file: the
top-level keys, the entry fields, the frames, the dtypes and the thread names. Every value that
varies across ranks is rewritten there.

Usage::

    .venv/bin/python benchmarks/make_template.py --out benchmarks/templates/gloo_rank0_2000.pkl.gz
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

WORLD = 4
STEPS = 560  # 4 collectives per step on rank 0 -> 2,240 records: the ring wraps.


def _train_step(step: int, groups: dict[str, object]) -> None:
    import torch
    import torch.distributed as dist

    grad = torch.ones(1024)
    dist.all_reduce(grad, group=groups["tp"])  # tensor-parallel activation reduce
    shard = torch.empty(512)
    dist.reduce_scatter_tensor(shard, torch.ones(1024), group=groups["dp"])  # ZeRO grad shard
    full = torch.empty(1024)
    dist.all_gather_into_tensor(full, shard, group=groups["dp"])  # ZeRO param gather
    loss = torch.tensor([float(step)])
    dist.all_reduce(loss)  # world: loss / grad-norm


def _worker(rank: int, store_path: str, out: str) -> None:
    import warnings

    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace

    # reduce_scatter_tensor / all_gather_into_tensor warn that they are deprecated; the template
    # wants exactly these stacks, so silence the noise rather than change the calls.
    warnings.filterwarnings("ignore", category=FutureWarning)

    timeout = timedelta(seconds=60)
    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD, timeout=timeout
    )
    # Every rank must create every group, in the same order (new_group is collective).
    tp_groups = [dist.new_group([0, 1], timeout=timeout), dist.new_group([2, 3], timeout=timeout)]
    dp_groups = [dist.new_group([0, 2], timeout=timeout), dist.new_group([1, 3], timeout=timeout)]
    groups = {"tp": tp_groups[rank // 2], "dp": dp_groups[rank % 2]}
    for step in range(STEPS):
        _train_step(step, groups)
    dist.barrier()
    time.sleep(0.5)  # let the Gloo worker threads retire the last entries
    if rank == 0:
        data = _dump_fr_trace(
            includeCollectives=True, includeStackTraces=True, onlyActive=False
        )
        Path(out).write_bytes(gzip.compress(data, mtime=0))
        print(f"rank 0 dump: {len(data)} bytes pickle, written gzip to {out}")
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        ctx = mp.start_processes(
            _worker, args=(store, str(args.out)), nprocs=WORLD, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + 300
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print("template run did not finish in 300 s", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
