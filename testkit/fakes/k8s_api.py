"""A small loopback fake of the Kubernetes API server, for the real ``kubernetes`` client.

It serves exactly what the adapter uses, with the API server's semantics for them:
- ``GET /api/v1/nodes``, ``GET /api/v1/nodes/{name}``;
- ``PATCH /api/v1/nodes/{name}`` with ``application/strategic-merge-patch+json`` (maps merge,
  ``null`` deletes, ``spec.taints`` is an atomic list), ``application/merge-patch+json``
  (RFC 7386) and ``application/json-patch+json`` (RFC 6902: add, remove, replace, test). A patch
  whose result carries a ``resourceVersion`` other than the stored one fails with 409 Conflict,
  which is how the real server turns a read-modify-patch into an optimistic-concurrency update;
  a taint value that is not a label value fails with 422 Invalid, as the server validates it;
- ``GET /api/v1/pods`` with ``fieldSelector=spec.nodeName=...`` and equality ``labelSelector``s;
- ``POST /api/v1/namespaces/{ns}/pods/{name}/eviction``: 429 while a PodDisruptionBudget
  (``policy/v1``, ``matchLabels``) allows no disruption, else the pod is deleted (201);
  ``fail_evictions`` answers chosen ones with 500 first;
- ``GET /apis/policy/v1/namespaces/{ns}/poddisruptionbudgets``;
  ``termination_grace_s`` keeps chosen evicted pods Terminating (``deletionTimestamp`` set) for
  that long before they are gone, as a kubelet does while the containers stop;
- ``DELETE /api/v1/namespaces/{ns}/pods/{name}``: the pod is gone at once (no grace period).
Every request needs ``Authorization: Bearer <token>`` (401 otherwise). Requests are recorded.
With ``tls`` (a server ``SSLContext``) it serves HTTPS, as a real API server does.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

__all__ = ["FakeApiServer", "make_node", "make_pod", "make_pdb"]


def make_node(name: str, *, labels: dict[str, str] | None = None, unschedulable: bool = False,
              taints: list[dict[str, str]] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def make_pod(namespace: str, name: str, node: str, *, labels: dict[str, str] | None = None,
             daemonset: bool = False, owner: str | None = "ReplicaSet", empty_dir: bool = False,
             mirror: bool = False, phase: str = "Running", created: str | None = None) -> dict[str, Any]:
    """A running pod; by default managed by a ReplicaSet (``owner=None``: a bare pod)."""
    kind = "DaemonSet" if daemonset else owner
    owners = [{"apiVersion": "apps/v1", "kind": kind, "name": f"{name}-owner", "uid": f"{name}-owner-1",
               "controller": True}] if kind else []
    volumes = [{"name": "scratch", "emptyDir": {}}] if empty_dir else []
    annotations = {"kubernetes.io/config.mirror": "abc"} if mirror else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                     "labels": labels or {}, "ownerReferences": owners, "resourceVersion": "1",
                     "annotations": annotations, **({"creationTimestamp": created} if created else {})},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer:1"}], "volumes": volumes},
        "status": {"phase": phase},
    }


def make_pdb(namespace: str, name: str, match_labels: dict[str, str], disruptions_allowed: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": match_labels}, "minAvailable": 1},
        "status": {"disruptionsAllowed": disruptions_allowed, "currentHealthy": 1, "desiredHealthy": 1,
                   "expectedPods": 1, "observedGeneration": 1},
    }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _merge(target: Any, patch: Any, *, atomic_lists: bool = True) -> Any:
    """RFC 7386 merge; strategic merge for the fields used here is the same with atomic lists."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value, atomic_lists=atomic_lists)
    return result


_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _invalid_taint(node: dict[str, Any]) -> str | None:
    """The API server's complaint about the first taint value that is not a label value."""
    for index, taint in enumerate(node.get("spec", {}).get("taints") or []):
        value = taint.get("value") or ""
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            return (f'Node "{node["metadata"]["name"]}" is invalid: spec.taints[{index}].value: Invalid value: '
                    f'"{value}": a valid label must be an empty string or consist of alphanumeric characters, '
                    "'-', '_' or '.', and must start and end with an alphanumeric character, at most 63 characters")
    return None


class _PatchError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")] if path else []


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op["path"])
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
            if parent is None:
                raise _PatchError(422, "Invalid", f"path {op['path']} does not exist")
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            if parent.get(last) != op["value"]:
                raise _PatchError(422, "Invalid", f"test of {op['path']} failed")
        elif kind == "add":
            parent[last] = op["value"]
        elif kind == "replace":
            if last not in parent:
                raise _PatchError(422, "Invalid", f"replace of missing {op['path']}")
            parent[last] = op["value"]
        elif kind == "remove":
            if last not in parent:
                raise _PatchError(422, "Invalid", f"remove of missing {op['path']}")
            del parent[last]
        else:
            raise _PatchError(400, "BadRequest", f"unsupported op {kind}")
    return doc


class FakeApiServer:
    """``with FakeApiServer(token) as api: api.url ...``; state is plain JSON dicts."""

    def __init__(self, token: str = "test-token", *, tls: ssl.SSLContext | None = None) -> None:
        self.token = token
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.pdbs: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str]] = []
        """(method, path with query, content type) of every request."""
        self.fail_next_patches = 0
        """Answer this many node PATCHes with 500 after applying them (an ambiguous failure)."""
        self.fail_evictions: dict[str, int] = {}
        """Pod name -> how many evictions of it are answered 500 (nothing done) before one succeeds."""
        self.pdb_refusals: dict[str, int] = {}
        """PodDisruptionBudget name -> how many evictions it refuses before allowing one."""
        self.termination_grace_s: dict[str, float] = {}
        """Pod name -> seconds an evicted pod stays Terminating before it is gone."""
        self.concurrent_writes: list[dict[str, Any]] = []
        """Taints another writer adds right before the next node PATCHes (one per PATCH)."""
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        if tls is not None:
            # The handshake runs in accept(); a client that refuses our certificate never
            # reaches a handler, so it leaves no request behind.
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def add_node(self, node: dict[str, Any]) -> None:
        self.nodes[node["metadata"]["name"]] = node

    def _gone(self, pod: dict[str, Any]) -> None:
        with self.lock:
            if pod in self.pods:
                self.pods.remove(pod)

    def patches(self, node: str) -> list[str]:
        """Content types of the PATCH requests sent for ``node``."""
        return [ctype for method, path, ctype in self.requests
                if method == "PATCH" and urlparse(path).path == f"/api/v1/nodes/{node}"]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"null")

            def _authorized(self) -> bool:
                api.requests.append((self.command, self.path, self.headers.get("Content-Type", "")))
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if not self._authorized():
                    return
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                with api.lock:
                    if parts == ["api", "v1", "nodes"]:
                        self._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                         "items": list(api.nodes.values())})
                    elif parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                        node = api.nodes.get(unquote(parts[3]))
                        if node is None:
                            self._send(404, _status(404, "NotFound", f'nodes "{parts[3]}" not found'))
                        else:
                            self._send(200, node)
                    elif parts == ["api", "v1", "pods"]:
                        selector = parse_qs(url.query).get("fieldSelector", [""])[0]
                        labels = parse_qs(url.query).get("labelSelector", [""])[0]
                        items = api.pods
                        if labels:
                            # Equality selectors only ("k=v,k2=v2"), the form the adapter sends.
                            wanted = dict(term.split("=", 1) for term in labels.split(","))
                            items = [p for p in items if all(p["metadata"].get("labels", {}).get(k) == v
                                                             for k, v in wanted.items())]
                        if selector:
                            field, _, value = selector.partition("=")
                            if field != "spec.nodeName":
                                self._send(400, _status(400, "BadRequest", f"field {field} not supported"))
                                return
                            items = [p for p in items if p["spec"].get("nodeName") == value]
                        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                         "items": items})
                    elif parts[:3] == ["apis", "policy", "v1"] and parts[-1] == "poddisruptionbudgets":
                        items = [p for p in api.pdbs if p["metadata"]["namespace"] == parts[4]]
                        self._send(200, {"kind": "PodDisruptionBudgetList", "apiVersion": "policy/v1",
                                         "metadata": {}, "items": items})
                    else:
                        self._send(404, _status(404, "NotFound", f"{url.path} not served by the fake"))

            def do_PATCH(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                parts = urlparse(self.path).path.strip("/").split("/")
                ctype = self.headers.get("Content-Type", "").split(";")[0]
                body = self._body()
                with api.lock:
                    if parts[:3] != ["api", "v1", "nodes"] or len(parts) != 4 or parts[3] not in api.nodes:
                        self._send(404, _status(404, "NotFound", "node not found"))
                        return
                    if api.concurrent_writes:
                        other = copy.deepcopy(api.nodes[parts[3]])
                        other["spec"]["taints"] = [*other["spec"].get("taints", []), api.concurrent_writes.pop(0)]
                        other["metadata"]["resourceVersion"] = str(int(other["metadata"]["resourceVersion"]) + 1)
                        api.nodes[parts[3]] = other
                    current = api.nodes[parts[3]]
                    try:
                        if ctype == "application/json-patch+json":
                            patched = _json_patch(current, body)
                        elif ctype in ("application/strategic-merge-patch+json", "application/merge-patch+json"):
                            patched = _merge(current, body)
                        else:
                            raise _PatchError(415, "UnsupportedMediaType", f"content type {ctype!r}")
                    except _PatchError as exc:
                        self._send(exc.code, _status(exc.code, exc.reason, str(exc)))
                        return
                    invalid = _invalid_taint(patched)
                    if invalid is not None:
                        self._send(422, _status(422, "Invalid", invalid))
                        return
                    if patched["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                        self._send(409, _status(409, "Conflict", "the object has been modified; please apply "
                                                "your changes to the latest version and try again"))
                        return
                    patched["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
                    api.nodes[parts[3]] = patched
                    if api.fail_next_patches > 0:
                        api.fail_next_patches -= 1
                        self._send(500, _status(500, "InternalError", "etcd leader changed"))
                        return
                    self._send(200, patched)

            def do_POST(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                parts = urlparse(self.path).path.strip("/").split("/")
                self._body()
                if len(parts) != 7 or parts[:3] != ["api", "v1", "namespaces"] or parts[6] != "eviction":
                    self._send(404, _status(404, "NotFound", "not served by the fake"))
                    return
                namespace, name = parts[3], parts[5]
                with api.lock:
                    pod = next((p for p in api.pods if p["metadata"]["namespace"] == namespace
                                and p["metadata"]["name"] == name), None)
                    if pod is None:
                        self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
                        return
                    if api.fail_evictions.get(name, 0) > 0:
                        api.fail_evictions[name] -= 1
                        self._send(500, _status(500, "InternalError", "etcd request timed out"))
                        return
                    labels = pod["metadata"].get("labels", {})
                    budgets = [b for b in api.pdbs if b["metadata"]["namespace"] == namespace and all(
                        labels.get(k) == v for k, v in b["spec"]["selector"]["matchLabels"].items())]
                    for budget in budgets:
                        left = api.pdb_refusals.get(budget["metadata"]["name"])
                        if left is not None and budget["status"]["disruptionsAllowed"] <= 0:
                            if left == 0:
                                budget["status"]["disruptionsAllowed"] = 1
                            api.pdb_refusals[budget["metadata"]["name"]] = left - 1
                    if any(b["status"]["disruptionsAllowed"] <= 0 for b in budgets):
                        self._send(429, _status(429, "TooManyRequests",
                                                "Cannot evict pod as it would violate the pod's disruption budget."))
                        return
                    for budget in budgets:
                        budget["status"]["disruptionsAllowed"] -= 1
                    grace = api.termination_grace_s.get(name)
                    if grace is None:
                        api.pods.remove(pod)
                    elif "deletionTimestamp" not in pod["metadata"]:
                        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                        timer = threading.Timer(grace, api._gone, args=(pod,))
                        timer.daemon = True
                        timer.start()
                self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

            def do_DELETE(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                parts = urlparse(self.path).path.strip("/").split("/")
                if len(parts) != 6 or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "pods":
                    self._send(404, _status(404, "NotFound", "not served by the fake"))
                    return
                namespace, name = parts[3], parts[5]
                with api.lock:
                    pod = next((p for p in api.pods if p["metadata"]["namespace"] == namespace
                                and p["metadata"]["name"] == name), None)
                    if pod is None:
                        self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
                        return
                    api.pods.remove(pod)
                self._send(200, pod)

        return Handler
