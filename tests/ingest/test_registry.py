"""Tenants, keys, tokens and the nonce cache over the real SQLite state; the CLI commands."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from denpex.ingest.auth import authenticate_bearer, authenticate_signed
from denpex.ingest.errors import AuthenticationError, ForbiddenError, RegistryError
from denpex.ingest.nonce_cache import NonceCache
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import MASTER_KEY_NAME, Registry
from denpex.ingest.signing import signed_headers
from denpex.state_paths import INGEST_DATABASE

runner = CliRunner()


def _request(registry: Registry, key_id: str, secret: str, *, tenant: str = "acme", cluster: str = "c1",
             nonce: str | None = None, now: float | None = None) -> dict[str, str]:
    return signed_headers(secret=secret.encode(), key_id=key_id, tenant=tenant, cluster=cluster, method="POST",
                          path="/v1/alerts", body=b"{}", nonce=nonce,
                          timestamp=int(now if now is not None else time.time()))


def test_secrets_are_encrypted_at_rest_and_private(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    key = registry.create_key("acme", "c1")
    token = registry.create_token("acme", "c1")
    raw = (tmp_path / INGEST_DATABASE).read_bytes()
    assert key.secret.encode() not in raw and token.token.encode() not in raw
    for name in (INGEST_DATABASE, MASTER_KEY_NAME):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    # A fresh process (a restart) reads the same secret back through the master key.
    assert Registry(tmp_path).signing_key(key.key_id).secret.get_secret_value() == key.secret
    assert key.secret not in repr(Registry(tmp_path).signing_key(key.key_id))


def test_signed_request_checks(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    registry.add_tenant("globex", PlanTier.DATA_CENTER)
    key = registry.create_key("acme", "c1")
    nonces = NonceCache(registry.db)

    def check(headers: dict[str, str], now: float | None = None) -> object:
        return authenticate_signed(registry, nonces, headers, method="POST", path="/v1/alerts", body=b"{}",
                                   now=time.time() if now is None else now)

    caller = check(_request(registry, key.key_id, key.secret, nonce="n1"))
    assert caller.tenant == "acme" and caller.cluster == "c1"  # type: ignore[attr-defined]
    with pytest.raises(AuthenticationError, match="replayed"):
        check(_request(registry, key.key_id, key.secret, nonce="n1"))
    # The replay cache survives a restart: a new registry and cache over the same state.
    with pytest.raises(AuthenticationError, match="replayed"):
        authenticate_signed(Registry(tmp_path), NonceCache(Registry(tmp_path).db),
                            _request(registry, key.key_id, key.secret, nonce="n1"),
                            method="POST", path="/v1/alerts", body=b"{}", now=time.time())
    with pytest.raises(ForbiddenError, match="cannot act for tenant 'globex'"):
        check(_request(registry, key.key_id, key.secret, tenant="globex"))
    with pytest.raises(ForbiddenError, match="cluster 'c2'"):
        check(_request(registry, key.key_id, key.secret, cluster="c2"))
    with pytest.raises(AuthenticationError, match="behind"):
        check(_request(registry, key.key_id, key.secret, now=time.time() - 400))
    with pytest.raises(AuthenticationError, match="unknown key"):
        check(_request(registry, "dk_nope", key.secret))
    registry.revoke_key(key.key_id)
    with pytest.raises(ForbiddenError, match="revoked"):
        check(_request(registry, key.key_id, key.secret))


@pytest.mark.parametrize("plan", [p for p in PlanTier if p is not PlanTier.DATA_CENTER], ids=str)
def test_only_data_center_may_use_hang_triage(tmp_path: Path, plan: PlanTier) -> None:
    registry = Registry(tmp_path)
    registry.add_tenant("small", plan)
    key = registry.create_key("small", "c1")
    token = registry.create_token("small", "c1")
    with pytest.raises(ForbiddenError, match=f"{plan.value} plan"):
        authenticate_signed(registry, NonceCache(registry.db), _request(registry, key.key_id, key.secret,
                            tenant="small"), method="POST", path="/v1/alerts", body=b"{}", now=time.time())
    with pytest.raises(ForbiddenError, match="data-center plan"):
        authenticate_bearer(registry, f"Bearer {token.token}")


def test_bearer_tokens(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    token = registry.create_token("acme", "c1")
    grant = authenticate_bearer(registry, f"Bearer {token.token}")
    assert (grant.tenant, grant.cluster) == ("acme", "c1")
    with pytest.raises(AuthenticationError):
        authenticate_bearer(registry, "Bearer wrong")
    with pytest.raises(AuthenticationError, match="Bearer <token>"):
        authenticate_bearer(registry, f"Basic {token.token}")
    registry.revoke_token(token.token_id)
    with pytest.raises(ForbiddenError, match="revoked"):
        authenticate_bearer(registry, f"Bearer {token.token}")


def test_registry_refusals(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    with pytest.raises(RegistryError, match="unknown tenant"):
        registry.create_key("ghost", "c1")
    with pytest.raises(RegistryError, match="not a valid name"):
        registry.add_tenant("../etc", PlanTier.FREE)


def test_cli_commands(tmp_path: Path) -> None:
    env = {"DENPEX_STATE_DIR": str(tmp_path)}
    result = runner.invoke(app, ["tenants", "add", "acme", "--plan", "data-center"], env=env)
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--cluster", "c1", "--host", "gpu-node-001"],
                           env=env)
    assert result.exit_code == 0, result.output
    issued = json.loads(result.stdout)
    assert set(issued) >= {"key_id", "secret"} and issued["host"] == "gpu-node-001"
    assert Registry(tmp_path).signing_key(issued["key_id"]).host == "gpu-node-001"
    result = runner.invoke(app, ["tokens", "create", "--tenant", "acme", "--cluster", "c1"], env=env)
    assert result.exit_code == 0 and json.loads(result.stdout)["token"].startswith("dpxt_")
    assert runner.invoke(app, ["keys", "revoke", issued["key_id"]], env=env).exit_code == 0
    again = runner.invoke(app, ["keys", "revoke", issued["key_id"]], env=env)
    assert again.exit_code == 2 and "already revoked" in again.output
    bad = runner.invoke(app, ["tenants", "add", "x", "--plan", "platinum"], env=env)
    assert bad.exit_code == 2
    relative = runner.invoke(app, ["tenants", "add", "x", "--plan", "free"], env={"DENPEX_STATE_DIR": "rel"})
    assert relative.exit_code == 2 and "relative" in relative.output
