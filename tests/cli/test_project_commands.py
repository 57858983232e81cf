"""``denpex serve`` and ``denpex register-blocks`` hand over to the Prefect project's own entry
points (``python -m flows.serve``, ``python -m blocks.register``) in the repository root, with this
interpreter, and leave this process's ``sys.path`` alone (issue 32): the core never imports the
project. The hand-over replaces the process, so it is recorded here instead of made.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from denpex.cli import main

ROOT = Path(__file__).resolve().parents[2]


class HandedOver(Exception):
    """Raised by the stand-in for os.execve: what the command would have become."""

    def __init__(self, path: str, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(path)
        self.path, self.argv, self.env = path, argv, env


def _hand_over(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> HandedOver:
    def execve(path: str, args: list[str], env: dict[str, str]) -> None:
        raise HandedOver(path, list(args), dict(env))

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    before = list(sys.path)
    with pytest.raises(HandedOver) as handed:
        main(argv)
    assert sys.path == before
    return handed.value


def test_serve_becomes_python_m_flows_serve_with_the_same_options(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _hand_over(["serve", "--only", "manual", "--only", "on-alert", "--spawn-runs"], monkeypatch)
    assert handed.path == sys.executable
    assert handed.argv == [sys.executable, "-m", "flows.serve", "--only=manual", "--only=on-alert", "--spawn-runs"]
    # The project is imported from the root that python -m puts first, whatever the caller's setting.
    assert "PYTHONSAFEPATH" not in handed.env and handed.env["PATH"] == os.environ["PATH"]

    import flows.serve

    served: list[Any] = []
    monkeypatch.setattr(flows.serve, "serve", lambda only, *, spawn_runs=False: served.append((only, spawn_runs)))
    flows.serve.main(handed.argv[3:])
    assert served == [({"manual", "on-alert"}, True)]


def test_serve_with_no_option_serves_every_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _hand_over(["serve"], monkeypatch)
    assert handed.argv == [sys.executable, "-m", "flows.serve"]


def test_register_blocks_becomes_python_m_blocks_register_with_the_same_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _hand_over(["register-blocks", "--runbook", "quick", "--evidence-folder", "-odd name",
                         "--overwrite"], monkeypatch)
    assert handed.argv == [sys.executable, "-m", "blocks.register", "--runbook=quick",
                           "--evidence-folder=-odd name", "--overwrite"]

    import blocks.register

    made: list[dict[str, Any]] = []
    monkeypatch.setattr(blocks.register, "register", lambda **options: made.append(options))
    blocks.register.main(handed.argv[3:])
    assert made == [{"runbook": "quick", "evidence_folder": "-odd name", "overwrite": True}]
    blocks.register.main(_hand_over(["register-blocks"], monkeypatch).argv[3:])
    assert made[1] == {"runbook": "hang-triage", "evidence_folder": None, "overwrite": False}


def test_outside_the_repository_root_nothing_is_handed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail("handed over outside the root"))
    monkeypatch.chdir(tmp_path)
    for argv in (["serve"], ["register-blocks"]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        assert capsys.readouterr().err == (f"denpex: error: {tmp_path} is not the Denpex repository root "
                                           "(no flows/serve.py); run this from there\n")
