"""Rank -> node from Slurm's job record (issue 18, item 2): parsing, block distribution, and when a
derivation is refused. The lab's real ``scontrol -o show job -d`` output is parsed in
tests/flows/test_dead_rank_flow.py."""

from __future__ import annotations

from denpex.evidence.manifest import HostSource, JobManifest, RankIdentity
from denpex.isolation.slurm_layout import derive_hosts, parse_job_layout, with_derived_hosts

# As Slurm 22.05 prints it in the lab (one line; trimmed of fields the parser does not read).
RECORD = ("JobId=7 JobName=wrap UserId=root(0) JobState=RUNNING Reason=None NodeList=gpu-node-[001-002,007] "
          "BatchHost=gpu-node-001 NumNodes=3 NumCPUs=3 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
          "Nodes=gpu-node-[001-002,007] CPU_IDs=0 Mem=0 GRES=")


def test_the_record_gives_the_nodes_in_allocation_order_and_the_task_count() -> None:
    layout = parse_job_layout(RECORD)
    assert layout is not None
    assert layout.nodes == ("gpu-node-001", "gpu-node-002", "gpu-node-007") and layout.tasks == 3
    assert parse_job_layout("slurm_load_jobs error: Invalid job id specified") is None


def test_block_distribution_one_and_several_ranks_per_node() -> None:
    layout = parse_job_layout(RECORD)
    assert layout is not None
    assert derive_hosts(layout, 3) == ({0: "gpu-node-001", 1: "gpu-node-002", 2: "gpu-node-007"}, None)
    hosts, why = derive_hosts(layout, 6)  # torchrun: one task per node, 2 processes each
    assert why is None and [hosts[r] for r in range(6)] == ["gpu-node-001"] * 2 + ["gpu-node-002"] * 2 + [
        "gpu-node-007"] * 2
    hosts, why = derive_hosts(layout, 4)
    assert hosts == {} and why is not None and "do not split evenly" in why


def test_only_ranks_without_a_host_are_filled_and_marked_derived() -> None:
    manifest = JobManifest(world_size=3, ranks={0: RankIdentity(host="gpu-node-001", host_source=HostSource.UPLOAD),
                                                1: RankIdentity(local_rank=0)})
    filled_manifest, filled, why = with_derived_hosts(
        manifest, 3, {0: "gpu-node-001", 1: "gpu-node-002", 2: "gpu-node-007"})
    assert why is None and filled == [1, 2] and filled_manifest is not None
    assert filled_manifest.ranks[0].host_source is HostSource.UPLOAD
    assert filled_manifest.ranks[1].host == "gpu-node-002" and filled_manifest.ranks[1].host_is_derived
    assert filled_manifest.ranks[1].local_rank == 0  # what was known of the rank is kept


def test_a_derivation_that_contradicts_a_ranks_own_host_is_not_used() -> None:
    """A rendezvous numbered the nodes otherwise: rank 0 ran on gpu-node-002, not where the block puts it."""
    manifest = JobManifest(world_size=2, ranks={0: RankIdentity(host="gpu-node-002")})
    same, filled, why = with_derived_hosts(manifest, 2, {0: "gpu-node-001", 1: "gpu-node-002"})
    assert same is manifest and filled == [] and why is not None and "ran on gpu-node-002" in why


def test_a_job_name_that_names_fields_is_not_read_and_a_huge_or_odd_node_list_is_refused() -> None:
    """Hostile review, finding 8: the job's name is the user's own text, printed among the fields
    (``scontrol -o``): a name such as ``x NodeList=victim-[01-02]`` chose the nodes; a range of a
    billion names exhausted memory; a non-ASCII digit escaped as an uncaught error."""
    import pytest

    from denpex.isolation.errors import UnreadableRecordError
    from denpex.isolation.slurm_parse import expand_hostlist, parse_show_job

    hostile = RECORD.replace("JobName=wrap", "JobName=train NodeList=victim-[01-02] NumTasks=2")
    with pytest.raises(UnreadableRecordError, match="names NodeList, NumTasks more than once"):
        parse_job_layout(hostile)
    with pytest.raises(ValueError, match="more than 65536 nodes"):
        expand_hostlist("n[0-999999999]")
    with pytest.raises(ValueError, match="more than 65536 nodes"):
        expand_hostlist("r[0-999]n[0-999]")
    with pytest.raises(ValueError, match="bad range"):
        expand_hostlist("n[\u00b2-3]")
    odd = parse_job_layout(RECORD.replace("NumTasks=3", "NumTasks=\u00b2"))
    assert odd is not None and odd.tasks is None
    assert parse_job_layout(RECORD.replace("JobName=wrap", "JobName=ReqNodeList=x")) is not None
    # The requeue reads the same record: a name cannot fake the job's state or its nodes there either.
    with pytest.raises(UnreadableRecordError, match="names JobState more than once"):
        parse_show_job(RECORD.replace("JobName=wrap", "JobName=x JobState=PENDING"))
    with pytest.raises(UnreadableRecordError, match="NodeList cannot be read"):
        parse_job_layout(RECORD.replace("NodeList=gpu-node-[001-002,007]", "NodeList=n[0-999999999]"))
