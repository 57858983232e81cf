"""The Prefect flows: ``triage`` (alert-driven triage and remediation), ``return_to_service``
(rollback of an incident's isolation), ``replay`` (scheduled replays; flows/replay.py)."""
