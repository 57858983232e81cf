"""The Slurm lab itself: a port taken between the lab's check and its daemon's bind.

Each slurmd binds its own port, a moment after the lab found the port free. Anything that takes
one in that moment (another lab's daemons, an outgoing connection's ephemeral port) makes that
slurmd exit at start-up; CI saw it as "slurmd-gpu-node-015 exited during start-up". The lab picks
its ports below the kernel's ephemeral range and starts again on fresh ports when a bind fails.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.services.net import free_port, listener_port_range
from testkit.services.slurm import LabError, SlurmLab

pytestmark = pytest.mark.slow


@pytest.fixture
def lab_root() -> Iterator[Path]:
    # As the session's lab: munged needs execute-for-all above its socket and a short path.
    root = Path(tempfile.mkdtemp(prefix="denpex-lab-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_server_ports_stay_out_of_the_ephemeral_range() -> None:
    low, high = listener_port_range()
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert high <= ephemeral_low and high - low >= 2000
    assert all(low <= free_port() < high for _ in range(20))


def test_a_slurmd_port_taken_before_its_bind_restarts_the_lab_on_fresh_ports(lab_root: Path) -> None:
    lab = SlurmLab(lab_root, node_count=3)
    write_conf = lab._write_slurm_conf
    squatters: list[socket.socket] = []
    first_ports: list[int] = []

    def take_a_node_port_after_the_check() -> None:
        write_conf()
        if not squatters:  # only the first attempt's block: the retry must get a fresh one
            first_ports.append(lab.ctld_port)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("0.0.0.0", lab.ctld_port + 3))  # the second node's slurmd port
            sock.listen(1)
            squatters.append(sock)

    lab._write_slurm_conf = take_a_node_port_after_the_check  # type: ignore[method-assign]
    try:
        lab.start()
        assert lab.ctld_port != first_ports[0]
        assert set(lab.states().values()) == {"IDLE"}
        clash = lab.root / "log" / "port-clash-1"
        assert "Address already in use" in (clash / "slurmd-gpu-node-002.log").read_text()
        assert "Address already in use" not in (lab.root / "log" / "slurmd-gpu-node-002.log").read_text()
    finally:
        lab.stop()
        for sock in squatters:
            sock.close()


def test_a_start_up_failure_that_is_not_a_port_clash_is_not_retried(lab_root: Path) -> None:
    lab = SlurmLab(lab_root, node_count=2)
    write_conf = lab._write_slurm_conf
    attempts: list[int] = []

    def broken_conf() -> None:
        write_conf()
        attempts.append(lab.ctld_port)
        lab.slurm_conf.write_text(lab.slurm_conf.read_text().replace("CPUs=8", "CPUs=nonsense"))

    lab._write_slurm_conf = broken_conf  # type: ignore[method-assign]
    try:
        with pytest.raises(LabError, match="exited during start-up"):
            lab.start()
        assert len(attempts) == 1
    finally:
        lab.stop()
