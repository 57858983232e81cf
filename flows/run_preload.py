"""What every served flow run would otherwise import or load for itself, done once in the
forkserver the runs are forked from (flows/forked_runs.py).

Measured per run before (py-spy, the triage flow on the test rig): 2.2-2.8 s loading Prefect's
collections (``prefect_aws`` and ``prefect_dask`` with ``distributed``, loaded the first time a
block is made) and 0.6-0.8 s importing boto3 for the evidence store, of about 5 s of CPU a run.
The forkserver forks, so nothing here may start a thread: none of these imports does (read off
/proc/self/task before and after). tests/flows/test_forked_runs.py checks that a run finds them done.
"""

from __future__ import annotations

import boto3  # noqa: F401  (the evidence store's S3 client)
import botocore.client  # noqa: F401
from prefect._internal.plugins.collections import load_prefect_collections

import denpex.charts  # noqa: F401  (the report's charts: matplotlib)

load_prefect_collections()  # cached in this process, and so in every run forked from it
