"""Kubernetes adapter: cordon, taint and (optionally) evict through the official client.

Isolating a node:
1. one strategic-merge PATCH of the node sets ``spec.unschedulable``, adds the
   ``denpex.io/isolated=<incident>:NoSchedule`` taint (``spec.taints`` is an atomic list, so the
   full list is sent) and annotations recording who, why and when. The patch carries the
   ``resourceVersion`` read just before, so a concurrent change makes it fail with 409 and it is
   re-read and retried instead of overwriting someone else's taints;
2. for ``cordon_taint_evict``, pods are evicted through the Eviction API by ``kubectl drain``'s
   rules (``EvictionRule``): DaemonSet and mirror pods are never evicted; pods without a
   controller (nothing recreates them) and pods with ``emptyDir`` data only where the runbook
   allows it. Each pod is settled on its own: a PodDisruptionBudget's 429 is retried with backoff
   until ``eviction_timeout_s``; a failed eviction (5xx, a dropped connection) is noted and the
   next pod is tried. The post-check then reads the node again: the action is only complete when
   no evictable pod remains and the evicted ones are gone (terminated, as ``kubectl drain`` waits
   for), within the operator's verify timeout; so a re-run evicts what is left, or waits again,
   instead of saying "already done".

Rolling back is one JSON-patch (with the same ``resourceVersion`` guard) that clears
``unschedulable`` and removes only this incident's taint and annotations. After a person
uncordoned the node by hand, the rollback still removes them: left behind, the taint keeps pods
away and the annotations keep Denpex from ever isolating the node again.

A node still carrying our annotations but no longer unschedulable was uncordoned by a person: that
cancels the automated workflow, and the gates refuse to isolate it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from denpex.isolation.adapter import ActionOutput
from denpex.isolation.config import KubernetesSettings
from denpex.isolation.errors import (
    CommandFailedError,
    HostKeyError,
    OutcomeUnknownError,
    RemoteAuthError,
    RemoteError,
    TransientRemoteError,
)
from denpex.isolation.facts import ClusterFacts, NodeFacts, ReasonOwner, owned_reason_prefix
from denpex.isolation.k8s_layout import JobPod
from denpex.isolation.plan import HungJob, NodeAction, Operation, utc_now
from denpex.isolation.policy import ActionKind, EvictionRule, Scheduler
from denpex.isolation.ssh import Backoff

__all__ = [
    "TAINT_KEY",
    "ANNOTATION_REASON",
    "ANNOTATION_BY",
    "ANNOTATION_AT",
    "ANNOTATION_INCIDENT",
    "POOL_LABELS",
    "JOB_LABELS",
    "KubernetesAdapter",
]

TAINT_KEY = "denpex.io/isolated"
ANNOTATION_REASON = "denpex.io/reason"
ANNOTATION_BY = "denpex.io/isolated-by"
ANNOTATION_AT = "denpex.io/isolated-at"
ANNOTATION_INCIDENT = "denpex.io/incident"
_OUR_ANNOTATIONS = (ANNOTATION_REASON, ANNOTATION_BY, ANNOTATION_AT, ANNOTATION_INCIDENT)
POOL_LABELS = (
    "denpex.io/partition",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
)
"""Labels naming a node's pool, used as its 'partition' for the blast-radius share."""
JOB_LABELS = (
    "batch.kubernetes.io/job-name",
    "job-name",
    "training.kubeflow.org/job-name",
    "denpex.io/job-id",
)
"""Pod labels that name the job a pod belongs to (Job, Kubeflow training jobs, our own)."""

_T = TypeVar("_T")

# Pods a drain passes over as a matter of course (kubectl does too, without a word).
_FINISHED = "finished"
_TERMINATING = "terminating"
_MIRROR = "a mirror pod (the kubelet's)"
_DAEMONSET = "a DaemonSet pod (it would come back on the same node)"
_NOT_EVICTED = frozenset({_FINISHED, _TERMINATING, _MIRROR, _DAEMONSET})
# How one eviction settled, besides the reason it failed.
_EVICTED = "evicted"
_KEPT = "kept by a PodDisruptionBudget"


def _incident_tag(action: NodeAction) -> str:
    """``"denpex:inc-42 rank 1: ..."`` -> ``"inc-42"`` (a valid label value, at most 63 chars)."""
    return action.reason.split(" ", 1)[0].partition(":")[2][:63]


def _escape(key: str) -> str:
    """JSON-pointer escaping (RFC 6901) for an annotation key in a JSON-patch path."""
    return key.replace("~", "~0").replace("/", "~1")


class KubernetesAdapter:
    """Reads nodes and pods and changes node scheduling through ``CoreV1Api``."""

    scheduler = Scheduler.KUBERNETES

    def __init__(
        self,
        core: Any,
        *,
        opt_out_label: str = "denpex.io/opt-out",
        actor: str = "denpex",
        backoff: Backoff | None = None,
        request_timeout_s: float = 10.0,
        eviction_timeout_s: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        cluster: str | None = None,
        eviction: EvictionRule = EvictionRule(),
    ) -> None:
        self.core = core
        self.eviction = eviction
        self.cluster = cluster
        self.opt_out_label = opt_out_label
        self.actor = actor
        self.backoff = backoff or Backoff()
        self.request_timeout_s = request_timeout_s
        self.eviction_timeout_s = eviction_timeout_s
        self._sleep = sleep

    @classmethod
    @contextmanager
    def connect(cls, settings: KubernetesSettings, *, opt_out_label: str,
                eviction: EvictionRule = EvictionRule()) -> Iterator[KubernetesAdapter]:
        """An adapter on a fresh ``ApiClient`` (kubeconfig, or host plus bearer token), closed after."""
        from kubernetes import client, config

        configuration = client.Configuration()
        context: str | None = None
        if settings.host:
            configuration.host = settings.host
            if settings.token is not None:
                configuration.api_key = {"BearerToken": settings.token.get_secret_value()}
                configuration.api_key_prefix = {"BearerToken": "Bearer"}
            configuration.verify_ssl = settings.verify_tls
            if settings.ca_cert is not None:
                configuration.ssl_ca_cert = str(settings.ca_cert)
        else:
            config.load_kube_config(
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                context=settings.context, client_configuration=configuration, persist_config=False,
            )
            context = settings.context or config.list_kube_config_contexts(
                config_file=str(settings.kubeconfig) if settings.kubeconfig else None)[1]["name"]
        configuration.retries = 0  # our own backoff decides what is safe to retry
        api_client = client.ApiClient(configuration)
        try:
            yield cls(client.CoreV1Api(api_client), opt_out_label=opt_out_label,
                      backoff=settings.backoff, request_timeout_s=settings.request_timeout_s,
                      eviction_timeout_s=settings.eviction_timeout_s, cluster=context, eviction=eviction)
        finally:
            api_client.close()

    # -- facts ---------------------------------------------------------------------------
    def cluster_name(self) -> str | None:
        """The kubeconfig context it was reached through; None for a bare host and token."""
        return self.cluster

    def cluster_facts(self) -> ClusterFacts:
        nodes = self._read(lambda: self.core.list_node(_request_timeout=self.request_timeout_s), "list nodes")
        pods = self._read(
            lambda: self.core.list_pod_for_all_namespaces(_request_timeout=self.request_timeout_s), "list pods"
        )
        by_node: dict[str, list[Any]] = {}
        for pod in pods.items or []:
            if pod.spec and pod.spec.node_name:
                by_node.setdefault(pod.spec.node_name, []).append(pod)
        facts = {n.metadata.name: self._facts(n, by_node.get(n.metadata.name, [])) for n in nodes.items or []}
        return ClusterFacts(nodes=facts, collected_at=utc_now())

    def node_facts(self, node: str) -> NodeFacts:
        from kubernetes.client.exceptions import NotFoundException

        try:
            found = self._read(lambda: self.core.read_node(node, _request_timeout=self.request_timeout_s),
                               f"read node {node}", passthrough=(NotFoundException,))
        except NotFoundException:
            return NodeFacts(name=node, exists=False)
        return self._facts(found, self._pods_on(node))

    def job_pods(self, job_id: str) -> list[JobPod]:
        """Every pod a job label names ``job_id`` (finished ones too: a dead rank's pod may have
        failed), one entry per pod, for the derived layout."""
        found: dict[str, JobPod] = {}
        for key in JOB_LABELS:
            pods = self._read(partial(self.core.list_pod_for_all_namespaces, label_selector=f"{key}={job_id}",
                                      _request_timeout=self.request_timeout_s), f"list pods of job {job_id}")
            for pod in pods.items or []:
                meta = pod.metadata
                found[meta.uid or f"{meta.namespace}/{meta.name}"] = JobPod(
                    name=meta.name, namespace=meta.namespace, node=pod.spec.node_name if pod.spec else None,
                    phase=pod.status.phase if pod.status else None, labels=dict(meta.labels or {}),
                    created=meta.creation_timestamp)
        return list(found.values())

    def _pods_on(self, node: str) -> list[Any]:
        pods = self._read(
            lambda: self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=self.request_timeout_s),
            f"list pods on {node}",
        )
        return list(pods.items or [])

    def _facts(self, node: Any, pods: list[Any]) -> NodeFacts:
        meta, spec = node.metadata, node.spec
        labels = meta.labels or {}
        annotations = meta.annotations or {}
        unschedulable = bool(spec and spec.unschedulable)
        taints = tuple(f"{t.key}={t.value or ''}:{t.effect}" for t in (spec.taints if spec and spec.taints else []))
        ready = next((c.status for c in (node.status.conditions or []) if c.type == "Ready"), "Unknown") \
            if node.status else "Unknown"
        state = {"True": "Ready", "False": "NotReady"}.get(ready, "Unknown")
        if unschedulable:
            state += ",SchedulingDisabled"
        ours = annotations.get(ANNOTATION_REASON)
        overridden = None
        if ours and not unschedulable:
            overridden = f"uncordoned by hand while annotated {ours!r}"
        return NodeFacts(
            name=meta.name,
            exists=True,
            state=state,
            isolated=unschedulable,
            not_responding=ready != "True",
            reason=ours if unschedulable else None,
            partitions=tuple(labels[k] for k in POOL_LABELS if k in labels)[:1],
            running_jobs=tuple(
                f"{p.metadata.namespace}/{p.metadata.name}" for p in pods
                if not (p.status and p.status.phase in ("Succeeded", "Failed"))
            ),
            opted_out=labels.get(self.opt_out_label, "").lower() == "true",
            overridden_by=overridden,
            evictable_pods=tuple(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods
                                 if self._eviction_blocker(p) is None),
            terminating_pods=tuple(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods
                                   if self._eviction_blocker(p) == _TERMINATING
                                   and self._eviction_blocker(p, terminating=False) is None),
            marked_by=annotations.get(ANNOTATION_INCIDENT),
            taints=taints,
        )

    # -- changes -------------------------------------------------------------------------
    def command_for(self, action: NodeAction, operation: Operation) -> str:
        taint = f"{TAINT_KEY}={_incident_tag(action)}:NoSchedule"
        if operation is Operation.ROLLBACK:
            return (f"PATCH /api/v1/nodes/{action.node} (json-patch): spec.unschedulable=false, "
                    f"remove taint {taint} and the denpex.io annotations")
        text = (f"PATCH /api/v1/nodes/{action.node} (strategic-merge): spec.unschedulable=true, "
                f"taint {taint}, annotations {ANNOTATION_REASON}={action.reason!r}")
        if action.action is ActionKind.CORDON_TAINT_EVICT:
            text += "; then POST .../pods/<pod>/eviction for each pod (PodDisruptionBudgets honoured)"
        return text

    def apply(self, action: NodeAction, operation: Operation) -> ActionOutput:
        if operation is Operation.ROLLBACK:
            output = self._guarded_patch(action.node, lambda node: self._uncordon_patch(node, action))
        elif action.action is ActionKind.CORDON_TAINT_EVICT:
            output = self._cordon_before_evicting(action) + "; " + self._evict_all(action.node)
        else:
            output = self._guarded_patch(action.node, lambda node: self._cordon_patch(node, action))
        return ActionOutput(command=self.command_for(action, operation), rc=0, output=output)

    def _cordon_before_evicting(self, action: NodeAction) -> str:
        """Cordon; if its answer is lost but the node shows our cordon, go on to the evictions.

        Otherwise the executor would read the cordon, count the whole action as done, and the
        evictions the plan asked for would silently never happen.
        """
        try:
            return self._guarded_patch(action.node, lambda node: self._cordon_patch(node, action))
        except OutcomeUnknownError as exc:
            facts = self.node_facts(action.node)
            if not (facts.isolated and f"{TAINT_KEY}={_incident_tag(action)}:NoSchedule" in facts.taints):
                raise
            return f"the answer to the cordon was lost ({exc}); the node shows it took effect"

    def unmet_checks(self, action: NodeAction, operation: Operation, facts: NodeFacts, *,
                     reason_prefix: str, incident_id: str) -> list[str]:
        ours = [t for t in facts.taints if t == f"{TAINT_KEY}={_incident_tag(action)}:NoSchedule"]
        if operation is Operation.ROLLBACK:
            unmet = [f"{facts.name} is still unschedulable"] if facts.isolated else []
            if facts.overridden_by and facts.marked_by == _incident_tag(action):
                unmet.append(f"{facts.name} still carries this incident's annotations")
            return unmet + [f"{facts.name} still carries taint {t}" for t in ours]
        unmet = []
        if not facts.exists:
            return [f"{facts.name} is not known to the API server"]
        if not facts.isolated:
            unmet.append(f"{facts.name} is schedulable ({facts.state})")
        if f"{TAINT_KEY}={_incident_tag(action)}:NoSchedule" not in facts.taints:
            unmet.append(f"{facts.name} lacks taint {TAINT_KEY}={_incident_tag(action)}:NoSchedule")
        if facts.isolated and facts.owner(reason_prefix, incident_id) is not ReasonOwner.THIS_INCIDENT:
            unmet.append(f"{facts.name} annotation {ANNOTATION_REASON} is {facts.reason!r}, not "
                         f"{owned_reason_prefix(reason_prefix, incident_id)}")
        if action.action is ActionKind.CORDON_TAINT_EVICT and facts.evictable_pods:
            unmet.append(f"{len(facts.evictable_pods)} evictable pod(s) remain on {facts.name}: "
                         f"{', '.join(facts.evictable_pods[:5])}")
        if action.action is ActionKind.CORDON_TAINT_EVICT and facts.terminating_pods:
            unmet.append(f"{len(facts.terminating_pods)} pod(s) still terminating on {facts.name}: "
                         f"{', '.join(facts.terminating_pods[:5])}")
        return unmet

    def _cordon_patch(self, node: Any, action: NodeAction) -> dict[str, Any]:
        sanitize = self.core.api_client.sanitize_for_serialization
        kept = [sanitize(t) for t in (node.spec.taints or []) if t.key != TAINT_KEY] if node.spec else []
        return {
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {
                    ANNOTATION_REASON: action.reason,
                    ANNOTATION_INCIDENT: _incident_tag(action),
                    ANNOTATION_BY: self.actor,
                    ANNOTATION_AT: utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                },
            },
            "spec": {
                "unschedulable": True,
                "taints": [*kept, {"key": TAINT_KEY, "value": _incident_tag(action), "effect": "NoSchedule"}],
            },
        }

    def _uncordon_patch(self, node: Any, action: NodeAction) -> list[dict[str, Any]]:
        """Clear ``unschedulable``, and remove this incident's taint and annotations only: another
        incident's marks stay with it."""
        sanitize = self.core.api_client.sanitize_for_serialization
        tag = _incident_tag(action)
        taints = list(node.spec.taints or []) if node.spec else []
        ops: list[dict[str, Any]] = [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": node.metadata.resource_version},
            {"op": "add", "path": "/spec/unschedulable", "value": False},
        ]
        if taints:
            ops.append({"op": "add", "path": "/spec/taints",
                        "value": [sanitize(t) for t in taints if not (t.key == TAINT_KEY and t.value == tag)]})
        annotations = node.metadata.annotations or {}
        if annotations.get(ANNOTATION_INCIDENT) == tag:
            ops += [{"op": "remove", "path": f"/metadata/annotations/{_escape(k)}"}
                    for k in _OUR_ANNOTATIONS if k in annotations]
        return ops

    def _guarded_patch(self, name: str, build: Callable[[Any], Any]) -> str:
        """Read, build the patch against that version, PATCH; a 409 (changed meanwhile) re-reads."""
        from kubernetes.client.exceptions import ConflictException

        delays = iter(self.backoff.delays())
        while True:
            node = self._read(lambda: self.core.read_node(name, _request_timeout=self.request_timeout_s),
                              f"read node {name}")
            body = build(node)
            try:
                self._change(partial(self.core.patch_node, name, body, _request_timeout=self.request_timeout_s),
                             f"patch node {name}", passthrough=(ConflictException,))
            except ConflictException:
                delay = next(delays, None)
                if delay is None:
                    raise CommandFailedError(f"node {name} kept changing under us (409 Conflict); "
                                             "try again later") from None
                self._sleep(delay)
                continue
            return f"patched node {name} (resourceVersion {node.metadata.resource_version})"

    # -- the hung job ---------------------------------------------------------------------
    def hung_job_command(self, job: HungJob) -> str:
        return (f"DELETE /api/v1/namespaces/<ns>/pods/<pod> for each pod labelled with job {job.job_id} "
                f"({' or '.join(JOB_LABELS)}) on {', '.join(job.exclude_nodes)}")

    def hung_job_unmet(self, job: HungJob) -> list[str]:
        left = [f"{p.metadata.namespace}/{p.metadata.name} on {p.spec.node_name}" for p in self._job_pods(job)
                if p.metadata.deletion_timestamp is None]
        return [f"pods of job {job.job_id} remain: {', '.join(left)}"] if left else []

    def restart_hung_job(self, job: HungJob) -> ActionOutput:
        """Delete the job's pods on the excluded nodes; their controller places new ones (the nodes
        are cordoned and tainted, so elsewhere)."""
        from kubernetes.client.exceptions import NotFoundException

        deleted = []
        for pod in self._job_pods(job):
            meta = pod.metadata
            if meta.deletion_timestamp is not None:
                continue
            try:
                self._change(partial(self.core.delete_namespaced_pod, meta.name, meta.namespace,
                                     _request_timeout=self.request_timeout_s),
                             f"delete pod {meta.namespace}/{meta.name}", passthrough=(NotFoundException,))
            except NotFoundException:
                pass  # already gone
            deleted.append(f"{meta.namespace}/{meta.name}")
        return ActionOutput(command=self.hung_job_command(job), rc=0,
                            output=f"deleted {', '.join(deleted) or 'no pod'}")

    def _job_pods(self, job: HungJob) -> list[Any]:
        """The job's unfinished pods on the excluded nodes. Job names are per namespace: when the
        name matches pods of more than one, another tenant's job shares it, and nothing is
        guessed (CommandFailedError, before any intent or deletion)."""
        pods = []
        for node in job.exclude_nodes:
            for pod in self._pods_on(node):
                labels = pod.metadata.labels or {}
                finished = pod.status and pod.status.phase in ("Succeeded", "Failed")
                if not finished and any(labels.get(key) == job.job_id for key in JOB_LABELS):
                    pods.append(pod)
        namespaces = sorted({p.metadata.namespace for p in pods})
        if len(namespaces) > 1:
            raise CommandFailedError(
                f"job {job.job_id} names pods in more than one namespace ({', '.join(namespaces)}) on "
                f"{', '.join(job.exclude_nodes)}; another tenant's job shares the name, so no pod was "
                "deleted: restart the hung job's pods by hand")
        return pods

    def _eviction_blocker(self, pod: Any, *, terminating: bool = True) -> str | None:
        """Why ``pod`` is not to be evicted, kubectl's way; None when it is. Finished, terminating,
        mirror and DaemonSet pods are ``_NOT_EVICTED`` as a matter of course. ``terminating=False``
        judges a terminating pod as if it were not: would it have been evicted?"""
        meta, spec = pod.metadata, pod.spec
        if pod.status and pod.status.phase in ("Succeeded", "Failed"):
            return _FINISHED
        if terminating and meta.deletion_timestamp is not None:
            return _TERMINATING
        if "kubernetes.io/config.mirror" in (meta.annotations or {}):
            return _MIRROR
        owners = meta.owner_references or []
        if any(o.kind == "DaemonSet" for o in owners):
            return _DAEMONSET
        if not any(o.controller for o in owners) and not self.eviction.evict_unmanaged:
            return "not managed by a controller: nothing would recreate it (the runbook's evict_unmanaged)"
        volumes = (spec.volumes or []) if spec else []
        if any(v.empty_dir is not None for v in volumes) and not self.eviction.delete_emptydir_data:
            return "has emptyDir data that eviction deletes (the runbook's delete_emptydir_data)"
        return None

    def _evict_all(self, node: str) -> str:
        """Evict every evictable pod, each settled on its own; the summary says what happened to each."""
        evicted: list[str] = []
        kept: list[str] = []
        failed: list[str] = []
        left: list[str] = []
        for pod in self._pods_on(node):
            name = f"{pod.metadata.namespace}/{pod.metadata.name}"
            blocker = self._eviction_blocker(pod)
            if blocker is not None:
                if blocker not in _NOT_EVICTED:
                    left.append(f"{name} ({blocker})")
                continue
            outcome = self._evict_one(pod)
            if outcome == _EVICTED:
                evicted.append(name)
            elif outcome == _KEPT:
                kept.append(name)
            else:
                failed.append(f"{name} ({outcome})")
        parts = [f"evicted {', '.join(evicted) or 'no pod'}"]
        if kept:
            parts.append(f"a PodDisruptionBudget kept {', '.join(kept)} (429 for "
                         f"{self.eviction_timeout_s:.0f} s); a re-run tries them again")
        if failed:
            parts.append(f"eviction failed for {', '.join(failed)}; a re-run tries them again")
        if left:
            parts.append(f"left on the node by kubectl's rules: {', '.join(left)}")
        return "; ".join(parts)

    def _evict_one(self, pod: Any) -> str:
        """``"evicted"`` (or already gone), ``"kept"`` (a PDB still refused at the deadline), or why
        it failed. Only refused credentials stop the whole drain."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException, NotFoundException

        meta = pod.metadata
        what = f"evict {meta.namespace}/{meta.name}"
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=meta.name, namespace=meta.namespace))
        deadline = time.monotonic() + self.eviction_timeout_s
        delays = iter(self.backoff.delays())
        while True:
            try:
                self._change(partial(self.core.create_namespaced_pod_eviction, meta.name, meta.namespace, body,
                                     _request_timeout=self.request_timeout_s), what, passthrough=(ApiException,))
                return _EVICTED
            except NotFoundException:
                return _EVICTED  # already gone
            except ApiException as exc:
                if exc.status != 429:
                    mapped = self._translate(exc, what, True)
                    if isinstance(mapped, RemoteAuthError):
                        raise mapped from exc
                    return str(mapped)
            except RemoteAuthError:
                raise
            except RemoteError as exc:
                return str(exc)
            delay = next(delays, self.backoff.max_s)
            if time.monotonic() + delay > deadline:
                return _KEPT
            self._sleep(delay)

    # -- error handling ------------------------------------------------------------------
    def _read(self, call: Callable[[], _T], what: str, *, passthrough: tuple[type[Exception], ...] = ()) -> _T:
        """A read: every transient failure is retried with backoff."""
        return self._call(call, what, changes_state=False, passthrough=passthrough)

    def _change(self, call: Callable[[], _T], what: str, *, passthrough: tuple[type[Exception], ...] = ()) -> _T:
        """A change: retried only when the request surely did not take effect (refused, 409, 429)."""
        return self._call(call, what, changes_state=True, passthrough=passthrough)

    def _call(self, call: Callable[[], _T], what: str, *, changes_state: bool,
              passthrough: tuple[type[Exception], ...]) -> _T:
        delays = iter(self.backoff.delays())
        while True:
            try:
                return call()
            except passthrough:
                raise
            except Exception as exc:
                mapped = self._translate(exc, what, changes_state)
                retry = isinstance(mapped, TransientRemoteError) and not isinstance(mapped, OutcomeUnknownError)
                delay = next(delays, None)
                if not retry or delay is None:
                    raise mapped from exc
                self._sleep(delay)

    @staticmethod
    def _translate(exc: Exception, what: str, changes_state: bool) -> RemoteError:
        """Map client/urllib3 errors to ours, most specific first."""
        import urllib3.exceptions as u3
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, RemoteError):
            return exc
        if isinstance(exc, ApiException):
            status = exc.status or 0
            if status in (401, 403):
                return RemoteAuthError(f"{what}: the API server refused our credentials ({status} "
                                       f"{exc.reason}); check the token or kubeconfig and RBAC for nodes")
            if status == 429 or status == 409:
                return TransientRemoteError(f"{what}: {status} {exc.reason}")
            if status >= 500:
                if changes_state:
                    return OutcomeUnknownError(f"{what}: {status} {exc.reason}; the change may or may not "
                                               "have been applied")
                return TransientRemoteError(f"{what}: {status} {exc.reason}")
            return CommandFailedError(f"{what}: {status} {exc.reason}: {(exc.body or '')[:300]}")
        if isinstance(exc, u3.MaxRetryError) and exc.reason is not None:
            exc = exc.reason if isinstance(exc.reason, Exception) else exc
        if isinstance(exc, u3.SSLError):
            return HostKeyError(f"{what}: the API server's certificate is not trusted ({exc}); nothing was "
                                "sent. Check ca_cert in the Kubernetes settings")
        if isinstance(exc, u3.NewConnectionError | u3.ConnectTimeoutError):
            return TransientRemoteError(f"{what}: cannot connect: {exc}")
        if isinstance(exc, u3.HTTPError | ConnectionError | TimeoutError | OSError):
            if changes_state:
                return OutcomeUnknownError(f"{what}: connection lost mid-request ({exc}); read the node "
                                           "before retrying")
            return TransientRemoteError(f"{what}: {exc}")
        return RemoteError(f"{what}: unexpected {type(exc).__name__}: {exc}")
