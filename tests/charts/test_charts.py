"""The triage pictures: real Gloo incidents, a 4,096-rank job, and ``denpex triage --chart``.

Each test checks the data the chart plots (who is marked culprit, where each rank sits) and that
the PNG decodes at the promised size with the culprit's red actually drawn.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from denpex.analysis.job_progress import GroupPosition, JobProgress
from denpex.analysis.models import Candidate, CandidateKind, StuckCollective, TriageResult, Verdict
from denpex.charts import (
    RankState,
    group_charts,
    job_overview,
    png_data_uri,
    png_markdown,
    render_overview,
    triage_charts,
)
from denpex.charts.group_chart import GROUP_CHART_SIZE
from denpex.charts.overview_chart import OVERVIEW_SIZE, grid_shape
from denpex.charts.style import STATE_COLORS
from denpex.cli import app
from denpex.investigate import investigate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gloo"
runner = CliRunner()


def decode(png: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    return np.asarray(image.convert("RGB"))


def red_pixels(pixels: np.ndarray) -> int:
    """Pixels of the culprit colour (antialiasing allowed a little slack)."""
    target = np.array([int(STATE_COLORS[RankState.CULPRIT][i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels.astype(int) - target).sum(axis=2) < 30).sum())


@pytest.mark.parametrize("scenario", ["withheld_one", "sigstop", "mismatch"])
def test_real_gloo_incident_charts_mark_the_recorded_culprit(scenario: str) -> None:
    folder = FIXTURES / scenario
    expected = json.loads((folder / "expected.json").read_text())
    found = investigate(folder, keep_progress=True)
    assert found.progress is not None
    overview = job_overview(found.report, found.progress)
    assert {str(m.rank): m.culprit_kind.value for m in overview.culprits if m.culprit_kind} == expected["culprits"]
    for rank, where in expected.get("waiting", {}).items():
        mark = overview.marks[int(rank)]
        if mark.state is RankState.WAITING:
            assert mark.offset == 0, f"rank {rank} waits in its stuck op, so it sits at offset 0"
    charts = triage_charts(found.report, found.progress)
    assert charts[0].name == "overview"
    assert decode(charts[0].png).shape == (OVERVIEW_SIZE[1], OVERVIEW_SIZE[0], 3)
    assert red_pixels(decode(charts[0].png)) > 100
    groups = group_charts(found.report, found.progress)
    assert len(charts) == 1 + len(groups) >= 2
    first = groups[0]
    assert {m.rank for m in first.culprits} <= set(map(int, expected["culprits"]))
    assert first.culprits, "the first group chart is the one waiting directly on a culprit"
    assert decode(charts[1].png).shape == (GROUP_CHART_SIZE[1], GROUP_CHART_SIZE[0], 3)
    assert red_pixels(decode(charts[1].png)) > 50


def test_withheld_one_group_chart_puts_the_culprit_below_the_stuck_op() -> None:
    found = investigate(FIXTURES / "withheld_one", keep_progress=True)
    assert found.progress is not None
    [first, *_] = group_charts(found.report, found.progress)
    assert first.stuck.process_group == "2" and first.stuck.collective_seq_id == 3
    members = {m.rank: m for m in first.members}
    assert members[2].state is RankState.CULPRIT and members[2].last_enqueued == 2
    assert members[3].state is RankState.WAITING and members[3].last_enqueued == 3


def test_no_hang_has_only_the_overview_and_no_culprit() -> None:
    found = investigate(FIXTURES / "healthy", keep_progress=True)
    assert found.progress is not None and found.report.verdict is Verdict.NO_HANG
    charts = triage_charts(found.report, found.progress)
    assert [c.name for c in charts] == ["overview"]
    assert red_pixels(decode(charts[0].png)) == 0


def big_job(world: int = 4096, culprit: int = 2731) -> tuple[TriageResult, JobProgress]:
    """tp=8 groups all at #120; the culprit's group is stuck at #121 without it."""
    tp = 8
    group = culprit // tp
    members = tuple(range(group * tp, group * tp + tp))
    positions = {}
    for r in range(world):
        name = f"tp{r // tp}"
        ahead = 1 if r in members and r != culprit else 0
        positions[r] = {name: GroupPosition(last_enqueued=120 + ahead, last_completed=120)}
    stuck = StuckCollective(process_group=f"tp{group}", collective_seq_id=121, op="nccl:all_reduce",
                            waiting_ranks=tuple(r for r in members if r != culprit), behind_ranks=(culprit,))
    result = TriageResult(
        verdict=Verdict.LOCALIZED, world_size=world, ranks_with_evidence=list(range(world)),
        missing_ranks=[], stuck=[stuck],
        candidates=[Candidate(rank=culprit, kind=CandidateKind.NOT_ENTERED, process_group=f"tp{group}",
                              collective_seq_id=121, confidence=0.9, host="gpu-node-342")])
    return result, JobProgress(world_size=world, positions=positions)


def test_overview_at_4096_ranks_shows_the_one_culprit() -> None:
    result, progress = big_job()
    overview = job_overview(result, progress)
    assert [m.rank for m in overview.culprits] == [2731]
    assert overview.marks[2731].offset == -1
    assert sum(m.state is RankState.WAITING for m in overview.marks) == 7
    png = render_overview(overview)
    pixels = decode(png)
    assert pixels.shape == (OVERVIEW_SIZE[1], OVERVIEW_SIZE[0], 3)
    # The star and the grid dot are drawn large: hundreds of red pixels for one rank in 4,096.
    assert red_pixels(pixels) > 300
    assert grid_shape(4096) == (46, 91)


def test_markdown_embeds_the_png_as_a_data_uri() -> None:
    png = triage_charts(*big_job(64, 9))[0].png
    uri = png_data_uri(png)
    assert uri.startswith("data:image/png;base64,")
    assert base64.b64decode(uri.split(",", 1)[1]) == png
    assert png_markdown(png, "job [overview]") == f"![job \\[overview\\]]({uri})"  # alt text is escaped


def test_cli_writes_the_overview_and_group_charts(tmp_path: Path) -> None:
    out = tmp_path / "chart.png"
    result = runner.invoke(app, ["triage", str(FIXTURES / "withheld_one"), "--format", "json",
                                 "--chart", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verdict"] == "localized"
    written = sorted(tmp_path.glob("chart*.png"))
    assert out in written and len(written) >= 2
    assert f"chart: {out}" in result.stderr
    for path in written:
        Image.open(path).verify()
