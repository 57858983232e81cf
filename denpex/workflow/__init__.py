"""The incident workflow's domain logic, free of Prefect.

The Prefect flow (``flows/triage.py``) composes these pieces with the triage and isolation core:
evidence coverage while ranks are still uploading, the workflow section of a runbook, the approval
answer turned into an approval record, the recovery check before acting, the approvers' notice and
the final incident report.
"""
