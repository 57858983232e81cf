"""The one loader every model file goes through (``denpex.evidence.loading``): one cap, one read,
one error shape, and the loaders that had no cap now have one."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from denpex.evidence.loading import FileKind, read_mapping, read_model
from denpex.isolation.approval import MAX_APPROVAL_BYTES, load_approval, load_trusted_approvers
from denpex.isolation.config import load_settings
from denpex.isolation.errors import ApprovalError, ConfigError, RunbookError
from denpex.isolation.runbook import load_runbook


class Thing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    size: int = 0


KIND = FileKind("thing", hint="write it with `make thing`")


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "thing.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize(("text", "syntax", "message"), [
    (b"x" * 65, "json", "thing is over the 64-byte cap"),
    ('{"name": ', "json", "thing is not JSON: "),
    ("name: [", "yaml", "thing is not YAML: "),
    ("- a\n- b\n", "yaml", "thing must be a mapping, got list; write it"),
    ('{"name": 3, "colour": "red"}', "json", "not a valid thing: name: Input should be a valid string; colour: "),
    ("!!python/object/apply:os.system ['true']", "yaml", "thing is not YAML: "),  # the safe loader only
])
def test_every_problem_has_one_shape(tmp_path: Path, text: str | bytes, syntax: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as raised:
        read_model(path, Thing, max_bytes=64, kind=KIND, error=ValueError, syntax=syntax)  # type: ignore[arg-type]
    assert str(raised.value).startswith(f"{path}: {message}"), str(raised.value)
    # The hint is for a file whose content is wrong, not for one too large to read.
    assert str(raised.value).endswith("; write it with `make thing`") == ("cap" not in message)


def test_a_missing_file_and_a_good_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"thing.json: cannot read thing: No such file or directory$"):
        read_model(tmp_path / "thing.json", Thing, max_bytes=64, kind=KIND, error=ValueError)
    path = _write(tmp_path, '{"name": "a", "size": 2}')
    assert read_model(path, Thing, max_bytes=64, kind=KIND, error=ValueError) == Thing(name="a", size=2)
    yaml_path = _write(tmp_path, "name: a\n")
    assert read_model(yaml_path, Thing, max_bytes=64, kind=KIND, error=ValueError, syntax="yaml").name == "a"
    assert read_mapping(_write(tmp_path, ""), max_bytes=64, kind=KIND, error=ValueError, syntax="yaml",
                        empty_ok=True) == {}


def test_files_that_had_no_cap_have_one(tmp_path: Path) -> None:
    """Before the one loader, an approval, the trusted approvers and the isolation settings were read
    whole, whatever their size."""
    approval = tmp_path / "approval.json"
    approval.write_bytes(b"{" + b" " * MAX_APPROVAL_BYTES + b"}")
    with pytest.raises(ApprovalError, match="approval is over the 4194304-byte cap$"):
        load_approval(approval)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(ConfigError, match="trusted approvers is over the 1048576-byte cap"):
        load_trusted_approvers(big)
    with pytest.raises(ConfigError, match="the settings file is over the 1048576-byte cap"):
        load_settings(big, {})


def test_the_loaders_keep_their_own_words(tmp_path: Path) -> None:
    runbook = tmp_path / "runbook.yaml"
    runbook.write_text("name: x\n")
    with pytest.raises(RunbookError, match=r"runbook.yaml: invalid runbook: name: .*; version: Field required"):
        load_runbook(runbook)
    runbook.write_text("[1, 2]\n")
    with pytest.raises(RunbookError, match="a runbook is a YAML mapping, got list"):
        load_runbook(runbook)
