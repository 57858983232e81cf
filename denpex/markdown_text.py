"""Evidence strings made inert where markdown (or a chat message) is built from them.

Hosts, process-group descriptions, reasons, hardware summaries and comments come from uploads,
dumps and forms: a tenant controls them. Placed in markdown as they are, a newline starts a new
block, a backtick run closes the report's code fence, and ``[text](url)`` or HTML adds content
beside the approval form that Denpex never wrote. Every builder goes through these helpers.
"""

from __future__ import annotations

import re

__all__ = ["inline", "code_block", "chat_text", "visible"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# Invisible format characters: bidirectional overrides and isolates (a "Trojan Source" stack frame
# or host name reads in another order than it is written), zero-width spaces and joiners, the
# byte-order mark and tag characters. Shown as ``\u202e``, never rendered.
_INVISIBLE = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
                        "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]")
# Every ASCII punctuation character may be backslash-escaped in CommonMark; these are the ones
# that open or close markup anywhere in a line (emphasis, code, links, images, HTML, tables).
_MARKUP = re.compile(r"([\\`*_{}\[\]()<>|~&])")
# These start a block only at the start of a line (list, heading, quote, setext or thematic
# break, ordered list): escaped there, and left readable inside words (gpu-node-003, 10.0.0.1).
_BLOCK_START = re.compile(r"^(\s*)(?:([-+#=])|(\d+)([.]))")


def visible(text: str) -> str:
    """``text`` with each invisible format character written out as its code (``\u202e``)."""
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def inline(text: object, *, limit: int = 2000) -> str:
    """``text`` as one line of literal markdown: control characters become spaces, invisible
    format characters are written out (``visible``), markup is escaped, and overlong text is cut
    (with an ellipsis) so one field cannot bury the rest."""
    flat = visible(_CONTROL.sub(" ", str(text)))
    if len(flat) > limit:
        flat = flat[:limit] + "…"
    escaped = _MARKUP.sub(r"\\\1", flat)
    return _BLOCK_START.sub(_escape_block_start, escaped, count=1)


def _escape_block_start(match: re.Match[str]) -> str:
    lead, mark, digits, dot = match.groups()
    return lead + ("\\" + mark if mark else digits + "\\" + dot)


def code_block(text: str, info: str = "text") -> str:
    """``text`` in a fenced code block that nothing inside it can close: the fence is one backtick
    longer than the longest backtick run in the text (CommonMark closes a fence only with a run
    at least as long), and HTML inside a code block is shown, never rendered. Invisible format
    characters are written out (``visible``): a bidi override reorders a code block too."""
    text = visible(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def chat_text(text: object, *, limit: int = 500) -> str:
    """``text`` for a Slack-compatible message: one line, with ``&``, ``<`` and ``>`` escaped as
    Slack requires (``<url|label>`` and ``<!channel>`` are its only active markup)."""
    flat = visible(_CONTROL.sub(" ", str(text)))[:limit]
    return flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
