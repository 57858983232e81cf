"""The real-services lab: munged, slurmctld, 16 slurmd and sshd on loopback, once per session.

Nothing is installed at test time: ``scripts/install_system_deps.sh`` (run by ``make test``)
installs the Debian packages. Every daemon is stopped at teardown, jobs first, even when tests
fail; the lab folder is removed afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.isolation.ssh import Backoff, SshSettings
from lab.rig import Rig, rig_for
from testkit.services.slurm import SlurmLab


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[SlurmLab]:
    # Not pytest's tmp_path: munged needs execute-for-all on every folder above its socket, and
    # the socket path must stay short.
    root = Path(tempfile.mkdtemp(prefix="denpex-lab-"))
    lab = SlurmLab(root)
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def lab(slurm_lab: SlurmLab) -> SlurmLab:
    """The session's lab with no jobs, no drains and no features left by an earlier test."""
    slurm_lab.reset_nodes()
    return slurm_lab


@pytest.fixture
def ssh_settings(lab: SlurmLab) -> SshSettings:
    return SshSettings(
        host="127.0.0.1", port=lab.ssh_port, username="root", key_path=lab.client_key,
        known_hosts=lab.known_hosts, connect_timeout_s=5, command_timeout_s=20,
        backoff=Backoff(attempts=4, initial_s=0.05, max_s=0.2),
    )


@pytest.fixture
def rig(lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path) -> Iterator[Rig]:
    with rig_for(lab, ssh_settings, tmp_path) as ready:
        yield ready
