"""A probe for flows/forked_runs.py, run in its own process (``python tests/flows/forked_probe.py
OUT``): the forkserver is one per process, so a test process that already started it for the
parse workers could not show what the preload does."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

from prefect import flow, flow_engine
from prefect.runner import _starter_direct


@flow(name="forked-probe")
def probe(out: str) -> None:
    # The probe never imports flows.triage: only a preloaded forkserver can have it here.
    main = sys.modules["__main__"]
    Path(out).write_text(json.dumps({"parent": os.getppid(), "preloaded": "flows.triage" in sys.modules,
                                     "main": getattr(main, "__file__", None) or getattr(main.__spec__, "name", None)}))


def main(out: str) -> int:
    from flows.forked_runs import PRELOAD, use_forked_flow_runs

    start = use_forked_flow_runs(preload=(*PRELOAD, "forked_probe"))
    assert _starter_direct.run_flow_in_subprocess is start
    process = start(probe, parameters={"out": out})
    process.join(300)
    print(json.dumps({"runner": os.getpid(), "exitcode": process.exitcode, "kind": type(process).__name__,
                      "restored": flow_engine.multiprocessing is multiprocessing}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
