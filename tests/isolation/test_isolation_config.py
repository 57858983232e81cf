"""Isolation settings: a file, overridden value by value from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.isolation.config import load_settings
from denpex.isolation.errors import ConfigError


def test_file_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("ssh:\n  host: login1\n  key_path: /k\n  known_hosts: /kh\naudit_log: /var/a.jsonl\n")
    settings = load_settings(path, {"DENPEX_SSH_PORT": "2222", "DENPEX_EVIDENCE_STORE": "s3://b/p"})
    assert settings.ssh is not None
    assert (settings.ssh.host, settings.ssh.port, settings.ssh.username) == ("login1", 2222, "root")
    assert settings.audit_log == Path("/var/a.jsonl") and settings.evidence_store == "s3://b/p"


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
