"""Who a rank is in its scheduler's terms: the node it runs on and the job it belongs to.

The registration (``POST /v1/jobs/{job_id}/ranks``) and the alert must meet on one job id and one
node name, and the node name must be the one a drain acts on; so both come from the scheduler,
never from the container's hostname when the scheduler says otherwise::

    >>> node_name({"SLURMD_NODENAME": "gpu-node-002"}, fallback="c0ffee")
    'gpu-node-002'
    >>> node_name({}, fallback="c0ffee")
    'c0ffee'
    >>> scheduler_job_id({"SLURM_JOB_ID": "4242"})
    '4242'

- node: ``DENPEX_NODE_NAME`` (an explicit override), ``SLURMD_NODENAME`` (Slurm), ``NODE_NAME`` or
  ``KUBERNETES_NODE_NAME`` (Kubernetes: the downward API's ``spec.nodeName`` put in the env), then
  the hostname;
- job: ``DENPEX_JOB_ID``, ``SLURM_JOB_ID``, ``KUBERNETES_JOB_NAME`` (the pod's job, from the
  downward API's ``metadata.labels['job-name']``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["NODE_ENV", "JOB_ENV", "node_name", "scheduler_job_id"]

NODE_ENV = ("DENPEX_NODE_NAME", "SLURMD_NODENAME", "NODE_NAME", "KUBERNETES_NODE_NAME")
JOB_ENV = ("DENPEX_JOB_ID", "SLURM_JOB_ID", "KUBERNETES_JOB_NAME")


def node_name(environ: Mapping[str, str] | None = None, *, fallback: str | None = None) -> str:
    """The scheduler's name for this node, else the hostname."""
    env = os.environ if environ is None else environ
    for name in NODE_ENV:
        value = env.get(name, "").strip()
        if value:
            return value
    return fallback if fallback is not None else socket.gethostname()


def scheduler_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The job id the scheduler (or the operator) gave this job, or None."""
    env = os.environ if environ is None else environ
    for name in JOB_ENV:
        value = env.get(name, "").strip()
        if value:
            return value
    return None
