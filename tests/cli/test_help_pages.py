"""What a newcomer meets at the command line (issue 31 items 5 to 7 and the cosmetic ones): every
command's help shows its options by name with an example and no Python type tags, ``--version``
answers, a usage error is one ``denpex: error:`` line like every other error, and ``--chart``
into a folder that does not exist yet makes the folder.

Each case runs ``denpex.cli.main``, the console script itself, so the help is the one users see.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer

from denpex.cli import app, main
from denpex.cli.help import commands

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gloo"
# typer's labels: <str>, <int range>, <path>, <list[Path]>, <text|json>, ...
TYPE_TAG = re.compile(r"<(?:str|int|float|bool|path|file|dir|datetime|uuid)(?: range)?>|<list\[|<[a-z-]+(?:\|[a-z-]+)+>")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    captured = capsys.readouterr()
    code = stopped.value.code
    return (code if isinstance(code, int) else 0), captured.out, captured.err


def _paths() -> list[tuple[str, ...]]:
    return [path for path, _command in commands(typer.main.get_command(app))]


@pytest.mark.parametrize("path", _paths(), ids=" ".join)
def test_every_commands_help_names_its_options_and_shows_an_example(path: tuple[str, ...],
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([*path, "--help"], capsys)
    assert code == 0
    options = out.split("Options:", 1)[1]
    named = [line.split()[0] for line in options.splitlines() if line.strip().startswith("--")]
    assert named and named != ["--help"], f"{' '.join(path)} shows no option of its own:\n{out}"
    assert "Example:" in out and f"denpex {' '.join(path)}" in out.split("Example:", 1)[1]
    tags = TYPE_TAG.findall(out)
    assert not tags, f"{' '.join(path)}: {tags}\n{out}"
    assert not re.search(r"\(default[^)]*\)\.?\s*\[default:", out), f"a default stated twice:\n{out}"


def test_the_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--version"], capsys)
    assert code == 0 and re.fullmatch(r"denpex \S+\n", out)


@pytest.mark.parametrize("argv", [
    ["triage", "some-folder", "--world-size", "0"],
    ["triage", "some-folder", "--no-such-option"],
    ["keys", "create", "--cluster", "c1"],  # --tenant missing
    ["serve", "--only", "no-such-deployment"],
], ids=["out-of-range", "unknown-option", "missing-option", "unknown-deployment"])
def test_a_usage_error_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("denpex: error: "), err


def test_no_arguments_shows_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run([], capsys)
    assert "Commands:" in out + err and "triage" in out + err and code == 2


def test_a_chart_into_a_missing_folder_makes_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "not" / "yet" / "chart.png"
    code, stdout, err = _run(["triage", str(FIXTURES / "withheld_one"), "--format", "json", "--chart", str(out)], capsys)
    assert code == 0, err
    assert json.loads(stdout)["verdict"] == "localized" and out.is_file()


def test_a_chart_where_no_folder_can_be_made_is_refused_before_triage(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, stdout, err = _run(["triage", str(FIXTURES / "withheld_one"), "--chart", str(blocker / "chart.png")], capsys)
    assert code == 2 and stdout == ""
    assert len(err.splitlines()) == 1 and "cannot create the folder" in err, err


def test_the_serve_commands_deployment_names_are_the_served_ones() -> None:
    # The CLI checks --only before it imports the Prefect project; the names must not drift.
    from denpex.cli.project import SERVED
    from flows.serve import served_deployments

    assert set(SERVED) == {d.name for d in served_deployments()}


def test_an_abort_or_a_bug_in_a_command_comes_out_as_itself(capsys: pytest.CaptureFixture[str]) -> None:
    from denpex.cli.help import run_tidy

    tiny = typer.Typer()

    @tiny.command()
    def stop(bug: bool = False) -> None:
        """Example: x stop"""
        if bug:
            raise RuntimeError("a bug")
        raise typer.Abort()

    with pytest.raises(SystemExit) as stopped:
        run_tidy(tiny, ["--no-bug"], prog_name="x", exit_unusable=2)
    assert stopped.value.code == 1 and capsys.readouterr().err == "Aborted.\n"
    with pytest.raises(RuntimeError, match="a bug"):  # its own traceback, not one about the handler
        run_tidy(tiny, ["--bug"], prog_name="x", exit_unusable=2)
