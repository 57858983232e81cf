"""The approval page (``denpex serve-approvals``) as its own process, for the tests and the demo,
and a person's answer on it, sent as the browser's form would send it.

    with approval_page(state_dir, api_url, log=tmp / "page.log") as page:
        decide(page.url, run_id, decision="approve", approver="alice", code="492039")
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from testkit.services.net import free_port, wait_http
from testkit.services.prefect import prefect_env
from testkit.services.process_group import stop_process_group

__all__ = ["ApprovalPage", "approval_page", "decide", "page_form"]

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class ApprovalPage:
    """A running page: its address and process."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def approval_page(state_dir: Path, api_url: str, *, log: Path, auth_string: str | None = None,
                  extra_args: Sequence[str] = (), home: Path | None = None) -> Iterator[ApprovalPage]:
    """``denpex serve-approvals`` on a free loopback port over ``state_dir``, resuming runs through
    ``api_url``; stopped (its process group) when the block ends."""
    port = free_port()
    env = prefect_env(home or state_dir.parent / "page-home", api_url=api_url, DENPEX_STATE_DIR=str(state_dir))
    if auth_string:
        env["PREFECT_API_AUTH_STRING"] = auth_string
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "denpex", "serve-approvals", "--port", str(port),
                                    *extra_args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    page = ApprovalPage(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_http(f"{page.url}/healthz", 120, process, log, interval_s=0.3)
        yield page
    finally:
        stop_process_group(process)


def page_form(client: httpx.Client, page_url: str, run_id: object) -> str:
    """Open the run's page as a browser does (the client keeps its CSRF cookie); its form's token."""
    response = client.get(f"{page_url}/runs/{run_id}")
    response.raise_for_status()
    found = _CSRF.search(response.text)
    if found is None:
        raise AssertionError(f"the run's page shows no decision form:\n{response.text[:2000]}")
    return html.unescape(found.group(1))


def decide(page_url: str, run_id: object, *, decision: str, approver: str, code: str = "",
           nodes: Sequence[str] | None = None, comment: str = "", headers: dict[str, str] | None = None) -> httpx.Response:
    """Answer run ``run_id`` on the page as its form does (``nodes`` None: every node the page
    offers). Returns the page's answer (303 to the run's page once it was resumed)."""
    with httpx.Client(timeout=60, headers=headers) as client:
        token = page_form(client, page_url, run_id)
        if nodes is None:
            shown = client.get(f"{page_url}/runs/{run_id}").text
            nodes = [html.unescape(n) for n in re.findall(r'name="nodes" value="([^"]+)"', shown)]
        form: dict[str, str | list[str]] = {"csrf": token, "decision": decision, "approver": approver, "code": code,
                                            "comment": comment, "nodes": list(nodes)}
        return client.post(f"{page_url}/runs/{run_id}/decision", data=form)
