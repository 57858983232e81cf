"""The committed real Gloo dumps (tests/fixtures/gloo/, made by testkit.generators.gloo_scenarios):
each triages to its ground truth from pickle and from JSON, under any file names, and shows the
facts the analysis relies on. Fast: no process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from gloo_checks import (
    EXTENSIONS,
    NAMINGS,
    check_dump_facts,
    evidence_folder,
    read_expected,
    scenario_names,
    triage_outcome,
)
from testkit.generators.gloo_scenarios import SCENARIOS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gloo"
NAMES = scenario_names(FIXTURES)
MAX_BYTES = 1024 * 1024


def test_every_scenario_has_a_fixture_and_the_set_is_small() -> None:
    assert set(SCENARIOS) <= set(NAMES)
    assert any(read_expected(FIXTURES / n)["long_stall"] for n in NAMES)
    size = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert size < MAX_BYTES, f"fixtures grew to {size} bytes"


@pytest.mark.parametrize("name", NAMES)
def test_dumps_show_the_scenario(name: str) -> None:
    check_dump_facts(FIXTURES / name)


@pytest.mark.parametrize("naming", NAMINGS)
@pytest.mark.parametrize("fmt", list(EXTENSIONS))
@pytest.mark.parametrize("name", NAMES)
def test_triage_finds_the_culprits(tmp_path: Path, name: str, fmt: str, naming: str) -> None:
    expected = read_expected(FIXTURES / name)
    folder = evidence_folder(FIXTURES / name, tmp_path / name, fmt, naming)
    assert triage_outcome(folder) == (expected["verdict"], expected["culprits"])
