"""The run's name and log lines from untrusted parameters: bounded, one line, nothing but safe text."""

from __future__ import annotations

import pytest

from denpex.workflow.run_story import MAX_NAME_PART, incident_run_name, plain


@pytest.mark.parametrize(
    ("cluster", "incident", "name"),
    [
        pytest.param("lab", "inc-42", "lab/inc-42", id="plain"),
        pytest.param("lab\n", "a b\tc", "lab_/a_b_c", id="whitespace-and-newline"),
        pytest.param(None, "../../etc/passwd", "?/.._.._etc_passwd", id="missing-cluster-and-slashes"),
        pytest.param("", 42, "?/?", id="empty-and-not-a-string"),
        pytest.param("lab", "[x](http://evil)<b>", "lab/_x_http_evil_b_", id="markup"),
        pytest.param("lab", "x" * 5000, "lab/" + "x" * MAX_NAME_PART, id="long"),
    ],
)
def test_the_run_name_is_bounded_and_sanitized(cluster: object, incident: object, name: str) -> None:
    assert incident_run_name(cluster, incident) == name


def test_plain_text_is_one_bounded_line() -> None:
    assert plain("a\nb\x1b[31mc\x7f") == "a b [31mc"
    assert plain("y" * 1000, 20) == "y" * 17 + "..."
