"""Evidence strings made inert where markdown (or a chat message) is built from them.

Hosts, process-group descriptions, reasons, hardware summaries and comments come from uploads,
dumps and forms: a tenant controls them. Placed in markdown as they are, a newline starts a new
block, a backtick run closes the report's code fence, and ``[text](url)`` or HTML adds content
beside the approval form that Denpex never wrote. Every builder goes through these helpers.
"""

from __future__ import annotations

import re
import textwrap

__all__ = ["inline", "code_block", "folded", "CONTINUED", "chat_text", "visible"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# Characters that draw nothing (Unicode's Default_Ignorable_Code_Point, with the bidi marks):
# bidirectional overrides and isolates (a "Trojan Source" stack frame or host name reads in
# another order than it is written), zero-width spaces and joiners, fillers, variation selectors
# and tag characters (which can hide a payload). Each run is written out by its codes, never drawn.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+")
# A run is shown by its first few distinct codes and its length, so a flood of invisible
# characters cannot push the visible text out of a bounded field.
_SHOWN_CODES = 3
# Every ASCII punctuation character may be backslash-escaped in CommonMark; these are the ones
# that open or close markup anywhere in a line (emphasis, code, links, images, HTML, tables).
_MARKUP = re.compile(r"([\\`*_{}\[\]()<>|~&])")
# GitHub's markdown (the Prefect UI's too) links bare "http://", "https://", "ftp://", "www." and
# e-mail addresses by itself. A backslash does not stop it there (the UI shows "http:\/\/" as
# written), but a code span does: such a word is written as code. It stops at what could end or
# break the span ("`"), a table's cell ("|"), or bracket it ("<>[]()": escaped, outside the span).
_WORD = re.compile(r"[^\s`|<>\[\]()]+")
_LINKS_ITSELF = re.compile(r"://|www\.|.@.", re.IGNORECASE)
# These start a block only at the start of a line (list, heading, quote, setext or thematic
# break, ordered list): escaped there, and left readable inside words (gpu-node-003, 10.0.0.1).
_BLOCK_START = re.compile(r"^(\s*)(?:([-+#=])|(\d+)([.]))")


def visible(text: str) -> str:
    r"""``text`` with each run of invisible characters written out by its codes: ``a\u202eb`` for
    one, ``\u200b×27`` for a run of one kind, ``\u200b\u2066…×9`` for a mixed run."""
    return _INVISIBLE.sub(_written_out, text)


def _written_out(match: re.Match[str]) -> str:
    run = match.group()
    kinds = list(dict.fromkeys(run))
    shown = "".join(_code(c) for c in kinds[:_SHOWN_CODES]) + ("…" if len(kinds) > _SHOWN_CODES else "")
    return shown + (f"×{len(run)}" if len(run) > 1 else "")


def _code(char: str) -> str:
    point = ord(char)
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def inline(text: object, *, limit: int = 2000, bare_links: bool = False) -> str:
    """``text`` as one line of literal markdown: control characters become spaces, overlong text
    is cut (with an ellipsis) so one field cannot bury the rest, invisible characters are written
    out (``visible``; after the cut, so a run of them cannot push the rest out), and markup is
    escaped. A word that a renderer would link by itself (``www.evil.example``, ``https://…``,
    ``a@b.c``) is written as code, unless ``bare_links`` (Denpex's own link text)."""
    flat = _CONTROL.sub(" ", str(text))
    if len(flat) > limit:
        flat = flat[:limit] + "…"
    shown = visible(flat)
    pieces: list[str] = []
    at = 0
    words = [] if bare_links else (w for w in _WORD.finditer(shown) if _LINKS_ITSELF.search(w.group()))
    for word in words:
        pieces += [_MARKUP.sub(r"\\\1", shown[at:word.start()]), f"`{word.group()}`"]
        at = word.end()
    escaped = "".join(pieces) + _MARKUP.sub(r"\\\1", shown[at:])
    return _BLOCK_START.sub(_escape_block_start, escaped, count=1)


def _escape_block_start(match: re.Match[str]) -> str:
    lead, mark, digits, dot = match.groups()
    return lead + ("\\" + mark if mark else digits + "\\" + dot)


CONTINUED = "↪ "
"""Starts each continuation line of a folded one: a line of the text never starts with it."""


def folded(text: str, width: int) -> str:
    """``text`` with every line longer than ``width`` folded onto continuation lines, each marked
    ``↪`` two columns past the line's own indent. A code block never wraps: Prefect's artifact
    page cuts what passes its width (about 96 columns at 1400 px), so the end of a reason was lost.
    Words are kept whole where they fit; a path or token longer than a line is cut. The indent
    carried is at most a quarter of the width: a line of 500 spaces and a word (a frame's file
    name comes from the job) would otherwise fold one character per line."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        body = line.lstrip(" ")
        indent = " " * min(len(line) - len(body), width // 4)
        out += textwrap.wrap(indent + body, width=width, subsequent_indent=indent + "  " + CONTINUED,
                             break_on_hyphens=False, expand_tabs=False, replace_whitespace=False) or [line]
    return "\n".join(out)


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
    flat = visible(_CONTROL.sub(" ", str(text))[:limit])
    return flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
