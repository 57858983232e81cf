"""How a ``denpex`` command stops on an error: one ``denpex: error:`` line on stderr and a status.

Every command uses 0 for done and 2 for unusable input (docs/contracts.md); the commands that
have more outcomes name their own statuses beside them (``isolate``, ``node-agent``).
"""

from __future__ import annotations

import typer

__all__ = ["EXIT_UNUSABLE", "fail"]

EXIT_UNUSABLE = 2


def fail(message: str, code: int = EXIT_UNUSABLE) -> typer.Exit:
    """Print one line on stderr and return the exit to raise (unusable input unless ``code``)."""
    typer.echo(f"denpex: error: {message}", err=True)
    return typer.Exit(code)
