"""The audit log's stored copies: the checked one per cluster, and one per incident beside its evidence.

The audit store (``audit_store`` in the operator's settings, ``$DENPEX_AUDIT_STORE``, else
``<state_dir>/audit-store``) holds, per cluster::

    <cluster-slug>/audit.jsonl   the whole machine-wide log as it stood after this cluster's latest write
    <cluster-slug>/head.json     that copy's last record, as the log holds it (hash and mac included)

``lab`` -> ``lab/``; ``Prod East/1`` -> ``prod-east-1/`` (the rule of the target block names).
Every writer (an execution's records, a decision, a return to service) appends to the state
directory's log and then extends its cluster's copy (``update_stored_copy``); every action first
checks that the log extends it (``check_extends_stored_copy``), reading only the small head.
What "extends" means is in ``denpex.isolation.audit``'s docstring.

The evidence store, where one is configured, also gets ``audit/<incident>/audit.jsonl`` after
each run: the log as the incident left it, for whoever reads the incident's evidence. It only
grows too, but no action is checked against it; the cluster's copy is the one that is.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError

from denpex.evidence.errors import EvidenceError
from denpex.evidence.store import EvidenceStore
from denpex.isolation.audit import AuditLog, AuditRecord
from denpex.isolation.errors import AuditChainError, AuditError, StoreError
from denpex.isolation.file_lock import file_lock

__all__ = ["cluster_slug", "stored_copy_name", "stored_head_name", "incident_copy_name",
           "check_extends_stored_copy", "update_stored_copy", "copy_audit_log"]

_MAX_COPY_BYTES = 1 << 30
_MAX_HEAD_BYTES = 16 << 20  # one record; an intent that lists thousands of jobs is long


def cluster_slug(cluster: str) -> str:
    """The cluster's folder in the audit store: lowercase letters, digits and dashes.

    >>> cluster_slug("Prod East/1")
    'prod-east-1'
    """
    return re.sub(r"[^a-z0-9]+", "-", cluster.lower()).strip("-") or "default"


def stored_copy_name(cluster: str) -> str:
    """``<cluster-slug>/audit.jsonl``: the cluster's copy of the whole log."""
    return f"{cluster_slug(cluster)}/audit.jsonl"


def stored_head_name(cluster: str) -> str:
    """``<cluster-slug>/head.json``: the last record of the cluster's copy."""
    return f"{cluster_slug(cluster)}/head.json"


def incident_copy_name(log: AuditLog, incident_id: str) -> str:
    """``audit/<incident>/<log file name>``: the incident's copy in its evidence store."""
    return f"audit/{incident_id}/{log.path.name}"


def check_extends_stored_copy(log: AuditLog, store: EvidenceStore, cluster: str) -> None:
    """Raise AuditChainError when ``log`` does not extend ``cluster``'s copy in ``store``.

    The caller verifies the log's keyed chain first (the executor does, under its run lock): the
    log then extends the copy exactly when it holds the copy's head record unchanged. A log
    longer than the copy is fine (a writer died between its append and its copy, or another
    cluster wrote since); one that ends before the head, or holds another record at its seq, was
    cut, rolled back or replaced. No copy yet (the cluster's first write) passes. StoreError
    when the copy cannot be read: a copy that cannot be read cannot be checked.
    """
    name, head_name = stored_copy_name(cluster), stored_head_name(cluster)
    head = _stored_head(store, name, head_name, log)
    if head is None:
        return
    problem = _not_extending(head, _hashes(_read_log(log)))
    if problem:
        raise AuditChainError(_refusal(log, store, name, problem))


def update_stored_copy(log: AuditLog, store: EvidenceStore, cluster: str) -> str | None:
    """Extend ``cluster``'s copy to the whole log (then its head); returns the copy's URI, None
    when the log has no record yet.

    The copy only grows: a log that does not extend it is refused (AuditChainError), so a cut
    log never replaces the record of what was done. Copies are made one at a time per state
    directory, and one already as new as the log is left alone, so two writers finishing in
    either order never take a copy back.
    """
    return _extend(log, store, stored_copy_name(cluster), stored_head_name(cluster))


def copy_audit_log(log: AuditLog, store: EvidenceStore, incident_id: str) -> str:
    """Copy the whole log into the evidence store under ``audit/<incident>/``; returns its URI.

    Like the cluster's copy it only grows (AuditChainError otherwise); nothing is checked
    against it before acting.
    """
    name = incident_copy_name(log, incident_id)
    return _extend(log, store, name, None) or _uri(store, name)


def _extend(log: AuditLog, store: EvidenceStore, name: str, head_name: str | None) -> str | None:
    with _copy_lock(log):
        data = _read_log(log)
        hashes = _hashes(data)
        if not hashes:
            return None
        try:
            head = _stored_head(store, name, head_name, log)
        except StoreError as exc:
            raise StoreError(f"{exc}; the local copy at {log.path} is intact") from exc
        if head is not None:
            problem = _not_extending(head, hashes)
            if problem:
                raise AuditChainError(_refusal(log, store, name, problem).replace(
                    "nothing was done", "the copy was left as it was"))
            if head.seq >= max(hashes):
                return _uri(store, name)
        last = data[data.rstrip(b"\n").rfind(b"\n") + 1:]
        try:
            # The whole copy first, then its head: a copy newer than its head is still checked,
            # against the older head; the reverse would name a record the copy lacks.
            store.write(name, data)
            if head_name is not None:
                store.write(head_name, last)
        except EvidenceError as exc:
            raise StoreError(f"cannot copy the audit log to {_uri(store, name)}: {exc}; the local copy "
                             f"at {log.path} is intact") from exc
    return _uri(store, name)


@contextmanager
def _copy_lock(log: AuditLog) -> Iterator[None]:
    """One copy at a time per state directory, held across read, compare and write (a store has no
    compare-and-swap); not the log's own lock, so an upload never holds up an append."""
    with file_lock(log.path.with_name(log.path.name + ".copy.lock"), what="the copy lock", error=StoreError):
        yield


def _read_log(log: AuditLog) -> bytes:
    """The log's whole records (a torn tail is for ``denpex audit verify`` to report)."""
    try:
        raw = log.path.read_bytes()
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise AuditError(f"{log.path}: cannot read audit log: {exc.strerror or exc}") from exc
    return raw[:raw.rfind(b"\n") + 1]


def _hashes(data: bytes) -> dict[int, str]:
    hashes: dict[int, str] = {}
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = AuditRecord.model_validate_json(line)
        except ValidationError:
            continue  # the chain check names a damaged line; here it is simply not the head
        hashes[record.seq] = record.hash
    return hashes


def _not_extending(head: AuditRecord, hashes: dict[int, str]) -> str:
    """Why a log whose records hash to ``hashes`` does not extend a copy ending at ``head``; ''."""
    at = f"seq {head.seq} of {head.time.isoformat()}"
    if head.seq not in hashes:
        ends = f"ends at seq {max(hashes)}" if hashes else "has no record"
        return (f"the copy goes up to {at}, but this log {ends}: it was cut back, removed or replaced "
                f"({head.seq - max(hashes, default=0)} record(s) missing)")
    if hashes[head.seq] != head.hash:
        return (f"this log holds another record at {at} than the copy: it was cut back and written "
                "again, or replaced (or another state directory writes this cluster's copy)")
    return ""


def _stored_head(store: EvidenceStore, name: str, head_name: str | None, log: AuditLog) -> AuditRecord | None:
    """The copy's last record: its head object, else the copy's last line; None: no copy yet."""
    raw = _read_stored(store, head_name, _MAX_HEAD_BYTES) if head_name else None
    where = head_name
    if raw is None:
        copy = _read_stored(store, name, _MAX_COPY_BYTES)
        if copy is None or not copy.strip():
            return None
        raw, where = copy.rstrip(b"\n").rsplit(b"\n", 1)[-1], name
    try:
        head = AuditRecord.model_validate_json(raw)
    except ValidationError as exc:
        raise AuditChainError(f"the stored audit head {_uri(store, str(where))} is not an audit record "
                              f"({exc.error_count()} problems); nothing was done. Restore it from the "
                              "store's history, or inspect it") from exc
    key = log.key
    if head.hash != head.expected_hash() or (
            key is not None and not hmac.compare_digest(head.mac or "", head.expected_mac(key))):
        raise AuditChainError(
            f"the stored audit head {_uri(store, str(where))} (seq {head.seq}) does not verify with this "
            f"log's key: it was edited, or written by another state directory; nothing was done. "
            f"Compare it with `denpex audit verify {log.path}`")
    return head


def _read_stored(store: EvidenceStore, name: str, max_bytes: int) -> bytes | None:
    """The object's bytes; None only when the store says it has no such object."""
    try:
        return store.read(name, max_bytes=max_bytes)
    except EvidenceError as exc:
        if _is_missing(exc.__cause__):
            return None
        raise StoreError(f"cannot read the stored audit copy {_uri(store, name)}: {exc}; nothing was "
                         "done (a copy that cannot be read cannot be checked)") from exc


def _is_missing(cause: BaseException | None) -> bool:
    if isinstance(cause, FileNotFoundError):
        return True
    response = getattr(cause, "response", None)  # botocore ClientError
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in ("NoSuchKey", "404")


def _refusal(log: AuditLog, store: EvidenceStore, name: str, problem: str) -> str:
    return (f"the audit log {log.path} does not extend its stored copy {_uri(store, name)}: {problem}; "
            f"nothing was done. Compare the two with `denpex audit verify {log.path} --against COPY` "
            "and restore the log from the copy before acting again")


def _uri(store: EvidenceStore, name: str) -> str:
    return f"{store.uri.rstrip('/')}/{name}"
