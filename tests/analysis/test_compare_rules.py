"""The comparison's public surface and its one rule list (denpex.analysis.compare)."""

from denpex.analysis import compare
from denpex.analysis.blockage import BlockageKind


def test_public_names() -> None:
    assert sorted(compare.__all__) == ["AGE_UNKNOWN_NOTE", "Blockage", "BlockageKind", "Comparison", "RULES",
                                       "compare_groups", "progress_from_status"]


def test_rule_order() -> None:
    # The order is the rules' priority: a reorder changes verdicts, so it must be deliberate.
    assert [rule.__name__ for rule in compare.RULES] == [
        "locate", "mismatch", "behind_or_absent", "queued_on_some", "overdue_started", "wrapped_unknown",
        "overdue_tie", "all_in", "retired_by_gloo_peers", "defer_unready", "guessed_membership",
        "stopped_first", "lagging_behind", "peer_waits", "_unreached"]


def test_blockage_kind_values_unchanged() -> None:
    # The values were plain string constants before the enum; anything that printed one reads the same.
    assert {k.name: str(k) for k in BlockageKind} == {
        "BEHIND": "behind", "MISMATCH": "mismatch", "P2P": "p2p", "OVERDUE": "overdue",
        "UNKNOWN_MEMBERS": "unknown_members", "STOPPED": "stopped", "LAGGING": "lagging",
        "UNREACHED": "unreached"}
