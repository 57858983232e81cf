"""The test harness itself: a hung test fails within its own limit, in minutes, not after the
quarter hour the suite once allowed every test.

The inner run is a real pytest process (``pytester``) with pytest-timeout as this suite uses it.
"""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

HANGS = """
import re
import time

import pytest


@pytest.mark.timeout(3)
def test_hangs():
    time.sleep(600)


def test_passes():
    pass
"""


def test_a_deliberately_hung_test_fails_within_its_limit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(HANGS)
    start = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    elapsed = time.monotonic() - start
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*Failed: Timeout (>3.0s) from pytest-timeout*"])
    assert elapsed < 60, f"a test limited to 3 s took {elapsed:.0f} s to fail"


def test_every_test_has_a_limit_of_minutes() -> None:
    """Unmarked tests get the suite's default; the slow real-service modules mark their own,
    sized to what they start (tests/README.md lists them)."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 120
    limits = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        text = path.read_text()
        limits += [int(n) for n in re.findall(r"mark\.timeout\((\d+)\)", text)]
    assert limits and max(limits) <= 600, "no test may wait more than 10 minutes to fail"
