"""The triage pictures: real Gloo incidents, a 4,096-rank job, and ``denpex triage --chart``.

Each test checks the data the chart plots (who is marked culprit, where each rank sits) and that
the PNG decodes at the promised size with the culprit's red actually drawn.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image
from typer.testing import CliRunner

from denpex.analysis.job_progress import GroupPosition, JobProgress
from denpex.analysis.models import Candidate, CandidateKind, StuckCollective, TriageResult, Verdict
from denpex.charts import (
    MAX_GROUP_CHARTS,
    RankState,
    charts_section,
    group_charts,
    job_overview,
    png_data_uri,
    png_markdown,
    render_overview,
    triage_charts,
)
from denpex.charts.group_chart import GROUP_CHART_SIZE, UNPLACED_LABEL, group_figure
from denpex.charts.overview_chart import OVERVIEW_SIZE, grid_shape, overview_figure
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


# -- issue 20 item 3: every stuck group drawn, colours equal to the JSON's roles, text inside -------

INCIDENT = Path(__file__).resolve().parents[2] / "examples" / "incident-xid79"


def json_role(report: dict[str, Any], rank: int, stuck: list[dict[str, Any]]) -> str:
    """The rank's role as the triage JSON lists it (``stuck`` is one entry for a group's chart,
    all of them for the overview)."""
    if rank in {c["rank"] for c in report["candidates"]}:
        return "culprit"
    if rank in {*report["missing_ranks"], *report["stale_ranks"]}:
        return "no_evidence"
    for role, key in (("waiting", "waiting_ranks"), ("behind", "behind_ranks"), ("unknown", "unknown_ranks")):
        if any(rank in s[key] for s in stuck):
            return role
    return "clear"


def drawn_states(axes: Any) -> dict[float, str]:
    """x position -> the state whose colour the marker at x is drawn in (markers only: bars and
    legend entries are not collections of points)."""
    by_color = {to_hex(color): state.value for state, color in STATE_COLORS.items()}
    found: dict[float, str] = {}
    for collection in axes.collections:
        if not isinstance(collection, PathCollection) or not len(collection.get_offsets()):
            continue
        colors = collection.get_facecolors()
        colors = colors if len(colors) and colors[0][3] > 0 else collection.get_edgecolors()
        for (x, _), color in zip(collection.get_offsets(), np.broadcast_to(colors, (len(collection.get_offsets()), 4)),
                                 strict=True):
            name = by_color.get(to_hex(color[:3]))
            if name is not None:  # a culprit's black ring is drawn over its red marker
                found.setdefault(float(x), name)
    return found


def triage_json(folder: Path) -> dict[str, Any]:
    result = runner.invoke(app, ["triage", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.mark.parametrize("folder", [INCIDENT, FIXTURES / "withheld_one", FIXTURES / "sigstop",
                                    FIXTURES / "mismatch"], ids=lambda p: p.name)
def test_each_rank_is_drawn_in_the_colour_of_its_role_in_the_json(folder: Path) -> None:
    report = triage_json(folder)
    found = investigate(folder, keep_progress=True)
    assert found.progress is not None
    groups = group_charts(found.report, found.progress)
    assert len(groups) == len(report["stuck"])  # every stuck group has its chart
    for chart in groups:
        [stuck] = [s for s in report["stuck"] if (s["process_group"], s["collective_seq_id"])
                   == (chart.stuck.process_group, chart.stuck.collective_seq_id)]
        figure = group_figure(chart)
        [axes] = figure.axes
        ranks = [int(t.get_text()) for t in axes.get_xticklabels()]  # what the reader sees under each bar
        drawn = drawn_states(axes)
        assert sorted(drawn) == list(range(len(ranks)))
        got = {rank: drawn[float(x)] for x, rank in enumerate(ranks)}
        want = {rank: json_role(report, rank, [stuck]) for rank in ranks}
        assert got == want, f"group {stuck['process_group']!r}"
    overview = overview_figure(job_overview(found.report, found.progress))
    grid = overview.axes[1].images[0].get_array()
    states = list(RankState)
    cells = {r: states[int(grid[0][r])].value for r in range(report["world_size"])}
    assert cells == {r: json_role(report, r, report["stuck"]) for r in range(report["world_size"])}


def test_a_rank_that_never_entered_a_groups_op_is_not_drawn_as_in_no_stuck_op() -> None:
    """The bundled incident: rank 3 waits in group '2' and never entered group '4''s #3."""
    found = investigate(INCIDENT, keep_progress=True)
    assert found.progress is not None
    [group4] = [g for g in group_charts(found.report, found.progress) if g.stuck.process_group == "4"]
    assert {m.rank: m.state for m in group4.members} == {1: RankState.WAITING, 3: RankState.BEHIND}


def test_the_report_shows_every_group_chart_and_the_dialog_says_where_the_rest_are() -> None:
    found = investigate(INCIDENT, keep_progress=True)
    assert found.progress is not None
    charts = triage_charts(found.report, found.progress)
    assert [c.name for c in charts] == ["overview", "group-2-3", "group-3-3", "group-4-3"]
    report = charts_section(charts, found.report)
    assert report.count("](data:image/png;base64,") == 4 and "more group chart" not in report
    beside_form = charts_section(charts, found.report, groups=1, rest_at="[the full report](http://ui/x)")
    assert beside_form.count("](data:image/png;base64,") == 2
    assert beside_form.endswith("2 more group charts (group '3' #3, group '4' #3) are in "
                                "[the full report](http://ui/x).")


def test_charts_are_bounded_and_the_groups_left_undrawn_are_named() -> None:
    result, progress = big_job(world=64, culprit=9)
    extra = [StuckCollective(process_group=f"dp{i}", collective_seq_id=7, op="nccl:all_reduce",
                             waiting_ranks=(i,), behind_ranks=(i + 8,)) for i in range(20)]
    result = result.model_copy(update={"stuck": [*result.stuck, *extra]})
    charts = triage_charts(result, progress)
    assert len(charts) == 1 + MAX_GROUP_CHARTS
    section = charts_section(charts, result)
    assert section.count("](data:image/png;base64,") == 1 + MAX_GROUP_CHARTS
    assert "15 more stuck groups without a chart (the first 6 are drawn): group 'dp5' #7" in section
    assert section.rstrip(".").endswith("and 3 more")  # named up to a bound, then counted


def text_outside(figure: Figure) -> list[str]:
    """Every visible text whose extent leaves the figure, as drawn (after the layout engine ran)."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    box = figure.bbox
    # The locator keeps ticks just past the axis ends; those are not drawn.
    undrawn = {id(label) for axes in figure.axes for axis in (axes.xaxis, axes.yaxis)
               for tick in axis.get_major_ticks()
               if not min(axis.get_view_interval()) - 1e-9 <= tick.get_loc() <= max(axis.get_view_interval()) + 1e-9
               for label in (tick.label1, tick.label2)}
    outside = []
    for text in figure.findobj(Text):
        if id(text) in undrawn or not text.get_visible() or not text.get_text().strip():
            continue
        extent = text.get_window_extent(renderer)
        if extent.x0 < box.x0 - 1 or extent.y0 < box.y0 - 1 or extent.x1 > box.x1 + 1 or extent.y1 > box.y1 + 1:
            outside.append(f"{text.get_text()!r} at {extent.bounds}")
    return outside


@pytest.mark.parametrize("world", [4, 4096])
def test_every_text_of_the_overview_lies_inside_the_figure(world: int) -> None:
    result, progress = big_job(world=world, culprit=world - 2) if world > 4 else big_job(world=8, culprit=6)
    if world == 4:  # four ranks, one tp group of four stuck without rank 2
        found = investigate(INCIDENT, keep_progress=True)
        assert found.progress is not None
        result, progress = found.report, found.progress
    figure = overview_figure(job_overview(result, progress))
    assert text_outside(figure) == []
    texts = [t.get_text() for t in figure.findobj(Text)]
    assert any("never entered" in t or "waiting" in t for t in texts)  # the legend is there
    for chart in group_charts(result, progress):
        assert text_outside(group_figure(chart)) == []


def test_a_culprit_with_nothing_recorded_is_labelled_inside_the_frame_and_its_mark_is_in_the_legend() -> None:
    """Issue 31: rank 1 of the sigkill run has no dump; its × sits at the foot of the chart. Its
    label hung below the point and crossed the frame, and the legend had no entry for the ×."""
    found = investigate(FIXTURES / "sigkill", keep_progress=True)
    assert found.progress is not None
    [chart] = group_charts(found.report, found.progress)
    assert [m.rank for m in chart.members if m.last_enqueued is None] == [1]
    figure = group_figure(chart)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    [axes] = figure.axes
    frame = axes.get_window_extent(renderer)
    labels = [t for t in axes.texts if t.get_text().startswith("rank ")]
    assert [t.get_text() for t in labels] == ["rank 1\nstopped_reporting"]
    for label in labels:
        box = label.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, box.bounds
    [legend] = figure.legends
    entries = dict(zip((t.get_text() for t in legend.get_texts()), legend.legend_handles, strict=True))
    assert entries[UNPLACED_LABEL].get_marker() == "x"
    # A chart where every member recorded the group has no such entry.
    found = investigate(FIXTURES / "mismatch", keep_progress=True)
    assert found.progress is not None
    [legend] = group_figure(group_charts(found.report, found.progress)[0]).legends
    assert UNPLACED_LABEL not in [t.get_text() for t in legend.get_texts()]
