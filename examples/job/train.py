"""A small data- and tensor-parallel training job, written as a user would write it, with
Denpex's hang dumper around the training loop. It is the job behind `examples/incident-xid79/`
(`testkit/generators/bundled_incident.py` runs 4 ranks of it on Gloo and records what they dump).

    torchrun --nproc-per-node 4 train.py --checkpoint-dir /ckpt --dump-dir /shared/fr

Ranks pair up two ways: tensor-parallel pairs (0,1), (2,3) all-reduce their activations, and
data-parallel pairs (0,2), (1,3) all-reduce their gradients; the world all-reduces the loss for
the log. After the warm-up steps every rank writes its checkpoint shard, then trains on. A rank
whose shard write never returns (a hung filesystem, a node going bad) never reaches the next
step: its tensor-parallel peer waits in the step's first all_reduce, the others behind it.
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from denpex.collector import HangDumper

WORLD = 4
TP_PAIRS = ((0, 1), (2, 3))
DP_PAIRS = ((0, 2), (1, 3))


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, batch: torch.Tensor, tp: dist.ProcessGroup) -> torch.Tensor:
        activations = self.layer(batch)
        dist.all_reduce(activations, group=tp)  # the tensor-parallel partial sums
        return activations


def next_batch(step: int) -> torch.Tensor:
    return torch.full((4, 4), float(step))


def train_step(model: Model, step: int, tp: dist.ProcessGroup, dp: dist.ProcessGroup) -> float:
    loss = model(next_batch(step), tp).square().mean()
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    dist.all_reduce(grads, group=dp)  # the data-parallel gradient sum
    with torch.no_grad():
        offset = 0
        for param in model.parameters():
            param.sub_(1e-3 * grads[offset:offset + param.numel()].view_as(param))
            offset += param.numel()
    model.zero_grad()
    total = loss.detach().reshape(1)
    dist.all_reduce(total)  # the loss, for the log
    return float(total)


def save_checkpoint(model: Model, folder: Path, rank: int) -> None:
    with open(folder / f"shard_{rank}.pt", "wb") as shard:
        torch.save(model.state_dict(), shard)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--dump-dir", type=Path, required=True)
    parser.add_argument("--warm-up-steps", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()
    timeout = timedelta(seconds=args.timeout_s)
    dist.init_process_group("gloo", timeout=timeout)  # MASTER_ADDR, RANK, WORLD_SIZE from torchrun
    rank = dist.get_rank()
    tp_groups = [dist.new_group(list(p), timeout=timeout, group_desc="tp") for p in TP_PAIRS]
    dp_groups = [dist.new_group(list(p), timeout=timeout, group_desc="dp") for p in DP_PAIRS]
    tp = next(g for g, p in zip(tp_groups, TP_PAIRS) if rank in p)
    dp = next(g for g, p in zip(dp_groups, DP_PAIRS) if rank in p)
    torch.manual_seed(0)
    model = Model()
    dumper = HangDumper(args.dump_dir, rank=rank, collective_timeout=timeout,
                        host=os.environ.get("NODE_NAME"), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                        poll_interval=timedelta(seconds=0.25))
    with dumper:
        for step in range(args.warm_up_steps):
            train_step(model, step, tp, dp)
        dumper.warm_up()  # the first dump of a process is slow: take it before anything can hang
        dist.barrier()
        save_checkpoint(model, args.checkpoint_dir, rank)
        for step in range(args.warm_up_steps, 10 ** 6):
            train_step(model, step, tp, dp)


if __name__ == "__main__":
    main()
