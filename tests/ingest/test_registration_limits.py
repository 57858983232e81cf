"""The bounds of ``POST /v1/jobs/{job_id}/ranks`` that a hostile job key would push on, at the core
(the HTTP refusals are in test_job_layout.py): ranks per request, and registrations and rank
entries per cluster and window."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from denpex.evidence.store import LocalStore
from denpex.ingest.auth import Caller
from denpex.ingest.database import Database
from denpex.ingest.errors import ForbiddenError, InvalidRequestError, RateLimitedError
from denpex.ingest.identity import parse_identity
from denpex.ingest.incidents import IncidentBook, IncidentKey
from denpex.ingest.manifest_writer import ManifestWriter, _Draft
from denpex.ingest.registration import (
    HISTORY_PER_RANK,
    MAX_GROUP_MEMBERS,
    MAX_PROCESS_GROUPS,
    MAX_RANKS_PER_REGISTRATION,
    MOVES_SHOWN,
    PRUNE_EVERY_S,
    REGISTRATION_RETENTION_S,
    JobRegistry,
    RegisteredLayout,
    parse_registration,
)

CALLER = Caller(tenant="acme", cluster="c1", key_id="dk_1")


def _open_incident(tmp_path: Path, at: float, job: str) -> None:
    """An incident of ``job`` opened at ``at`` (server time), as the incident book records one: what
    keeps the identities a restart replaces."""
    with Database(tmp_path).connect() as db:
        db.execute("INSERT INTO incidents (tenant, cluster, incident_id, job_id, created_at) VALUES (?, ?, ?, ?, ?)",
                   ("acme", "c1", f"inc-{at}", job, at))


def _body(ranks: range, world_size: int = 1 << 20, host: str = "gpu-node-001") -> bytes:
    return json.dumps({"world_size": world_size, "ranks": {str(r): {"host": host} for r in ranks}}).encode()


def test_one_registration_carries_at_most_16384_ranks() -> None:
    assert len(parse_registration(_body(range(MAX_RANKS_PER_REGISTRATION))).ranks) == MAX_RANKS_PER_REGISTRATION
    with pytest.raises(InvalidRequestError, match="at most 16384"):
        parse_registration(_body(range(MAX_RANKS_PER_REGISTRATION + 1)))


def test_registrations_and_their_ranks_are_counted_per_cluster_and_window(tmp_path: Path) -> None:
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), max_per_window=3, max_ranks_per_window=100, window_s=60,
                       clock=lambda: now[0])
    jobs.register(CALLER, "job-a", parse_registration(_body(range(60))))
    with pytest.raises(RateLimitedError, match="100 ranks") as refused:
        jobs.register(CALLER, "job-b", parse_registration(_body(range(60))))
    assert refused.value.retry_after_s == 61
    assert jobs.layout("acme", "c1", "job-b") is None  # nothing of a refused registration is kept
    other = Caller(tenant="acme", cluster="c2", key_id="dk_2")
    jobs.register(other, "job-b", parse_registration(_body(range(60))))  # another cluster: its own budget
    jobs.register(CALLER, "job-c", parse_registration(_body(range(1))))
    jobs.register(CALLER, "job-c", parse_registration(_body(range(1))))
    with pytest.raises(RateLimitedError, match="3 registrations"):
        jobs.register(CALLER, "job-c", parse_registration(_body(range(1))))
    now[0] += 61  # the window has passed
    jobs.register(CALLER, "job-d", parse_registration(_body(range(60))))


def test_a_rank_restarted_many_times_lists_its_newest_moves_and_keeps_its_first_placement(tmp_path: Path) -> None:
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), clock=lambda: now[0])
    jobs.register(CALLER, "job-a", parse_registration(_body(range(1), world_size=4, host="gpu-node-001")))
    incident_opened = now[0] + 0.5
    _open_incident(tmp_path, incident_opened, "job-a")
    for n in range(2, 40):
        now[0] += 1
        jobs.register(CALLER, "job-a", parse_registration(_body(range(1), world_size=4, host=f"gpu-node-{n:03d}")))
    layout = jobs.placement_at("acme", "c1", "job-a", incident_opened)
    assert layout is not None and layout.ranks[0].host == "gpu-node-001"
    assert len(layout.moves[0]) == MOVES_SHOWN and layout.moves[0][-1].to_host == "gpu-node-039"
    current = jobs.layout("acme", "c1", "job-a")
    assert current is not None and current.ranks[0].host == "gpu-node-039"


def _layout(world_size: int, ranks: range, groups: dict[str, list[int]] | None = None, host: str = "") -> bytes:
    entries = {str(r): ({"host": host or f"gpu-node-{r // 8 + 1:03d}"} if host != "-" else {}) for r in ranks}
    body: dict[str, object] = {"world_size": world_size, "ranks": entries}
    if groups is not None:
        body["process_groups"] = {name: {"ranks": members} for name, members in groups.items()}
    return json.dumps(body).encode()


def test_a_node_agents_key_may_not_shrink_the_job_and_an_elastic_restart_spares_open_incidents(tmp_path: Path) -> None:
    """Finding 4 (r_agent_shrink.py): the agent of gpu-node-001 may not hide gpu-node-002's ranks; a
    job key's elastic restart may, but not from an incident opened before it."""
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), clock=lambda: now[0])
    jobs.register(CALLER, "job", parse_registration(_layout(16, range(16), {"0": list(range(16))})))
    agent = Caller(tenant="acme", cluster="c1", key_id="nk_x", host="gpu-node-001")
    with pytest.raises(ForbiddenError, match="world size 16 to 1"):
        jobs.register(agent, "job", parse_registration(_layout(1, range(1), {"0": [0]}, host="-")))
    with pytest.raises(ForbiddenError, match="process groups"):
        jobs.register(agent, "job", parse_registration(_layout(16, range(1), {"evil": [0]}, host="-")))
    same = jobs.register(agent, "job", parse_registration(_layout(16, range(1), {"0": list(range(16))}, host="-")))
    assert same.unchanged == 1 and not same.changed  # its own rank, with the job's own layout
    layout = jobs.layout("acme", "c1", "job")
    assert layout is not None and layout.world_size == 16 and layout.ranks[12].host == "gpu-node-002"
    opened = now[0] + 0.5
    now[0] += 1
    shrink = jobs.register(CALLER, "job", parse_registration(_layout(8, range(8), {"0": list(range(8))})))
    assert shrink.changed and shrink.registered == 0
    then = jobs.placement_at("acme", "c1", "job", opened)
    assert then is not None and then.world_size == 16 and then.ranks[12].host == "gpu-node-002"
    assert then.process_groups["0"].ranks == tuple(range(16))
    current = jobs.layout("acme", "c1", "job")
    assert current is not None and current.world_size == 8 and 12 not in current.ranks


def test_an_upload_from_another_host_than_the_registered_one_keeps_none_of_its_pid_or_gpu(tmp_path: Path) -> None:
    """Finding 5 (r_upload_override.py): a job key's upload of rank 1 from gpu-node-009, registered
    on gpu-node-002 with pid 101: the manifest shows the upload's host, and not pid 101 beside it."""
    jobs = JobRegistry(Database(tmp_path))
    jobs.register(CALLER, "job", parse_registration(json.dumps({"world_size": 4, "ranks": {
        str(r): {"host": f"gpu-node-00{r + 1}", "pid": 100 + r, "gpu_pci_bus_id": "0000:3b:00.0"}
        for r in range(4)}}).encode()))
    draft = _Draft(job_id="job", registered=jobs.layout("acme", "c1", "job"))
    draft.add(parse_identity(json.dumps({"job_id": "job", "incident_id": "fr-1", "rank": 1, "world_size": 4,
                                         "host": "gpu-node-009"})))
    draft.add(parse_identity(json.dumps({"job_id": "job", "incident_id": "fr-1", "rank": 2, "world_size": 4,
                                         "host": "gpu-node-003"})))
    ranks = draft.manifest(IncidentKey("acme", "c1", "fr-1")).ranks
    assert (ranks[1].host, ranks[1].pid, ranks[1].gpu_pci_bus_id) == ("gpu-node-009", None, None)
    assert (ranks[2].host, ranks[2].pid) == ("gpu-node-003", 102)  # same host: the registration completes it


def _with_group(members: list[int], world_size: int = 1 << 20, groups: int = 1) -> bytes:
    return json.dumps({"world_size": world_size, "ranks": {"0": {"host": "gpu-node-001"}},
                       "process_groups": {str(g): {"ranks": members} for g in range(groups)}}).encode()


def test_process_group_members_count_against_the_budget_and_are_capped(tmp_path: Path) -> None:
    """Finding 2 (r_disk.py): a one-rank registration carrying a 1,048,576-member group was counted
    as one entry; now its members count, and a registration carries at most MAX_GROUP_MEMBERS."""
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), max_ranks_per_window=1000, window_s=60, clock=lambda: now[0])
    jobs.register(CALLER, "job-a", parse_registration(_with_group(list(range(900)))))
    with pytest.raises(RateLimitedError, match="901 ranks"):
        jobs.register(CALLER, "job-b", parse_registration(_with_group(list(range(900)))))
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_GROUP_MEMBERS:,} process group members"):
        parse_registration(_with_group(list(range(MAX_GROUP_MEMBERS + 1))))
    with pytest.raises(InvalidRequestError, match=f"process_groups: .*at most {MAX_PROCESS_GROUPS} items"):
        parse_registration(_with_group([0], groups=MAX_PROCESS_GROUPS + 1))


def test_a_refused_registration_names_its_problem_in_a_short_error() -> None:
    """Finding 2 (r_parse2.py): the 422 for a group of a million repeated ranks echoed all of them
    (12,582,812 characters)."""
    with pytest.raises(InvalidRequestError, match="repeat") as refused:
        parse_registration(_with_group([0] * 100_000 + [1]))
    assert len(str(refused.value)) <= 600


def test_layouts_of_jobs_not_registered_for_the_retention_are_pruned(tmp_path: Path) -> None:
    """Finding 2: jobs_registered, job_ranks and their moves were never pruned."""
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), clock=lambda: now[0])
    jobs.register(CALLER, "old", parse_registration(_body(range(4), world_size=4)))
    jobs.register(CALLER, "old", parse_registration(_body(range(1), world_size=4, host="gpu-node-002")))
    now[0] += REGISTRATION_RETENTION_S - 10
    jobs.register(CALLER, "kept", parse_registration(_body(range(4), world_size=4)))
    now[0] += PRUNE_EVERY_S  # a registration prunes at most once in this interval
    jobs.register(CALLER, "new", parse_registration(_body(range(4), world_size=4)))
    assert jobs.layout("acme", "c1", "old") is None and jobs.layout("acme", "c1", "kept") is not None
    with Database(tmp_path).connect() as db:
        assert db.execute("SELECT COUNT(*) FROM job_ranks WHERE job_id = 'old'").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM job_rank_moves WHERE job_id = 'old'").fetchone() == (0,)


def test_a_restart_on_the_same_node_leaves_an_open_incident_its_dead_process(tmp_path: Path) -> None:
    """Finding 6 (r_samehost.py): rank 1's process 4242 on GPU 3b died; it restarted on the same node
    as 9999 on GPU 86. The incident opened before keeps 4242 and 3b (their Xid names that GPU)."""
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), clock=lambda: now[0])

    def rank1(pid: int, bus: str) -> bytes:
        return json.dumps({"world_size": 2, "ranks": {"1": {"host": "gpu-node-002", "pid": pid,
                                                            "gpu_pci_bus_id": bus}}}).encode()

    jobs.register(CALLER, "job", parse_registration(rank1(4242, "0000:3b:00.0")))
    opened = now[0] + 1
    _open_incident(tmp_path, opened, "job")
    now[0] += 10
    restarted = jobs.register(CALLER, "job", parse_registration(rank1(9999, "0000:86:00.0")))
    assert restarted.registered == 1 and restarted.moved == []  # the same host: no move
    now[0] += 10
    jobs.register(CALLER, "job", parse_registration(rank1(7777, "0000:af:00.0")))  # and once more
    then = jobs.placement_at("acme", "c1", "job", opened)
    assert then is not None and (then.ranks[1].pid, then.ranks[1].gpu_pci_bus_id) == (4242, "0000:3b:00.0")
    current = jobs.layout("acme", "c1", "job")
    assert current is not None and current.ranks[1].pid == 7777


class _HeldRegistry(JobRegistry):
    """The real registry, held inside ``placement_at`` for one tenant until released: a stand-in for a
    layout that takes seconds to read (r_lock.py: 6.1 s at 65k moves)."""

    def __init__(self, db: Database, tenant: str) -> None:
        super().__init__(db)
        self.tenant = tenant
        self.entered = threading.Event()
        self.release = threading.Event()

    def placement_at(self, tenant: str, cluster: str, job_id: str, when: float | None) -> RegisteredLayout | None:
        if tenant == self.tenant:
            self.entered.set()
            self.release.wait(20)
        return super().placement_at(tenant, cluster, job_id, when)


def test_one_tenants_registration_does_not_hold_another_tenants_uploads(tmp_path: Path) -> None:
    """Finding 3 (r_lock.py): ManifestWriter.registered read every open incident's layout under the
    lock every upload takes; another tenant's upload waited for it."""
    db = Database(tmp_path / "state")
    jobs, book = _HeldRegistry(db, "acme"), IncidentBook(db)
    jobs.register(CALLER, "job", parse_registration(_body(range(4), world_size=4)))
    book.ensure_incident(IncidentKey("acme", "c1", "inc-a"), "job")
    writer = ManifestWriter(LocalStore(tmp_path / "store"), book, interval_s=60, jobs=jobs)
    try:
        registering = threading.Thread(target=writer.registered, args=("acme", "c1", "job"))
        registering.start()
        assert jobs.entered.wait(10)
        other = parse_identity(json.dumps({"job_id": "gjob", "incident_id": "inc-g", "rank": 0, "world_size": 2,
                                           "host": "g-node-1"}))
        uploading = threading.Thread(target=writer.add, args=(IncidentKey("globex", "g1", "inc-g"), other))
        uploading.start()
        uploading.join(5)
        blocked = uploading.is_alive()
        jobs.release.set()
        registering.join(10)
        uploading.join(10)
        assert not blocked, "another tenant's upload waited on this tenant's registration"
    finally:
        jobs.release.set()
        writer.close()


def test_a_rank_restarted_in_a_loop_keeps_a_bounded_number_of_moves(tmp_path: Path) -> None:
    """Finding 3 (r_moves.py): every move was kept and read on each layout (82k moves: 1.95 s)."""
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), clock=lambda: now[0])
    for n in range(100):
        now[0] += 1
        jobs.register(CALLER, "job", parse_registration(_body(range(2), world_size=2, host=f"gpu-node-{n % 2}")))
    with Database(tmp_path).connect() as db:
        assert db.execute("SELECT COUNT(*) FROM job_rank_moves").fetchone() == (2 * MOVES_SHOWN,)
    layout = jobs.layout("acme", "c1", "job")
    assert layout is not None and [len(m) for m in layout.moves.values()] == [MOVES_SHOWN, MOVES_SHOWN]


def test_a_job_keeps_only_the_replaced_identities_an_incident_needs(tmp_path: Path) -> None:
    """Issue 30, §3: restarts with no incident keep nothing; one incident keeps the process each rank
    had when it opened, and no later one."""
    now = [1_000_000.0]
    jobs = JobRegistry(Database(tmp_path), clock=lambda: now[0])

    def restart(pid: int) -> None:
        now[0] += 1
        jobs.register(CALLER, "job", parse_registration(json.dumps({"world_size": 64, "ranks": {
            str(r): {"host": f"gpu-node-{r // 8:03d}", "pid": pid + r} for r in range(64)}}).encode()))

    def rows() -> int:
        with Database(tmp_path).connect(read_only=True) as db:
            return int(db.execute("SELECT COUNT(*) FROM job_rank_history").fetchone()[0])

    for generation in range(6):
        restart(1000 * generation)
    assert rows() == 0  # six generations, no incident: nothing any incident could ask for
    _open_incident(tmp_path, now[0] + 0.5, "job")
    for generation in range(6, 12):
        restart(1000 * generation)
    assert rows() == 64  # the processes the incident saw die, once
    then = jobs.placement_at("acme", "c1", "job", now[0] - 5.5)
    assert then is not None and [then.ranks[r].pid for r in (0, 63)] == [5000, 5063]
    for generation in range(12, 32):  # an incident between every two restarts: each rank keeps its newest 16
        _open_incident(tmp_path, now[0] + 0.5, "job")
        restart(1000 * generation)
    assert rows() == 64 * HISTORY_PER_RANK
