"""`benchmarks/accuracy.py` runs on the committed cases and scores them against their truth.

Not an accuracy gate (the fixture tests are): it checks that the benchmark itself loads every
case of a family, scores a right verdict as right, and writes the JSON it promises.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_accuracy_benchmark_scores_the_committed_gloo_dumps(tmp_path: Path) -> None:
    out = tmp_path / "accuracy.json"
    done = subprocess.run([sys.executable, "benchmarks/accuracy.py", "--only", "gloo", "gloo_bare", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    fixtures = sorted(p.parent.name for p in (ROOT / "tests" / "fixtures" / "gloo").glob("*/expected.json"))
    assert result["totals"]["cases"] == 3 * len(fixtures) and result["totals"]["errors"] == 0
    rows = {row["case"]: row for row in result["cases"]}
    withheld = rows["gloo/withheld_one [pickle]"]
    assert withheld["verdict_right"] and withheld["right"] == [2] and withheld["wrong"] == []
    assert f"cases: {result['totals']['cases']}, right verdict: " in done.stdout
