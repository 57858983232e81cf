"""The isolation rig over the real-services lab (``slurm_lab``, ``lab`` and ``ssh_settings`` come
from tests/plugins/services.py, once per session for every folder that uses them).

Nothing is installed at test time: ``scripts/install_system_deps.sh`` (run by ``make test``)
installs the Debian packages. Every daemon is stopped at teardown, jobs first, even when tests
fail; the lab folder is removed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.isolation.ssh import SshSettings
from lab.rig import Rig, rig_for
from testkit.services.slurm import SlurmLab


@pytest.fixture
def rig(lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path) -> Iterator[Rig]:
    with rig_for(lab, ssh_settings, tmp_path) as ready:
        yield ready
