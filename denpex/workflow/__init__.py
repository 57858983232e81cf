"""The incident workflow's domain logic, free of Prefect.

The Prefect flow (``flows/triage.py``) composes these pieces with the triage and isolation core:
evidence coverage while ranks are still uploading, the approval answer turned into an approval
record, the recovery check before acting, the approvers' notice and the final incident report.
(The runbook's ``workflow:`` section is read with the runbook: ``denpex.isolation.workflow_section``.)
"""
