"""A probe for flows/forked_runs.py, served in its own process exactly as flows/serve.py serves
the real flows (``python tests/flows/forked_probe.py``): the forkserver is one per process, so a
test process that already started one for the parse workers could not show what the preload does.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from prefect import flow


@flow(name="forked-probe")
def probe(out: str) -> None:
    # The probe never imports flows.triage: only a preloaded forkserver can have it here.
    from prefect._internal.plugins import collections

    main = sys.modules["__main__"]
    Path(out).write_text(json.dumps({
        "pid": os.getpid(), "parent": os.getppid(), "preloaded": "flows.triage" in sys.modules,
        "collections_loaded": collections._collections is not None, "boto3": "boto3" in sys.modules,
        "main": getattr(main, "__file__", None) or getattr(main.__spec__, "name", None)}))


def main() -> None:
    from flows.forked_runs import PRELOAD, use_forked_flow_runs
    from flows.serve import ServedDeployment, serve_deployments

    use_forked_flow_runs(preload=(*PRELOAD, "forked_probe"))
    asyncio.run(serve_deployments([ServedDeployment(probe, "probe")]))


if __name__ == "__main__":
    main()
