"""Progress of a long triage on stderr, only when stderr is a terminal.

Reading 32,768 dumps takes minutes; a person at a terminal should see it move. Scripts that
read ``--format json`` from stdout, and logs that capture stderr, get nothing extra.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from denpex.analysis.workers import Progress

__all__ = ["dump_progress"]


@contextmanager
def dump_progress(stream: TextIO) -> Iterator[Progress | None]:
    """A ``(done, total)`` callback drawing a bar on ``stream`` if it is a terminal, else None."""
    if not stream.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

    with Bar(TextColumn("reading dumps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
             console=Console(file=stream), transient=True) as bar:
        task = bar.add_task("dumps", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance
