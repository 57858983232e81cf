"""The parse fan-out on a real Dask cluster of two worker processes, through prefect-dask.

The verdict and the culprits equal what ``denpex triage --format json`` says on the same files,
and both workers decoded dumps (the flow's process decodes none).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from denpex.analysis.batch import summarize_batch
from denpex.analysis.triage import resolve_manifest, triage_summaries
from denpex.analysis.summary import RankSummary
from denpex.evidence.discovery import discover_dumps
from denpex.evidence.store import open_store
from flows.dask_parse import parse_on_dask
from testkit.generators.expansion import generate_dump_set
from testkit.generators.fr_template import load_template
from testkit.generators.hang_model import Scenario

# Sized to what it starts: the harness server and a real Dask cluster.
pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "benchmarks" / "templates" / "gloo_rank0_2000.pkl.gz"
GLOO = ROOT / "tests" / "fixtures" / "gloo"


@pytest.fixture
def harness(prefect_harness: str) -> str:
    """The session's test-harness server (tests/plugins/services.py)."""
    return prefect_harness


@pytest.fixture(scope="module")
def cluster() -> Iterator[Client]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1", scheduler_port=0) as local, Client(local) as client:
        yield client


def executed_per_worker(client: Client) -> dict[str, int]:
    counts: dict[str, int] = client.run(lambda dask_worker: dask_worker.state.executed_count)
    return counts


def cli_answer(folder: Path) -> dict[str, object]:
    done = subprocess.run([str(Path(sys.executable).parent / "denpex"), "triage", str(folder), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    body: dict[str, object] = json.loads(done.stdout)
    return body


def dask_answer(folder: Path, address: str, n_batches: int) -> dict[str, object]:
    store = open_store(folder)
    objects = store.list()
    manifest = resolve_manifest(store, None, objects)
    assert manifest is not None
    inventory = discover_dumps(store.uri, objects, manifest, manifest.world_size)
    refs = list(inventory.dumps.values())
    batches = [refs[i::n_batches] for i in range(n_batches)]
    outcomes = parse_on_dask(batches, address=address)
    summaries = {o.rank: o for o in outcomes if isinstance(o, RankSummary)}
    assert len(summaries) == len(refs), "every dump came back as a summary"
    result = triage_summaries(summaries, world_size=manifest.world_size, manifest=manifest)
    return {"verdict": result.verdict.value,
            "candidates": [{"rank": c.rank, "kind": c.kind.value} for c in result.candidates]}


def culprits(body: dict[str, object]) -> list[tuple[int, str]]:
    candidates = body["candidates"]
    assert isinstance(candidates, list)
    return sorted((int(c["rank"]), str(c["kind"])) for c in candidates)


@pytest.mark.parametrize("scenario", ["withheld_one", "sigkill"])
def test_real_gloo_incident_on_dask_matches_the_cli(harness: str, cluster: Client, scenario: str) -> None:
    before = executed_per_worker(cluster)
    answer = dask_answer(GLOO / scenario, cluster.scheduler.address, n_batches=4)
    cli = cli_answer(GLOO / scenario)
    assert answer["verdict"] == cli["verdict"] and culprits(answer) == culprits(cli)
    after = executed_per_worker(cluster)
    assert sum(after.values()) - sum(before.values()) >= 4


def test_256_rank_job_on_dask_uses_both_workers_and_matches_the_cli(harness: str, cluster: Client,
                                                                     tmp_path: Path) -> None:
    folder = tmp_path / "job"
    generate_dump_set(folder, world_size=256, scenario=Scenario.STALLED, template=load_template(TEMPLATE),
                      ring_size=200, workers=1)
    before = executed_per_worker(cluster)
    answer = dask_answer(folder, cluster.scheduler.address, n_batches=16)
    cli = cli_answer(folder)
    assert answer["verdict"] == cli["verdict"] == "localized"
    assert culprits(answer) == culprits(cli)
    after = executed_per_worker(cluster)
    assert len(after) == 2 and all(after[w] > before.get(w, 0) for w in after), \
        f"both Dask worker processes ran batches: {before} -> {after}"


def test_plain_batch_and_dask_agree_on_every_summary(harness: str, cluster: Client) -> None:
    folder = GLOO / "withheld_two"
    store = open_store(folder)
    objects = store.list()
    manifest = resolve_manifest(store, None, objects)
    assert manifest is not None
    refs = list(discover_dumps(store.uri, objects, manifest, manifest.world_size).dumps.values())
    local = {o.rank: o for o in summarize_batch(refs) if isinstance(o, RankSummary)}
    remote = {o.rank: o for o in parse_on_dask([[r] for r in refs], address=cluster.scheduler.address)
              if isinstance(o, RankSummary)}
    assert local == remote
