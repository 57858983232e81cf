"""Triage accuracy on every dump set with a known truth: verdict and named ranks against the truth.

    .venv/bin/python benchmarks/accuracy.py                      # every case, a table on stdout
    .venv/bin/python benchmarks/accuracy.py --json /tmp/acc.json # the same, also as JSON
    .venv/bin/python benchmarks/accuracy.py --only gloo nccl     # the case families named

The cases, and where each one's truth comes from (the same truth the tests compare with):

- ``gloo/<name> [pickle|json]``: the committed real Gloo dumps (``tests/fixtures/gloo/``), one
  encoding at a time with the manifest, as ``tests/gloo_real/test_gloo_fixtures.py`` copies them;
  truth ``expected.json`` (``verdict``, ``culprits``).
- ``gloo_bare/<name> [pickle, no-manifest]``: the same committed Gloo dumps without their
  manifest, as a user without one has them (no dump times, process groups or world size);
  truth ``expected.json``. No test pins these: they are held-out evidence.
- ``gloo_cases/<name>``: the committed real Gloo families of issue 9 (``tests/fixtures/gloo_cases/``,
  no manifest), triaged in place as ``tests/gloo_real/test_gloo_cases.py`` does; truth
  ``expected.json``.
  Issue 17's real Gloo reproductions are among them: ``pairs_on_demand`` (family 4: a healthy
  job whose truth names no culprit; the triage may name the other pair's ranks only as
  ``membership: inferred`` suspects, which count as named wrongly, and the notes say so),
  ``overlap_retire_race`` (family 5) and ``restart_withheld`` (family 6).
- ``gloo_torch29/<name>`` and ``gloo_torch214/<name>``: real Gloo dumps from torch 2.9.1 and
  2.14.1 (``tests/fixtures/gloo_torch29/``, ``tests/fixtures/gloo_torch214/``), triaged in place
  as ``tests/analysis/test_torch_versions.py`` does; truth ``expected.json``.
- ``gloo_collected/<name>``: the folders HangDumper wrote (dumps plus ``collector/`` records, no
  manifest); they carry no truth file, so the truth is what ``check_collected`` in
  ``tests/gloo_real/test_gloo_cases.py`` asserts (``subgroup_unknown``: localized, rank 1
  not_entered; ``slow_rank``: no_hang, so nobody named).
- ``nccl/<name> [pickle|json]``: the 64-rank NCCL-format scenarios
  (``testkit.generators.nccl_fixtures``), generated into a temporary folder and triaged with one
  worker, as ``tests/analysis/test_nccl_scenarios.py`` does; truth ``BuiltScenario.expected``.
- ``moe/<name> [pickle|json, manifest|no-manifest]``: the Megatron MoE reproductions
  (``testkit.generators.nccl_moe``); truth ``BuiltMoE.expected``: the failed ranks, stalled, with
  the verdict ambiguous for a GPU lost in an ep all_to_all (a stopped-CPU lead) and localized
  for one lost in a tp collective whose rank is behind its ep peers; a tp partner that nothing
  separates from the failed rank is in the truth too (verdict ambiguous). Until issue 17 the
  members of each failed rank's ep group were named after the leads: any still named count as
  named wrongly, and the notes column says how many are such ep peers. Issue 29's cases are among
  them: ``moe16_tp_partner_went_on`` (a tp member that enqueued an op its partner never reached
  waits on it) and the ``*_active_*`` ones, dumped with ``onlyActive=True`` as the pilots' GPU
  jobs dump (only the entries still in flight).

A "named" rank is one of the report's candidates (``TriageResult.candidates``), as in the tests.
Per case: expected and given verdict, ranks named right (in the truth's culprits), named wrongly
(not in them), missed (in them, not named), and those named right with another kind than the
truth's. Nothing is timed. Exits 0 (a measurement), or 1 when a case could not be loaded or
triaged: its error is printed and the other cases still run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test kit (testkit/) is imported from the repo root

from denpex.analysis.models import Membership, TriageResult  # noqa: E402
from denpex.analysis.triage import TriageOptions, triage_path  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
FAMILIES = ("gloo", "gloo_bare", "gloo_cases", "gloo_collected", "gloo_torch29", "gloo_torch214",
            "nccl", "moe")

# tests/gloo_real/test_gloo_cases.py::check_collected: the only truth these folders have.
COLLECTED_TRUTH: dict[str, tuple[str, dict[int, str]]] = {
    "subgroup_unknown": ("localized", {1: "not_entered"}),
    "slow_rank": ("no_hang", {}),
}


@dataclass
class Truth:
    verdict: str
    culprits: dict[int, str]
    note: str = ""
    accepted_extra: frozenset[int] = frozenset()
    """Ranks not in the culprits that are counted apart when named (MoE ep peers of a failed rank)."""


@dataclass
class Case:
    """One triage run: where its folder comes from and what it should give."""

    name: str
    prepare: Callable[[Path], tuple[Path, Truth]]
    """Given an empty scratch folder, returns the folder to triage and the truth."""
    options: TriageOptions | None = None


@dataclass
class Row:
    case: str
    expected_verdict: str = ""
    given_verdict: str = ""
    right: list[int] = field(default_factory=list)
    wrong: list[int] = field(default_factory=list)
    missed: list[int] = field(default_factory=list)
    kind_differs: dict[int, str] = field(default_factory=dict)
    """Ranks named right but with another kind: ``"given (expected ...)"``."""
    wrong_accepted: list[int] = field(default_factory=list)
    """Of ``wrong``, the MoE ep peers of a failed rank."""
    notes: str = ""
    error: str | None = None

    @property
    def verdict_right(self) -> bool:
        return self.error is None and self.expected_verdict == self.given_verdict


def _culprits(raw: dict[str, str]) -> dict[int, str]:
    return {int(rank): str(kind) for rank, kind in raw.items()}


def _read_truth(folder: Path) -> Truth:
    data = json.loads((folder / "expected.json").read_text())
    # ``suspects`` (issue 17, family 4): ranks the triage names only through a guessed membership;
    # they are not culprits, so naming them counts as wrong here, and the notes say how many.
    suspects = data.get("suspects") or {}
    note = f"{len(suspects)} expected inferred-membership suspects (not culprits)" if suspects else ""
    return Truth(verdict=str(data["verdict"]), culprits=_culprits(data["culprits"]), note=note)


# -- the cases -------------------------------------------------------------------------------------


def _gloo_fixture(name: str, suffix: str, manifest: bool = True) -> Callable[[Path], tuple[Path, Truth]]:
    def prepare(scratch: Path) -> tuple[Path, Truth]:
        source = FIXTURES / "gloo" / name
        if manifest:
            shutil.copyfile(source / "manifest.json", scratch / "manifest.json")
        for dump in sorted(source.glob(f"rank_*{suffix}")):
            shutil.copyfile(dump, scratch / dump.name)
        return scratch, _read_truth(source)
    return prepare


def _gloo_case(name: str, family: str = "gloo_cases") -> Callable[[Path], tuple[Path, Truth]]:
    def prepare(scratch: Path) -> tuple[Path, Truth]:
        folder = FIXTURES / family / name
        return folder, _read_truth(folder)
    return prepare


def _gloo_collected(name: str) -> Callable[[Path], tuple[Path, Truth]]:
    def prepare(scratch: Path) -> tuple[Path, Truth]:
        if name not in COLLECTED_TRUTH:
            raise LookupError(f"no known truth for tests/fixtures/gloo_collected/{name}")
        verdict, culprits = COLLECTED_TRUTH[name]
        folder = shutil.copytree(FIXTURES / "gloo_collected" / name, scratch / name)
        return folder, Truth(verdict=verdict, culprits=dict(culprits))
    return prepare


def _nccl(name: str, fmt_name: str) -> Callable[[Path], tuple[Path, Truth]]:
    def prepare(scratch: Path) -> tuple[Path, Truth]:
        from testkit.generators.nccl_dump import DumpFormat
        from testkit.generators.nccl_fixtures import build_scenario, write_scenario

        built = build_scenario(name)
        folder = write_scenario(built, scratch / name, DumpFormat(fmt_name))
        expected = built.expected
        return folder, Truth(verdict=expected.verdict.value,
                             culprits={r: k.value for r, k in expected.culprits.items()})
    return prepare


def _moe(name: str, fmt_name: str, manifest: bool) -> Callable[[Path], tuple[Path, Truth]]:
    def prepare(scratch: Path) -> tuple[Path, Truth]:
        from testkit.generators.nccl_dump import DumpFormat
        from testkit.generators.nccl_moe import build_moe_scenario, write_moe_scenario
        from testkit.generators.nccl_topology import GroupKind

        built = build_moe_scenario(name)
        folder = write_moe_scenario(built, scratch / name, DumpFormat(fmt_name), manifest=manifest)
        faulty = {f.rank for f in built.scenario.faults}
        peers: set[int] = set()
        for rank in faulty:
            group = built.topology.group_of(rank, GroupKind.EP)
            peers |= set(group.ranks if group is not None else ()) - faulty
        expected = built.expected
        return folder, Truth(verdict=expected.verdict.value,
                             culprits={r: k.value for r, k in expected.culprits.items()},
                             accepted_extra=frozenset(peers))
    return prepare


def cases(families: tuple[str, ...]) -> Iterator[Case]:
    if "gloo" in families:
        for folder in sorted(p.parent for p in (FIXTURES / "gloo").glob("*/expected.json")):
            for fmt, suffix in (("pickle", ".pkl"), ("json", ".json")):
                yield Case(f"gloo/{folder.name} [{fmt}]", _gloo_fixture(folder.name, suffix))
    if "gloo_bare" in families:
        # The same real dumps as a user without a manifest has them: no dump times, no process
        # group list, no world size. No test pins these: they are held-out evidence.
        for folder in sorted(p.parent for p in (FIXTURES / "gloo").glob("*/expected.json")):
            yield Case(f"gloo_bare/{folder.name} [pickle, no-manifest]", _gloo_fixture(folder.name, ".pkl", False))
    if "gloo_cases" in families:
        for folder in sorted(p for p in (FIXTURES / "gloo_cases").iterdir() if p.is_dir()):
            yield Case(f"gloo_cases/{folder.name}", _gloo_case(folder.name))
    if "gloo_torch29" in families:
        # Issue 29: real Gloo dumps from torch 2.9.1 (the same schema and pg_config as 2.13).
        for folder in sorted(p for p in (FIXTURES / "gloo_torch29").iterdir() if p.is_dir()):
            yield Case(f"gloo_torch29/{folder.name}", _gloo_case(folder.name, "gloo_torch29"))
    if "gloo_torch214" in families:
        # Issue 29: real Gloo dumps from torch 2.14.1 (pg_config lists subgroup positions).
        for folder in sorted(p for p in (FIXTURES / "gloo_torch214").iterdir() if p.is_dir()):
            yield Case(f"gloo_torch214/{folder.name}", _gloo_case(folder.name, "gloo_torch214"))
    if "gloo_collected" in families:
        for folder in sorted(p for p in (FIXTURES / "gloo_collected").iterdir() if p.is_dir()):
            yield Case(f"gloo_collected/{folder.name}", _gloo_collected(folder.name))
    one_worker = TriageOptions(workers=1)
    if "nccl" in families:
        from testkit.generators.nccl_scenarios import scenario_names

        for name in scenario_names():
            for fmt in ("pickle", "json"):
                yield Case(f"nccl/{name} [{fmt}]", _nccl(name, fmt), one_worker)
    if "moe" in families:
        from testkit.generators.nccl_moe import MOE_SCENARIOS

        for name in MOE_SCENARIOS:
            for fmt in ("pickle", "json"):
                for manifest in (True, False):
                    label = f"moe/{name} [{fmt}, {'manifest' if manifest else 'no-manifest'}]"
                    yield Case(label, _moe(name, fmt, manifest), one_worker)


# -- scoring ---------------------------------------------------------------------------------------


def score(case: str, truth: Truth, result: TriageResult) -> Row:
    named = {c.rank: c.kind.value for c in result.candidates}
    row = Row(case=case, expected_verdict=truth.verdict, given_verdict=result.verdict.value)
    row.right = sorted(r for r in named if r in truth.culprits)
    row.wrong = sorted(r for r in named if r not in truth.culprits)
    row.missed = sorted(r for r in truth.culprits if r not in named)
    row.kind_differs = {r: f"{named[r]} (expected {truth.culprits[r]})"
                        for r in row.right if named[r] != truth.culprits[r]}
    notes = [truth.note] if truth.note else []
    guessed = sorted(c.rank for c in result.candidates if c.membership is Membership.INFERRED)
    if guessed:
        notes.append(f"membership inferred for {_ranks(guessed)}")
    if truth.accepted_extra and row.wrong:
        row.wrong_accepted = [r for r in row.wrong if r in truth.accepted_extra]
        notes.append(f"{len(row.wrong_accepted)} of {len(row.wrong)} wrong are ep peers")
    row.notes = "; ".join(notes)
    return row


def run_case(case: Case, scratch: Path) -> Row:
    try:
        folder, truth = case.prepare(scratch)
        result = triage_path(folder, options=case.options)
    except Exception as exc:  # noqa: BLE001 - a case that cannot be loaded is reported, not fatal
        print(f"error: {case.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return Row(case=case.name, error=f"{type(exc).__name__}: {exc}")
    return score(case.name, truth, result)


# -- output ----------------------------------------------------------------------------------------


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks)) if ranks else "-"


def totals(rows: list[Row]) -> dict[str, int]:
    return {
        "cases": len(rows),
        "verdict_right": sum(r.verdict_right for r in rows),
        "errors": sum(r.error is not None for r in rows),
        "named_right": sum(len(r.right) for r in rows),
        "named_wrongly": sum(len(r.wrong) for r in rows),
        "named_wrongly_ep_peers": sum(len(r.wrong_accepted) for r in rows),
        "missed": sum(len(r.missed) for r in rows),
        "kind_differs": sum(len(r.kind_differs) for r in rows),
    }


def table(rows: list[Row]) -> str:
    header = ("case", "expected", "given", "ok", "right", "wrong", "missed", "kind differs", "notes")
    lines: list[tuple[str, ...]] = [header]
    for r in rows:
        if r.error is not None:
            lines.append((r.case, r.expected_verdict or "?", "ERROR", "no", "", "", "", "", r.error))
            continue
        kinds = ",".join(f"{rank}:{text}" for rank, text in r.kind_differs.items()) or "-"
        lines.append((r.case, r.expected_verdict, r.given_verdict, "yes" if r.verdict_right else "NO",
                      _ranks(r.right), _ranks(r.wrong), _ranks(r.missed), kinds, r.notes))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    t = totals(rows)
    out += ["",
            f"cases: {t['cases']}, right verdict: {t['verdict_right']}/{t['cases']}"
            + (f", could not be run: {t['errors']}" if t["errors"] else ""),
            f"ranks named right: {t['named_right']}, named wrongly: {t['named_wrongly']} "
            f"(of them {t['named_wrongly_ep_peers']} MoE ep peers), "
            f"missed: {t['missed']}, named right with another kind: {t['kind_differs']}"]
    return "\n".join(out)


def to_json(rows: list[Row]) -> dict[str, Any]:
    items = []
    for r in rows:
        item = asdict(r)
        item["kind_differs"] = {str(k): v for k, v in r.kind_differs.items()}
        item["verdict_right"] = r.verdict_right
        items.append(item)
    return {"cases": items, "totals": totals(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--only", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                        help="run only these case families (default: all)")
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="denpex-accuracy-") as tmp:
        for i, case in enumerate(cases(tuple(args.only))):
            scratch = Path(tmp) / f"case{i:03d}"
            scratch.mkdir()
            rows.append(run_case(case, scratch))
            shutil.rmtree(scratch, ignore_errors=True)
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(rows), indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return 1 if any(r.error is not None for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
