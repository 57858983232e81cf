"""No Denpex task caches or persists a result, and no flow persists one (``tasks/options.py``): a
result read back from API-chosen storage is unpickled, and a planted pickle ran code in the flow.
Every ``@task`` and ``@flow`` in ``tasks/`` and ``flows/`` is found by import, so a new one
decorated without ``NOT_CACHED``/``NOT_PERSISTED`` fails here."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType

from prefect import Flow
from prefect.cache_policies import NO_CACHE
from prefect.tasks import Task

import flows
import tasks


def _decorated() -> Iterator[tuple[str, object]]:
    for package in (tasks, flows):
        for info in pkgutil.iter_modules(package.__path__):
            module: ModuleType = importlib.import_module(f"{package.__name__}.{info.name}")
            for name, value in vars(module).items():
                if isinstance(value, (Task, Flow)) and getattr(value.fn, "__module__", "") == module.__name__:
                    yield f"{module.__name__}.{name}", value


def test_no_task_caches_or_persists_and_no_flow_persists_a_result() -> None:
    found = list(_decorated())
    all_tasks = {name: value for name, value in found if isinstance(value, Task)}
    all_flows = {name: value for name, value in found if isinstance(value, Flow)}
    assert len(all_tasks) >= 10 and "flows.triage.triage" in all_flows, [name for name, _ in found]
    assert [name for name, t in all_tasks.items() if t.persist_result is not False or t.cache_policy is not NO_CACHE] == []
    assert [name for name, f in all_flows.items() if f.persist_result is not False] == []
