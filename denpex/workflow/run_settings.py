"""A run's settings are its worker's, never what the Prefect API gave the run.

The evidence roots, the state directory, the runbooks, the S3 endpoint and credentials, the SSH
and Kubernetes targets reach a flow as environment variables on its worker
(:data:`PROTECTED_PREFIXES`). A process worker starts each run with
``{**worker environment, **job variables["env"]}``, and job variables come from the flow run,
its deployment and its work pool's base job template: all three editable by anyone who reaches
the Prefect API. A run started with ``env: {DENPEX_EVIDENCE_ROOT: s3://forged}`` would pass the
evidence binding with a forged folder (attacker review). So a run refuses to start when any of
them sets such a variable, or replaces the command that starts the run.

This is plain data in, refusal out: ``flows/run_settings.py`` reads the three sources from the
API. (``denpex serve`` ignores job variables; the check holds there too.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from denpex.workflow.flow_parameters import FlowParameterError

__all__ = ["PROTECTED_PREFIXES", "check_run_settings", "pool_job_variables"]

PROTECTED_PREFIXES = ("DENPEX_", "AWS_", "PREFECT_API_")
"""Environment variables a run's job variables may not set: Denpex's settings, the S3 client's
credentials and endpoint, and where the run reports (and takes its approval from)."""

_PLACEHOLDER = re.compile(r"\{\{\s*\w+\s*\}\}")


def pool_job_variables(base_job_template: Mapping[str, Any]) -> dict[str, Any]:
    """What a work pool's base job template gives every run, as job variables: each variable's
    default, and a literal (not ``{{ name }}``) ``env`` or ``command`` in its job configuration."""
    variables: dict[str, Any] = {}
    properties = base_job_template.get("variables", {}).get("properties", {})
    for name, schema in properties.items() if isinstance(properties, Mapping) else ():
        if isinstance(schema, Mapping) and "default" in schema:
            variables[name] = schema["default"]
    configuration = base_job_template.get("job_configuration", {})
    if isinstance(configuration, Mapping):
        env = configuration.get("env")
        if isinstance(env, Mapping):
            variables["env"] = {**(variables.get("env") or {}), **env}
        command = configuration.get("command")
        if isinstance(command, str) and command.strip() and not _PLACEHOLDER.fullmatch(command.strip()):
            variables["command"] = command
    return variables


def check_run_settings(sources: Mapping[str, Mapping[str, Any]]) -> None:
    """FlowParameterError naming each source (``"this run's job variables"``...) that sets a
    protected environment variable or a command; the variables' values are never repeated."""
    problems = []
    for where, variables in sources.items():
        env = variables.get("env")
        if isinstance(env, Mapping):
            names = sorted(str(k) for k in env if str(k).upper().startswith(PROTECTED_PREFIXES))
            if names:
                problems.append(f"{where} set {', '.join(names)}")
        elif env not in (None, "") and not (isinstance(env, str) and _PLACEHOLDER.fullmatch(env.strip())):
            problems.append(f"{where} set env to something other than a mapping")
        if variables.get("command"):
            problems.append(f"{where} replace the command that starts the run")
    if problems:
        raise FlowParameterError(
            "this run's settings must be its worker's: " + "; ".join(problems) + " (the evidence roots, "
            "state, runbooks, S3 and cluster access come from the worker's own environment, never "
            "from job variables, which the Prefect API can edit); nothing was done")
