"""Issue 29, sections 2 and 3: dumps as each supported torch lays them out.

- torch 2.14 (real Gloo, committed in ``tests/fixtures/gloo_torch214``): Gloo's ``pg_config``
  lists the positions within the last subgroup a rank built (``[0, 1]``), not ``"[]"``; read by a
  rule that needs no version, a list shorter than the world means the rank built a subgroup.
- torch 2.6 records no Flight Recorder entries for Gloo at all (measured on the 2.6.0 wheel); its
  NCCL dumps say schema ``"2.4"``, have no ``comm_lib_version``, and their entries no
  ``thread_name`` / ``thread_id``. The NCCL reproductions written that way triage to their truth.
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
from testkit.generators.nccl_dump import DumpFormat, encode_dump, torch26_form
from testkit.generators.nccl_fixtures import BuiltScenario, build_scenario, dump_file_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gloo_torch214"
TORCH214 = sorted(p.parent.name for p in FIXTURES.glob("*/expected.json"))


@pytest.mark.parametrize(("text", "size"), [("[]", 0), ("[0, 1]", 2), ("[0, 1, 2, 3]", 4), ("nonsense", None)])
def test_gloo_pg_config_is_read_as_a_count_of_ranks(text: str, size: int | None) -> None:
    assert _gloo_config_size({"": {"name": "", "desc": "", "ranks": text}}) == size


@pytest.mark.parametrize("name", TORCH214)
def test_real_torch_2_14_gloo_dumps_triage_to_their_truth(name: str) -> None:
    """On bde3b97 ``subgroup_skipped`` was ``localized`` naming no rank (2.14's ``[0, 1]`` read as
    "built no subgroup"), and ``subgroup_unknown`` ``localized`` on a guessed membership."""
    folder = FIXTURES / name
    expected = json.loads((folder / "expected.json").read_text())
    result = triage_path(folder)
    assert invariant_violations(result) == []
    assert (result.verdict.value, {str(c.rank): c.kind.value for c in result.candidates}) == (
        expected["verdict"], expected["culprits"])
    if result.verdict is Verdict.INCOMPLETE:
        assert result.incomplete_reason is IncompleteReason.MEMBERSHIP_UNKNOWN


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
