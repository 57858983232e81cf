"""What the project's flows share, by concept: this run and its configuration (``run``), the
cluster a run acts on (``targets``), the approval pause (``pause``) and the approval page's side of
it (``page``), the decision records (``records``) and events (``events``). Prefect-facing; the
decisions themselves are in ``denpex.workflow``."""
