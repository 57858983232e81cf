"""What Gloo's pg_status counter counts, on real processes: the rule that a low Gloo counter
proves a wrapped rank behind (``denpex.analysis.compare.progress_from_status``) rests on it.

Gloo numbers every op it runs, sends and recvs too, though send and recv leave no Flight Recorder
entry; ``last_enqueued_collective`` is that number for the last collective. So it is never below
the rank's collective count, and a value below a stuck collective's seq id means the rank never
enqueued it. A high value proves nothing (the sends inflate it)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from testkit.services.net import free_port
from testkit.services.rank_zygote import rank_launcher

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace
    from denpex.evidence.safe_pickle import safe_loads

    def run(rank, port, out):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        t = torch.ones(4)
        dist.all_reduce(t)
        for _ in range(5):
            dist.send(t, 1) if rank == 0 else dist.recv(t, 0)
        dist.all_reduce(t)
        dump = safe_loads(_dump_fr_trace(True, True, False))
        seqs = [e["collective_seq_id"] for e in dump["entries"]]
        with open(f"{out}/rank_{rank}.json", "w") as f:
            json.dump({"status": dump["pg_status"], "seqs": seqs,
                       "ops": [e["profiling_name"] for e in dump["entries"]]}, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
""")


def test_gloo_counts_sends_and_recvs_in_pg_status(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port, launcher = free_port(), rank_launcher()  # two real ranks, forked with torch already imported
    ranks = [launcher.spawn_script(script, [str(rank), str(port), str(tmp_path)], env=dict(os.environ),
                                   cwd=tmp_path, log=tmp_path / f"rank-{rank}.log") for rank in (0, 1)]
    for rank, proc in enumerate(ranks):
        assert proc.wait(timeout=120) == 0, (tmp_path / f"rank-{rank}.log").read_text()[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert seen["ops"] == ["gloo:all_reduce", "gloo:all_reduce"]  # no entry for send or recv
        assert seen["seqs"] == [1, 2]
        status = seen["status"]["0"]
        # 2 collectives and 5 p2p ops: the counter is 7, never below the collective count of 2.
        assert int(status["last_enqueued_collective"]) == 7 >= max(seen["seqs"])
