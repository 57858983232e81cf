"""The merge step alone: how big one rank summary is, and what merging N of them costs.

A fanned-out triage (process pool today, Prefect tasks over S3 batches tomorrow) ships one
``RankSummary`` per rank back to the merge. This measures, on a generated N-rank set:

- the size of one summary as it crosses a process boundary (pickle) and as JSON;
- the time to summarize all dumps (2 worker processes), for context;
- the time of ``triage_summaries``: membership, staleness, comparison, wait-for graph, verdict.

    .venv/bin/python benchmarks/merge_summaries.py --ranks 4096 [--scenario stalled] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test kit (testkit/) lives at the repo root

from denpex.analysis.workers import summarize_all  # noqa: E402
from denpex.analysis.triage import triage_summaries  # noqa: E402
from denpex.evidence.discovery import discover_dumps  # noqa: E402
from denpex.evidence.manifest import load_manifest  # noqa: E402
from denpex.evidence.skipped import SkippedFile  # noqa: E402
from denpex.evidence.store import LocalStore  # noqa: E402
from testkit.generators.expansion import generate_dump_set  # noqa: E402
from testkit.generators.fr_template import load_template  # noqa: E402
from testkit.generators.hang_model import Scenario  # noqa: E402

TEMPLATE = Path(__file__).resolve().parent / "templates" / "gloo_rank0_2000.pkl.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--scenario", default="stalled", choices=[s.value for s in Scenario])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="denpex-merge-"))
    try:
        generate_dump_set(workdir, world_size=args.ranks, scenario=Scenario(args.scenario),
                          template=load_template(TEMPLATE))
        manifest = load_manifest(workdir / "manifest.json")
        store = LocalStore(workdir)
        inventory = discover_dumps(store.uri, store.list(), manifest, manifest.world_size)
        started = time.perf_counter()
        outcomes = summarize_all(list(inventory.dumps.values()), workers=2)
        summarize_s = time.perf_counter() - started
        summaries = {o.rank: o for o in outcomes if not isinstance(o, SkippedFile)}
        pickled = [len(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL)) for s in summaries.values()]
        as_json = [len(s.model_dump_json()) for s in list(summaries.values())[:256]]
        merges = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = triage_summaries(summaries, world_size=manifest.world_size, manifest=manifest)
            merges.append(time.perf_counter() - started)
        expected = json.loads((workdir / "expected.json").read_text())
        right = (result.verdict.value == expected["verdict"]
                 and {str(c.rank): c.kind.value for c in result.candidates} == expected["culprits"])
        print(f"ranks                       {args.ranks} ({args.scenario})")
        print(f"summary size, pickle        median {statistics.median(pickled):,.0f} B, "
              f"max {max(pickled):,} B, all {sum(pickled) / 2**20:,.1f} MiB")
        print(f"summary size, JSON          median {statistics.median(as_json):,.0f} B")
        print(f"summarize all dumps         {summarize_s:.2f} s (2 workers, for context)")
        print(f"merge + compare + verdict   median {statistics.median(merges):.3f} s, "
              f"min {min(merges):.3f} s over {args.repeat} runs")
        print(f"verdict right               {right} ({result.verdict.value})")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
