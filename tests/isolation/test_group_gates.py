"""One verdict per stuck group, and the isolation gates applied group by group (issue 17, family 7).

The reproduction is the 32-rank Megatron MoE job (NCCL-format dumps, timing off) in which two GPUs
fail in tensor-parallel collectives: rank 21's (tp [20, 21]), which the dumps separate from its
partner (rank 21 is also behind its expert-parallel peers, and rank 20 went past it), and rank
6's (tp [6, 7]), which they cannot. The incident as a whole is ambiguous; the tp group of rank 21
is localized on its own, and a fresh Xid 79 on rank 21's node may drain it while the other pair
stays a guess, even with a signal on its node too.
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import cache
from pathlib import Path

from typer.testing import CliRunner

from denpex.analysis.models import Verdict
from denpex.analysis.triage import triage_path
from denpex.cli import app
from denpex.investigate import investigate
from denpex.isolation.plan import Gate
from denpex.isolation.policy import Scheduler
from testkit.generators.nccl_dump import DumpFormat
from testkit.generators.nccl_moe import BuiltMoE, build_moe_scenario, write_moe_scenario
from testkit.generators.nccl_topology import GroupKind


@cache
def built(name: str = "moe32_two_tp_pairs") -> BuiltMoE:
    return build_moe_scenario(name)


def _incident(tmp_path: Path, name: str = "moe32_two_tp_pairs") -> tuple[Path, Path]:
    """The dumps with their manifest, and a kernel log with an Xid 79 on rank 21's GPU and on
    another GPU of rank 6's node, two seconds after the oldest stuck op was enqueued."""
    scenario = built(name)
    folder = write_moe_scenario(scenario, tmp_path / "dumps", DumpFormat.PICKLE)
    # Rank 21's GPU is the one the Xid names; ranks 6 and 7 sit on other GPUs of their node.
    manifest = json.loads((folder / "manifest.json").read_text())
    for rank, bus in ((21, "0000:3b:00.0"), (6, "0000:5e:00.0"), (7, "0000:86:00.0")):
        manifest["ranks"][str(rank)]["gpu_pci_bus_id"] = bus
    (folder / "manifest.json").write_text(json.dumps(manifest))
    enqueued = min(s.enqueued_at for s in triage_path(folder).stuck if s.enqueued_at is not None)
    stamp = (enqueued + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S+0000")
    lines = [f"{stamp} {scenario.manifest.host_of(rank)} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, "
             "GPU has fallen off the bus." for rank in (21, 6)]
    log = tmp_path / "kern.log"
    log.write_text("\n".join(lines) + "\n")
    return folder, log


def test_each_stuck_group_has_its_own_verdict(tmp_path: Path) -> None:
    folder, _ = _incident(tmp_path)
    report = investigate(folder).report
    assert report.verdict is Verdict.AMBIGUOUS
    assert {c.rank for c in report.candidates} == {6, 7, 21}
    topology = built().topology
    by_group = {(g.process_group, g.collective_seq_id, g.p2p_seq_id): g for g in report.groups}
    tp21 = topology.group_of(21, GroupKind.TP).name
    tp6 = topology.group_of(6, GroupKind.TP).name
    [mine] = [g for g in by_group.values() if g.process_group == tp21]
    [pair] = [g for g in by_group.values() if g.process_group == tp6]
    assert (mine.verdict, mine.candidates) == (Verdict.LOCALIZED, [21])
    assert (pair.verdict, pair.candidates) == (Verdict.AMBIGUOUS, [6, 7])
    # Every stuck op's waits end on one of the two incidents, never on both here.
    assert all(set(g.candidates) in ({21}, {6, 7}) for g in report.groups)
    assert {(s.process_group, s.collective_seq_id) for s in report.stuck} >= {
        (g.process_group, g.collective_seq_id if g.collective_seq_id is not None else g.p2p_seq_id)
        for g in report.groups}


def test_a_proven_group_is_drained_while_another_stays_ambiguous(tmp_path: Path) -> None:
    folder, log = _incident(tmp_path)
    found = investigate(folder, telemetry=[log], scheduler=Scheduler.SLURM, cluster="c1")
    assert found.plan is not None
    host21 = built().manifest.host_of(21)
    assert [a.node for a in found.plan.actions] == [host21]
    assert found.plan.actions[0].ranks == (21,)
    guesses = [b for b in found.plan.blocked if b.gate is Gate.VERDICT]
    assert [b.message for b in guesses] == [
        f"process group {built().topology.group_of(6, GroupKind.DP).name!r} collective #62004 is ambiguous: "
        "ranks 6, 7 could be behind it but the evidence cannot say which; no node is isolated on a guess"]
    assert built().manifest.host_of(6) not in {a.node for a in found.plan.actions}


def test_a_stopped_cpu_lead_in_one_group_does_not_hold_back_a_proven_drain_in_another(tmp_path: Path) -> None:
    """The case the last note left: rank 6's CPU stopped in an ep all_to_all every member entered
    (a lead, ambiguous: it may only have synchronised), and rank 21 is proven in its tp group.
    Before per-group verdicts the lead's ambiguity blocked every drain of the incident."""
    name = "moe32_stopped_lead_and_tp_pair"
    folder, log = _incident(tmp_path, name)
    found = investigate(folder, telemetry=[log], scheduler=Scheduler.SLURM, cluster="c1")
    assert found.report.verdict is Verdict.AMBIGUOUS
    assert {c.rank for c in found.report.candidates} == {6, 21}
    ep6 = built(name).topology.group_of(6, GroupKind.EP).name
    assert {(g.process_group, g.verdict.value, tuple(g.candidates)) for g in found.report.groups
            if g.process_group in (ep6, built(name).topology.group_of(21, GroupKind.TP).name)} == {
        (ep6, "ambiguous", (6,)), (built(name).topology.group_of(21, GroupKind.TP).name, "localized", (21,))}
    assert found.plan is not None
    assert [(a.node, a.ranks) for a in found.plan.actions] == [(built(name).manifest.host_of(21), (21,))]
    assert any(b.gate is Gate.VERDICT and "is ambiguous: rank 6 could be behind it" in b.message
               for b in found.plan.blocked)


def test_the_cli_prints_the_groups_in_json_and_text(tmp_path: Path) -> None:
    folder, log = _incident(tmp_path)
    runner = CliRunner()
    out = runner.invoke(app, ["triage", str(folder), "--telemetry", str(log), "--scheduler", "slurm",
                              "--cluster", "c1", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["verdict"] == "ambiguous" and data["plan"]["recommend_isolation"] is True
    for group in data["groups"]:
        # ``tied`` appears only where true: the pair [6, 7] that nothing separates. Rank 21 is
        # proven by the dumps (behind in the ep all_to_all), so no group is ``hardware_separated``.
        assert set(group) - {"tied"} in ({"process_group", "collective_seq_id", "verdict", "candidates"},
                                         {"process_group", "p2p_seq_id", "verdict", "candidates"})
        assert group.get("tied", False) is (group["candidates"] == [6, 7])
    text = runner.invoke(app, ["triage", str(folder), "--telemetry", str(log), "--scheduler", "slurm",
                               "--cluster", "c1"])
    assert text.exit_code == 0, text.output
    tp21 = built().topology.group_of(21, GroupKind.TP)
    assert f"group {tp21.name!r} ({tp21.desc}) collective #" in text.stdout
    assert "Verdict per stuck group:" in text.stdout
    assert "localized: rank 21" in text.stdout and "ambiguous: ranks 6, 7" in text.stdout


def test_a_fault_on_a_rank_outside_the_candidates_makes_each_localized_group_ambiguous_too(tmp_path: Path) -> None:
    """Hostile review, finding 1: correlation turned the incident's verdict ambiguous (an Xid on a
    GPU of a rank that is not a candidate: the hang may have started there) but left the groups'
    own verdicts localized, and the per-group gate then drained the candidate's node anyway.
    Real Gloo ``withheld_one``: rank 2 on gpu-node-003 never enters its tp all_reduce; Xid 79 on
    gpu-node-003 and on rank 0's gpu-node-001."""
    import shutil
    from datetime import datetime

    folder = tmp_path / "withheld_one"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "gloo" / "withheld_one", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    for rank in manifest["ranks"].values():
        rank["gpu_pci_bus_id"] = "0000:3b:00.0"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    newest = max(datetime.fromisoformat(r["dumped_at"].replace("Z", "+00:00"))
                 for r in manifest["ranks"].values() if r.get("dumped_at"))
    stamp = (newest - timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S+0000")
    log = tmp_path / "kern.log"
    log.write_text("".join(f"{stamp} {host} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, "
                           "GPU has fallen off the bus.\n" for host in ("gpu-node-003", "gpu-node-001")))
    found = investigate(folder, telemetry=[log], scheduler=Scheduler.SLURM, cluster="c1")
    assert found.report.verdict is Verdict.AMBIGUOUS
    assert found.report.groups and {g.verdict for g in found.report.groups} == {Verdict.AMBIGUOUS}
    assert found.plan is not None and found.plan.actions == ()
    assert [b.gate for b in found.plan.blocked] == [Gate.VERDICT]
