"""Issue 29, sections 2 and 3: dumps as each supported torch lays them out.

- torch 2.14 (real Gloo, committed in ``tests/fixtures/gloo_torch214``): Gloo's ``pg_config``
  lists the positions within the last subgroup a rank built (``[0, 1]``), not ``"[]"``; read by a
  rule that needs no version, a list shorter than the world means the rank built a subgroup.
- torch 2.9 (real Gloo, committed in ``tests/fixtures/gloo_torch29``): the same schema ``"2.10"``,
  keys and ``pg_config`` (``"[]"``) as 2.13; the same dump facts hold.
- torch 2.6 records no Flight Recorder entries for Gloo at all (measured on the 2.6.0 wheel); its
  NCCL dumps say schema ``"2.4"``, have no ``comm_lib_version``, and their entries no
  ``thread_name`` / ``thread_id``. The NCCL reproductions written that way triage to their truth.

The 2.9 and 2.14 folders each hold ``gloo_scenarios``' withheld_one, mismatch, sigkill and healthy
(pickle, JSON, manifest, truth), triaged here under the dev pin (torch 2.13) in place and one
encoding at a time; their dumps show the same facts as the 2.13 fixtures (but for 2.14's ``pg_config``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from denpex.analysis.invariants import invariant_violations
from denpex.analysis.models import IncompleteReason, Verdict
from denpex.analysis.summary import _gloo_config_size
from denpex.analysis.triage import triage_path
from gloo_real.gloo_checks import EXTENSIONS, check_dump_facts, evidence_folder, triage_outcome
from testkit.generators.nccl_dump import DumpFormat, encode_dump, torch26_form
from testkit.generators.nccl_fixtures import BuiltScenario, build_scenario, dump_file_name

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
# Each torch version's folder, and what its Gloo writes as pg_config's ranks.
PG_CONFIG_RANKS = {"gloo_torch29": "[]", "gloo_torch214": "[0, 1]"}
FOLDERS = sorted((family, p.parent.name) for family in PG_CONFIG_RANKS
                 for p in (ROOT / family).glob("*/expected.json"))
# The gloo_scenarios runs (pickle, JSON and manifest); the others are gloo_cases folders.
SCENARIOS = [(family, name) for family, name in FOLDERS if (ROOT / family / name / "manifest.json").is_file()]
ISSUE_29_SCENARIOS = {"withheld_one", "mismatch", "sigkill", "healthy"}
MAX_BYTES = 512 * 1024


@pytest.mark.parametrize(("text", "size"), [("[]", 0), ("[0, 1]", 2), ("[0, 1, 2, 3]", 4), ("nonsense", None)])
def test_gloo_pg_config_is_read_as_a_count_of_ranks(text: str, size: int | None) -> None:
    assert _gloo_config_size({"": {"name": "", "desc": "", "ranks": text}}) == size


@pytest.mark.parametrize("family", sorted(PG_CONFIG_RANKS))
def test_each_torch_version_has_the_issue_29_scenarios_and_stays_small(family: str) -> None:
    assert ISSUE_29_SCENARIOS <= {name for f, name in SCENARIOS if f == family}
    size = sum(p.stat().st_size for p in (ROOT / family).rglob("*") if p.is_file())
    assert size < MAX_BYTES, f"{family} grew to {size} bytes"


@pytest.mark.parametrize(("family", "name"), FOLDERS)
def test_real_gloo_dumps_of_other_torch_versions_triage_to_their_truth(family: str, name: str) -> None:
    """On bde3b97 2.14's ``subgroup_skipped`` was ``localized`` naming no rank (2.14's ``[0, 1]``
    read as "built no subgroup"), and ``subgroup_unknown`` ``localized`` on a guessed membership."""
    folder = ROOT / family / name
    expected = json.loads((folder / "expected.json").read_text())
    result = triage_path(folder)
    assert invariant_violations(result) == []
    assert (result.verdict.value, {str(c.rank): c.kind.value for c in result.candidates}) == (
        expected["verdict"], expected["culprits"])
    if result.verdict is Verdict.INCOMPLETE:
        # sigkill: the killed rank left no dump; subgroup_unknown (no manifest): nothing says who
        # the dumps' subgroups hold.
        assert result.incomplete_reason is (IncompleteReason.RANKS_MISSING if name == "sigkill"
                                            else IncompleteReason.MEMBERSHIP_UNKNOWN)


@pytest.mark.parametrize("fmt", list(EXTENSIONS))
@pytest.mark.parametrize(("family", "name"), SCENARIOS)
def test_other_torch_versions_triage_from_either_encoding(tmp_path: Path, family: str, name: str,
                                                          fmt: str) -> None:
    source = ROOT / family / name
    expected = json.loads((source / "expected.json").read_text())
    folder = evidence_folder(source, tmp_path / name, fmt, "as_written")
    assert triage_outcome(folder) == (expected["verdict"], expected["culprits"])


@pytest.mark.parametrize(("family", "name"), SCENARIOS)
def test_other_torch_versions_dumps_show_the_scenario(family: str, name: str) -> None:
    """The facts the 2.13 fixtures show hold on 2.9 and 2.14 too, but for 2.14's pg_config."""
    check_dump_facts(ROOT / family / name, PG_CONFIG_RANKS[family])


@cache
def built(name: str) -> BuiltScenario:
    return build_scenario(name)


@pytest.mark.parametrize("name", ["pp_p2p_hang"])
def test_nccl_dumps_as_torch_2_6_writes_them_triage_to_their_truth(name: str, tmp_path: Path) -> None:
    scenario = built(name)
    for rank, dump in scenario.dumps.items():
        old = torch26_form(dump)
        assert old["version"] == "2.4" and "comm_lib_version" not in old
        assert all("thread_name" not in e and "thread_id" not in e for e in old["entries"])
        (tmp_path / dump_file_name(rank, DumpFormat.PICKLE)).write_bytes(encode_dump(old, DumpFormat.PICKLE))
    (tmp_path / "manifest.json").write_text(scenario.manifest.model_dump_json(exclude_none=True))
    result = triage_path(tmp_path)
    assert invariant_violations(result) == []
    assert (result.verdict, {c.rank: c.kind for c in result.candidates}) == (
        scenario.expected.verdict, scenario.expected.culprits)
