"""FlowRuntime on the memory store: the shared ledger contract (runtime_contract),
and what only a ledger that dies with the process does — refuse durability."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

import runtime_contract
from videoflow.core.runtime import FlowRuntime, MemoryRuntimeStore, forget_aborts
from videoflow.core.runtime_records import key_token, token_text
from videoflow.errors import DurabilityUnavailable, LedgerError, RevisionConflict, VideoflowError


@pytest.fixture
def make() -> runtime_contract.Factory:
    store = MemoryRuntimeStore()

    def factory(node: str = "join", replica_id: int = 0) -> FlowRuntime:
        return FlowRuntime(store, "flow-1", "run-1", node, replica_id)

    return factory


@pytest.mark.parametrize("check", runtime_contract.SHARED, ids=lambda check: check.__name__)
def test_memory_runtime_keeps_the_ledger_contract(
    check: Callable[[runtime_contract.Factory], None], make: runtime_contract.Factory
) -> None:
    check(make)


class CountingStore(MemoryRuntimeStore):
    """Counts the store calls a ledger makes: each is a round trip on a KV store."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def get(self, key: str) -> tuple[bytes, int] | None:
        self.calls.append("get")
        return super().get(key)

    def create(self, key: str, value: bytes) -> int:
        self.calls.append("create")
        return super().create(key, value)

    def create_many(self, items: Sequence[tuple[str, bytes]]) -> list[int | None]:
        self.calls.append("create_many")
        made = []
        for key, value in items:
            try:
                made.append(MemoryRuntimeStore.create(self, key, value))
            except RevisionConflict:
                made.append(None)
        return made

    def update(self, key: str, value: bytes, expected_revision: int) -> int:
        self.calls.append("update")
        return super().update(key, value, expected_revision)


def test_a_publication_is_entered_and_resolved_in_two_round_trips_each() -> None:
    # The outbox is written for every output that travels by ref: a fenced create,
    # then a fenced update of the revision it wrote -- no read of a record that
    # cannot exist yet, none of the one just written.
    store = CountingStore()
    runtime = FlowRuntime(store, "flow-1", "run-1", "cam")
    runtime.claim_owner()
    store.calls.clear()
    runtime.record_publication("cam:1:1", ["ref"], ["fuse"])
    assert store.calls == ["get", "create"]  # the fence's read of the owner epoch
    store.calls.clear()
    assert runtime.resolve_publication("cam:1:1", 42).stream_seq == 42
    assert store.calls == ["get", "update"]
    assert runtime.publication("cam:1:1").status == "accepted"


def test_a_batch_of_terminations_is_fenced_once() -> None:
    # A join that evicts a burst logs it as one fence read and one batch of creates
    # (a NATS KV store sends those together): it paid a fence, a fenced read and a
    # create per input, four round trips each, while falling further behind.
    store = CountingStore()
    runtime = FlowRuntime(store, "flow-1", "run-1", "fuse")
    runtime.claim_owner()
    store.calls.clear()
    runtime.log_terminals([(f"cam:{i}", f"terminal/cam:{i}", "join expired") for i in range(5)])
    assert store.calls == ["get", "create_many"]


def test_memory_runtime_concurrent_counts_never_lose_an_increment(
    make: runtime_contract.Factory,
) -> None:
    # Switch threads as often as the interpreter allows, so a read-modify-write that
    # is not compare-and-swap would be interleaved, and lose counts, within the run.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        runtime_contract.check_concurrent_counts_never_lose_an_increment(make, per_thread=2000)
    finally:
        sys.setswitchinterval(interval)


def test_memory_runtime_is_not_durable_and_refuses_checkpoints(
    make: runtime_contract.Factory,
) -> None:
    runtime = make()
    runtime.claim_owner()
    assert runtime.durable_shared() is False
    with pytest.raises(DurabilityUnavailable, match="no.*durable|RUN-022") as refused:
        runtime.checkpoint(b"state", "trace-1:4")
    assert isinstance(refused.value, LedgerError) and isinstance(refused.value, VideoflowError)
    assert refused.value.retryable is False
    # The refusal left nothing behind that a restore could mistake for a commit.
    assert runtime.restore_checkpoint() is None
    assert make().restore_checkpoint() is None


def test_memory_runtime_refuses_checkpoint_even_before_claiming(
    make: runtime_contract.Factory,
) -> None:
    with pytest.raises(DurabilityUnavailable, match="RUN-022"):
        make().checkpoint(b"state", "g")


def test_in_memory_runtime_is_claimed_and_isolated() -> None:
    first = FlowRuntime.in_memory("flow", "run", "node")
    second = FlowRuntime.in_memory("flow", "run", "node")
    assert (first.epoch, second.epoch) == (1, 1)
    first.count_attempt("in")
    assert (first.attempts("in"), second.attempts("in")) == (1, 0)


def test_runtimes_of_other_runs_and_flows_do_not_share_records() -> None:
    store = MemoryRuntimeStore()
    runtimes = [FlowRuntime(store, f, r, "join") for f, r in
                [("f", "r"), ("f", "r-x"), ("f-r", "x"), ("g", "r")]]
    for runtime in runtimes:
        runtime.claim_owner()
    runtimes[0].count_attempt("in")
    runtimes[0].record_publication("p")
    assert [r.attempts("in") for r in runtimes] == [1, 0, 0, 0]
    assert [len(r.outbox()) for r in runtimes] == [1, 0, 0, 0]


def test_negative_replica_is_refused() -> None:
    with pytest.raises(ValueError, match="replica_id must be >= 0"):
        FlowRuntime(MemoryRuntimeStore(), "f", "r", "n", replica_id=-1)


@given(st.text())
def test_key_tokens_round_trip_and_stay_in_the_kv_alphabet(text: str) -> None:
    token = key_token(text)
    assert token_text(token) == text
    # NATS KV keys: [-/_=.a-zA-Z0-9], and a token never contains the separator.
    assert token and set(token) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_/="
    )


def test_key_tokens_of_distinct_texts_are_distinct() -> None:
    texts = ["", "=", "=3D", ".", "=2E", "a.b", "a=2Eb", "ü"]
    assert len({key_token(t) for t in texts}) == len(texts)


def test_a_resume_forgets_the_aborts_of_the_run_before_and_keeps_its_clean_ends() -> None:
    store = MemoryRuntimeStore()
    first = FlowRuntime(store, "flow-1", "run-1", "fuse", 1)
    first.claim_owner()
    first.record_eos("cam", 0, aborted=True)  # the camera died
    first.record_eos("imu", 0)                 # the IMU ended its stream
    other_run = FlowRuntime(store, "flow-1", "run-2", "fuse", 0)
    other_run.claim_owner()
    other_run.record_eos("cam", 0, aborted=True)
    assert forget_aborts(store, "flow-1", "run-1") == 1
    resumed = FlowRuntime(store, "flow-1", "run-1", "fuse", 1)
    resumed.claim_owner()
    assert resumed.eos_received("cam") == {}  # the camera, started again, ends anew
    assert resumed.eos_received("imu") == {0: "stop"}
    assert resumed.record_eos("cam", 0) is True
    assert other_run.eos_received("cam") == {0: "abort"}  # another run's, untouched
