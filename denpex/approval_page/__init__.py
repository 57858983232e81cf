"""The approval page (``denpex serve-approvals``): where a person sees a paused run's brief from
Denpex's own state, decides, proves who they are, and the decision is signed for that run.

- ``store``: the page's database (runs waiting, one decision per run, every answer);
- ``brief``: what the flow saves for the page to show;
- ``decide``: one answer judged and, when it stands, signed and recorded;
- ``resume``: the run resumed with the signed record (Prefect's HTTP API);
- ``app``: the HTTP app (``denpex serve-approvals`` runs it: ``denpex.cli.approval_page``).
"""
