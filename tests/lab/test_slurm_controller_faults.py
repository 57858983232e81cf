"""slurmctld away for a moment: the real ``scontrol``/``squeue`` over real SSH meet a closed port,
a port that never answers, or the real controller behind a proxy that cuts its answer
(``Detoured``), and the run goes on once the controller is back.

Reads are retried with the SSH settings' backoff. A change that never reached the controller
("connect failure") is sent again; one that may have reached it (a socket timeout, zero bytes) is
never sent again before the node's state has been read.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from denpex.isolation.audit import Outcome
from denpex.isolation.errors import TransientRemoteError
from denpex.isolation.ssh import CommandRunner, SshSettings
from lab.rig import Detoured, drained, rig_for, xid79
from testkit.services.slurm import SlurmLab
from testkit.services.tcp_proxy import Fault, FaultProxy

pytestmark = pytest.mark.slow


@contextmanager
def _controller(lab: SlurmLab, fault: str) -> Iterator[int]:
    """The port of a stand-in for slurmctld that fails with ``fault``.

    - ``connect-failure``: nothing listens (a bound socket that never listens refuses at once);
    - ``socket-timeout``: connections are accepted (the kernel's backlog) and never answered;
    - ``answer-lost``: the real slurmctld behind a proxy that cuts the first answer it sends.
    """
    if fault == "answer-lost":
        with FaultProxy(lab.ctld_port, trigger=lambda: True, fault=Fault.CUT) as proxy:
            yield proxy.port
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        if fault == "socket-timeout":
            sock.listen(16)
        yield int(sock.getsockname()[1])


def _reads(argv: Sequence[str]) -> bool:
    return "update" not in argv


def _updates(argv: Sequence[str]) -> bool:
    return "update" in argv


class _Detour:
    """Builds the rig's runner and keeps the ``Detoured`` for the test's checks."""

    def __init__(self, conf: Path, when: Callable[[Sequence[str]], bool], times: int) -> None:
        self.conf, self.when, self.times = conf, when, times
        self.runner: Detoured | None = None

    def __call__(self, inner: CommandRunner) -> CommandRunner:
        self.runner = Detoured(inner, self.conf, self.when, self.times)
        return self.runner

    @property
    def detoured(self) -> list[tuple[str, ...]]:
        return self.runner.detoured if self.runner else []


@pytest.mark.parametrize(("away", "stopped"), [(3, False), (100, True)], ids=["back-in-time", "stays-away"])
def test_reads_while_the_controller_is_away_are_retried(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path, away: int, stopped: bool
) -> None:
    # The lab's backoff allows 4 attempts per command.
    node = "gpu-node-011"
    sent_before = lab.update_rpc_count(node)
    with _controller(lab, "connect-failure") as port:
        detour = _Detour(lab.client_conf("away", port), _reads, times=away)
        with rig_for(lab, ssh_settings, tmp_path, wrap=detour) as rig:
            plan = rig.plan(xid79(node), live_facts=False)
            if not stopped:
                assert rig.execute(plan).nodes[0].outcome is Outcome.APPLIED
            else:
                with pytest.raises(TransientRemoteError) as caught:
                    rig.execute(plan)
    assert len(set(detour.detoured)) == 1  # the same read, again
    if not stopped:
        assert len(detour.detoured) == 3 and drained(lab, node)
        return
    message = str(caught.value)
    assert "slurmctld could not be reached after 4 attempts" in message
    assert "Unable to contact slurm controller (connect failure)" in message
    assert "before changing any node" in message
    assert len(detour.detoured) == 4
    assert not drained(lab, node) and lab.update_rpc_count(node) == sent_before


@pytest.mark.parametrize(
    ("fault", "node", "said"),
    [
        # Never reached slurmctld: sent again at once.
        ("connect-failure", "gpu-node-012", []),
        # May have reached it: the node is read, shows no drain, and only then is it sent again.
        ("socket-timeout", "gpu-node-013",
         ["Socket timed out on send/recv operation", "does not show the change; sending again"]),
        # Reached it, the answer was lost: the node shows the drain, nothing is sent again.
        ("answer-lost", "gpu-node-014",
         ["Zero Bytes were transmitted or received", "shows it took effect, so it was not sent again"]),
    ],
    ids=["connect-failure", "socket-timeout", "answer-lost"],
)
def test_a_drain_the_controller_may_have_missed_is_sent_exactly_once(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path, fault: str, node: str, said: list[str]
) -> None:
    sent_before = lab.update_rpc_count(node)
    with _controller(lab, fault) as port:
        detour = _Detour(lab.client_conf(fault, port), _updates, times=1)
        with rig_for(lab, ssh_settings, tmp_path, wrap=detour) as rig:
            report = rig.execute(rig.plan(xid79(node)))
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED, outcome.message
    assert outcome.rc == (None if fault == "answer-lost" else 0)
    assert all(text in outcome.message for text in said), outcome.message
    assert len(detour.detoured) == 1
    assert drained(lab, node) and lab.update_rpc_count(node) - sent_before == 1
