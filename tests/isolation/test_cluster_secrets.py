"""Issue 30, the red team's critical finding: Prefect's API gave the lab target block's SSH key
to a client with the API's basic-auth string (``include_secrets``), and that key drained a node
with no approval and no Denpex record. With ``DENPEX_CLUSTER_SECRETS`` on the workers, the key
(or a Kubernetes token) is the worker's own file, and a block still carrying one is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from blocks.ssh import DenpexSshCredentials
from blocks.targets import DenpexKubernetesTarget, DenpexSlurmTarget
from denpex.isolation.cluster_secrets import SECRETS_ENV, cluster_secrets_dir
from denpex.isolation.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "runbooks" / "hang-triage.yaml"
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


def _secret(folder: Path, name: str, body: str, mode: int = 0o600) -> Path:
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / name
    path.write_text(body)
    os.chmod(path, mode)
    return path


def _slurm(private_key: str | None) -> DenpexSlurmTarget:
    creds = DenpexSshCredentials(username="root", known_hosts="[127.0.0.1]:2222 ssh-ed25519 AAAA",
                                 private_key=SecretStr(private_key) if private_key else None)
    return DenpexSlurmTarget(cluster_name="Lab East", host="127.0.0.1", port=2222, credentials=creds)


def test_the_worker_keeps_the_ssh_key_and_the_block_only_says_where(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    own = _secret(secrets, "lab-east.ssh-key", KEY)
    settings = _slurm(None).settings(tmp_path / "state", RUNBOOK, {SECRETS_ENV: str(secrets)})
    assert settings.ssh is not None and settings.ssh.key_path == own
    assert settings.ssh.known_hosts.read_text().startswith("[127.0.0.1]:2222")
    assert not (tmp_path / "state" / "keys" / "slurm-lab-east.key").exists()  # no copy from a block


def test_a_block_carrying_a_key_is_refused_where_the_worker_keeps_its_own(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    _secret(secrets, "lab-east.ssh-key", KEY)
    with pytest.raises(ConfigError, match="carries its SSH private key, which Prefect gives to any API client"):
        _slurm(KEY).settings(tmp_path / "state", RUNBOOK, {SECRETS_ENV: str(secrets)})
    assert not (tmp_path / "state" / "keys").exists()


def test_without_the_folder_the_blocks_key_is_used_as_before(tmp_path: Path) -> None:
    settings = _slurm(KEY).settings(tmp_path / "state", RUNBOOK, {})
    assert settings.ssh is not None and settings.ssh.key_path.read_text() == KEY
    assert settings.ssh.key_path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match=f"carries no SSH private key, and this worker sets no {SECRETS_ENV}"):
        _slurm(None).settings(tmp_path / "state", RUNBOOK, {})


@pytest.mark.parametrize("problem, match", [
    ("missing", "no ssh-key for cluster 'lab-east'"),
    ("shared", r"accessible to group or others \(mode 640\); run `chmod 600 .*lab-east\.ssh-key`"),
    ("folder", "not a regular file"),
    ("link", "not a regular file"),
    ("empty", "the ssh-key is empty"),
    ("other owner", r"owned by uid \d+, not by this worker.s user \(4242\)"),
    ("unreadable", "cannot read the ssh-key"),
])
def test_the_workers_key_file_must_be_there_and_its_owners_alone(tmp_path: Path, problem: str, match: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    key = secrets / "lab-east.ssh-key"
    if problem == "shared":
        _secret(secrets, key.name, KEY, mode=0o640)
    elif problem == "folder":
        key.mkdir()
    elif problem == "link":
        key.symlink_to(_secret(tmp_path / "elsewhere", "k", KEY))
    elif problem == "empty":
        _secret(secrets, key.name, " \n")
    elif problem == "other owner":
        _secret(secrets, key.name, KEY)
        monkeypatch.setattr("denpex.isolation.cluster_secrets.os.geteuid", lambda: 4242)
    elif problem == "unreadable":  # as seen by a worker's user that is not root
        _secret(secrets, key.name, KEY)
        monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: (_ for _ in ()).throw(
            PermissionError(13, "Permission denied")))
    with pytest.raises(ConfigError, match=match):
        _slurm(None).settings(tmp_path / "state", RUNBOOK, {SECRETS_ENV: str(secrets)})


def test_the_workers_token_goes_only_to_an_https_server_under_the_workers_ca(tmp_path: Path) -> None:
    """The block's host is the API writer's: with the worker's token, an http:// address of theirs,
    or an https:// one under a CA of their choosing, would receive it (review of the change)."""
    secrets = tmp_path / "secrets"
    _secret(secrets, "k8s-east.kube-token", "tok-from-the-worker\n")
    ca = _secret(secrets, "k8s-east.kube-ca.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    env = {SECRETS_ENV: str(secrets)}
    block = DenpexKubernetesTarget(cluster_name="k8s-east", host="https://10.0.0.1:6443")
    settings = block.settings(tmp_path / "state", RUNBOOK, env)
    assert settings.kubernetes is not None and settings.kubernetes.token is not None
    assert settings.kubernetes.token.get_secret_value() == "tok-from-the-worker"
    assert settings.kubernetes.ca_cert == ca and settings.kubernetes.verify_tls
    with pytest.raises(ConfigError, match="sends its token to an https:// API server only"):
        DenpexKubernetesTarget(cluster_name="k8s-east", host="http://attacker.example:80").settings(
            tmp_path / "state", RUNBOOK, env)
    with pytest.raises(ConfigError, match="names another CA than this worker's k8s-east.kube-ca.pem"):
        DenpexKubernetesTarget(cluster_name="k8s-east", host="https://attacker.example", ca_cert_pem="THEIRS").settings(
            tmp_path / "state", RUNBOOK, env)
    ca.unlink()
    with pytest.raises(ConfigError, match="no kube-ca.pem for cluster 'k8s-east'"):
        block.settings(tmp_path / "state", RUNBOOK, env)
    carrying = DenpexKubernetesTarget(cluster_name="k8s-east", host="https://10.0.0.1:6443", token=SecretStr("t"))
    with pytest.raises(ConfigError, match="carries its API token"):
        carrying.settings(tmp_path / "state", RUNBOOK, env)
    assert carrying.settings(tmp_path / "state", RUNBOOK, {}).kubernetes is not None
    # A cleared field holds no credential.
    cleared = DenpexKubernetesTarget(cluster_name="k8s-east", host="https://10.0.0.1:6443", token=SecretStr(" "))
    with pytest.raises(ConfigError, match="carries no API token"):
        cleared.settings(tmp_path / "state", RUNBOOK, {})


def test_a_key_an_earlier_run_copied_from_the_block_is_removed(tmp_path: Path) -> None:
    _slurm(KEY).settings(tmp_path / "state", RUNBOOK, {})
    copied = tmp_path / "state" / "keys" / "slurm-lab-east.key"
    assert copied.is_file()
    secrets = tmp_path / "secrets"
    _secret(secrets, "lab-east.ssh-key", KEY)
    _slurm(None).settings(tmp_path / "state", RUNBOOK, {SECRETS_ENV: str(secrets)})
    assert not copied.exists()


def test_the_folder_must_be_absolute() -> None:
    assert cluster_secrets_dir({}) is None and cluster_secrets_dir({SECRETS_ENV: " "}) is None
    with pytest.raises(ConfigError, match="must be an absolute folder"):
        cluster_secrets_dir({SECRETS_ENV: "secrets"})


def test_a_later_run_of_an_edited_block_leaves_a_paused_runs_host_pins_alone(tmp_path: Path) -> None:
    """Red team of the change: every run rewrote one known_hosts file per cluster, which a paused
    run reads only when it connects; a run of a block an API writer had edited swapped the pins
    under it. Each set of pins is now a file of its own, named by its content."""
    secrets = tmp_path / "secrets"
    _secret(secrets, "lab-east.ssh-key", KEY)
    env = {SECRETS_ENV: str(secrets)}
    paused = _slurm(None).settings(tmp_path / "state", RUNBOOK, env)
    assert paused.ssh is not None
    pins = paused.ssh.known_hosts.read_text()
    edited = _slurm(None)
    edited.credentials.known_hosts = "[127.0.0.1]:24999 ssh-ed25519 THEIRS"
    later = edited.settings(tmp_path / "state", RUNBOOK, env)
    assert later.ssh is not None and later.ssh.known_hosts != paused.ssh.known_hosts
    assert paused.ssh.known_hosts.read_text() == pins and "THEIRS" not in pins
    again = _slurm(None).settings(tmp_path / "state", RUNBOOK, env)
    assert again.ssh is not None and again.ssh.known_hosts == paused.ssh.known_hosts
