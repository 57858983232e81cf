"""A state forced through the Prefect API cannot make a Denpex run deserialize a result.

Attacker review: while a served triage run was pending, a COMPLETED state whose data was result
metadata (a pickled record in storage the attacker chose) was forced on it; the engine's own
proposal to run was rejected, it read the "result", and the pickle ran ``os.system`` in the flow
process. Here the same forgery meets a flow run on the session's real Prefect API, run by
Prefect's own engine in this process, where ``flows`` (and so its guard) is imported."""

from __future__ import annotations

import pathlib
from pathlib import Path

import pytest

import flows  # noqa: F401 - the guard, as in every flow process
from flows.result_guard import StoredResultRefused


class Planted:
    """Unpickling it creates a file: the proof that a result was deserialized."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (pathlib.Path.touch, (str(self.marker),))  # type: ignore[return-value]


def _planted_record(tmp_path: Path) -> tuple[object, Path]:
    """A real pickled result record on local storage, and the file its unpickling creates."""
    from prefect._internal.result_records import ResultRecord, ResultRecordMetadata
    from prefect.serializers import PickleSerializer

    marker = tmp_path / "deserialized"
    key = tmp_path / "planted-result"
    metadata = ResultRecordMetadata(storage_key=str(key), expiration=None, serializer=PickleSerializer(),
                                    storage_block_id=None)
    key.write_bytes(ResultRecord(metadata=metadata, result=Planted(marker)).serialize())
    # The bytes are hostile: Prefect's own deserialization of them creates the marker.
    ResultRecord.deserialize(key.read_bytes())
    assert marker.exists()
    marker.unlink()
    return metadata, marker


def test_a_forced_completed_state_with_a_stored_result_is_refused_not_deserialized(
        prefect_harness: str, tmp_path: Path) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    metadata, marker = _planted_record(tmp_path)

    @flow(name="forged-state-probe", persist_result=False)
    def probe() -> str:
        return "ran"

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(probe)
        # As the attacker sent it: the API's own set_state, the record's metadata as the state's data.
        forced = client.request("POST", "/flow_runs/{id}/set_state", path_params={"id": run.id}, json={
            "state": {"type": "COMPLETED", "name": "Completed", "data": metadata.model_dump(mode="json")},
            "force": True})
        assert forced.json()["status"] == "ACCEPT"
        run = client.read_flow_run(run.id)
    with pytest.raises(StoredResultRefused, match="Denpex persists no result"):
        run_flow(probe, flow_run=run)
    assert not marker.exists()
