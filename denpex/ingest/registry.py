"""Tenants, their plans, signing keys and Alertmanager bearer tokens, over the state database.

- A key belongs to exactly one tenant and one cluster, and, for a node agent, to one host: only
  telemetry sent with a host-bound key for that host can support a drain.
- The server must verify HMACs, so it keeps key secrets, encrypted at rest (Fernet) with a master
  key in ``$DENPEX_STATE_DIR/ingest-master.key`` (mode 0600, as is the database).
- Bearer tokens are stored as SHA-256 hashes only; a token is printed once, when it is created.
- Keys rotate by creating a new one and revoking the old one; a revoked key is refused (403).
- A cluster belongs to exactly one tenant: the first key or token for it (or ``denpex clusters
  add``) claims it, and a name another tenant holds, or one that makes the same block name as a
  held one (``gpu.prod``, ``GPU_Prod``), is refused. ``denpex.tenancy`` reads the claims.
- A registry from before ownership is migrated when it is opened: each cluster named by active
  keys and tokens of one tenant under one spelling is claimed for it; one named by several
  (tenants or spellings) is marked contested, and nothing acts on it until the operator revokes
  the others' keys and tokens (the next open then claims it for the one left).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from pydantic import BaseModel, ConfigDict, SecretStr

from denpex.ingest.database import Database
from denpex.ingest.errors import AuthenticationError, ForbiddenError, RegistryError
from denpex.ingest.plans import PlanTier
from denpex.tenancy import cluster_slug

__all__ = ["MASTER_KEY_NAME", "SigningKey", "IssuedKey", "IssuedToken", "TokenGrant", "ClusterRecord", "Registry",
           "check_name"]

MASTER_KEY_NAME = "ingest-master.key"
# Tenant, cluster and host names end up in storage keys and signed strings: keep them plain.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class SigningKey(BaseModel):
    """A key as the server uses it to verify a request."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    tenant: str
    cluster: str
    host: str | None
    secret: SecretStr
    revoked: bool


class IssuedKey(BaseModel):
    """What ``denpex keys create`` prints once: the id and the secret."""

    key_id: str
    secret: str
    tenant: str
    cluster: str
    host: str | None = None


class IssuedToken(BaseModel):
    """What ``denpex tokens create`` prints once: the bearer token (only its hash is kept)."""

    token_id: str
    token: str
    tenant: str
    cluster: str


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """Who a valid bearer token speaks for."""

    token_id: str
    tenant: str
    cluster: str


class ClusterRecord(BaseModel):
    """A cluster as the registry holds it; ``tenant`` is None while it is contested."""

    model_config = ConfigDict(frozen=True)

    cluster: str
    block_name: str
    tenant: str | None
    contested_by: str | None = None


def check_name(kind: str, value: str) -> str:
    """A tenant, cluster or host name: 1-63 of ``A-Za-z0-9._-``, starting with a letter or digit."""
    if not _NAME.fullmatch(value):
        raise RegistryError(f"{kind} {value!r} is not a valid name: use 1-63 of A-Za-z0-9._-, "
                            "starting with a letter or digit")
    return value


class Registry:
    """Tenants, keys and tokens in ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self.db = Database(state_dir)
        self._fernet = Fernet(_master_key(state_dir / MASTER_KEY_NAME))
        self._claim_existing()

    # -- tenants -------------------------------------------------------------------------------

    def add_tenant(self, tenant: str, plan: PlanTier) -> None:
        """Add a tenant, or change the plan of an existing one."""
        check_name("tenant", tenant)
        with self.db.connect() as db:
            db.execute("INSERT INTO tenants (name, plan, created_at) VALUES (?, ?, ?) "
                       "ON CONFLICT(name) DO UPDATE SET plan = excluded.plan",
                       (tenant, plan.value, time.time()))

    def plan_of(self, tenant: str) -> PlanTier | None:
        """The tenant's plan, or None for an unknown tenant."""
        with self.db.connect() as db:
            row = db.execute("SELECT plan FROM tenants WHERE name = ?", (tenant,)).fetchone()
        return PlanTier(row[0]) if row else None

    # -- clusters ------------------------------------------------------------------------------

    def add_cluster(self, tenant: str, cluster: str) -> ClusterRecord:
        """Claim ``cluster`` for ``tenant`` (a no-op when it holds it already)."""
        check_name("cluster", cluster)
        self._known_tenant(tenant)
        with self.db.connect() as db:
            _claim(db, tenant, cluster)
        return ClusterRecord(cluster=cluster, block_name=cluster_slug(cluster), tenant=tenant)

    def clusters(self) -> list[ClusterRecord]:
        """Every registered cluster, by name."""
        with self.db.connect() as db:
            rows = db.execute("SELECT name, slug, tenant, contested_by FROM clusters ORDER BY name").fetchall()
        return [ClusterRecord(cluster=r[0], block_name=r[1], tenant=r[2], contested_by=r[3]) for r in rows]

    def _claim_existing(self) -> None:
        """Claim the clusters that active keys and tokens name but no row holds yet (module docstring)."""
        with self.db.connect() as db:
            named = db.execute("SELECT cluster, tenant FROM keys WHERE revoked_at IS NULL UNION "
                               "SELECT cluster, tenant FROM tokens WHERE revoked_at IS NULL").fetchall()
            owned = {row[0] for row in db.execute("SELECT slug FROM clusters WHERE tenant IS NOT NULL")}
            by_slug: dict[str, set[tuple[str, str]]] = {}
            for cluster, tenant in named:
                if cluster_slug(cluster) not in owned:
                    by_slug.setdefault(cluster_slug(cluster), set()).add((cluster, tenant))
            for slug, claims in by_slug.items():
                names = sorted({c for c, _ in claims})
                tenants = sorted({t for _, t in claims})
                single = len(names) == 1 and len(tenants) == 1
                contested = None if single else (f"names {', '.join(map(repr, names))} used by tenants "
                                                 f"{', '.join(map(repr, tenants))}")
                db.execute("INSERT INTO clusters (slug, name, tenant, contested_by, claimed_at) VALUES (?, ?, ?, ?, ?) "
                           "ON CONFLICT(slug) DO UPDATE SET name = excluded.name, tenant = excluded.tenant, "
                           "contested_by = excluded.contested_by",
                           (slug, names[0], tenants[0] if single else None, contested, time.time()))

    def _known_tenant(self, tenant: str) -> None:
        if self.plan_of(tenant) is None:
            raise RegistryError(f"unknown tenant {tenant!r}; add it first with `denpex tenants add`")

    # -- signing keys --------------------------------------------------------------------------

    def create_key(self, tenant: str, cluster: str, host: str | None = None) -> IssuedKey:
        """A new key for one tenant and cluster (and host, for a node agent)."""
        check_name("cluster", cluster)
        if host is not None:
            check_name("host", host)
        self._known_tenant(tenant)
        key_id = "dk_" + secrets.token_hex(8)
        secret = secrets.token_hex(32)
        with self.db.connect() as db:
            _claim(db, tenant, cluster)
            db.execute("INSERT INTO keys (key_id, tenant, cluster, host, secret_encrypted, created_at) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (key_id, tenant, cluster, host, self._fernet.encrypt(secret.encode()), time.time()))
        return IssuedKey(key_id=key_id, secret=secret, tenant=tenant, cluster=cluster, host=host)

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key; requests signed with it are refused from now on."""
        with self.db.connect() as db:
            changed = db.execute("UPDATE keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                                 (time.time(), key_id)).rowcount
            known = db.execute("SELECT 1 FROM keys WHERE key_id = ?", (key_id,)).fetchone()
        if not known:
            raise RegistryError(f"no key {key_id!r}")
        if not changed:
            raise RegistryError(f"key {key_id!r} is already revoked")

    def signing_key(self, key_id: str) -> SigningKey:
        """The key with its decrypted secret; an unknown key is an authentication failure."""
        with self.db.connect() as db:
            row = db.execute("SELECT tenant, cluster, host, secret_encrypted, revoked_at FROM keys "
                             "WHERE key_id = ?", (key_id,)).fetchone()
        if row is None:
            raise AuthenticationError(f"unknown key id {key_id!r}")
        try:
            secret = self._fernet.decrypt(row[3]).decode()
        except InvalidToken as exc:
            raise AuthenticationError(f"key {key_id!r} cannot be decrypted with this server's master "
                                      "key; it was made by another installation") from exc
        return SigningKey(key_id=key_id, tenant=row[0], cluster=row[1], host=row[2],
                          secret=SecretStr(secret), revoked=row[4] is not None)

    # -- bearer tokens -------------------------------------------------------------------------

    def create_token(self, tenant: str, cluster: str) -> IssuedToken:
        """A new bearer token bound to one tenant and cluster; only its hash is stored."""
        check_name("cluster", cluster)
        self._known_tenant(tenant)
        token = "dpxt_" + secrets.token_urlsafe(32)
        token_id = "dt_" + secrets.token_hex(8)
        with self.db.connect() as db:
            _claim(db, tenant, cluster)
            db.execute("INSERT INTO tokens (token_sha256, token_id, tenant, cluster, created_at) "
                       "VALUES (?, ?, ?, ?, ?)", (_token_hash(token), token_id, tenant, cluster, time.time()))
        return IssuedToken(token_id=token_id, token=token, tenant=tenant, cluster=cluster)

    def revoke_token(self, token_id: str) -> None:
        """Revoke a bearer token by its id."""
        with self.db.connect() as db:
            changed = db.execute("UPDATE tokens SET revoked_at = ? WHERE token_id = ? AND revoked_at IS NULL",
                                 (time.time(), token_id)).rowcount
        if not changed:
            raise RegistryError(f"no active token {token_id!r}")

    def grant_for_token(self, token: str) -> TokenGrant:
        """Who the token speaks for; unknown (401) or revoked (403) tokens are refused."""
        # The lookup is by hash: the stored value is never compared with the secret itself.
        with self.db.connect() as db:
            row = db.execute("SELECT token_id, tenant, cluster, revoked_at FROM tokens WHERE token_sha256 = ?",
                             (_token_hash(token),)).fetchone()
        if row is None:
            raise AuthenticationError("unknown bearer token")
        if row[3] is not None:
            raise ForbiddenError(f"bearer token {row[0]} was revoked; create a new one with `denpex tokens create`")
        return TokenGrant(token_id=row[0], tenant=row[1], cluster=row[2])


def _claim(db: sqlite3.Connection, tenant: str, cluster: str) -> None:
    """Claim ``cluster`` for ``tenant`` inside the caller's transaction; refuse a taken or colliding name."""
    slug = cluster_slug(cluster)
    row = db.execute("SELECT name, tenant, contested_by FROM clusters WHERE slug = ?", (slug,)).fetchone()
    if row is None:
        db.execute("INSERT INTO clusters (slug, name, tenant, claimed_at) VALUES (?, ?, ?, ?)",
                   (slug, cluster, tenant, time.time()))
        return
    name, owner, contested_by = row
    same = "is" if name == cluster else f"makes the same block name {slug!r} as cluster {name!r}, which is"
    if owner is None:
        raise RegistryError(f"cluster {cluster!r} {same} contested ({contested_by}); revoke all but one "
                            "tenant's keys and tokens for it first")
    if owner != tenant:
        raise RegistryError(f"cluster {cluster!r} {same} registered to tenant {owner!r}; a cluster belongs "
                            "to one tenant: choose another cluster name")
    if name != cluster:
        raise RegistryError(f"cluster {cluster!r} {same} already registered to tenant {tenant!r}; "
                            f"use the name {name!r}")


def _token_hash(token: str) -> str:
    # Tokens carry 256 random bits, so a plain hash cannot be brute-forced; no salt is needed.
    return hashlib.sha256(token.encode()).hexdigest()


def _master_key(path: Path) -> bytes:
    """Read the master key, creating it (mode 0600, exclusively) on first use."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    key = Fernet.generate_key()
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
        fh.flush()
        os.fsync(fh.fileno())
    return key
