"""The runtime obligation ledger (BLOB-14 step 4) against JetStreamMessagingBackend on a
real nats-server (conftest's fixture chain): ack floors and stream retention read from
the broker itself, and an unanswering broker read as Unknown, hence required."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from videoflow.backends.jetstream import backend as jetstream_backend
from videoflow.backends.jetstream import connection as jetstream_connection
from videoflow.backends.jetstream.backend import (
    JetStreamMessagingBackend,
    channel_spec_for,
    subscription_spec_for,
)
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    Completed,
    Envelope,
    Known,
    SettleConfirmed,
    SubscriptionId,
    Unknown,
)
from videoflow.backends.payload import MemoryPayloadStore
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.runtime import FlowRuntime
from videoflow.core.runtime_store import MemoryRuntimeStore
from videoflow.messaging.obligations import RuntimeObligationLedger, reconcile, subscription_for

pytestmark = pytest.mark.timeout(60)

FLOW, RUN, CHILD = "flow", "run", "sink"


class World:
    """A parent publishing through a started backend, its outbox in a shared run
    ledger, a payload store, and the child's obligation ledger over that parent."""

    def __init__(self, backend: JetStreamMessagingBackend, parent: str) -> None:
        self.backend, self.parent = backend, parent
        self.channel = ChannelId(FLOW, RUN, parent)
        store = MemoryRuntimeStore()
        self.outbox = FlowRuntime(store, FLOW, RUN, parent)
        self.outbox.claim_owner()
        child = FlowRuntime(store, FLOW, RUN, CHILD)
        child.claim_owner()
        self.payloads = MemoryPayloadStore()
        self.ledger = RuntimeObligationLedger(child, backend, [parent])

    def provision(self, readers: tuple[str, ...], profile: str = RELIABLE_WORK,
                  realtime_buffer: int = 1) -> dict[str, SubscriptionId]:
        subs = {reader: subscription_for(reader, self.channel) for reader in readers}
        flow_type = BATCH if profile == RELIABLE_WORK else REALTIME
        self.backend.ensure_channel(channel_spec_for(
            FLOW, RUN, self.parent, flow_type, profile, required=list(subs.values()),
            realtime_buffer=realtime_buffer), "chan")
        for reader, sub in subs.items():
            self.backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, 8),
                                             f"bind-{reader}")
        return subs

    def publish(self, readers: tuple[str, ...], pid: str) -> tuple[str, int]:
        """put, record, send, resolve; the intent's own release is left undone."""
        ref = self.payloads.put(b"payload-" + pid.encode(), readers, pid)
        self.outbox.record_publication(pid, [ref], readers)
        outcome = self.backend.publish(Envelope(self.channel, "data", ref.encode(), pid),
                                       time.monotonic() + 5)
        assert isinstance(outcome, Accepted), outcome
        self.outbox.resolve_publication(pid, outcome.stream_seq)
        return ref, outcome.stream_seq

    def settle(self, sub: SubscriptionId, count: int) -> None:
        got = []
        deadline = time.monotonic() + 5
        while len(got) < count and time.monotonic() < deadline:
            got += self.backend.receive(sub, count - len(got), 0,
                                        min(deadline, time.monotonic() + 1))
        assert len(got) == count
        for delivery in got:
            assert self.backend.settle(delivery.token, Completed(),
                                       f"{sub.consumer}-{delivery.stream_seq}") == (
                SettleConfirmed())

    def floor(self, sub: SubscriptionId) -> int:
        observed = self.backend.observe_ack_floor(sub)
        assert isinstance(observed, Known), observed
        return observed.value


@pytest.fixture
def world(nats_server: embedded.EmbeddedServer) -> Iterator[Callable[[str], World]]:
    made: list[JetStreamMessagingBackend] = []

    def make(parent: str) -> World:
        backend = JetStreamMessagingBackend(nats_server.url, FLOW, RUN, BATCH,
                                            fetch_timeout=0.5)
        backend.start()
        made.append(backend)
        return World(backend, parent)

    try:
        yield make
    finally:
        for backend in made:
            backend.shutdown(hand_back=False)


def test_a_settled_reader_owes_nothing_and_an_unsettled_one_owes(
    world: Callable[[str], World],
) -> None:
    w = world("settled")
    subs = w.provision(("sink", "audit"))
    first, seq1 = w.publish(("sink", "audit"), "p1")
    second, seq2 = w.publish(("sink", "audit"), "p2")
    w.settle(subs["sink"], 2)
    # audit holds both messages in the INTEREST stream: nothing was evicted, so the
    # broker's floors alone decide.
    channel = w.backend.observe_channel(w.channel)
    assert isinstance(channel, Known) and channel.value.first_seq == seq1
    assert w.floor(subs["sink"]) == seq2 and w.floor(subs["audit"]) < seq1
    assert w.ledger.required_obligations() == {first: ("audit",), second: ("audit",)}
    # sink's releases and both intents' were lost: reconciliation cancels those four.
    assert reconcile(w.payloads, w.ledger) == 4
    assert w.payloads.obligations(first) == w.payloads.obligations(second) == ("audit",)


def test_a_realtime_channel_that_evicted_a_publication_owes_nothing_for_it(
    world: Callable[[str], World],
) -> None:
    w = world("live")
    subs = w.provision(("sink",), LIVE_LATEST, realtime_buffer=1)
    # 'late' never bound a durable, so its floor is Unknown('missing'): only the
    # eviction can say it owes nothing (JetStream also moves a bound durable's floor
    # over evicted messages, which would settle sink's share on its own).
    readers = ("sink", "late")
    evicted, seq1 = w.publish(readers, "p1")
    kept, seq2 = w.publish(readers, "p2")
    channel = w.backend.observe_channel(w.channel)
    assert isinstance(channel, Known)
    assert seq1 < channel.value.first_seq <= seq2
    late = w.backend.observe_ack_floor(subscription_for("late", w.channel))
    assert isinstance(late, Unknown) and late.reason == "missing"
    assert w.floor(subs["sink"]) < seq2
    required = w.ledger.required_obligations()
    assert required == {evicted: (), kept: ("late", "sink")}
    assert reconcile(w.payloads, w.ledger) == 4  # evicted's two readers + both intents
    assert evicted not in w.payloads.refs()
    assert w.payloads.obligations(kept) == ("late", "sink")


def test_a_frozen_server_makes_floors_unknown_and_every_reader_required(
    world: Callable[[str], World], nats_server: embedded.EmbeddedServer,
    freeze: Callable[[embedded.EmbeddedServer], AbstractContextManager[None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = world("frozen")
    subs = w.provision(("sink",), LIVE_LATEST, realtime_buffer=10)
    ref, seq = w.publish(("sink",), "p1")
    w.payloads.resolve_intent(ref, "p1", accepted=True)
    w.settle(subs["sink"], 1)
    assert w.floor(subs["sink"]) >= seq  # settled, and its release was lost
    # Observations give up fast instead of after the backend's 10 s broker call.
    monkeypatch.setattr(jetstream_backend, "BROKER_CALL_SECONDS", 0.3)
    monkeypatch.setattr(jetstream_connection, "CALL_MARGIN_SECONDS", 0.2)
    with freeze(nats_server):  # only this test's own server
        assert isinstance(w.backend.observe_ack_floor(subs["sink"]), Unknown)
        assert w.ledger.required_obligations() == {ref: ("sink",)}
        assert reconcile(w.payloads, w.ledger) == 0  # an unobservable release is none
    assert w.payloads.obligations(ref) == ("sink",)
    monkeypatch.undo()
    # Once the broker answers again, the lost release is reconciled.
    assert w.ledger.required_obligations() == {ref: ()}
    assert reconcile(w.payloads, w.ledger) == 1
    assert ref not in w.payloads.refs()
