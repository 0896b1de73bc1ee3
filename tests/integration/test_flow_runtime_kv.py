"""FlowRuntime on a NATS KV bucket of a real nats-server: the shared ledger contract
(runtime_contract), each runtime over its own connection to the bucket as a
restarted process would be, and the durable checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import runtime_contract
from videoflow.backends.jetstream.ledger_store import NatsKvRuntimeStore
from videoflow.broker import server as embedded
from videoflow.core.runtime import FlowRuntime
from videoflow.core.runtime_records import Checkpoint
from videoflow.errors import BrokerUnavailable, RevisionConflict, SupersededOwner

pytestmark = pytest.mark.timeout(60)

BUCKET = "vf-runtime-test"


@pytest.fixture
def stores(nats_server: embedded.EmbeddedServer) -> Iterator[list[NatsKvRuntimeStore]]:
    opened: list[NatsKvRuntimeStore] = []
    try:
        yield opened
    finally:
        for store in opened:
            store.close()


@pytest.fixture
def make(nats_server: embedded.EmbeddedServer,
         stores: list[NatsKvRuntimeStore]) -> runtime_contract.Factory:
    def factory(node: str = "join", replica_id: int = 0) -> FlowRuntime:
        # A connection of its own: what this runtime sees, another process would.
        store = NatsKvRuntimeStore(nats_server.url, BUCKET)
        stores.append(store)
        return FlowRuntime(store, "flow-1", "run-1", node, replica_id)

    return factory


@pytest.mark.parametrize("check", runtime_contract.SHARED, ids=lambda check: check.__name__)
def test_kv_runtime_keeps_the_ledger_contract(
    check: Callable[[runtime_contract.Factory], None], make: runtime_contract.Factory
) -> None:
    check(make)


def test_kv_runtime_concurrent_counts_never_lose_an_increment(
    make: runtime_contract.Factory,
) -> None:
    runtime_contract.check_concurrent_counts_never_lose_an_increment(make, per_thread=60)


def test_kv_checkpoint_commits_state_and_covered_group_together(
    make: runtime_contract.Factory,
) -> None:
    runtime = make()
    runtime.claim_owner()
    assert runtime.durable_shared() is True
    assert runtime.restore_checkpoint() is None
    keys_before = set(runtime.store.keys(""))
    runtime.checkpoint(b"\x00state-1", "trace-a:1")
    # One ledger write: a single record holds state and group (RUN-022).
    assert set(runtime.store.keys("")) - keys_before == {"flow-1.run-1.join.r0.checkpoint"}
    runtime.checkpoint(b"state-2", "trace-a:2", output="join:1:2")

    restarted = make()
    assert restarted.restore_checkpoint() == Checkpoint(b"state-2", "trace-a:2", "join:1:2", 1)
    # Checkpoints are the replica's own.
    assert make(replica_id=1).restore_checkpoint() is None


def test_kv_superseded_owner_cannot_checkpoint_over_the_new_owner(
    make: runtime_contract.Factory,
) -> None:
    old = make()
    old.claim_owner()
    old.checkpoint(b"old", "g1")
    new = make()
    assert new.claim_owner() == 2
    assert new.restore_checkpoint() == Checkpoint(b"old", "g1", None, 1)
    with pytest.raises(SupersededOwner, match="epoch 1 was superseded by epoch 2"):
        old.checkpoint(b"stale", "g2")
    new.checkpoint(b"new", "g2")
    assert make().restore_checkpoint() == Checkpoint(b"new", "g2", None, 2)


def test_kv_checkpoint_written_by_a_newer_epoch_is_never_overwritten(
    make: runtime_contract.Factory,
) -> None:
    # The fence on the checkpoint record itself, not only the owner read: even a
    # writer whose owner check passed cannot replace a newer epoch's checkpoint.
    old, new = make(), make()
    old.claim_owner()
    new.claim_owner()
    new.checkpoint(b"new", "g2")
    old._fence = lambda: 1  # type: ignore[method-assign]  # the check it raced past
    with pytest.raises(SupersededOwner, match="cannot overwrite epoch 2's checkpoint"):
        old.checkpoint(b"stale", "g1")
    assert make().restore_checkpoint() == Checkpoint(b"new", "g2", None, 2)


def test_kv_store_binds_an_existing_bucket_and_refuses_a_stale_revision(
    nats_server: embedded.EmbeddedServer, stores: list[NatsKvRuntimeStore],
) -> None:
    first = NatsKvRuntimeStore(nats_server.url, "vf-bind")
    stores.append(first)
    revision = first.create("a.b", b"1")
    second = NatsKvRuntimeStore(nats_server.url, "vf-bind")
    stores.append(second)
    assert second.get("a.b") == (b"1", revision)
    second.update("a.b", b"2", revision)
    with pytest.raises(RevisionConflict, match="no longer at revision"):
        first.update("a.b", b"3", revision)
    with pytest.raises(ValueError, match="expected_revision must be > 0"):
        first.update("a.b", b"3", 0)
    with pytest.raises(ValueError, match="not a KV key"):
        first.create("a b", b"1")


def test_kv_store_on_an_unreachable_server_is_broker_unavailable(closed_port_url: str) -> None:
    with pytest.raises(BrokerUnavailable, match="cannot connect"):
        NatsKvRuntimeStore(closed_port_url, BUCKET, timeout=1.0)
