"""``--help`` of every command: a flag that takes no value shows no type tag (issue 20 item 11)."""

from __future__ import annotations

import re

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from denpex.cli import app


def command_paths() -> list[list[str]]:
    """Every leaf command of the CLI, as the argv that reaches it."""
    root = typer.main.get_command(app)
    paths: list[list[str]] = []

    # Typer vendors its own click: its groups and options are recognised by what they have.
    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        else:
            paths.append(path)

    walk(root, [])
    return paths


def test_every_command_is_found() -> None:
    names = {" ".join(p) for p in command_paths()}
    assert {"triage", "isolate", "approve", "audit verify", "breaker status"} <= names


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p))
def test_flags_carry_no_type_tag(path: list[str]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    flags = [o for p in command.params if getattr(p, "is_flag", False) for o in (*p.opts, *p.secondary_opts)]
    assert "--help" in result.output
    for flag in [*flags, "--help"]:
        line = next(line for line in result.output.splitlines() if re.search(rf"(^|\s){re.escape(flag)}(\s|$)", line))
        assert "<bool>" not in line and "BOOLEAN" not in line, f"{' '.join(path)}: {line.strip()}"
