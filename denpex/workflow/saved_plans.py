"""An incident's saved plan, as the follow-up flows (return to service, requeue) find it.

Plans are kept per tenant, cluster and incident (``plans/<tenant>/<cluster>/<incident>.json``,
``denpex.state_paths.plan_file``): an incident id is the collector's, and another tenant may open
an incident of the same id on its own cluster. The tenant is the cluster's registered owner,
never a parameter.

Plans saved before this layout (``plans/<incident>.json``) are still read, once, and only when
the file's own plan is for this cluster and this owner (a file another tenant's incident
overwrote names its own cluster, and is refused); it is then copied to the keyed place, which is
read from then on. The old file is left as it was, and nothing writes there any more::

    load_saved_plan(state, "acme", "gpu-prod", "inc-7")
      plans/acme/gpu-prod/inc-7.json                 -> that plan
      else plans/inc-7.json for gpu-prod and acme    -> that plan, copied to the keyed place
      else                                           -> PlanError
"""

from __future__ import annotations

from pathlib import Path

from denpex.isolation.errors import PlanError
from denpex.isolation.plan import IsolationPlan, load_plan, save_plan
from denpex.state_paths import legacy_plan_file, plan_file

__all__ = ["load_saved_plan"]


def load_saved_plan(state_dir: Path, tenant: str | None, cluster: str, incident_id: str) -> IsolationPlan:
    """``tenant``'s plan for ``incident_id`` on ``cluster`` (see the module docstring)."""
    keyed = plan_file(state_dir, tenant, cluster, incident_id)
    if keyed.exists():
        return load_plan(keyed)
    legacy = legacy_plan_file(state_dir, incident_id)
    if not legacy.exists():
        raise PlanError(f"no plan is saved for incident {incident_id} of tenant {tenant or '(no registered owner)'} "
                        f"on cluster {cluster!r} ({keyed})")
    plan = load_plan(legacy)
    if plan.cluster != cluster or plan.tenant != tenant:
        raise PlanError(f"{legacy} (saved before plans were kept per tenant and cluster) is a plan for tenant "
                        f"{plan.tenant or '(none)'} on cluster {plan.cluster!r}, not for {tenant or '(none)'} on "
                        f"{cluster!r}; it is not used")
    keyed.parent.mkdir(parents=True, exist_ok=True)
    save_plan(plan, keyed)
    return plan
