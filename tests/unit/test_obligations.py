"""The runtime obligation ledger (BLOB-14 step 4) on the in-process adapter: a parent's
outbox in a shared MemoryRuntimeStore, the memory broker's retention and ack floors,
and a MemoryPayloadStore that reconciliation cancels on. Each rule has its own test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    ChannelObservation,
    ChannelSpec,
    Completed,
    Envelope,
    Known,
    SubscriptionId,
    SubscriptionSpec,
    Unknown,
)
from videoflow.backends.payload import MemoryPayloadStore, intent_id
from videoflow.backends.shm_payload import SharedMemoryPayloadStore
from videoflow.core.runtime import FlowRuntime
from videoflow.core.runtime_store import MemoryRuntimeStore
from videoflow.errors import PayloadMissing
from videoflow.messaging.obligations import (
    ObligationLedger,
    RuntimeObligationLedger,
    StoreObligationLedger,
    reconcile,
    subscription_for,
)

FLOW, RUN, PARENT, CHILD = "flow", "run", "source", "sink"
CHANNEL = ChannelId(FLOW, RUN, PARENT)


class Blind(MemoryMessagingBackend):
    """Fault injection: the named ack floors, or the channel, cannot be observed (a
    broker call that timed out), whatever the broker holds."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker, flow_id=FLOW, run_id=RUN)
        self.blind_floors: set[SubscriptionId] = set()
        self.blind_channel = False

    def observe_ack_floor(self, subscription: SubscriptionId) -> Known[int] | Unknown:
        if subscription in self.blind_floors:
            return Unknown("timeout", "injected")
        return super().observe_ack_floor(subscription)

    def observe_channel(self, channel: ChannelId) -> Known[ChannelObservation] | Unknown:
        if self.blind_channel:
            return Unknown("timeout", "injected")
        return super().observe_channel(channel)


@pytest.fixture
def backend() -> Iterator[Blind]:
    made = Blind(MemoryBroker())
    made.start()
    yield made
    made.shutdown(hand_back=False)


@pytest.fixture
def store() -> MemoryRuntimeStore:
    return MemoryRuntimeStore()


@pytest.fixture
def parent(store: MemoryRuntimeStore) -> FlowRuntime:
    runtime = FlowRuntime(store, FLOW, RUN, PARENT)
    runtime.claim_owner()
    return runtime


@pytest.fixture
def ledger(store: MemoryRuntimeStore, backend: Blind) -> RuntimeObligationLedger:
    child = FlowRuntime(store, FLOW, RUN, CHILD)
    child.claim_owner()
    return RuntimeObligationLedger(child, backend, [PARENT])


@pytest.fixture
def payloads() -> MemoryPayloadStore:
    return MemoryPayloadStore()


def provision(backend: Blind, readers: tuple[str, ...], profile: str = RELIABLE_WORK,
              realtime_buffer: int = 1) -> dict[str, SubscriptionId]:
    subs = {reader: subscription_for(reader, CHANNEL) for reader in readers}
    backend.ensure_channel(ChannelSpec(CHANNEL, profile, required=tuple(subs.values()),
                                       realtime_buffer=realtime_buffer), "channel")
    for reader, sub in subs.items():
        backend.ensure_subscription(SubscriptionSpec(sub, 30.0, -1, 16), f"bind-{reader}")
    return subs


def publish(backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
            readers: tuple[str, ...], pid: str) -> tuple[str, int]:
    """What a publisher does: put (readers + intent), record, send, resolve. The
    intent's own release is left undone unless a test does it."""
    ref = payloads.put(b"payload-" + pid.encode(), readers, pid)
    parent.record_publication(pid, [ref], readers)
    outcome = backend.publish(Envelope(CHANNEL, "data", ref.encode(), pid),
                              time.monotonic() + 1)
    assert isinstance(outcome, Accepted), outcome
    parent.resolve_publication(pid, outcome.stream_seq)
    return ref, outcome.stream_seq


def settle_all(backend: Blind, sub: SubscriptionId) -> list[int]:
    settled = []
    while got := backend.receive(sub, 16, 0, time.monotonic()):
        for delivery in got:
            backend.settle(delivery.token, Completed(), f"s-{sub}-{delivery.stream_seq}")
            settled.append(delivery.stream_seq)
    return settled


def floor(backend: Blind, sub: SubscriptionId) -> int:
    observed = backend.observe_ack_floor(sub)
    assert isinstance(observed, Known), observed
    return observed.value


# ------------------------------------------------------------------- reader ids


def test_reader_ids_map_to_the_shared_or_the_replica_durable() -> None:
    assert subscription_for("sink", CHANNEL) == SubscriptionId("sink", CHANNEL)
    assert subscription_for("sink/p3", CHANNEL) == SubscriptionId("sink", CHANNEL, replica=3)
    assert subscription_for("a/b/p0", CHANNEL) == SubscriptionId("a/b", CHANNEL, replica=0)
    # Not a replica suffix: a competing child with that name.
    assert subscription_for("sink/px", CHANNEL) == SubscriptionId("sink/px", CHANNEL)
    assert subscription_for("sink/p01", CHANNEL) == SubscriptionId("sink/p01", CHANNEL)


def test_the_runtime_ledger_is_an_obligation_ledger(ledger: RuntimeObligationLedger) -> None:
    assert isinstance(ledger, ObligationLedger)
    with pytest.raises(ValueError, match="sequence of node names"):
        RuntimeObligationLedger(ledger.runtime, ledger.backend, PARENT)


# --------------------------------------------------------------- PAY-012 eviction


def test_an_evicted_publication_owes_nothing_even_to_an_unobservable_reader(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    provision(backend, ("sink",), LIVE_LATEST, realtime_buffer=1)
    # 'late' never bound a durable: its floor is Unknown('missing'), so only the
    # eviction can say it owes nothing.
    readers = ("sink", "late")
    evicted, seq1 = publish(backend, parent, payloads, readers, "p1")
    kept, seq2 = publish(backend, parent, payloads, readers, "p2")
    channel = backend.observe_channel(CHANNEL)
    assert isinstance(channel, Known) and seq1 < channel.value.first_seq <= seq2
    assert isinstance(backend.observe_ack_floor(subscription_for("late", CHANNEL)), Unknown)
    required = ledger.required_obligations()
    assert required[evicted] == ()
    assert required[kept] == ("late", "sink")


# ---------------------------------------------------------- PAY-006 ack floors


def test_a_floor_below_the_sequence_owes_and_one_at_or_past_it_does_not(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    subs = provision(backend, ("sink", "audit"))
    readers = ("sink", "audit")
    first, seq1 = publish(backend, parent, payloads, readers, "p1")
    second, seq2 = publish(backend, parent, payloads, readers, "p2")
    assert settle_all(backend, subs["sink"]) == [seq1, seq2]
    # audit settled nothing, so INTEREST retention keeps both messages: the channel
    # evicted nothing and the floors alone decide.
    channel = backend.observe_channel(CHANNEL)
    assert isinstance(channel, Known) and channel.value.first_seq == seq1
    assert floor(backend, subs["sink"]) == seq2  # past seq1, at seq2
    assert floor(backend, subs["audit"]) < seq1
    required = ledger.required_obligations()
    assert required == {first: ("audit",), second: ("audit",)}


def test_partitioned_replicas_are_judged_by_their_own_durable(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    subs = provision(backend, ("sink/p0", "sink/p1"))
    ref, _ = publish(backend, parent, payloads, ("sink/p0", "sink/p1"), "p1")
    settle_all(backend, subs["sink/p1"])
    assert ledger.required_obligations() == {ref: ("sink/p0",)}


# ------------------------------------------------------------- PAY-007/013 intents


def test_an_unresolved_publication_owes_its_intent_and_every_reader(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    provision(backend, ("sink",))
    ref = payloads.put(b"x", ["sink"], "p1")
    parent.record_publication("p1", [ref], ["sink"])
    assert ledger.required_obligations() == {ref: ("intent/p1", "sink")}
    assert ledger.authoritative(intent_id("p1"))


def test_an_accepted_publication_owes_no_intent(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    provision(backend, ("sink",))
    ref, _ = publish(backend, parent, payloads, ("sink",), "p1")
    assert ledger.required_obligations() == {ref: ("sink",)}


def test_a_refused_publication_owes_nothing(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    provision(backend, ("sink",))
    ref = payloads.put(b"x", ["sink"], "p1")
    parent.record_publication("p1", [ref], ["sink"])
    parent.resolve_publication("p1", None)
    assert ledger.required_obligations() == {ref: ()}
    # The crash lost resolve_intent(accepted=False): reconciliation does its work.
    assert reconcile(payloads, ledger) == 2
    with pytest.raises(PayloadMissing, match="reclaimed"):
        payloads.get(ref)


# ----------------------------------------------------------------- unobservable


def test_an_unknown_floor_is_required(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    subs = provision(backend, ("sink", "audit"))
    ref, seq = publish(backend, parent, payloads, ("sink", "audit"), "p1")
    settle_all(backend, subs["sink"])
    assert floor(backend, subs["sink"]) >= seq
    backend.blind_floors.add(subs["sink"])
    assert ledger.required_obligations() == {ref: ("audit", "sink")}


def test_an_unknown_channel_is_required_unless_the_floor_proves_settlement(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    subs = provision(backend, ("sink", "audit"), LIVE_LATEST, realtime_buffer=1)
    ref, _ = publish(backend, parent, payloads, ("sink", "audit"), "p1")
    settle_all(backend, subs["sink"])
    publish(backend, parent, payloads, ("sink", "audit"), "p2")  # evicts p1
    backend.blind_channel = True
    backend.blind_floors.add(subs["audit"])
    # p1 was evicted, but that could not be observed: audit (Unknown floor) still
    # owes; sink's floor shows it settled.
    assert ledger.required_obligations()[ref] == ("audit",)


def test_a_missing_channel_is_required(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    # Nothing provisioned: the publication's record exists, the channel does not.
    ref = payloads.put(b"x", ["sink"], "p1")
    parent.record_publication("p1", [ref], ["sink"])
    parent.resolve_publication("p1", 1)
    assert isinstance(backend.observe_channel(CHANNEL), Unknown)
    assert ledger.required_obligations() == {ref: ("sink",)}
    assert reconcile(payloads, ledger) == 1  # only the lost intent release
    assert payloads.obligations(ref) == ("sink",)


# ------------------------------------------------------------------- authority


def test_pins_and_unknown_ids_are_not_authoritative(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    provision(backend, ("sink",))
    publish(backend, parent, payloads, ("sink",), "p1")
    assert ledger.authoritative("sink")
    assert ledger.authoritative(intent_id("p1"))
    assert not ledger.authoritative("archive/sink")
    assert not ledger.authoritative("dlq/sink")
    assert not ledger.authoritative("stranger")
    assert not ledger.authoritative(intent_id("someone-elses"))


def test_reconcile_never_cancels_archive_or_dlq_pins(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    subs = provision(backend, ("sink",))
    ref, _ = publish(backend, parent, payloads, ("sink",), "p1")
    payloads.acquire(ref, "archive/cold")
    payloads.acquire(ref, "dlq/sink")
    payloads.acquire(ref, "stranger")
    settle_all(backend, subs["sink"])
    assert reconcile(payloads, ledger) == 2  # sink and the intent
    assert payloads.obligations(ref) == ("archive/cold", "dlq/sink", "stranger")
    assert payloads.get(ref) == b"payload-p1"


# ---------------------------------------------------------------- reconciliation


def test_reconcile_cancels_exactly_the_lost_releases_and_the_payload_is_reclaimed(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    subs = provision(backend, ("sink", "audit"))
    first, _ = publish(backend, parent, payloads, ("sink", "audit"), "p1")
    second, _ = publish(backend, parent, payloads, ("sink", "audit"), "p2")
    for pid, ref in (("p1", first), ("p2", second)):
        assert payloads.resolve_intent(ref, pid, accepted=True)
    settle_all(backend, subs["sink"])
    # audit settled p1 only and crashed before releasing; sink crashed before both.
    (delivery, _) = backend.receive(subs["audit"], 2, 0, time.monotonic())
    backend.settle(delivery.token, Completed(), "audit-p1")
    assert reconcile(payloads, ledger) == 3
    with pytest.raises(PayloadMissing, match="reclaimed"):
        payloads.get(first)
    assert payloads.reclaimed == 1
    assert payloads.obligations(second) == ("audit",)
    assert reconcile(payloads, ledger) == 0  # nothing left to cancel: idempotent


def test_an_obligation_with_an_unobservable_floor_survives_reconcile(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    # LIMITS retention keeps the settled message, so only the floor can release it.
    subs = provision(backend, ("sink",), LIVE_LATEST, realtime_buffer=10)
    ref, _ = publish(backend, parent, payloads, ("sink",), "p1")
    settle_all(backend, subs["sink"])  # settled, release lost...
    backend.blind_floors.add(subs["sink"])  # ...but that cannot be observed now
    assert reconcile(payloads, ledger) == 1  # the intent only
    assert payloads.obligations(ref) == ("sink",)
    assert payloads.get(ref) == b"payload-p1"
    backend.blind_floors.clear()
    assert reconcile(payloads, ledger) == 1
    with pytest.raises(PayloadMissing, match="reclaimed"):
        payloads.get(ref)


def test_reconcile_skips_refs_already_reclaimed(
    backend: Blind, parent: FlowRuntime, payloads: MemoryPayloadStore,
    ledger: RuntimeObligationLedger,
) -> None:
    subs = provision(backend, ("sink",))
    ref, _ = publish(backend, parent, payloads, ("sink",), "p1")
    settle_all(backend, subs["sink"])
    payloads.resolve_intent(ref, "p1", accepted=True)
    payloads.release(ref, "sink")  # the releases happened: nothing is lost
    assert ledger.required_obligations() == {ref: ()}
    assert reconcile(payloads, ledger) == 0


# ------------------------------------------- a store that keeps its own outbox


@pytest.fixture
def shm(tmp_path: Path) -> SharedMemoryPayloadStore:
    return SharedMemoryPayloadStore(tmp_path / "payloads")


def publish_kept(backend: Blind, payloads: SharedMemoryPayloadStore, readers: tuple[str, ...],
                 pid: str, *, resolve: bool = True) -> tuple[str, int]:
    """What a publisher does when the store keeps the outbox: put naming its channel,
    send, and resolve the intent with the stream sequence. No run-ledger entry."""
    ref = payloads.put(b"payload-" + pid.encode(), readers, pid, channel=PARENT)
    outcome = backend.publish(Envelope(CHANNEL, "data", ref.encode(), pid),
                              time.monotonic() + 1)
    assert isinstance(outcome, Accepted), outcome
    if resolve:
        payloads.resolve_intent(ref, pid, accepted=True, stream_seq=outcome.stream_seq)
    return ref, outcome.stream_seq


def test_a_store_kept_outbox_is_judged_by_the_same_floors(
    backend: Blind, ledger: RuntimeObligationLedger, shm: SharedMemoryPayloadStore,
) -> None:
    subs = provision(backend, ("sink", "audit"))
    store_ledger = StoreObligationLedger(shm, ledger.runtime, backend, [PARENT])
    first, _ = publish_kept(backend, shm, ("sink", "audit"), "p1")
    unresolved, _ = publish_kept(backend, shm, ("sink", "audit"), "p2", resolve=False)
    elsewhere = shm.put(b"another node's", ("sink",), "q1", channel="other")
    settle_all(backend, subs["sink"])  # sink settled both; its releases were lost
    assert ledger.required_obligations() == {}  # nothing in the run ledger's outbox
    required = store_ledger.required_obligations()
    assert required == {first: ("audit",),
                        unresolved: ("audit", "intent/p2", "sink")}  # PAY-007
    assert elsewhere not in required  # not a judged channel
    assert reconcile(shm, store_ledger) == 1  # sink's lost release on the accepted one
    assert shm.obligations(first) == ("audit",)
    assert shm.obligations(unresolved) == ("audit", "intent/p2", "sink")
    assert shm.obligations(elsewhere) == ("intent/q1", "sink")
