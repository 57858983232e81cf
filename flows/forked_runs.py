"""Served flow runs forked from a process that already imported Prefect and the flows.

flows/serve.py hands the runner its flows as objects, and Prefect's runner starts each run of
such a flow with ``prefect.flow_engine.run_flow_in_subprocess``: a fresh interpreter
(``multiprocessing`` "spawn") that imports Prefect and the flow's modules all over again, seconds
on a 2-core machine. A forkserver that imported them once forks each run in milliseconds.
Isolation is the same: one process per run, forked from a server process that runs no threads
(never from the runner itself, whose threads make a plain fork unsafe).

Prefect documents the seam: its direct starter calls ``run_flow_in_subprocess`` through a
module-level name "to patch". The function is Prefect's own; only the context it asks
``multiprocessing`` for is the forkserver instead of spawn.

The runs are the forkserver's children, not the runner's: should the forkserver die while the
runner lives (it is killed alone), the runner reads its runs as exited (code 255) and marks them
Crashed though they still run. Stop serve as a whole (Ctrl-C, or a signal to its process group,
as the demo does).
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from prefect import flow_engine
from prefect.runner import _starter_direct

__all__ = ["PRELOAD", "use_forked_flow_runs"]

# What every run imports first; Prefect's engine, then the flows and what they import.
PRELOAD = ("prefect.flow_engine", "flows.triage", "flows.replay", "flows.return_to_service", "flows.requeue",
           "flows.run_preload")

# Prefect's runner starts runs from its event loop thread, one call at a time; the lock keeps the
# swap below atomic should that ever change.
_SWAP = threading.Lock()


class _ForkserverMultiprocessing:
    """Stands in for the ``multiprocessing`` module inside Prefect's ``flow_engine`` for one call:
    every context it asks for is the forkserver."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def get_context(self, method: str | None = None) -> Any:
        return self._context

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)


@contextmanager
def _forkserver_in(module: ModuleType, context: Any) -> Iterator[None]:
    saved = module.multiprocessing
    module.multiprocessing = _ForkserverMultiprocessing(context)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        module.multiprocessing = saved  # type: ignore[attr-defined]


def _ready() -> None:
    """Forked once at start so that the server has finished importing before the first run."""


@contextmanager
def _bare_main() -> Iterator[None]:
    """Start the run without naming this process's ``__main__``: a child imports its parent's main
    module first (``multiprocessing.spawn.prepare``), and so would each parse worker the run starts
    after it: ``flows.serve`` and all of Prefect, seconds per worker. Nothing in the run needs it."""
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


def use_forked_flow_runs(preload: Sequence[str] = PRELOAD) -> Callable[..., Any]:
    """Make this process's runner fork served flow runs from a preloaded forkserver.

    Returns the function now in use (for tests). Call it before the runner starts. Only runs the
    runner starts from a flow object it holds (``Runner.add_flow``, as flows/serve.py does) are
    forked; deployments it loads from storage run under ``python -m prefect.engine`` as before.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    # Started, and one process forked from it, before the runner polls: its imports then happen
    # now, not while the first alert waits.
    with _bare_main():
        warm = context.Process(target=_ready, name="denpex-forkserver-warm")
        warm.start()
    warm.join()
    spawn_run = flow_engine.run_flow_in_subprocess

    def run_flow_in_forked_subprocess(*args: Any, **kwargs: Any) -> Any:
        with _SWAP, _forkserver_in(flow_engine, context), _bare_main():
            return spawn_run(*args, **kwargs)

    _starter_direct.run_flow_in_subprocess = run_flow_in_forked_subprocess
    return run_flow_in_forked_subprocess
