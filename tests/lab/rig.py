"""What the lab isolation tests share: an executor wired to the real cluster, and probes of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from denpex.analysis.models import TriageResult, Verdict
from denpex.isolation.approval import Approval
from denpex.isolation.audit import AuditLog, load_or_create_audit_key
from denpex.isolation.breaker import CircuitBreaker
from denpex.isolation.run import ExecutionReport, RunMode, execute
from denpex.isolation.operator import OperatorConfig
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import IsolationPolicy, Scheduler
from denpex.isolation.slurm import SlurmAdapter
from denpex.isolation.ssh import CommandResult, CommandRunner, SshRunner, SshSettings
from isolation.triage_cases import candidate, killed_process, signal
from isolation.trust import operator_for, signed
from testkit.services.slurm import SlurmLab
from testkit.services.tcp_proxy import FaultProxy

__all__ = ["INCIDENT", "CLUSTER", "Rig", "Hooked", "Detoured", "rig_for", "xid79", "xid79_on", "drained", "drained_nodes",
           "reason_of", "proxied"]

INCIDENT = "inc-lab"
CLUSTER = "lab"
"""The lab's Slurm ``ClusterName``."""


def xid79(node: str, *, age: timedelta = timedelta(minutes=2), as_of: datetime | None = None) -> TriageResult:
    """Rank 1's process was killed and its GPU logged Xid 79 (fallen off the bus)."""
    as_of = as_of or utc_now()
    return killed_process(hardware=[signal(79, host=node, age=age, as_of=as_of)], host=node, as_of=as_of)


def xid79_on(nodes: Sequence[str]) -> TriageResult:
    """Ranks 1, 2, ... were killed, one per node, each node's GPU logging Xid 79."""
    as_of = utc_now()
    ranks = range(1, len(nodes) + 1)
    return TriageResult(
        verdict=Verdict.INCOMPLETE, world_size=len(nodes) + 1, ranks_with_evidence=[0],
        missing_ranks=list(ranks), as_of=as_of,
        candidates=[candidate(r, host=n, hardware=[signal(79, host=n, age=timedelta(minutes=2), as_of=as_of)])
                    for r, n in zip(ranks, nodes, strict=True)],
    )


def drained(lab: SlurmLab, node: str) -> bool:
    return "DRAIN" in lab.state_of(node).split("+")


def drained_nodes(lab: SlurmLab) -> set[str]:
    # Compare drain flags, not whole states: a node resumed by an earlier test may still turn
    # from IDLE+NOT_RESPONDING to IDLE while a test runs.
    return {n for n, state in lab.states().items() if "DRAIN" in state.split("+")}


def reason_of(lab: SlurmLab, node: str) -> str:
    line = lab.node_line(node)
    return line.split(" Reason=", 1)[1].strip() if " Reason=" in line else ""


class Hooked:
    """A ``CommandRunner`` that runs ``hook`` once, right before the first command ``when`` picks.

    It stands for the rest of the world acting at that instant: a person draining a node, or a
    second ``denpex isolate`` started by someone else.
    """

    def __init__(self, inner: CommandRunner, when: Callable[[Sequence[str]], bool],
                 hook: Callable[[], None]) -> None:
        self.inner = inner
        self.when = when
        self.hook: Callable[[], None] | None = hook

    def run(self, argv: Sequence[str], *, changes_state: bool = False) -> CommandResult:
        if self.hook is not None and self.when(argv):
            hook, self.hook = self.hook, None
            hook()
        return self.inner.run(argv, changes_state=changes_state)


class Detoured:
    """A ``CommandRunner`` that sends the next ``times`` commands ``when`` picks to another
    slurm.conf (``env SLURM_CONF=...``, see ``SlurmLab.client_conf``).

    The real client then meets a controller that is away for a moment; the rest of the run talks
    to the real one. ``detoured`` lists the commands that were sent away.
    """

    def __init__(self, inner: CommandRunner, conf: Path, when: Callable[[Sequence[str]], bool],
                 times: int) -> None:
        self.inner = inner
        self.conf = conf
        self.when = when
        self.left = times
        self.detoured: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, changes_state: bool = False) -> CommandResult:
        if self.left > 0 and self.when(argv):
            self.left -= 1
            self.detoured.append(tuple(argv))
            argv = ["env", f"SLURM_CONF={self.conf}", *argv]
        return self.inner.run(argv, changes_state=changes_state)


@dataclass
class Rig:
    """One test's operator and adapter, wired to the real cluster through real SSH; the state
    directory is the test's own folder."""

    lab: SlurmLab
    adapter: SlurmAdapter
    state_dir: Path
    audit: AuditLog
    breaker: CircuitBreaker
    store: Path

    def plan(self, result: TriageResult, *, policy: IsolationPolicy = IsolationPolicy(),
             live_facts: bool = True, job_id: str | None = None) -> IsolationPlan:
        facts = self.adapter.cluster_facts() if live_facts else None
        return plan_isolation(result, None, policy, facts, Scheduler.SLURM, INCIDENT,
                              result.as_of or utc_now(), breaker=self.breaker.state(), cluster=CLUSTER,
                              job_id=job_id)

    def operator(self, policy: IsolationPolicy = IsolationPolicy()) -> OperatorConfig:
        return operator_for(self.state_dir, policy, evidence_store=str(self.store))

    def execute(self, plan: IsolationPlan, *, operation: Operation = Operation.ISOLATE,
                approval: Approval | None = None, policy: IsolationPolicy | None = None,
                adapter: SlurmAdapter | None = None) -> ExecutionReport:
        """Execute through ``execute``, as an operator whose runbook is ``policy`` (default:
        the plan's), with alice's signed approval unless ``approval`` is given."""
        approval = approval or signed(plan, operation=operation)
        return execute(plan, approval, operator=self.operator(policy or plan.policy),
                       adapter=adapter or self.adapter, mode=RunMode.EXECUTE, operation=operation)

    def dry_run(self, plan: IsolationPlan, *, policy: IsolationPolicy | None = None) -> ExecutionReport:
        return execute(plan, None, operator=self.operator(policy or plan.policy), adapter=self.adapter,
                       mode=RunMode.DRY_RUN)


@contextmanager
def rig_for(lab: SlurmLab, settings: SshSettings, folder: Path,
            wrap: Callable[[CommandRunner], CommandRunner] | None = None) -> Iterator[Rig]:
    """A rig on ``folder`` (audit log, breaker, store); ``wrap`` may interpose on its commands."""
    with SshRunner(settings) as runner:
        adapter = SlurmAdapter(wrap(runner) if wrap else runner, backoff=settings.backoff, actor=settings.username)
        folder.mkdir(parents=True, exist_ok=True)
        audit = AuditLog(folder / "audit.jsonl", key=load_or_create_audit_key(folder / "audit.key"))
        breaker = CircuitBreaker(folder / "breaker.json")
        yield Rig(lab, adapter, folder, audit, breaker, folder / "store")


def proxied(settings: SshSettings, lab: SlurmLab, proxy: FaultProxy, folder: Path) -> SshSettings:
    known = folder / "known_hosts_proxy"
    known.write_text(lab.known_hosts_line(proxy.port))
    return settings.model_copy(update={"port": proxy.port, "known_hosts": known})
