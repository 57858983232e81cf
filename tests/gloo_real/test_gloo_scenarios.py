"""Run the Gloo scenario generator for real (4 processes per scenario, ~1.5 min on 2 cores) and
triage what it wrote: every verdict and culprit, from pickle and from JSON, under any file names.
The tests that need the run are marked ``slow``; CI must run them.

The session fixture runs all scenarios once, including the long stall (withheld_one_long: hung
35 s past the 5 s collective timeout before anyone dumps).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from denpex.collector.layout import request_path
from gloo_checks import (
    EXTENSIONS,
    NAMINGS,
    check_dump_facts,
    evidence_folder,
    read_expected,
    scenario_names,
    triage_outcome,
)
from testkit.generators.gloo_scenarios import (
    SCENARIOS,
    WORK_DIR,
    GeneratorOptions,
    ScenarioRun,
    main,
    run_scenarios,
)

# Sized to what it starts: the first test runs every real Gloo scenario, one hung 35 s past its timeout.
pytestmark = [pytest.mark.timeout(600)]

OPTIONS = GeneratorOptions()
NAMES = [*SCENARIOS, f"{OPTIONS.long_stall}_long"]


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, ScenarioRun]]:
    out = tmp_path_factory.mktemp("gloo-scenarios")
    runs = run_scenarios(out, list(SCENARIOS), OPTIONS)
    return out, {run.name: run for run in runs}


@pytest.mark.slow
def test_every_scenario_was_written(generated: tuple[Path, dict[str, ScenarioRun]]) -> None:
    out, runs = generated
    assert scenario_names(out) == sorted(NAMES)
    assert sorted(runs) == sorted(NAMES)
    assert (out / "summary.json").is_file()


@pytest.mark.slow
def test_no_rank_outlives_its_scenario(generated: tuple[Path, dict[str, ScenarioRun]]) -> None:
    _, runs = generated
    for run in runs.values():
        for info in run.detail["ranks"].values():  # type: ignore[union-attr]
            with pytest.raises(ProcessLookupError):
                os.kill(info["pid"], 0)


@pytest.mark.slow
def test_long_stall_lasts_over_30s_past_the_timeout(
        generated: tuple[Path, dict[str, ScenarioRun]]) -> None:
    _, runs = generated
    detail = runs[f"{OPTIONS.long_stall}_long"].detail
    assert detail["long_stall"] is True
    assert detail["stall_seconds_past_timeout"] > 30  # type: ignore[operator]


@pytest.mark.slow
def test_store_signal_carries_the_request_between_real_processes(
        generated: tuple[Path, dict[str, ScenarioRun]]) -> None:
    """withheld_two's idle ranks are in no collective: only the request can make them dump, and
    it reached them through the generator's TCPStore, with no shared request file."""
    out, runs = generated
    detail = runs["withheld_two"].detail
    assert detail["dump_signal"] == "store"
    ranks = detail["ranks"]
    assert {ranks[r]["trigger"] for r in (1, 2)} == {"request"}  # type: ignore[index]
    # The first of the waiting ranks to stall sent it; the other may have got it first.
    assert "stall" in {ranks[r]["trigger"] for r in (0, 3)}  # type: ignore[index]
    assert not request_path(out / WORK_DIR / "withheld_two" / "collected").exists()
    assert runs["withheld_one"].detail["dump_signal"] == "file"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_dumps_show_the_scenario(generated: tuple[Path, dict[str, ScenarioRun]], name: str) -> None:
    out, _ = generated
    check_dump_facts(out / name)


@pytest.mark.slow
@pytest.mark.parametrize("naming", NAMINGS)
@pytest.mark.parametrize("fmt", list(EXTENSIONS))
@pytest.mark.parametrize("name", NAMES)
def test_triage_finds_the_culprits(generated: tuple[Path, dict[str, ScenarioRun]], tmp_path: Path,
                                   name: str, fmt: str, naming: str) -> None:
    out, _ = generated
    expected = read_expected(out / name)
    folder = evidence_folder(out / name, tmp_path / name, fmt, naming)
    assert triage_outcome(folder) == (expected["verdict"], expected["culprits"])


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["out", "--long-stall", "nope"], "--long-stall 'nope'", id="unknown-long-stall"),
    pytest.param(["out", "--timeout-s", "1"], "below 2 s", id="timeout-too-short"),
    pytest.param(["out", "--scenario", "nope"], "invalid choice", id="unknown-scenario"),
])
def test_cli_refuses_bad_options(argv: list[str], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
