"""How the ``denpex`` command line shows its help and its usage errors.

typer labels every option with its Python type (``<str>``, ``<int range>``, ``<list[Path]>``)
and prints a usage error as a boxed page. Operators read the first and scripts parse the second,
so the tree of commands is tidied once before it runs:

- an option without a metavar of its own is shown with its name (``--world-size WORLD_SIZE``), a
  choice with its values (``--format text|json``);
- a default that the help text already states is not shown a second time;
- a usage error (a bad value, an unknown option, a missing one) is one ``denpex: error:`` line and
  exit status 2, as every other error of the command line.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import typer
import typer.core

__all__ = ["tidy", "commands", "run_tidy"]

# typer 0.29 vendors click; earlier versions use click itself.
_click: Any = getattr(typer.core, "_click", None) or importlib.import_module("click")
# click 8.2 and later; before it, no arguments printed the help without raising (an empty tuple
# catches nothing).
_NO_ARGS_IS_HELP: Any = getattr(_click.exceptions, "NoArgsIsHelpError", ())
# A help text that already says the default: "(default 256 MiB)", "default: the newest time".
_STATES_DEFAULT = re.compile(r"\(default\b|\bdefault:|\bdefaults to\b", re.IGNORECASE)


def tidy(command: Any) -> Any:
    """Give every option of ``command``'s tree a plain metavar and one statement of its default."""
    for _path, leaf in commands(command):
        for param in leaf.params:
            _tidy_param(param)
    return command


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every runnable command under ``command``, with its path of names (groups left out)."""
    if hasattr(command, "list_commands"):
        context = _click.Context(command)
        for name in command.list_commands(context):
            yield from commands(command.get_command(context, name), (*path, name))
    else:
        yield path, command


def _tidy_param(param: Any) -> None:
    is_option = getattr(param, "param_type_name", "") == "option"
    if param.metavar is None and not getattr(param, "is_flag", False):
        choices = _choices(param)
        if choices:
            param.metavar = "|".join(str(getattr(c, "value", c)) for c in choices)
        elif is_option:
            longest = max(param.opts, key=len)
            param.metavar = longest.lstrip("-").replace("-", "_").upper()
        else:
            param.metavar = (param.name or "value").upper()
    if not is_option and hasattr(param, "display_type_rich"):
        # typer prints an argument's Python type beside its name whatever its metavar says.
        param.display_type_rich = lambda ctx: None
    if is_option and _STATES_DEFAULT.search(param.help or ""):
        param.show_default = False  # the help says it in words already


def _choices(param: Any) -> Sequence[Any] | None:
    described = getattr(param, "type_descriptor", None)  # typer 0.29's own parameter types
    if described is not None:
        return described.choices if described.is_choice else None
    return getattr(getattr(param, "type", None), "choices", None)  # click's


def run_tidy(app: typer.Typer, argv: Sequence[str] | None, *, prog_name: str, exit_unusable: int) -> NoReturn:
    """Run ``app`` as the console script does, with its help tidied and its usage errors short."""
    command = tidy(typer.main.get_command(app))
    try:
        status = command.main(args=list(argv) if argv is not None else None, prog_name=prog_name,
                              standalone_mode=False)
    except _NO_ARGS_IS_HELP as exc:
        exc.show()  # no arguments at all: the help page itself
        sys.exit(exc.exit_code)
    except _click.exceptions.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog_name
        typer.echo(f"{prog_name}: error: {exc.format_message()} (see `{where} --help`)", err=True)
        sys.exit(exit_unusable)
    except _click.exceptions.ClickException as exc:
        typer.echo(f"{prog_name}: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:  # end of input at a prompt
        typer.echo("Aborted.", err=True)
        sys.exit(1)
    sys.exit(status if isinstance(status, int) else 0)
