"""Issue 16, finding 11: text that came from evidence cannot lay out the report beside the form.

A tenant controls hosts, process-group descriptions, reasons and hardware summaries. Placed in
markdown as they are, a code fence closes the report's block and the lines after it render as
Denpex's own words ("safe to approve"). Names are validated where they arrive; every builder
escapes what it quotes.
"""

from __future__ import annotations

import re

import pytest

from denpex.analysis.models import Candidate, CandidateKind, Verdict
from denpex.evidence.errors import ManifestError
from denpex.evidence.manifest import parse_manifest_bytes
from denpex.ingest.errors import InvalidRequestError
from denpex.ingest.identity import parse_identity
from denpex.markdown_text import CONTINUED, chat_text, code_block, folded, inline, visible
from denpex.report import PlanView, TriageReport
from denpex.workflow.markdown import REPORT_COLUMNS, candidates_table, decision_markdown, report_markdown
from denpex.workflow.notify import approval_notice

FENCE_BREAK = "x\n```\n\n## Safe to approve: verified by Denpex\n\n```text"
PRINTABLE_BREAK = "```` **Safe to approve** [docs](http://evil.example) <img src=x onerror=alert(1)> ````"


def _report(reason: str, host: str) -> TriageReport:
    return TriageReport(
        verdict=Verdict.LOCALIZED, world_size=4, ranks_with_evidence=[0, 1, 2, 3], missing_ranks=[],
        candidates=[Candidate(rank=2, kind=CandidateKind.NOT_ENTERED, confidence=0.9, host=host,
                              reasons=[reason])],
        plan=PlanView(recommend_isolation=False, actions=[], blocked=[f"rank 2 on {host}: {reason}"]),
    )


def _outside_code(markdown: str) -> list[str]:
    """The lines CommonMark renders as markdown: those outside fenced code blocks."""
    outside, fence = [], None
    for line in markdown.splitlines():
        opener = re.match(r"^(`{3,})", line)
        if fence is None and opener:
            fence = opener.group(1)
        elif fence is not None and re.fullmatch(rf"{fence}`*\s*", line):
            fence = None
        elif fence is None:
            outside.append(line)
    return outside


@pytest.mark.parametrize("hostile", [FENCE_BREAK, PRINTABLE_BREAK])
def test_the_report_keeps_evidence_text_literal(hostile: str) -> None:
    markdown = report_markdown(_report(hostile, "gpu-node-003"), incident_id="inc-1", cluster="lab", plan=None)
    outside = _outside_code(markdown)
    # Outside the code block the hostile text appears only escaped, on Denpex's own "blocked" line.
    assert any(line.endswith(inline(hostile)) for line in outside)
    [blocked] = [line for line in outside if line.startswith("- blocked: ")]
    # Escapes, then the code spans Denpex writes around a word that would link itself (literal text).
    unescaped = re.sub(r"`[^`]*`", "", re.sub(r"\\.", "", blocked.removeprefix("- blocked: ")))
    # Inside a line, '#' and '-' start nothing (headings and lists start lines), so they stay readable.
    assert not set(unescaped) & set("`*_[]()<>|"), unescaped
    assert "://" not in unescaped and "www." not in unescaped, unescaped
    assert not any(line.startswith("#") for line in outside[1:])


def test_a_code_block_cannot_be_closed_from_inside() -> None:
    block = code_block("a\n```\nb\n`````\nc")
    lines = block.splitlines()
    assert lines[0] == "``````text" and lines[-1] == "``````"
    assert _outside_code(block) == []


def test_inline_text_is_one_literal_line() -> None:
    assert inline("a\nb\r\u2028c") == "a b c"
    assert inline("[x] (e) <b>") == "\\[x\\] \\(e\\) \\<b\\>"
    # A word the Prefect UI's markdown would link by itself is code, where nothing links (red team
    # of issue 30; a backslash before "//" shows as written there). The Chromium test renders it.
    assert inline("[x](http://e) <b>") == "\\[x\\]\\(`http://e`\\) \\<b\\>"
    assert inline("see www.evil.example, a@b.c|https://x.y `q`") == \
        "see `www.evil.example,` `a@b.c`\\|`https://x.y` \\`q\\`"
    assert inline("rank 2 @ step c10d::run") == "rank 2 @ step c10d::run"
    assert inline("https://page/runs/1", bare_links=True) == "https://page/runs/1"
    assert len(inline("y" * 10_000, limit=50)) <= 51


# "Trojan Source": a right-to-left override makes a frame read `train.py:88 step()` while the
# text says otherwise; zero-width characters make two different names look the same.
TROJAN = "data.py:45 next_batch\u202e)(pets 88:yp.niart\u2066\u200b\ufeff"


def test_invisible_format_characters_are_written_out_wherever_text_is_rendered() -> None:
    for rendered in (inline(TROJAN), code_block(TROJAN), chat_text(TROJAN)):
        assert not {"\u202e", "\u2066", "\u200b", "\ufeff"} & set(rendered), rendered
        assert "u202e" in rendered and "u2066" in rendered and "u200b" in rendered and "ufeff" in rendered
    assert "\\\\u202e" in inline(TROJAN)  # the backslash itself escaped, so markdown shows it
    assert inline("gpu-node-003 é 中") == "gpu-node-003 é 中"  # ordinary letters untouched
    # Hostile review: a flood of zero-width spaces must not push the frame out of a bounded field.
    flood = inline("\u200b" * 500 + "train.py:88 step()", limit=600)
    assert flood == "\\\\u200b×500train.py:88 step\\(\\)", flood
    assert visible("\U000e0041") == "\\U000e0041"  # a tag character, not \ue004 then "1"
    markdown = report_markdown(_report(TROJAN, "gpu-node-003"), incident_id="inc-1", cluster="lab", plan=None)
    assert "\u202e" not in markdown and "\u2066" not in markdown


def test_decision_rows_and_the_chat_notice_escape_too() -> None:
    assert "\n## " not in decision_markdown("inc-1", "rejected", "no\n\n## Approved anyway")
    [row] = candidates_table(_report("r", "node|<b>\n| 9 | forged |"), None)[-1:]
    # The host cannot add a cell or a row to the candidates table: six cells, one line.
    assert "node\\|\\<b\\>" in row and len(re.findall(r"(?<!\\)\|", row)) == 7 and "\n" not in row
    report = _report("r", "gpu-node-003")
    report.candidates[0].host = "<!channel> <http://evil|click>"
    text = approval_notice(report, incident_id="inc-1", cluster="lab", run_url=None, plan_hash="ab" * 32).text
    assert "<!channel>" not in text and "<http" not in text and "&lt;!channel&gt;" in text
    assert chat_text("a\nb") == "a b"


@pytest.mark.parametrize("field, value", [
    ("host", "gpu-node-003\n```"), ("host", "node `x`"), ("gpu_uuid", "GPU-1\n## safe"),
])
def test_identity_strings_are_validated_at_upload(field: str, value: str) -> None:
    identity = {"job_id": "j", "incident_id": "i", "rank": 0, "world_size": 2, field: value}
    with pytest.raises(InvalidRequestError, match=field):
        parse_identity(__import__("json").dumps(identity))


def test_group_descriptions_are_printable_and_bounded() -> None:
    base = {"job_id": "j", "incident_id": "i", "rank": 0, "world_size": 2}
    for desc in ("tp\n```\n## Safe to approve", "d" * 300):
        with pytest.raises(InvalidRequestError, match="desc"):
            parse_identity(__import__("json").dumps(base | {"process_groups": {"0": {"desc": desc, "ranks": [0]}}}))
    with pytest.raises(ManifestError):
        parse_manifest_bytes(b'{"world_size": 2, "process_groups": {"0": {"desc": "a\\nb", "ranks": [0, 1]}}}',
                             source="manifest.json")
    ok = parse_identity(__import__("json").dumps(base | {"process_groups": {"0": {"desc": "tp `x`", "ranks": [0]}}}))
    assert ok.process_groups["0"].desc == "tp `x`"


@pytest.mark.parametrize("hostile", [FENCE_BREAK, PRINTABLE_BREAK])
def test_the_per_group_verdicts_keep_group_names_literal(hostile: str) -> None:
    """Issue 17, family 7: the report lists one verdict per stuck group. Group names and
    descriptions come from the dumps' process_group field, so they are escaped where rendered."""
    from denpex.analysis.models import GroupVerdict, StuckCollective

    report = _report("reason", "gpu-node-003").model_copy(update={
        "verdict": Verdict.AMBIGUOUS,
        "stuck": [StuckCollective(process_group=hostile, group_desc=hostile, collective_seq_id=7, op="nccl:all_reduce",
                                  waiting_ranks=(0,), behind_ranks=(2,))],
        "groups": [GroupVerdict(process_group=hostile, collective_seq_id=7, verdict=Verdict.LOCALIZED, candidates=[2]),
                   GroupVerdict(process_group="0", p2p_seq_id=3, verdict=Verdict.AMBIGUOUS, candidates=[0, 1])]})
    markdown = report_markdown(report, incident_id="inc-1", cluster="lab", plan=None)
    outside = _outside_code(markdown)
    assert "**Verdict per stuck group:**" in outside
    [line] = [x for x in outside if x.startswith("- group ") and "collective #7" in x]
    assert line == f"- group {inline(hostile, limit=200)} ({inline(hostile, limit=200)}), collective #7: **localized**, ranks 2"
    assert "- group 0, p2p\\_seq\\_id 3: **ambiguous**, ranks 0, 1" in outside
    assert not any(line.startswith("## Safe to approve") for line in outside)
    # The text report inside the fence lists them too.
    assert "Verdict per stuck group:" in markdown and "localized: rank 2" in markdown


@pytest.mark.parametrize("hostile", [FENCE_BREAK, PRINTABLE_BREAK])
def test_the_dialog_brief_keeps_evidence_text_literal_and_short(hostile: str) -> None:
    """Issue 20 item 2: beside the form, the essentials as short lines (no code block to scroll
    sideways), evidence text escaped and cut, who may approve, the full report a link away."""
    from denpex.isolation.plan import utc_now
    from denpex.isolation.planner import plan_isolation
    from denpex.isolation.policy import IsolationPolicy, Scheduler
    from denpex.workflow.markdown import approval_markdown
    from lab.rig import xid79_on

    result = xid79_on(["gpu-node-002"])
    plan = plan_isolation(result, None, IsolationPolicy(), None, Scheduler.SLURM, "inc-1", result.as_of or utc_now(),
                          cluster="lab")
    report = _report(hostile * 3, "gpu-node-002")
    brief = approval_markdown(report, incident_id="inc-1", cluster="lab", plan=plan, approvers=["alice", "carol"],
                              code_needed=True, report_link="http://ui/artifacts/key/denpex-inc-1-report")
    lines = brief.splitlines()
    assert "```" not in brief and all(len(line) < 400 for line in lines)
    keys = [re.match(r"\s*- \*\*([^*]+):\*\*", line).group(1) for line in lines if re.match(r"\s*- \*\*", line)]
    assert keys == ["Proposed", "Culprit", "Why", "Hardware", "Who may approve", "Plan"]
    [why] = [line for line in lines if "**Why:**" in line]
    assert why.strip() == f"- **Why:** {inline(hostile * 3, limit=160)}"
    assert "alice, carol, each with their authenticator code" in brief
    assert brief.rstrip().endswith("[full report](http://ui/artifacts/key/denpex-inc-1-report)")


def test_the_reports_code_blocks_fit_the_artifact_page() -> None:
    """Issue 31: Prefect's artifact page cuts a code block's lines at about 96 columns (1400 px),
    so a long reason lost its end. Every fenced line fits, and nothing is lost in the folding."""
    reason = "rank 3 waits in process group '2' (tp) collective #3 nccl:all_reduce Float[1048576]: " * 4
    report = _report(reason, "gpu-node-003")
    markdown = report_markdown(report, incident_id="inc-1", cluster="lab", plan=None)
    fenced = [line for line in markdown.splitlines() if line not in _outside_code(markdown)]
    assert fenced and max(len(line) for line in fenced) <= REPORT_COLUMNS
    assert "| 2 | gpu-node-003 | not_entered |" in markdown  # the table, above the text


def test_folding_keeps_every_character_and_marks_continuations() -> None:
    path = "/opt/job/" + "deep/" * 30 + "train.py:88 step()"
    text = "short line\n    " + "word " * 40 + "\n" + path
    out = folded(text, 40)
    assert all(len(line) <= 40 for line in out.splitlines())
    assert "".join(out.replace(CONTINUED, "").split()) == "".join(text.split())
    first, *rest = [line for line in out.splitlines() if "word" in line]
    assert first.startswith("    word") and len(rest) >= 4 and all(line.startswith("      ↪ word") for line in rest)
    assert out.splitlines()[-1].startswith("  ↪ ")  # the path's own continuation
    assert folded("a\n\nb", 10) == "a\n\nb"
    tabs = folded("\tx " * 30, 40)  # tabs kept as written (whitespace at a fold point is dropped)
    assert tabs.count("\t") >= 28 and "    x" not in tabs


def test_a_deep_indent_cannot_blow_the_folded_text_up() -> None:
    """A frame's file comes from the job (up to 512 characters, leading spaces allowed): carried
    whole onto every continuation, an indent near the width folded one character per line."""
    hostile = " " * 500 + "x" * 500
    out = folded(hostile, REPORT_COLUMNS)
    assert len(out) < 2 * len(hostile) and all(len(line) <= REPORT_COLUMNS for line in out.splitlines())
    assert out.replace(CONTINUED, "").replace(" ", "").replace("\n", "") == "x" * 500
