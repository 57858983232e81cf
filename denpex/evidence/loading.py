"""One way to read a model from a file: capped, decoded, validated, every problem in one error.

Plans, approvals, runbooks, settings, manifests, briefs and catalogs each come from a file that
someone else may have written. Each is read the same way, so each has a size cap, and each error
has one shape: ``{path}: {problem}[; {hint}]``::

    PLAN = FileKind("plan", invalid="not a valid isolation plan", hint="write plans with ...")
    plan = read_model(path, IsolationPlan, max_bytes=MAX_PLAN_BYTES, kind=PLAN, error=PlanError)

The problems, by what went wrong:

- unreadable: ``{path}: cannot read {what}: {reason}``
- too large:  ``{path}: {what} is over the {max_bytes}-byte cap``
- no syntax:  ``{path}: {what} is not JSON|YAML: {detail}``
- no mapping: ``{path}: {what} must be a mapping, got {type}``
- invalid:    ``{path}: {invalid}: {field}: {message}; ...`` (``invalid`` is "not a valid {what}")
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from denpex.evidence.files import read_at_most

__all__ = ["FileKind", "read_model", "read_mapping", "read_capped", "decode", "validated", "validation_problems"]

M = TypeVar("M", bound=BaseModel)
Syntax = Literal["json", "yaml"]


@dataclass(frozen=True)
class FileKind:
    """How one kind of file is named in its errors."""

    what: str
    """The file's name in a sentence: ``plan``, ``runbook``, ``the incident catalog``."""
    invalid: str = ""
    """Said of a file that decodes but does not validate; default ``not a valid {what}``."""
    hint: str = ""
    """What to do about a file whose content is wrong (``approve the plan with ...``)."""
    unparsable: str = ""
    """Said of a file that does not decode; default ``{what} is not JSON|YAML``."""
    shape: str = ""
    """Said of a file that is not a mapping (``{type}`` names what it is); default ``{what} must be a
    mapping, got {type}``."""

    def error(self, source: object, problem: str, *, hinted: bool = True) -> str:
        return f"{source}: {problem}" + (f"; {self.hint}" if self.hint and hinted else "")


def read_model(path: Path, model: type[M], *, max_bytes: int, kind: FileKind, error: Callable[[str], Exception],
               syntax: Syntax = "json", prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> M:
    """The ``model`` in the file at ``path``, read once, at most ``max_bytes``; any problem raises
    ``error(message)``. ``prepare`` may complete the decoded mapping (a base folder) first."""
    if syntax == "json" and prepare is None:
        return validated(model, read_capped(path, max_bytes, kind, error), path, kind, error)
    raw = read_mapping(path, max_bytes=max_bytes, kind=kind, error=error, syntax=syntax)
    return validated(model, prepare(raw) if prepare else raw, path, kind, error)


def read_mapping(path: Path, *, max_bytes: int, kind: FileKind, error: Callable[[str], Exception],
                 syntax: Syntax = "json", empty_ok: bool = False) -> dict[str, Any]:
    """The JSON or YAML mapping in the file at ``path`` (``{}`` for an empty YAML file if ``empty_ok``)."""
    raw = decode(read_capped(path, max_bytes, kind, error), path, kind, error, syntax)
    if raw is None and empty_ok:
        return {}
    if not isinstance(raw, dict):
        got = type(raw).__name__
        raise error(kind.error(path, kind.shape.replace("{type}", got) or f"{kind.what} must be a mapping, got {got}"))
    return raw


def decode(data: bytes, source: object, kind: FileKind, error: Callable[[str], Exception], syntax: Syntax) -> Any:
    """``data`` decoded as JSON or YAML (YAML's safe loader: no tags, no objects)."""
    try:
        return json.loads(data) if syntax == "json" else yaml.safe_load(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, yaml.YAMLError) as exc:
        raise error(kind.error(source, f"{kind.unparsable or f'{kind.what} is not {syntax.upper()}'}: {exc}")) from exc


def validated(model: type[M], raw: bytes | object, source: object, kind: FileKind,
              error: Callable[[str], Exception]) -> M:
    """``raw`` (JSON bytes, or a decoded value) as ``model``."""
    try:
        return model.model_validate_json(raw) if isinstance(raw, bytes) else model.model_validate(raw)
    except ValidationError as exc:
        broken = [e for e in exc.errors() if e["type"] == "json_invalid"]  # pydantic parsed the JSON itself
        problem = (f"{kind.unparsable or f'{kind.what} is not JSON'}: {broken[0]['msg'].removeprefix('Invalid JSON: ')}"
                   if broken else
                   f"{kind.invalid or f'not a valid {kind.what}'}: {validation_problems(exc)}")
        raise error(kind.error(source, problem)) from exc


def validation_problems(exc: ValidationError, first: int | None = None) -> str:
    """A pydantic error's problems (every one, or the ``first`` few) on one line:
    ``limits.max_nodes: Input should be ...; ...``."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
                     for err in exc.errors()[:first])


def read_capped(path: Path, max_bytes: int, kind: FileKind, error: Callable[[str], Exception]) -> bytes:
    """The file's bytes, at most ``max_bytes`` of them (read once: a file that grows meanwhile is still capped)."""
    try:
        data = read_at_most(path, max_bytes)
    except OSError as exc:
        raise error(kind.error(path, f"cannot read {kind.what}: {exc.strerror or exc}", hinted=False)) from exc
    if len(data) > max_bytes:
        raise error(kind.error(path, f"{kind.what} is over the {max_bytes}-byte cap", hinted=False))
    return data
