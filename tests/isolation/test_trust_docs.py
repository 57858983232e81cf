"""The README states the isolation trust model (issue 8, done-when)."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_states_the_trust_model() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Trust model", 1)[1].split("\n## ", 1)[0]
    for part in ("**What is trusted**", "**Who can approve**", "**Where state lives**",
                 "**An attacker who can write a plan file**"):
        assert part in section, part
    for fact in ("DENPEX_STATE_DIR", "ed25519", "prefect-ui", "audit.key", "cannot raise limits"):
        assert fact in section, fact
