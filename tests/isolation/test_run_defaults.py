"""The one entry point's safety default: a caller that does not say EXECUTE gets a dry run."""

from __future__ import annotations

import inspect

from denpex.isolation.run import RunMode, execute
from denpex.isolation.run.executor import Executor


def test_execute_and_the_executor_dry_run_unless_told_to_execute() -> None:
    assert inspect.signature(execute).parameters["mode"].default is RunMode.DRY_RUN
    assert inspect.signature(Executor.run).parameters["mode"].default is RunMode.DRY_RUN
