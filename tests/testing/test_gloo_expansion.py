"""The Gloo-style expansion behind ``benchmarks/triage_scale.py --scenarios gloo`` (issue 29,
section 6), at small scale: Gloo's shape (scheduled and retired entries, no p2p, Gloo's
``pg_config``), the retire race on a share of the ranks, and a triage that finds the culprit."""

from __future__ import annotations

import json
from pathlib import Path

from denpex.analysis.triage import triage_path
from denpex.evidence.safe_pickle import safe_loads
from testkit.generators.fr_template import load_template
from testkit.generators.gloo_expansion import GLOO_PREFIX, generate_gloo_set, gloo_culprit, racing

TEMPLATE = Path(__file__).resolve().parents[2] / "benchmarks" / "templates" / "gloo_rank0_2000.pkl.gz"
WORLD = 32
RING = 64


def test_a_gloo_style_set_has_gloos_shape_and_triages_to_its_culprit(tmp_path: Path) -> None:
    made = generate_gloo_set(tmp_path, world_size=WORLD, template=load_template(TEMPLATE), ring_size=RING)
    assert made.files == WORLD and made.states["RACING"] >= 3
    culprit = gloo_culprit(WORLD)
    for rank in range(WORLD):
        body = safe_loads((tmp_path / f"{GLOO_PREFIX}{rank}").read_bytes())
        assert isinstance(body, dict)
        entries = body["entries"]
        assert len(entries) == RING and entries[0]["record_id"] > 0  # full and wrapped
        assert {e["state"] for e in entries} == {"scheduled"} and not any(e["is_p2p"] for e in entries)
        assert body["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]"}}
        pair = f"{rank // 2 + 1:06d}"
        assert {e["process_group"][0] for e in entries} == {"0", pair}
        newest_pair_op = [e for e in entries if e["process_group"][0] == pair][-1]
        assert newest_pair_op["retired"] is not racing(rank)
        world_last = entries[-1]
        assert (world_last["process_group"][0] == "0") is (rank != culprit)
    expected = json.loads((tmp_path / "expected.json").read_text())
    result = triage_path(tmp_path)
    assert result.verdict.value == expected["verdict"] == "localized"
    assert {str(c.rank): c.kind.value for c in result.candidates} == expected["culprits"] == {str(culprit): "not_entered"}
    assert sum("retire race" in n for n in result.notes) == made.states["RACING"]
