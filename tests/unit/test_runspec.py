"""RunSpec: a provisioned run as workers load it, and the check that a worker sees the
shared memory a run's payloads go through."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator

import pytest

from videoflow import ConsumerNode, Flow, ProducerNode
from videoflow.backends.shm_runs import mark_store, run_store_dir, store_mark
from videoflow.core.constants import BATCH
from videoflow.errors import PayloadsElsewhere
from videoflow.run.runspec import RunSpec


@pytest.fixture
def run_id() -> Iterator[str]:
    made = f"r-test-{uuid.uuid4().hex[:12]}"
    yield made
    shutil.rmtree(run_store_dir("runspec-test", made), ignore_errors=True)


def chain() -> Flow:
    camera = ProducerNode(name="cam")
    return Flow([camera], [ConsumerNode(name="sink")(camera)], BATCH, name="runspec-test")


def test_a_spec_keeps_its_shared_memory_mark_and_one_written_before_it_reads_as_none(
    run_id: str,
) -> None:
    spec = RunSpec.for_flow("m:flow", chain(), run_id, shared_memory="ab" * 16)
    assert RunSpec.from_json(spec.to_json()) == spec
    data = json.loads(spec.to_json())
    del data["shared_memory"]  # a spec written before the field existed
    assert RunSpec.from_json(json.dumps(data)).shared_memory is None


def test_a_worker_that_sees_the_run_s_shared_memory_writes_payloads_there(run_id: str) -> None:
    flow = chain()
    directory = run_store_dir(flow.flow_id, run_id)
    spec = RunSpec.for_flow("m:flow", flow, run_id, shared_memory=mark_store(directory))
    job, _ = spec.replica(flow, "sink", 0, "nats://127.0.0.1:4222")
    assert job.payload_dir == str(directory)


def test_a_spec_without_shared_memory_uses_the_object_store(run_id: str) -> None:
    flow = chain()
    job, _ = RunSpec.for_flow("m:flow", flow, run_id).replica(flow, "sink", 0, "nats://x:1")
    assert job.payloads and job.payload_dir is None


@pytest.mark.parametrize("there", ["another store", "nothing"])
def test_a_worker_on_another_host_is_refused_naming_the_remedy(run_id: str, there: str) -> None:
    # Another host's /dev/shm: the run's folder is not there, or is another store's.
    flow = chain()
    directory = run_store_dir(flow.flow_id, run_id)
    if there == "another store":
        mark_store(directory)
    spec = RunSpec.for_flow("m:flow", flow, run_id, shared_memory="0" * 32)
    with pytest.raises(PayloadsElsewhere, match=r"in shared memory on the host that "
                       r"provisioned it.*start this worker on that host.*--payloads "
                       r"object_store"):
        spec.replica(flow, "sink", 0, "nats://127.0.0.1:4222")
    # Refusing made nothing: no store appears where there was none.
    assert (store_mark(directory) is None) == (there == "nothing")


def test_a_store_is_marked_once(run_id: str) -> None:
    directory = run_store_dir("runspec-test", run_id)
    first = mark_store(directory)
    assert mark_store(directory) == first == store_mark(directory)
    assert len(first) == 32
