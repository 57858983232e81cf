"""The SSH runner reads a command's whole output from the real sshd, not just what came before the
exit status.

sshd sends the exit status when it reaps the command, and may still hold output in the pipe.
Stopping at the exit status once cut ``scontrol -o show node`` to 7 of 16 nodes under load, and
the circuit breaker then saw 1 drain as 17 % of the partition. A background child that writes
after its parent exited makes the same order certain, with no load needed.
"""

from __future__ import annotations

from denpex.isolation.ssh import SshRunner, SshSettings


def test_output_written_after_the_command_exited_is_still_read(ssh_settings: SshSettings) -> None:
    late = "echo head; (sleep 0.5; echo tail; echo late-err >&2) & exit 3"
    with SshRunner(ssh_settings) as runner:
        result = runner.run(["sh", "-c", late])
    assert (result.rc, result.stdout, result.stderr) == (3, "head\ntail\n", "late-err\n")


def test_a_large_output_arrives_whole_every_time(ssh_settings: SshSettings) -> None:
    expected = "".join(f"{i}\n" for i in range(1, 100_001))  # 589 kB: many windows, a full pipe
    with SshRunner(ssh_settings) as runner:
        lengths = [len(runner.run(["seq", "1", "100000"]).stdout) for _ in range(5)]
    assert lengths == [len(expected)] * 5


def test_a_child_left_holding_the_output_does_not_hold_the_command(ssh_settings: SshSettings) -> None:
    """The command ended; a background child keeps its stdout open. The output so far and the exit
    status come back a short grace after the status, not at the command timeout."""
    import time

    from denpex.isolation import ssh

    with SshRunner(ssh_settings) as runner:
        started = time.monotonic()
        result = runner.run(["sh", "-c", "echo hi; sleep 60 & exit 0"])
    assert (result.rc, result.stdout) == (0, "hi\n")
    assert time.monotonic() - started < ssh_settings.command_timeout_s + ssh._EOF_GRACE_S
