"""The one way to execute a plan: ``open_cluster`` opens what a run needs, ``execute`` runs it.

::

    with open_cluster(plan, settings, os.environ, missing_hint=...) as (operator, adapter):
        report = execute(plan, approval, operator=operator, adapter=adapter, mode=RunMode.EXECUTE)

``execute`` dry-runs unless told ``mode=RunMode.EXECUTE``. Modules, in the order a run goes:

- ``cluster``: ``open_cluster``, the operator's configuration and the adapter, opened once;
- ``entry``: ``execute``, which re-checks the plan, the cluster, the tenancy (``checks``) and the
  approval, then hands the accepted approval, whole, to the ``executor``;
- ``executor``: the run lock, the audit chain, the node loop (act once, verify, audit); it decides
  with ``isolate`` or ``rollback`` and restarts the hung job with ``requeue``;
- ``context``: the run's context (plan, hash, operation, approval, mode), built once, and the
  dependencies its steps share;
- ``report``: ``RunMode`` and the ``ExecutionReport`` a run returns.
"""

from denpex.isolation.run.cluster import open_cluster
from denpex.isolation.run.entry import execute
from denpex.isolation.run.report import ExecutionReport, NodeDecision, NodeOutcome, RunMode

__all__ = [
    "execute",
    "open_cluster",
    "ExecutionReport",
    "NodeDecision",
    "NodeOutcome",
    "RunMode",
]
