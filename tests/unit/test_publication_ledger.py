"""The JetStream adapter's ledger of first sends (observe_publication's window)."""

from __future__ import annotations

import threading

from videoflow.backends.jetstream.outcomes import PublicationLedger
from videoflow.backends.messaging import ChannelId, Envelope

CHANNEL = ChannelId("flow", "run", "node")


def envelope(msg_id: str | None) -> Envelope:
    return Envelope(CHANNEL, "data", b"x", msg_id)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_first_send_time_is_kept_across_resends():
    clock = Clock()
    ledger = PublicationLedger(clock)
    ledger.sent(envelope("a"), horizon=120.0)
    clock.now = 5.0
    ledger.sent(envelope("a"), horizon=120.0)
    assert ledger.first_sent(envelope("a")) == 0.0
    assert ledger.first_sent(envelope(None)) is None


def test_sends_older_than_the_horizon_are_forgotten_as_time_passes():
    clock = Clock()
    ledger = PublicationLedger(clock)
    for i in range(10_000):
        clock.now = i / 10
        ledger.sent(envelope(f"m{i}"), horizon=120.0)
    # Only the last 120 s of sends (1,200 of them) are remembered.
    assert len(ledger) == 1200
    assert ledger.first_sent(envelope("m0")) is None
    assert ledger.first_sent(envelope("m9999")) == 999.9


def test_a_resolved_send_is_forgotten_and_a_later_send_starts_a_new_window():
    clock = Clock()
    ledger = PublicationLedger(clock)
    ledger.sent(envelope("a"), horizon=10.0)
    ledger.resolved(envelope("a"))
    assert ledger.first_sent(envelope("a")) is None
    clock.now = 3.0
    ledger.sent(envelope("a"), horizon=10.0)
    clock.now = 11.0
    ledger.sent(envelope("b"), horizon=10.0)  # prunes the stale first entry, not the new one
    assert ledger.first_sent(envelope("a")) == 3.0


def test_publishers_on_many_threads_share_the_ledger():
    ledger = PublicationLedger()
    errors: list[BaseException] = []

    def publish(worker: int) -> None:
        try:
            for i in range(5000):
                ledger.sent(envelope(f"{worker}-{i}"), horizon=0.001)
                ledger.first_sent(envelope(f"{worker}-{i}"))
        except BaseException as error:  # the test reports any failure from a worker
            errors.append(error)

    threads = [threading.Thread(target=publish, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_a_batch_is_recorded_at_once_and_each_of_its_sends_is_found():
    clock = Clock()
    ledger = PublicationLedger(clock)
    ledger.sent_all([envelope("a"), envelope(None), envelope("b")], horizon=10.0)
    clock.now = 2.0
    ledger.sent_all([envelope("b"), envelope("c")], horizon=10.0)
    assert [ledger.first_sent(envelope(k)) for k in "abc"] == [0.0, 0.0, 2.0]
    assert ledger.first_sent(envelope("a")) == 0.0  # looked up again: the same answer
    ledger.resolved(envelope("b"))
    assert ledger.first_sent(envelope("b")) is None and len(ledger) == 2
    clock.now = 10.5  # the first batch is past the horizon; the second is not
    ledger.sent_all([envelope("b")], horizon=10.0)
    assert ledger.first_sent(envelope("a")) is None
    assert ledger.first_sent(envelope("b")) == 10.5 and ledger.first_sent(envelope("c")) == 2.0
