"""Isolation settings: a file, overridden value by value from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.isolation.config import IsolationSettings, KubernetesSettings, load_settings, where_commands_go
from denpex.isolation.ssh import SshSettings
from denpex.isolation.errors import ConfigError


def test_file_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("ssh:\n  host: login1\n  key_path: /k\n  known_hosts: /kh\nstate_dir: /var/lib/x\n")
    settings = load_settings(path, {"DENPEX_SSH_PORT": "2222", "DENPEX_EVIDENCE_STORE": "s3://b/p"})
    assert settings.ssh is not None
    assert (settings.ssh.host, settings.ssh.port, settings.ssh.username) == ("login1", 2222, "root")
    assert settings.state_dir == Path("/var/lib/x") and settings.evidence_store == "s3://b/p"


def test_state_lives_in_one_absolute_state_dir(tmp_path: Path) -> None:
    from denpex.isolation.operator import load_operator_config

    operator = load_operator_config(load_settings(None, {}), {"DENPEX_STATE_DIR": str(tmp_path)})
    assert operator.audit_path == tmp_path / "audit.jsonl" and operator.breaker_path == tmp_path / "breaker.json"
    with pytest.raises(ConfigError, match="'state' is relative"):
        load_operator_config(load_settings(None, {}), {"DENPEX_STATE_DIR": "state"})
    path = tmp_path / "s.yaml"
    path.write_text("state_dir: here\n")
    with pytest.raises(ConfigError, match="'here' is relative"):
        load_operator_config(load_settings(path, {}), {})
    # The old per-file paths are gone: a breaker or log outside the state directory is refused.
    path.write_text("audit_log: denpex-audit.jsonl\n")
    with pytest.raises(ConfigError, match="audit_log: Extra inputs"):
        load_settings(path, {})


def test_environment_alone_and_secrets_are_redacted() -> None:
    settings = load_settings(None, {"DENPEX_KUBE_HOST": "https://10.0.0.1:6443", "DENPEX_KUBE_TOKEN": "s3cret"})
    assert settings.kubernetes is not None and settings.ssh is None
    assert "s3cret" not in repr(settings)


@pytest.mark.parametrize(
    ("text", "env", "needle"),
    [
        pytest.param("ssh:\n  host: h\n", {}, "ssh.key_path", id="missing-fields"),
        pytest.param("sssh: {}\n", {}, "sssh", id="typo"),
        pytest.param("- a\n", {}, "must be a mapping", id="not-a-mapping"),
        pytest.param("ssh: {host: h, key_path: /k, known_hosts: /kh}\n", {"DENPEX_SSH_PORT": "x"}, "ssh.port",
                     id="bad-env-value"),
    ],
)
def test_invalid_settings_name_the_field(tmp_path: Path, text: str, env: dict[str, str], needle: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_settings(path, env)


@pytest.mark.parametrize("which", ["runbook", "trusted_approvers"])
def test_a_runbook_or_approvers_file_others_can_write_is_not_trusted(tmp_path: Path, which: str) -> None:
    """Execution trusts only files the operator owns: one that group or others may write is a policy
    (or an approver key) anyone on the machine can substitute."""
    from denpex.isolation.operator import load_operator_config
    from denpex.isolation.policy import IsolationPolicy
    from isolation.trust import APPROVERS_FILE, write_runbook

    runbook = write_runbook(tmp_path / "runbook.yaml", IsolationPolicy())
    approvers = tmp_path / "approvers.yaml"
    approvers.write_text(APPROVERS_FILE.read_text())
    settings = tmp_path / "s.yaml"
    settings.write_text(f"runbook: {runbook}\ntrusted_approvers: {approvers}\nstate_dir: {tmp_path / 'state'}\n")
    assert load_operator_config(load_settings(settings, {}), {}).trusted.names() == ["alice", "bob"]
    target = runbook if which == "runbook" else approvers
    target.chmod(0o666)
    with pytest.raises(ConfigError, match=f"{target}: group or others may write it"):
        load_operator_config(load_settings(settings, {}), {})


def test_the_approver_is_told_where_the_commands_go(tmp_path: Path) -> None:
    ssh = SshSettings(host="fe80::5", port=2222, username="denpex", key_path=tmp_path / "k",
                      known_hosts=tmp_path / "kh")
    assert where_commands_go(IsolationSettings(ssh=ssh)) == "Slurm commands over SSH to denpex@[fe80::5]:2222"
    assert where_commands_go(IsolationSettings(kubernetes=KubernetesSettings(host="https://10.0.0.9:6443"))) == \
        "the Kubernetes API at https://10.0.0.9:6443"
    assert where_commands_go(IsolationSettings(kubernetes=KubernetesSettings(context="prod"))) == \
        "the Kubernetes API of the worker's kubeconfig, context prod"
    assert where_commands_go(IsolationSettings()) == ""
