"""A fault on one member's own GPU separates a tied pair (issue 17, family 1).

The reproduction is the 16-rank Megatron MoE job (NCCL-format dumps, timing off) in which rank 5's
GPU stops in a forward tensor-parallel ``_all_gather_base``: both members of tp [4, 5] entered it,
neither finished, and both stopped short of the ep dispatch, so the dumps alone leave the pair
``ambiguous``. An Xid 79 on rank 5's own GPU names rank 5 alone; signals that fall on both members
(on both GPUs, host-wide, or on a GPU neither uses) leave the pair as it was.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

import pytest

from denpex.analysis.models import Candidate, CandidateKind, GroupVerdict, Membership, Verdict
from denpex.analysis.triage import triage_path
from denpex.hardware.tie_break import MemberEvidence, separate_by_own_gpu
from denpex.investigate import investigate
from denpex.isolation.policy import Scheduler
from testkit.generators.nccl_dump import DumpFormat
from testkit.generators.nccl_moe import BuiltMoE, build_moe_scenario, write_moe_scenario

SCENARIO = "moe16_tp_pair_unseparated"
GPU = {4: "0000:3b:00.0", 5: "0000:5e:00.0"}


@cache
def built() -> BuiltMoE:
    return build_moe_scenario(SCENARIO)


def _dumps(tmp_path: Path, gpus: dict[int, str] = GPU, hosts: dict[int, str] | None = None) -> Path:
    folder = write_moe_scenario(built(), tmp_path / "dumps", DumpFormat.PICKLE)
    manifest = json.loads((folder / "manifest.json").read_text())
    for rank, bus in gpus.items():
        manifest["ranks"][str(rank)]["gpu_pci_bus_id"] = bus
    for rank, host in (hosts or {}).items():
        manifest["ranks"][str(rank)]["host"] = host
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _kernel_log(tmp_path: Path, folder: Path, lines: list[str], *, spans_the_hang: bool = True) -> Path:
    """``lines`` stamped two seconds after the oldest stuck op was enqueued, on the pair's node;
    with ``spans_the_hang``, between ordinary kernel lines from before the window to after the dumps
    (a host's log must span the hang before silence on it counts as a clean GPU)."""
    result = triage_path(folder)
    enqueued = min(s.enqueued_at for s in result.stuck if s.enqueued_at is not None)
    assert result.as_of is not None

    def at(when: datetime) -> str:
        return when.strftime("%Y-%m-%dT%H:%M:%S+0000")
    host = built().manifest.host_of(5)
    body = [f"{at(enqueued + timedelta(seconds=2))} {host} kernel: {line}" for line in lines]
    if spans_the_hang:
        body = ([f"{at(enqueued - timedelta(minutes=6))} {host} kernel: EXT4-fs (nvme0n1p2): re-mounted."] + body
                + [f"{at(result.as_of + timedelta(seconds=30))} {host} kernel: EXT4-fs (nvme0n1p2): re-mounted."])
    log = tmp_path / "kern.log"
    log.write_text("".join(f"{line}\n" for line in body))
    return log


def _xid79(bus: str) -> str:
    return f"NVRM: Xid (PCI:{bus[:-2]}): 79, pid=4242, GPU has fallen off the bus."


def test_the_dumps_alone_leave_the_pair_tied(tmp_path: Path) -> None:
    report = investigate(_dumps(tmp_path)).report
    assert report.verdict is Verdict.AMBIGUOUS
    assert {c.rank for c in report.candidates} == {4, 5}
    assert all((g.candidates, g.verdict, g.tied) == ([4, 5], Verdict.AMBIGUOUS, True) for g in report.groups)


def test_an_xid_on_one_members_own_gpu_names_that_member_alone(tmp_path: Path) -> None:
    folder = _dumps(tmp_path)
    found = investigate(folder, telemetry=[_kernel_log(tmp_path, folder, [_xid79(GPU[5])])],
                        scheduler=Scheduler.SLURM, cluster="c1")
    report = found.report
    assert report.verdict is Verdict.LOCALIZED
    [five] = report.candidates
    assert (five.rank, five.kind, five.confidence) == (5, CandidateKind.STALLED, 0.7)  # no longer split in two
    # First: the approval form shows a candidate's first reason.
    assert "set apart from rank 4" in five.reasons[0] and "Xid 79" in five.reasons[0], five.reasons
    assert report.groups and all((g.verdict, g.candidates, g.hardware_separated) == (Verdict.LOCALIZED, [5], True)
                                 for g in report.groups)
    assert any("Ranks 4, 5 were tied" in n and "rank 4 no longer" in n for n in report.notes), report.notes
    assert found.plan is not None
    assert [a.node for a in found.plan.actions] == [built().manifest.host_of(5)]


@pytest.mark.parametrize("lines", [
    pytest.param([_xid79(GPU[4]), _xid79(GPU[5])], id="both-gpus"),
    pytest.param(["nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)"],
                 id="host-wide-sxid"),
    pytest.param([_xid79("0000:86:00.0")], id="a-gpu-neither-uses"),
])
def test_a_signal_that_falls_on_both_members_or_neither_separates_nothing(tmp_path: Path, lines: list[str]) -> None:
    folder = _dumps(tmp_path)
    report = investigate(folder, telemetry=[_kernel_log(tmp_path, folder, lines)]).report
    assert report.verdict is Verdict.AMBIGUOUS
    assert {c.rank for c in report.candidates} == {4, 5}
    assert not any("were tied" in n for n in report.notes)


@pytest.mark.parametrize(("gpus", "hosts", "spans", "extra"), [
    pytest.param({5: GPU[5]}, None, True, [], id="the-peers-gpu-only-assumed-from-local-rank"),
    pytest.param(GPU, {4: "gpu-node-099"}, True, [], id="no-telemetry-covers-the-peers-host"),
    pytest.param(GPU, None, False, [], id="the-kernel-log-does-not-span-the-hang"),
    pytest.param(GPU, None, True, ["pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: 0000:3a:00.0"],
                 id="a-fatal-aer-not-proven-off-the-peers-path"),
])
def test_missing_evidence_on_the_peer_is_not_read_as_health(tmp_path: Path, gpus: dict[int, str],
                                                             hosts: dict[int, str] | None, spans: bool,
                                                             extra: list[str]) -> None:
    folder = _dumps(tmp_path, gpus, hosts)
    log = _kernel_log(tmp_path, folder, [_xid79(GPU[5]), *extra], spans_the_hang=spans)
    found = investigate(folder, telemetry=[log], scheduler=Scheduler.SLURM, cluster="c1")
    assert found.report.verdict is Verdict.AMBIGUOUS
    assert {c.rank for c in found.report.candidates} == {4, 5}
    assert found.plan is None or not found.plan.actions


def _stalled(rank: int, membership: Membership = Membership.KNOWN) -> Candidate:
    return Candidate(rank=rank, kind=CandidateKind.STALLED, confidence=0.35, membership=membership)


def _tied_group(*ranks: int, tied: bool = True) -> GroupVerdict:
    return GroupVerdict(process_group="7", collective_seq_id=12, verdict=Verdict.AMBIGUOUS,
                        candidates=list(ranks or (4, 5)), tied=tied)


FAULT = MemberEvidence(own_fault="Xid 79 on this rank's GPU", shown_clean=False)
CLEAN = MemberEvidence(shown_clean=True)


@pytest.mark.parametrize(("group", "five", "evidence"), [
    pytest.param(_tied_group(tied=False), _stalled(5), {5: FAULT, 4: CLEAN}, id="ambiguous-but-not-a-tie"),
    pytest.param(_tied_group(), _stalled(5, Membership.INFERRED), {5: FAULT, 4: CLEAN}, id="an-inferred-member"),
    pytest.param(_tied_group(), _stalled(5), {5: FAULT, 4: MemberEvidence()}, id="the-peer-not-shown-clean"),
    pytest.param(_tied_group(), _stalled(5), {5: FAULT, 4: FAULT}, id="both-faulty"),
])
def test_only_a_fault_beside_peers_shown_clean_separates_a_tie(group: GroupVerdict, five: Candidate,
                                                               evidence: dict[int, MemberEvidence]) -> None:
    out = separate_by_own_gpu([group], [_stalled(4), five], Verdict.AMBIGUOUS, evidence)
    assert (out.verdict, [c.rank for c in out.candidates], out.notes) == (Verdict.AMBIGUOUS, [4, 5], [])
    assert out.groups == [group]


def test_a_separated_group_leaves_another_tied_group_and_the_incident_ambiguous() -> None:
    other = GroupVerdict(process_group="9", collective_seq_id=3, verdict=Verdict.AMBIGUOUS, candidates=[6, 7],
                         tied=True)
    candidates = [_stalled(r) for r in (4, 5, 6, 7)]
    out = separate_by_own_gpu([_tied_group(), other], candidates, Verdict.AMBIGUOUS,
                              {4: CLEAN, 5: FAULT, 6: CLEAN, 7: MemberEvidence()})
    assert out.verdict is Verdict.AMBIGUOUS
    assert [(c.rank, c.confidence) for c in out.candidates] == [(5, 0.7), (6, 0.35), (7, 0.35)]
    assert [(g.verdict, g.candidates, g.tied, g.hardware_separated) for g in out.groups] == [
        (Verdict.LOCALIZED, [5], False, True), (Verdict.AMBIGUOUS, [6, 7], True, False)]
