"""A job's layout, registered by its collectors when it starts: ``POST /v1/jobs/{job_id}/ranks``.

A rank that dies without a dump (its GPU fell off the bus, the host OOM-killed it) never uploads,
so the incident's manifest could not say where it ran; its collector registered it at start.
The body is a manifest fragment (docs/contracts.md's Manifest, without ``job_id``)::

    {"world_size": 4,
     "ranks": {"1": {"host": "gpu-node-002", "local_rank": 0, "pid": 4242,
                     "gpu_uuid": "GPU-...", "gpu_pci_bus_id": "0000:3b:00.0"}},
     "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}}

Rules (each refusal stores nothing):

- bound to the key's tenant and cluster: the job id in the path names a job *of that cluster*;
  another tenant's job of the same name is another row, never touched (403 comes from the headers);
- a host-bound key (a node agent's) registers its own host's ranks only (403), as for uploads;
  a rank without a host takes the key's host;
- a rank registered on another host before is recorded as **moved** (a restart): the new host is
  its placement from now on, the move is kept with its time and answered, and an incident opened
  before the move keeps the placement it had (:meth:`JobRegistry.placement_at`);
- the identity a registration replaces (any restart) is kept only when an incident of the job was
  opened while it was current: that incident needs the process that died, and no other reader
  asks for it. At most HISTORY_PER_RANK are kept per rank, so a job holds at most that many times
  its ranks, however often it restarts (six restarts of 16,384 ranks once left 81,920 rows, and the
  rate limit allowed about 24 million a day per cluster, all kept for a week);
- a registration whose world size or process groups differ from the job's replaces them (an
  elastic restart) when a job's key sends it; ranks outside the new world size are not listed, and
  an incident opened before the change keeps the world size and groups it had. A host-bound key
  (one node's agent) may not change them (403): it would hide every other node's ranks from the
  incidents, its own faulty node's blame among them. It may send the same ones, or none;
- at most ``max_per_window`` registrations per cluster per window (429 with ``Retry-After``).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from denpex.evidence.loading import validation_problems
from denpex.evidence.manifest import MAX_WORLD_SIZE, HostMove, HostName, PlainText, ProcessGroupSpec
from denpex.ingest.auth import Caller
from denpex.ingest.database import Database
from denpex.ingest.errors import ForbiddenError, InvalidRequestError, RateLimitedError

__all__ = ["RegisteredRank", "Registration", "RegistrationReceipt", "RegisteredLayout", "JobRegistry",
           "parse_registration", "MAX_REGISTRATION_BYTES", "MAX_PROCESS_GROUPS", "MAX_GROUP_MEMBERS",
           "REGISTRATION_RETENTION_S", "PRUNE_EVERY_S", "HISTORY_PER_RANK"]

MAX_REGISTRATION_BYTES = 8 * 1024 * 1024
"""A registration body's cap: a whole 16,384-rank manifest fits; a collector sends one rank."""
MAX_RANKS_PER_REGISTRATION = 16_384
"""More ranks than this go in several requests (each one is one write transaction)."""
MOVES_SHOWN = 16
"""The newest moves kept and listed per rank (a rank restarted a hundred times lists its last 16)."""
HISTORY_PER_RANK = 16
"""Replaced identities kept per rank, newest first: a job keeps at most this many times its ranks."""
MAX_PROCESS_GROUPS = 8_192
"""Process groups per registration (a 16,384-rank job's TP, PP and DP groups number a few thousand)."""
MAX_GROUP_MEMBERS = 262_144
"""Members of all process groups of one registration, together: 16 per rank of the largest world."""
REGISTRATION_RETENTION_S = 30 * 86_400.0
"""A job not registered for this long is forgotten (its ranks, moves and layout changes too)."""
PRUNE_EVERY_S = 3_600.0
"""How often a registration also prunes what passed the retention (opportunistic, no thread)."""
MAX_ERROR_CHARS = 500


class RegisteredRank(BaseModel):
    """One rank as its collector registers it. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: HostName | None = None
    local_rank: int | None = Field(default=None, ge=0)
    pid: int | None = Field(default=None, ge=0)
    gpu_uuid: PlainText | None = None
    gpu_pci_bus_id: PlainText | None = None
    gpu_index: int | None = Field(default=None, ge=0)


class Registration(BaseModel):
    """A registration body (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world_size: int = Field(gt=0, le=MAX_WORLD_SIZE)
    ranks: dict[int, RegisteredRank] = Field(min_length=1, max_length=MAX_RANKS_PER_REGISTRATION)
    process_groups: dict[PlainText, ProcessGroupSpec] = Field(default_factory=dict, max_length=MAX_PROCESS_GROUPS)

    @property
    def entries(self) -> int:
        """What this registration stores, counted against the cluster's budget: ranks and group members."""
        return len(self.ranks) + sum(len(pg.ranks) for pg in self.process_groups.values())

    @model_validator(mode="after")
    def _ranks_in_world(self) -> "Registration":
        members = self.entries - len(self.ranks)
        if members > MAX_GROUP_MEMBERS:
            raise ValueError(f"{members:,} process group members; a registration carries at most "
                             f"{MAX_GROUP_MEMBERS:,} process group members")
        outside = [r for r in self.ranks if not 0 <= r < self.world_size]
        outside += [r for pg in self.process_groups.values() for r in pg.ranks if r >= self.world_size]
        if outside:
            raise ValueError(f"rank(s) {sorted(set(outside))[:8]} outside world_size {self.world_size}")
        return self


class RegistrationReceipt(BaseModel):
    """The answer: how many ranks were new or changed, and the moves this registration recorded."""

    job_id: str
    registered: int
    unchanged: int
    moved: list[dict[str, object]]
    """``{"rank", "from_host", "to_host", "at"}`` per rank that re-registered from another host."""
    _layout_changed: bool = PrivateAttr(default=False)
    """The job's world size or process groups changed (its open incidents' manifests take that)."""

    @property
    def changed(self) -> bool:
        """Anything an incident's manifest shows changed: a rank, or the job's world size or groups."""
        return self.registered > 0 or self._layout_changed


class RegisteredLayout(BaseModel):
    """A job's registered layout as an incident takes it (:meth:`JobRegistry.placement_at`)."""

    world_size: int
    ranks: dict[int, RegisteredRank]
    moves: dict[int, list[HostMove]]
    process_groups: dict[str, ProcessGroupSpec]


def parse_registration(data: bytes) -> Registration:
    """Validate a registration body; every problem is named in one 422."""
    try:
        return Registration.model_validate_json(data)
    except ValidationError as exc:
        problems = validation_problems(exc, first=10)
        if len(problems) > MAX_ERROR_CHARS:
            problems = problems[:MAX_ERROR_CHARS] + "..."
        raise InvalidRequestError(f"invalid registration: {problems}") from exc


class JobRegistry:
    """Registered layouts in the state database, per tenant, cluster and job."""

    def __init__(self, db: Database, *, max_per_window: int = 20_000, max_ranks_per_window: int = 1_000_000,
                 window_s: float = 3600.0, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self.max_per_window = max_per_window
        self.max_ranks_per_window = max_ranks_per_window
        """Rank entries one cluster may register per window: requests are counted, and so is their
        size, or one key could write a million rows per request all hour long."""
        self.window_s = window_s
        self._clock = clock
        self._pruned_at = float("-inf")

    def register(self, caller: Caller, job_id: str, registration: Registration) -> RegistrationReceipt:
        """Record ``registration`` for ``caller``'s cluster (see the module docstring)."""
        ranks = _bound_to_host(caller, registration)
        now = self._clock()
        at = datetime.fromtimestamp(now, UTC)
        groups = json.dumps({k: v.model_dump(mode="json") for k, v in registration.process_groups.items()})
        registered = unchanged = 0
        moved: list[dict[str, object]] = []
        with self._db.connect() as db:
            self._rate_limit(db, caller, now, registration.entries)
            db.execute("INSERT INTO registrations (tenant, cluster, registered_at, ranks) VALUES (?, ?, ?, ?)",
                       (caller.tenant, caller.cluster, now, registration.entries))
            self._prune(db, now)
            layout_changed = self._job_row(db, caller, job_id, registration, groups, now)
            # The newest incident of the job: an identity current when it opened is one it needs.
            newest_incident = db.execute("SELECT MAX(created_at) FROM incidents WHERE tenant = ? AND cluster = ? AND "
                                         "job_id = ?", (caller.tenant, caller.cluster, job_id)).fetchone()[0]
            for rank, entry in sorted(ranks.items()):
                row = db.execute("SELECT host, identity, registered_at FROM job_ranks WHERE tenant = ? AND "
                                 "cluster = ? AND job_id = ? AND rank = ?",
                                 (caller.tenant, caller.cluster, job_id, rank)).fetchone()
                identity = entry.model_dump_json(exclude_none=True)
                if row is not None and row[1] == identity:
                    unchanged += 1
                    continue
                if row is not None and caller.host is not None and row[0] not in (None, caller.host):
                    # As for uploads: one compromised node may not pull another node's rank onto itself
                    # (and the blame off the node it really ran on).
                    raise ForbiddenError(f"rank {rank} of job {job_id!r} is registered on host {row[0]!r}; a key "
                                         f"bound to host {caller.host!r} may not move it")
                if row is not None and newest_incident is not None and newest_incident >= row[2]:
                    # Any restart, on this node or another: the process that died is what an incident
                    # opened while it ran needs (its pid and GPU name the Xid's). No incident opened
                    # since it registered: none can ask for it, and it is not kept.
                    _keep_history(db, caller, job_id, rank, row[1], now)
                if row is not None and row[0] is not None and entry.host is not None and row[0] != entry.host:
                    db.execute("INSERT INTO job_rank_moves (tenant, cluster, job_id, rank, from_host, to_host, "
                               "from_identity, key_id, moved_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               (caller.tenant, caller.cluster, job_id, rank, row[0], entry.host, row[1],
                                caller.key_id, now))
                    _keep_newest(db, "job_rank_moves", "moved_at", caller, job_id, rank)
                    moved.append({"rank": rank, "from_host": row[0], "to_host": entry.host, "at": at.isoformat()})
                db.execute("INSERT INTO job_ranks (tenant, cluster, job_id, rank, host, identity, key_id, "
                           "registered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, cluster, job_id, "
                           "rank) DO UPDATE SET host = excluded.host, identity = excluded.identity, "
                           "key_id = excluded.key_id, registered_at = excluded.registered_at",
                           (caller.tenant, caller.cluster, job_id, rank, entry.host, identity, caller.key_id, now))
                registered += 1
        receipt = RegistrationReceipt(job_id=job_id, registered=registered, unchanged=unchanged, moved=moved)
        receipt._layout_changed = layout_changed
        return receipt

    @staticmethod
    def _job_row(db: sqlite3.Connection, caller: Caller, job_id: str, registration: Registration, groups: str,
                 now: float) -> bool:
        """Write the job's world size and groups; True when they changed. The old ones are kept with
        the change's time, for incidents opened before it (see the module docstring for the 403)."""
        row = db.execute("SELECT world_size, process_groups FROM jobs_registered WHERE tenant = ? AND cluster = ? "
                         "AND job_id = ?", (caller.tenant, caller.cluster, job_id)).fetchone()
        if row is None:
            db.execute("INSERT INTO jobs_registered (tenant, cluster, job_id, world_size, process_groups, updated_at) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (caller.tenant, caller.cluster, job_id, registration.world_size,
                                                     groups, now))
            return False
        new_groups = row[1] if not registration.process_groups else groups
        world_changed = row[0] != registration.world_size
        groups_changed = json.loads(row[1]) != json.loads(new_groups)
        if caller.host is not None and (world_changed or groups_changed):
            what = (f"world size {row[0]} to {registration.world_size}" if world_changed else "process groups")
            raise ForbiddenError(f"a key bound to host {caller.host!r} may not change job {job_id!r}'s {what}; "
                                 "it registers its own ranks with the job's world size and process groups (or none); "
                                 "the job's key registers an elastic restart")
        if world_changed or groups_changed:
            db.execute("INSERT INTO job_layout_changes (tenant, cluster, job_id, from_world_size, from_groups, key_id, "
                       "changed_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (caller.tenant, caller.cluster, job_id, row[0], row[1], caller.key_id, now))
        db.execute("UPDATE jobs_registered SET world_size = ?, process_groups = ?, updated_at = ? WHERE tenant = ? "
                   "AND cluster = ? AND job_id = ?",
                   (registration.world_size, new_groups, now, caller.tenant, caller.cluster, job_id))
        return world_changed or groups_changed

    def layout(self, tenant: str, cluster: str, job_id: str) -> RegisteredLayout | None:
        """The job's current registered layout, or None when nothing registered."""
        return self.placement_at(tenant, cluster, job_id, None)

    def placement_at(self, tenant: str, cluster: str, job_id: str, when: float | None) -> RegisteredLayout | None:
        """The layout as it stood at ``when`` (server time; None: now).

        A rank that moved after ``when`` is placed where it was then (an incident opened before a
        restart must drain the node the rank died on, not the one it restarted on); every move
        stays listed, so the report shows both.
        """
        with self._db.connect(read_only=True) as db:
            job = db.execute("SELECT world_size, process_groups FROM jobs_registered WHERE tenant = ? AND "
                             "cluster = ? AND job_id = ?", (tenant, cluster, job_id)).fetchone()
            if job is None:
                return None
            if when is not None:
                # The job's world size and groups as they were then (an elastic restart after the
                # incident opened must not take ranks out of its manifest).
                then = db.execute("SELECT from_world_size, from_groups FROM job_layout_changes WHERE tenant = ? AND "
                                  "cluster = ? AND job_id = ? AND changed_at > ? ORDER BY changed_at LIMIT 1",
                                  (tenant, cluster, job_id, when)).fetchone()
                job = then or job
            rows = db.execute("SELECT rank, identity FROM job_ranks WHERE tenant = ? AND cluster = ? AND job_id = ? "
                              "AND rank < ? ORDER BY rank", (tenant, cluster, job_id, job[0])).fetchall()
            # The first identity each rank replaced after ``when`` is the one it had at ``when`` (one
            # row per rank, found in SQL: a job's whole history is never read into this process).
            then_rows = [] if when is None else db.execute(
                "SELECT rank, identity, MIN(replaced_at) FROM job_rank_history WHERE tenant = ? AND cluster = ? "
                "AND job_id = ? AND replaced_at > ? GROUP BY rank", (tenant, cluster, job_id, when)).fetchall()
            move_rows = db.execute("SELECT rank, from_host, to_host, moved_at FROM (SELECT rank, from_host, to_host, "
                                   "moved_at, ROW_NUMBER() OVER (PARTITION BY rank ORDER BY moved_at DESC) AS n "
                                   "FROM job_rank_moves WHERE tenant = ? AND cluster = ? AND job_id = ?) "
                                   "WHERE n <= ? ORDER BY moved_at", (tenant, cluster, job_id, MOVES_SHOWN)).fetchall()
        ranks = {r[0]: RegisteredRank.model_validate_json(r[1]) for r in rows}
        for rank, identity, _ in then_rows:
            if rank in ranks:
                ranks[rank] = RegisteredRank.model_validate_json(identity)
        moves: dict[int, list[HostMove]] = {}
        for rank, from_host, to_host, moved_at in move_rows:
            moves.setdefault(rank, []).append(HostMove(from_host=from_host, to_host=to_host,
                                                       at=datetime.fromtimestamp(moved_at, UTC)))
        groups = {name: ProcessGroupSpec.model_validate(spec) for name, spec in json.loads(job[1]).items()}
        return RegisteredLayout(world_size=job[0], ranks=ranks, moves=moves, process_groups=groups)

    def host_at(self, tenant: str, cluster: str, job_id: str, rank: int, when: float | None) -> str | None:
        """The host ``rank`` was registered on at ``when`` (None: now), or None when it never was.
        One rank's rows only: every upload of a node agent's key asks it."""
        with self._db.connect(read_only=True) as db:
            row = db.execute("SELECT host FROM job_ranks WHERE tenant = ? AND cluster = ? AND job_id = ? AND rank = ?",
                             (tenant, cluster, job_id, rank)).fetchone()
            if row is None or when is None:
                return row[0] if row else None
            then = db.execute("SELECT identity FROM job_rank_history WHERE tenant = ? AND cluster = ? AND job_id = ? "
                              "AND rank = ? AND replaced_at > ? ORDER BY replaced_at LIMIT 1",
                              (tenant, cluster, job_id, rank, when)).fetchone()
        return RegisteredRank.model_validate_json(then[0]).host if then else row[0]

    def _prune(self, db: sqlite3.Connection, now: float) -> None:
        """Forget jobs not registered for the retention, at most once per PRUNE_EVERY_S per process."""
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        db.execute("DELETE FROM jobs_registered WHERE updated_at < ?", (now - REGISTRATION_RETENTION_S,))
        for table in ("job_ranks", "job_rank_moves", "job_rank_history", "job_layout_changes"):
            db.execute(f"DELETE FROM {table} WHERE (tenant, cluster, job_id) NOT IN "  # noqa: S608 - names above
                       "(SELECT tenant, cluster, job_id FROM jobs_registered)")

    def _rate_limit(self, db: sqlite3.Connection, caller: Caller, now: float, ranks: int) -> None:
        """Counted inside the registration's write transaction, so racing requests cannot both slip under."""
        db.execute("DELETE FROM registrations WHERE registered_at < ?", (now - self.window_s,))
        count, entries, oldest = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(ranks), 0), MIN(registered_at) FROM registrations WHERE tenant = ? "
            "AND cluster = ?", (caller.tenant, caller.cluster)).fetchone()
        if count >= self.max_per_window or entries + ranks > self.max_ranks_per_window:
            raise RateLimitedError(f"cluster {caller.cluster!r} sent {count} registrations ({entries} ranks) in the "
                                   f"last {self.window_s:.0f} s; {ranks} more ranks would pass its limit of "
                                   f"{self.max_per_window} registrations or {self.max_ranks_per_window} ranks; "
                                   "nothing was recorded, retry later",
                                   retry_after_s=int((oldest or now) + self.window_s - now) + 1)


def _bound_to_host(caller: Caller, registration: Registration) -> dict[int, RegisteredRank]:
    """A job's key registers any rank (it names each host); a node agent's key its own host's only."""
    if caller.host is None:
        nameless = [r for r, e in registration.ranks.items() if e.host is None]
        if nameless:
            raise InvalidRequestError(f"rank(s) {sorted(nameless)[:8]} name no host; a job's key registers where "
                                      "each rank runs (the scheduler's node name)")
        return dict(registration.ranks)
    out: dict[int, RegisteredRank] = {}
    for rank, entry in registration.ranks.items():
        if entry.host is not None and entry.host != caller.host:
            raise ForbiddenError(f"this key is bound to host {caller.host!r}; it registers that host's ranks only, "
                                 f"not rank {rank} on {entry.host!r}")
        out[rank] = entry if entry.host is not None else entry.model_copy(update={"host": caller.host})
    return out


def _keep_history(db: sqlite3.Connection, caller: Caller, job_id: str, rank: int, replaced: str, now: float) -> None:
    """Record the identity a registration replaced; the rank keeps its newest HISTORY_PER_RANK."""
    db.execute("INSERT INTO job_rank_history (tenant, cluster, job_id, rank, identity, key_id, replaced_at) "
               "VALUES (?, ?, ?, ?, ?, ?, ?)", (caller.tenant, caller.cluster, job_id, rank, replaced, caller.key_id, now))
    _keep_newest(db, "job_rank_history", "replaced_at", caller, job_id, rank, HISTORY_PER_RANK)


def _keep_newest(db: sqlite3.Connection, table: str, time_column: str, caller: Caller, job_id: str, rank: int,
                 kept: int = MOVES_SHOWN) -> None:
    """Delete one rank's rows of ``table`` beyond its newest ``kept``."""
    db.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE tenant = ? AND cluster = ? "  # noqa: S608
               f"AND job_id = ? AND rank = ? ORDER BY {time_column} DESC LIMIT -1 OFFSET ?)",
               (caller.tenant, caller.cluster, job_id, rank, kept))
