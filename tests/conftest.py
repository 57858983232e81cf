import sys
from pathlib import Path

# The repo root: the Prefect project (flows/, tasks/, blocks/) and the test kit (testkit/) import
# from it. tests/ itself: test modules import sibling helpers (lab.rig, lab.conftest,
# ingest.conftest, isolation.triage_cases, ...).
ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
