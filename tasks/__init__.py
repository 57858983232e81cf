"""Thin Prefect tasks over the Denpex core: retries, artifacts, events and logging only."""
