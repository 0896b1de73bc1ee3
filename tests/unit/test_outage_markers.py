"""End markers outlive a broker outage: a node that ends, or dies, while its broker is
away publishes its end-of-stream or abort marker once the broker is back, within the
outage budget, instead of losing it (a lost marker leaves every reader waiting for an
end that never comes); and a reader whose broker does not answer never takes quiet for
drained. On the memory adapter, with an outage made by hand."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    ChannelId,
    ChannelSpec,
    Envelope,
    PublishOutcome,
    Receipt,
    Rejected,
    SubscriptionId,
    SubscriptionSpec,
    Unknown,
)
from videoflow.core.constants import BATCH
from videoflow.messaging.messenger_window import PublicationFailed
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.wire.serialization import decode_envelope

FLOW, RUN = "flow", "run"
CHANNEL = ChannelId(FLOW, RUN, "cam")


class Outage(MemoryMessagingBackend):
    """Refuses every send (nothing sent, retryable) while `away` is set, and holds the
    publication ladder open until `budget_ends` meanwhile, as a JetStream backend
    reconnecting within its outage budget does."""

    def __init__(self, broker: MemoryBroker, budget: float) -> None:
        super().__init__(broker, flow_id=FLOW, run_id=RUN)
        self.away = threading.Event()
        self.budget, self.since = budget, 0.0

    def go_away(self) -> None:
        self.since = time.monotonic()
        self.away.set()

    def pursue_until(self) -> float:
        return self.since + self.budget if self.away.is_set() else 0.0

    def publish_async(self, envelope: Envelope, deadline: float) -> Receipt[PublishOutcome]:
        if self.away.is_set():
            return Receipt(Rejected("the broker is away; nothing was sent", retryable=True))
        return super().publish_async(envelope, deadline)

    def publish(self, envelope: Envelope, deadline: float) -> PublishOutcome:
        if self.away.is_set():
            return Rejected("the broker is away; nothing was sent", retryable=True)
        return super().publish(envelope, deadline)


def provisioned(budget: float) -> tuple[MemoryBroker, Outage]:
    broker = MemoryBroker()
    admin = MemoryMessagingBackend(broker, flow_id=FLOW, run_id=RUN)
    admin.start()
    admin.ensure_dead_letters("dlq")
    admin.ensure_channel(ChannelSpec(CHANNEL, RELIABLE_WORK, required=(
        SubscriptionId("sink", CHANNEL), SubscriptionId("eos-anchor", CHANNEL, "eos"))),
        "provision")
    backend = Outage(broker, budget)
    backend.start()
    return broker, backend


def markers(broker: MemoryBroker) -> list[dict[str, object]]:
    """The end markers on the camera's channel, read by a fresh reader."""
    reader = MemoryMessagingBackend(broker, flow_id=FLOW, run_id=RUN)
    reader.start()
    anchor = SubscriptionId("eos-anchor", CHANNEL, "eos")
    reader.ensure_subscription(SubscriptionSpec(anchor, 10.0, -1, 16), "read")
    return [decode_envelope(d.data) for d in reader.receive(anchor, 10, 0,
                                                             time.monotonic() + 0.2)]


@pytest.mark.parametrize("end", ["eos", "abort"])
def test_an_end_marker_sent_while_the_broker_is_away_goes_out_once_it_is_back(
    end: str,
) -> None:
    broker, backend = provisioned(budget=30.0)
    # ack_wait, a marker's own deadline, is far shorter than the outage.
    cam = NATSMessenger(SimpleNamespace(name="cam"), [], "nats://unused", FLOW, BATCH, RUN,
                        backend=backend, ack_wait=1)
    backend.go_away()
    threading.Timer(2.5, backend.away.clear).start()  # back after 2.5 s
    started = time.monotonic()
    if end == "eos":
        cam.publish_stop_signal()
    else:
        cam.publish_abort(RuntimeError("the camera died"))
    assert time.monotonic() - started >= 2.5  # it waited for the broker, not its deadline
    (marker,) = markers(broker)
    assert marker["is_abort"] is (end == "abort")
    cam.close()


def test_an_end_marker_past_the_outage_budget_fails_loudly_never_silently() -> None:
    broker, backend = provisioned(budget=1.5)
    cam = NATSMessenger(SimpleNamespace(name="cam"), [], "nats://unused", FLOW, BATCH, RUN,
                        backend=backend, ack_wait=1)
    backend.go_away()
    with pytest.raises(PublicationFailed, match="not published"):
        cam.publish_stop_signal()
    assert markers(broker) == []
    backend.away.clear()
    cam.close()


class Unanswered(MemoryMessagingBackend):
    """Answers no observation of a subscription (Unknown(reason)) while `silent` is set:
    a broker away, frozen, or a consumer electing its leader."""

    def __init__(self, broker: MemoryBroker, reason: str) -> None:
        super().__init__(broker, flow_id=FLOW, run_id=RUN)
        self.silent, self.reason = threading.Event(), reason
        self.silent.set()

    def observe_subscription(self, subscription: SubscriptionId):  # type: ignore[no-untyped-def]
        if self.silent.is_set():
            return Unknown(self.reason, "no answer")  # type: ignore[arg-type]
        return super().observe_subscription(subscription)

    def observe_subscriptions(self, subscriptions):  # type: ignore[no-untyped-def]
        return [self.observe_subscription(s) for s in subscriptions]


def test_a_reader_whose_broker_does_not_answer_never_takes_quiet_for_drained() -> None:
    broker, backend = provisioned(budget=30.0)
    backend.ensure_subscription(SubscriptionSpec(SubscriptionId("sink", CHANNEL), 10.0, -1, 16),
                                "sub")
    cam = NATSMessenger(SimpleNamespace(name="cam"), [], "nats://unused", FLOW, BATCH, RUN,
                        backend=backend)
    cam.publish_message(1)
    cam.publish_stop_signal()
    reader = Unanswered(broker, "timeout")
    reader.start()
    sink = NATSMessenger(SimpleNamespace(name="sink"), ["cam"], "nats://unused", FLOW, BATCH,
                         RUN, backend=reader, eos_quiescence_ms=10)
    assert sink.receive_message()["cam"]["message"] == 1
    sink.ack_inputs()
    ended: list[dict[str, object]] = []
    waiting = threading.Thread(target=lambda: ended.append(sink.receive_message()))
    waiting.start()
    waiting.join(1.0)  # a hundred quiescence periods: quiet, but never seen drained
    assert ended == [] and waiting.is_alive()
    reader.silent.clear()  # the broker answers again: nothing waits, so the end comes
    waiting.join(5.0)
    assert ended and ended[0]["cam"]["is_stop_signal"]
    for messenger in (cam, sink):
        messenger.close()


def test_a_reader_whose_counts_are_missing_falls_back_to_quiescence() -> None:
    broker, backend = provisioned(budget=30.0)
    backend.ensure_subscription(SubscriptionSpec(SubscriptionId("sink", CHANNEL), 10.0, -1, 16),
                                "sub")
    cam = NATSMessenger(SimpleNamespace(name="cam"), [], "nats://unused", FLOW, BATCH, RUN,
                        backend=backend)
    cam.publish_stop_signal()
    reader = Unanswered(broker, "missing")  # nothing to ask: quiet is all there is
    reader.start()
    sink = NATSMessenger(SimpleNamespace(name="sink"), ["cam"], "nats://unused", FLOW, BATCH,
                         RUN, backend=reader, eos_quiescence_ms=10)
    assert sink.receive_message()["cam"]["is_stop_signal"]
    for messenger in (cam, sink):
        messenger.close()
