"""The Prefect flows: ``triage`` (alert-driven triage and remediation), ``return_to_service``
(rollback of an incident's isolation), ``replay`` (scheduled replays; flows/replay.py)."""

# Where the Dask scheduler is, when the parse fan-out runs on a cluster (flows/dask_parse.py). Kept
# here so the triage flow can read it without importing prefect-dask and distributed (seconds).
DASK_ADDRESS_ENV = "DENPEX_DASK_ADDRESS"

# Before any flow module runs: no stored result is read in a Denpex process (flows/result_guard.py).
from flows.result_guard import refuse_stored_results  # noqa: E402

refuse_stored_results()
