"""The approval page's Host allowlist (``denpex.approval_page.hosts``): what a rebound name can
never pass, and the names an operator lists."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.approval_page.hosts import check_host_pattern, host_allowed


@pytest.mark.parametrize("header", ["127.0.0.1:8090", "10.0.0.5", "[::1]:8090", "[fe80::1]", "localhost:8090",
                                    "LOCALHOST", "approvals.example.com", "approvals.example.com:443",
                                    "approvals.example.com.", "x.gpu.example.com", "a.b.gpu.example.com:1"])
def test_addresses_localhost_and_listed_names_are_answered(header: str) -> None:
    assert host_allowed(header, ("approvals.example.com", "*.gpu.example.com"))


@pytest.mark.parametrize("header", ["", ":8090", "evil.example", "gpu.example.com", "approvals.example.com.evil.example",
                                    "xapprovals.example.com", "evilgpu.example.com", "[::1", "localhost.evil.example",
                                    "127.0.0.1.nip.io"])
def test_any_other_name_is_refused(header: str) -> None:
    assert not host_allowed(header, ("approvals.example.com", "*.gpu.example.com"))


def test_a_pattern_must_be_a_host_name() -> None:
    assert check_host_pattern("Approvals.Example.com") == "approvals.example.com"
    assert check_host_pattern("*.gpu.example.com") == "*.gpu.example.com"
    for bad in ("", "*", "*.", "evil.example/x", "a..b", "https://approvals.example.com", "a b", "*.*.example.com"):
        with pytest.raises(ValueError, match="not a host name"):
            check_host_pattern(bad)
    with pytest.raises(ValueError, match="covers a whole top-level domain"):
        check_host_pattern("*.com")


def test_serve_approvals_refuses_a_name_that_is_no_host_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "denpex", "serve-approvals", "--state-dir", str(tmp_path / "state"),
                           "--allowed-host", "https://approvals.example.com"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert done.returncode == 2 and "--allowed-host: 'https://approvals.example.com' is not a host name" in done.stderr
