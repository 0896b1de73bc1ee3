"""The publication window (messenger_window) on the memory adapter: a node goes on to
its next group while its outputs are in flight, and a group's inputs are settled only
once every output of it is accepted.

HeldReceipts is fault injection in the adapter, as a broker under load looks: every
publication is applied by the broker at once, but its receipt is held until the test
releases it; scripted answers stand for a broker's refusals of one msg_id.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from messenger_flows import FAST_RETRIES, FLOW, RUN, Flow, flows, run_producer, run_sink

from videoflow.backends.memory import MemoryMessagingBackend
from videoflow.backends.messaging import (
    ChannelId,
    DeliveryToken,
    Envelope,
    Known,
    PublicationUnknown,
    PublishOutcome,
    Receipt,
    Rejected,
    SettleOutcome,
    SettleResult,
    SubscriptionId,
)
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.credit import PRODUCER_WINDOW, WINDOW_GROUPS
from videoflow.core.runtime import FlowRuntime
from videoflow.core.runtime_store import MemoryRuntimeStore
from videoflow.messaging import messenger_deliveries
from videoflow.messaging.messenger_deliveries import SETTLE_BATCH
from videoflow.messaging.nats_messenger import POLL_SECONDS, NATSMessenger

__all__ = ["flows"]  # the fixture, imported for the tests below


class HeldReceipts(MemoryMessagingBackend):
    """Publications are applied at once; their receipts wait for release()."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holding = True
        self.held: list[tuple[concurrent.futures.Future[PublishOutcome], PublishOutcome]] = []
        self.script: dict[str, list[PublishOutcome]] = {}  # msg_id -> answers first
        self.lock = threading.Lock()

    def publish(self, envelope: Envelope, deadline: float) -> PublishOutcome:
        answers = self.script.get(envelope.msg_id or "")
        if answers:
            return answers.pop(0)  # refused: nothing stored
        return super().publish(envelope, deadline)

    def publish_async(self, envelope: Envelope,
                      deadline: float) -> concurrent.futures.Future[PublishOutcome]:
        future: concurrent.futures.Future[PublishOutcome] = concurrent.futures.Future()
        outcome = self.publish(envelope, deadline)
        with self.lock:
            if self.holding:
                self.held.append((future, outcome))
                return future
        future.set_result(outcome)
        return future

    def release(self) -> None:
        with self.lock:
            held, self.held, self.holding = self.held, [], False
        for future, outcome in held:
            future.set_result(outcome)


def held_messenger(flow: Flow, node: str, **options: Any) -> tuple[NATSMessenger, HeldReceipts]:
    backend = HeldReceipts(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    made = NATSMessenger(type("N", (), {"name": node})(), flow.edges[node], "nats://unused",
                         FLOW, flow.flow_type, RUN, backend=backend, **options)
    flow.made.append(made)
    return made, backend


def leased(flow: Flow, consumer: str, parent: str) -> int:
    observed = flow.admin.observe_subscription(
        SubscriptionId(consumer, ChannelId(FLOW, RUN, parent)))
    assert isinstance(observed, Known)
    return observed.value.leased


def stream_messages(flow: Flow, node: str) -> list[Any]:
    sink = flow.messenger("sink")
    *groups, _ = run_sink(sink, lambda inputs: None)
    return [g[node]["message"] for g in groups]


def test_a_groups_inputs_are_settled_only_once_its_output_is_confirmed(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "double": ["cam"], "sink": ["double"]})
    run_producer(flow.messenger("cam"), [1, 2, 3])
    double, backend = held_messenger(flow, "double")
    for _ in range(3):
        inputs = double.receive_message()
        double.publish_message(inputs["cam"]["message"] * 2)
        double.ack_inputs()  # returns at once: the outputs are in flight
    assert double.window.in_flight == 3
    assert leased(flow, "double", "cam") == 3  # no input acknowledged before its output
    backend.release()
    double.drain()
    assert double.window.in_flight == 0 and leased(flow, "double", "cam") == 0
    double.publish_stop_signal()
    assert stream_messages(flow, "double") == [2, 4, 6]


def test_an_output_refused_for_good_fails_its_group_per_the_delivery_policy(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "double": ["cam"], "sink": ["double"]})
    run_producer(flow.messenger("cam"), [1, 2, 3])
    double, backend = held_messenger(flow, "double", delivery_policy=FAST_RETRIES)
    backend.release()  # receipts come back at once here
    seen: list[int] = []
    refused_once = False
    while True:
        inputs = double.receive_message()
        if inputs["cam"]["is_stop_signal"]:
            break
        value = inputs["cam"]["message"]
        seen.append(value)
        if value == 2 and not refused_once:  # the broker refuses this output for good
            refused_once = True
            key = double.last_input_key()
            backend.script[f"double:{key}:1"] = [Rejected("too large", retryable=False)]
        double.publish_message(value * 2)
        double.ack_inputs()
    double.publish_stop_signal()
    assert double.failed_publications == 1
    assert sorted(seen) == [1, 2, 2, 3]  # the failed group was redelivered, not acked
    assert sorted(stream_messages(flow, "double")) == [2, 4, 6]
    assert double.publication_stats["rejected"] == 1


def test_outputs_reach_their_stream_in_the_order_the_node_made_them(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, backend = held_messenger(flow, "cam")
    for i in range(200):
        cam.publish_message(i)
        if i == 50:  # inside the window of 64: the first 51 were all in flight
            assert cam.window.in_flight == 51
            backend.release()
    cam.publish_stop_signal()
    assert stream_messages(flow, "cam") == list(range(200))


def test_a_producer_keeps_more_outputs_in_flight_than_a_processor_keeps_groups(flows) -> None:  # type: ignore[no-untyped-def]
    # A producer's groups are single outputs: its window covers a PubAck round trip at
    # its own rate (PRODUCER_WINDOW); a node with inputs holds WINDOW_GROUPS groups.
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, backend = held_messenger(flow, "cam")
    assert cam.window.max_groups == PRODUCER_WINDOW > WINDOW_GROUPS
    for i in range(PRODUCER_WINDOW):
        cam.publish_message(i)
    assert cam.window.in_flight == PRODUCER_WINDOW  # none waited for a receipt
    backend.release()
    cam.publish_stop_signal()
    sink = flow.messenger("sink")
    assert sink.window.max_groups == WINDOW_GROUPS
    *groups, _ = run_sink(sink, lambda inputs: None)
    assert [g["cam"]["message"] for g in groups] == list(range(PRODUCER_WINDOW))


class LostReceipts(MemoryMessagingBackend):
    """A stalled broker: pipelined publishes are held until lose_all() answers every
    receipt unknown, nothing stored; observing one stores it, after a round trip."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.held: list[Receipt[PublishOutcome]] = []
        self.observing = 0
        self.most_at_once = 0
        self.observed: list[str] = []

    def publish_async(self, envelope: Envelope, deadline: float) -> Receipt[PublishOutcome]:
        receipt: Receipt[PublishOutcome] = Receipt()
        self.held.append(receipt)
        return receipt

    def lose_all(self) -> None:
        for receipt in self.held:
            receipt.set_result(PublicationUnknown("no PubAck before the deadline"))

    def observe_publication(self, envelope: Envelope) -> PublishOutcome:
        with self.lock:
            self.observing += 1
            self.most_at_once = max(self.most_at_once, self.observing)
            self.observed.append(envelope.msg_id or "")
        time.sleep(0.02)
        try:
            return super().observe_publication(envelope)
        finally:
            with self.lock:
                self.observing -= 1


def test_unknown_outcomes_across_the_window_are_asked_after_together(flows) -> None:  # type: ignore[no-untyped-def]
    # One ladder after another (a backoff and a round trip each) let the outputs at
    # the back of a producer's window outlive their deadlines after a broker stall.
    flow = flows({"cam": [], "sink": ["cam"]})
    backend = LostReceipts(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    cam = NATSMessenger(type("N", (), {"name": "cam"})(), [], "nats://unused", FLOW,
                        flow.flow_type, RUN, backend=backend)
    flow.made.append(cam)
    for i in range(100):
        cam.publish_message(i)
    assert cam.window.in_flight == 100
    backend.lose_all()
    cam.drain()
    assert len(backend.observed) == len(set(backend.observed)) == 100  # each asked once
    assert backend.most_at_once > 1
    assert cam.publication_stats["accepted"] == 100
    backend.publish_async = super(LostReceipts, backend).publish_async  # type: ignore[method-assign]
    cam.publish_stop_signal()
    assert sorted(stream_messages(flow, "cam")) == list(range(100))


def test_the_window_waits_for_its_oldest_group_when_full(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, backend = held_messenger(flow, "cam")
    cam.window.max_groups = 2
    cam.publish_message("a")
    cam.publish_message("b")
    releaser = threading.Timer(0.3, backend.release)
    started = time.monotonic()
    releaser.start()
    cam.publish_message("c")  # a third group in flight: waits for the first receipt
    assert time.monotonic() - started >= 0.25
    releaser.join()
    cam.publish_stop_signal()
    assert stream_messages(flow, "cam") == ["a", "b", "c"]


class HeldSettlements(MemoryMessagingBackend):
    """Settlements started without waiting are applied, and their receipts answered,
    only on release()."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.holding = True
        self.held: list[tuple[Sequence[tuple[DeliveryToken, SettleOutcome, str]],
                              list[Receipt[SettleResult]]]] = []

    def settle_many_async(self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]],
                          ) -> list[Receipt[SettleResult]]:
        with self.lock:
            if self.holding:
                receipts: list[Receipt[SettleResult]] = [Receipt() for _ in settlements]
                self.held.append((settlements, receipts))
                return receipts
        return super().settle_many_async(settlements)

    def release(self) -> None:
        with self.lock:
            held, self.held, self.holding = self.held, [], False
        for settlements, receipts in held:
            for receipt, result in zip(receipts, self.settle_many(settlements), strict=True):
                receipt.set_result(result)


class SharedLedger(MemoryRuntimeStore):
    """A ledger that says it outlives the process, so the messenger accepts a
    checkpoint on it: where the record lives is not what the test below is about."""

    def durable_shared(self) -> bool:
        return True


def test_a_checkpoint_is_written_only_once_the_groups_before_it_are_settled(flows) -> None:  # type: ignore[no-untyped-def]
    # RUN-022: a replacement must not see again what the committed state holds, so a
    # sink's checkpoint waits until the settlements of its earlier groups are confirmed.
    flow = flows({"cam": [], "sink": ["cam"]})
    run_producer(flow.messenger("cam"), [1, 2, 3])
    backend = HeldSettlements(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    sink = NATSMessenger(type("N", (), {"name": "sink"})(), flow.edges["sink"],
                         "nats://unused", FLOW, flow.flow_type, RUN, backend=backend,
                         runtime=FlowRuntime(SharedLedger(), FLOW, RUN, "sink"))
    flow.made.append(sink)
    for _ in range(2):
        sink.receive_message()
        sink.ack_inputs()
    sink.receive_message()  # the third group, which the checkpoint covers
    releaser = threading.Timer(0.3, backend.release)
    started = time.monotonic()
    releaser.start()
    sink.checkpoint(b"state")
    assert time.monotonic() - started >= 0.25  # it waited for the first two to settle
    releaser.join()
    assert leased(flow, "sink", "cam") == 1  # only the group the checkpoint covers
    assert sink.restore_checkpoint() == b"state"


def test_an_end_marker_waits_for_every_output_in_flight(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, backend = held_messenger(flow, "cam")
    for i in range(5):
        cam.publish_message(i)
    ended = threading.Event()

    def end() -> None:
        cam.publish_stop_signal()
        ended.set()

    ender = threading.Thread(target=end)
    ender.start()
    assert not ended.wait(0.2)  # its outputs' receipts are still out
    backend.release()
    ender.join(5)
    assert ended.is_set()
    assert stream_messages(flow, "cam") == list(range(5))


@pytest.mark.parametrize("flow_type", [BATCH, REALTIME])
def test_a_full_stream_is_backpressure_in_batch_and_a_counted_drop_in_realtime(
    flows, flow_type: str,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"cam": [], "sink": ["cam"]}, flow_type)
    cam, backend = held_messenger(flow, "cam")
    backend.release()
    full = Rejected("maximum messages exceeded", retryable=True)
    cam.publish_message("first")
    backend.script[f"{cam.outputs.live_id_node}:{cam.runtime.epoch}:2"] = [full, full, full]
    cam.publish_message("second")
    cam.publish_message("third")
    cam.drain()
    drops = cam.take_drops()
    if flow_type == BATCH:  # waited, published again, nothing lost
        assert drops["publish_discarded"] == 0
        assert cam.publication_stats["accepted"] == 3
        cam.publish_stop_signal()
        assert stream_messages(flow, "cam") == ["first", "second", "third"]
    else:  # freshest wins: dropped, and counted
        assert drops["publish_discarded"] == 1
        assert cam.publication_stats["dropped"] == 1


class CountedSettlements(MemoryMessagingBackend):
    """Records the size of every batch of settlements started without waiting, and how
    long each receive_any was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []
        self.waits: list[float] = []

    def receive_any(self, subscriptions: Sequence[SubscriptionId], item_credit: int,
                    byte_credit: int, deadline: float) -> list[tuple[SubscriptionId, Any]]:
        self.waits.append(deadline - time.monotonic())
        return super().receive_any(subscriptions, item_credit, byte_credit, deadline)

    def settle_many_async(self, settlements: Sequence[tuple[DeliveryToken, SettleOutcome, str]],
                          ) -> list[Receipt[SettleResult]]:
        self.batches.append(len(settlements))
        return super().settle_many_async(settlements)


def counted_sink(flow: Flow) -> tuple[NATSMessenger, CountedSettlements]:
    backend = CountedSettlements(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    sink = NATSMessenger(type("N", (), {"name": "sink"})(), flow.edges["sink"],
                         "nats://unused", FLOW, flow.flow_type, RUN, backend=backend)
    flow.made.append(sink)
    return sink, backend


def test_acks_of_groups_done_one_wait_apart_go_out_together_once_the_oldest_lingered(
    flows, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    # A sink idling between inputs finishes one group per wait: its acks are gathered
    # for SETTLE_LINGER_SECONDS (here made long, so nothing is due by itself), and
    # leave as one batch once the oldest is due.
    monkeypatch.setattr(messenger_deliveries, "SETTLE_LINGER_SECONDS", 60.0)
    flow = flows({"cam": [], "sink": ["cam"]})
    run_producer(flow.messenger("cam"), list(range(5)))
    sink, backend = counted_sink(flow)
    for _ in range(5):
        assert sink.receive_message() is not None
        sink.ack_inputs()
    assert backend.batches == [] and leased(flow, "sink", "cam") == 5
    monkeypatch.setattr(messenger_deliveries, "SETTLE_LINGER_SECONDS", 0.0)
    sink.receive_message()  # its receive loop finds the oldest due: all five go
    assert backend.batches == [5]
    sink.close()
    assert leased(flow, "sink", "cam") == 0


def test_an_idle_node_waits_for_input_until_its_gathered_acks_are_due_not_in_short_polls(
    flows, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    # Every wake-up of an idle node costs CPU the host's other processes need. With
    # acks gathered, a receive waits until the oldest is due, and they go then; with
    # nothing gathered or in flight, the plain poll. Polled every 2 ms instead, a
    # paced flow's nodes spent most of their CPU waking for nothing.
    linger = 0.8 * POLL_SECONDS  # the plain poll is the longest any receive waits
    monkeypatch.setattr(messenger_deliveries, "SETTLE_LINGER_SECONDS", linger)
    flow = flows({"cam": [], "sink": ["cam"]})
    cam = flow.messenger("cam")
    cam.set_output_event_timestamp(1000.0)
    cam.publish_message(0)  # its end marker comes later, from another thread
    sink, backend = counted_sink(flow)
    sent: list[float] = []
    settle_many_async = backend.settle_many_async

    def timed(settlements: Any) -> Any:
        sent.append(time.monotonic())
        return settle_many_async(settlements)

    backend.settle_many_async = timed  # type: ignore[method-assign]
    assert sink.receive_message() is not None
    sink.ack_inputs()
    acked = time.monotonic()
    backend.waits.clear()  # from here on, the node idles with one ack gathered
    idle = 15 * linger
    ender = threading.Timer(idle, cam.publish_stop_signal)
    ender.start()
    try:
        ended = sink.receive_message()  # idles until the end marker
    finally:
        ender.join()
    assert all(entry["is_stop_signal"] for entry in ended.values())
    # sent once due: not before, and long before the end marker came
    assert len(sent) == 1 and linger * 0.9 <= sent[0] - acked <= linger + idle / 2
    assert backend.waits[0] > linger / 2  # the first wait ran to the acks' due time
    # then plain polls: about one per POLL_SECONDS, not one every few ms
    assert len(backend.waits) <= 2 + 1.5 * idle / POLL_SECONDS, backend.waits
    sink.close()


def test_acks_never_wait_past_a_full_batch_or_a_drain(
    flows, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setattr(messenger_deliveries, "SETTLE_LINGER_SECONDS", 60.0)
    flow = flows({"cam": [], "sink": ["cam"]})
    count = SETTLE_BATCH + 3
    run_producer(flow.messenger("cam"), list(range(count)))
    sink, backend = counted_sink(flow)
    for _ in range(count):
        assert sink.receive_message() is not None
        sink.ack_inputs()
    assert backend.batches == [SETTLE_BATCH]  # a full batch goes at once
    sink.window.drain()  # what an end of stream, a checkpoint or quiesce waits for
    assert backend.batches == [SETTLE_BATCH, 3]
    assert leased(flow, "sink", "cam") == 0
