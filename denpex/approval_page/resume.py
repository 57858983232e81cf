"""Resume a paused run with its signed decision, through Prefect's HTTP API (the core imports no
Prefect): ``POST {api}/flow_runs/{id}/resume`` with ``{"run_input": {"record": "<JSON>"}}``.

The record is the only thing the run's input holds: no code, nothing that proves a person to
whoever reads the API. The flow trusts none of it without the page's database (``page_decision``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from pydantic import SecretStr

from denpex.isolation.approval import Approval
from denpex.ingest.alert_event import api_headers

__all__ = ["PrefectLink", "ResumeResult", "resume_run", "ended_runs", "ENDED_STATES"]

ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "CRASHED"})
"""Prefect's final state types: a run in one of them waits for nothing."""


@dataclass(frozen=True)
class PrefectLink:
    """How the page reaches the Prefect API: its URL and the basic-auth string (from the
    environment only, never an option that ``ps`` would show)."""

    api_url: str
    auth: SecretStr | None = None
    timeout_s: float = 15.0
    attempts: int = 5
    """Tries of a resume the API did not take (unreachable, or 503 from a busy SQLite), with
    backoff from 0.5 s to 4 s between them."""


@dataclass(frozen=True)
class ResumeResult:
    resumed: bool
    message: str


def resume_run(link: PrefectLink, record: Approval) -> ResumeResult:
    """Resume ``record.flow_run_id`` with ``record``. A busy SQLite server answers 503 for a locked
    database (Prefect rolls the resume back first), so that is retried a few times."""
    url = f"{link.api_url.rstrip('/')}/flow_runs/{record.flow_run_id}/resume"
    headers = api_headers(link.auth.get_secret_value() if link.auth else None)
    body = {"run_input": {"record": record.model_dump_json()}}
    message = "no attempt was made"
    for attempt in range(max(1, link.attempts)):
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=link.timeout_s)
        except httpx.HTTPError as exc:
            message = f"the Prefect API at {link.api_url} could not be reached ({exc})"
        else:
            if response.status_code != 503:
                return _result(response)
            message = "the Prefect API answered 503"
        if attempt + 1 < link.attempts:
            time.sleep(min(4.0, 0.5 * 2 ** attempt))
    return ResumeResult(False, message)


def _result(response: httpx.Response) -> ResumeResult:
    if response.status_code >= 400:
        return ResumeResult(False, f"the Prefect API answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        answer = response.json()
    except ValueError:
        return ResumeResult(False, "the Prefect API answered something that is not JSON")
    status = str(answer.get("status", "")).upper()
    if status == "ACCEPT":
        return ResumeResult(True, "the run was resumed with the signed decision")
    details = answer.get("details") or {}
    return ResumeResult(False, f"the run was not resumed ({status or 'no status'}): {details.get('reason', '')}")


def ended_runs(link: PrefectLink, run_ids: Sequence[str]) -> dict[str, str] | None:
    """Of ``run_ids``, those Prefect has ended (or no longer knows), each with its state's name:
    the page stops offering them. None when the API cannot be asked, or answers something that
    is not a list of runs: then nothing is hidden.

    Only what the page lists and offers depends on it. An API writer can end a run anyway; the
    decision's integrity never rests on what Prefect says. Whoever reaches the page makes it ask,
    so the answer is bounded in time (``_ASK_S`` in all, not per read) and in size."""
    if not run_ids:
        return {}
    found = _runs_in_prefect(link, run_ids)
    return None if found is None else _ended_of(found, run_ids)


_ASK_S = 3.0
_MAX_ANSWER_BYTES = 4 * 1024 * 1024


def _runs_in_prefect(link: PrefectLink, run_ids: Sequence[str]) -> dict[str, dict[str, object]] | None:
    """``POST /flow_runs/filter`` for ``run_ids``: the runs by id, or None."""
    url = f"{link.api_url.rstrip('/')}/flow_runs/filter"
    body = {"flow_runs": {"id": {"any_": list(run_ids)}}, "limit": len(run_ids)}
    headers = api_headers(link.auth.get_secret_value() if link.auth else None)
    deadline = time.monotonic() + _ASK_S
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=_ASK_S) as response:
            if response.status_code != 200:
                return None
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > _MAX_ANSWER_BYTES or time.monotonic() > deadline:
                    return None
        answer = json.loads(data)
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(answer, list) or not all(isinstance(r, dict) and isinstance(r.get("id"), str) for r in answer):
        return None  # not Prefect's answer (a proxy's page, a misconfigured URL): hide nothing
    return {r["id"]: r for r in answer}


def _ended_of(found: dict[str, dict[str, object]], run_ids: Sequence[str]) -> dict[str, str]:
    ended = {run_id: "unknown to Prefect" for run_id in run_ids if run_id not in found}
    for run_id, run in found.items():
        if str(run.get("state_type") or "").upper() in ENDED_STATES:
            ended[run_id] = str(run.get("state_name") or run.get("state_type"))[:64]
    return ended
