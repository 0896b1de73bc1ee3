"""The publication ladder (videoflow.messaging.publication) on the memory adapter: each
outcome a backend can give, and what REALTIME and BATCH make of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    Accepted,
    BrokerUnavailable,
    ChannelId,
    ChannelSpec,
    Completed,
    Envelope,
    Known,
    PublicationUnknown,
    PublicationUnresolvable,
    Rejected,
    SettleConfirmed,
    SubscriptionId,
    SubscriptionSpec,
)
from videoflow.core.constants import BATCH, REALTIME
from videoflow.messaging.publication import (
    FIRST_BACKOFF_SECONDS,
    PublicationStats,
    publish_until_known,
)

CHANNEL = ChannelId("flow", "run", "camera")
SUB = SubscriptionId("fusion", CHANNEL)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(clock: FakeClock) -> MemoryMessagingBackend:
    made = MemoryMessagingBackend(MemoryBroker(clock=clock, duplicate_window=120.0),
                                  flow_id="flow", run_id="run")
    made.start()
    return made


def provision(backend: MemoryMessagingBackend, profile: str = RELIABLE_WORK,
              batch_max_msgs: int = 10_000) -> None:
    backend.ensure_channel(ChannelSpec(CHANNEL, profile, required=(SUB,),
                                       batch_max_msgs=batch_max_msgs), "chan")
    backend.ensure_subscription(SubscriptionSpec(SUB, 10.0, -1, 16), "sub")


def envelope(n: int, msg_id: str | None = "auto") -> Envelope:
    return Envelope(CHANNEL, "data", b"frame-%d" % n, f"camera:1:{n}" if msg_id else None)


def stored(backend: MemoryMessagingBackend) -> int:
    observed = backend.observe_channel(CHANNEL)
    assert isinstance(observed, Known)
    return observed.value.messages


def ladder(backend: MemoryMessagingBackend, clock: FakeClock, env: Envelope, flow_type: str,
           within: float = 5.0, sleep: Callable[[float], None] | None = None):  # type: ignore[no-untyped-def]
    return publish_until_known(backend, env, flow_type, clock() + within, clock=clock,
                               sleep=sleep or clock.sleep)


def test_an_accepted_publication_is_done_at_once(backend, clock) -> None:  # type: ignore[no-untyped-def]
    provision(backend)
    published = ladder(backend, clock, envelope(1), BATCH)
    assert (published.outcome, published.attempts, published.stat) == (
        Accepted(stream_seq=1), 1, "accepted")
    assert clock.slept == []


def test_batch_turns_a_full_stream_into_backpressure_until_room_is_freed(backend, clock) -> None:  # type: ignore[no-untyped-def]
    provision(backend, batch_max_msgs=2)
    for n in (1, 2):
        assert ladder(backend, clock, envelope(n), BATCH).stat == "accepted"
    assert isinstance(backend.publish(envelope(3), clock() + 1), Rejected)  # full, NEW

    def a_consumer_settles_meanwhile(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.slept) == 3:  # room appears only after a few waits
            (delivery,) = backend.receive(SUB, 1, 0, clock() + 1)
            assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()

    published = ladder(backend, clock, envelope(3), BATCH, sleep=a_consumer_settles_meanwhile)
    assert published.outcome == Accepted(stream_seq=3) and published.attempts == 4
    assert clock.slept[:2] == [FIRST_BACKOFF_SECONDS, 2 * FIRST_BACKOFF_SECONDS]  # backs off
    assert stored(backend) == 2  # the settled one left (interest retention), the new one in


def test_batch_never_drops_a_full_stream_but_reports_it_refused_at_the_deadline(  # type: ignore[no-untyped-def]
    backend, clock
) -> None:
    provision(backend, batch_max_msgs=1)
    ladder(backend, clock, envelope(1), BATCH)
    published = ladder(backend, clock, envelope(2), BATCH, within=2.0)
    assert isinstance(published.outcome, Rejected) and published.outcome.retryable
    assert (published.dropped, published.stat) == (False, "rejected")
    assert sum(clock.slept) == pytest.approx(2.0)  # waited out the whole deadline
    assert published.attempts > 3


def test_realtime_drops_a_retryable_refusal_rather_than_block_its_producer(clock) -> None:  # type: ignore[no-untyped-def]
    idle = MemoryMessagingBackend(MemoryBroker(clock=clock), flow_id="flow", run_id="run")
    # Not started: every publish is Rejected(retryable) -- nothing was sent.
    published = ladder(idle, clock, envelope(1), REALTIME)
    assert (published.dropped, published.stat, published.attempts) == (True, "dropped", 1)
    assert clock.slept == []
    waited = ladder(idle, clock, envelope(1), BATCH, within=0.1)
    assert (waited.dropped, waited.stat) == (False, "rejected") and waited.attempts > 1


def test_a_definite_refusal_is_returned_at_once_in_either_flow_type(backend, clock) -> None:  # type: ignore[no-untyped-def]
    # No stream captures the subject (nothing provisioned): waiting changes nothing.
    for flow_type in (BATCH, REALTIME):
        published = ladder(backend, clock, envelope(1), flow_type)
        assert isinstance(published.outcome, Rejected) and not published.outcome.retryable
        assert (published.dropped, published.stat, published.attempts) == (False, "rejected", 1)
    assert clock.slept == []


@pytest.mark.parametrize("stored_before", [True, False])
def test_an_unknown_send_is_resolved_by_observation_and_stored_once(  # type: ignore[no-untyped-def]
    backend, clock, stored_before: bool
) -> None:
    provision(backend)
    backend.lose_next_receipts(1, stored=stored_before)
    published = ladder(backend, clock, envelope(1), BATCH)
    assert published.outcome == Accepted(stream_seq=1, duplicate=stored_before)
    assert published.stat == ("duplicate" if stored_before else "accepted")
    assert published.attempts == 2
    assert stored(backend) == 1  # MSG-014: resolved, never sent twice into the stream


def test_an_unknown_send_without_a_msg_id_is_unresolvable_never_a_guess(backend, clock) -> None:  # type: ignore[no-untyped-def]
    provision(backend)
    backend.lose_next_receipts(1)
    published = ladder(backend, clock, envelope(1, msg_id=None), BATCH)
    assert isinstance(published.outcome, PublicationUnresolvable)
    assert published.stat == "unknown"


def test_an_unknown_send_still_unknown_at_the_deadline_stays_unknown(clock) -> None:  # type: ignore[no-untyped-def]
    class NeverAnswers(MemoryMessagingBackend):
        def observe_publication(self, envelope: Envelope) -> PublicationUnknown:
            return PublicationUnknown("still no receipt")

    backend = NeverAnswers(MemoryBroker(clock=clock), flow_id="flow", run_id="run")
    backend.start()
    provision(backend)
    backend.lose_next_receipts(1)
    published = ladder(backend, clock, envelope(1), BATCH, within=1.0)
    assert isinstance(published.outcome, PublicationUnknown) and published.stat == "unknown"
    assert sum(clock.slept) == pytest.approx(1.0)


def test_stats_count_every_kind_and_start_at_zero(backend, clock) -> None:  # type: ignore[no-untyped-def]
    stats = PublicationStats()
    assert stats.as_dict() == dict.fromkeys(
        ("accepted", "duplicate", "unknown", "dropped", "rejected"), 0)
    provision(backend)
    stats.count(ladder(backend, clock, envelope(1), BATCH))
    stats.count(ladder(backend, clock, envelope(1), BATCH))  # the same msg_id again
    assert stats.as_dict()["accepted"] == 1 and stats.as_dict()["duplicate"] == 1


def test_an_unknown_flow_type_is_refused(backend, clock) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="flow_type"):
        ladder(backend, clock, envelope(1), "weekly")


class AwayThenBack(MemoryMessagingBackend):
    """A backend whose broker is away: its sends are unknown and it cannot be asked
    until `back_at` (on the fake clock); meanwhile pursue_until holds the ladder open
    up to `budget_ends`, as an outage budget does."""

    def __init__(self, clock: FakeClock, back_at: float, budget_ends: float) -> None:
        super().__init__(MemoryBroker(clock=clock, duplicate_window=120.0),
                         flow_id="flow", run_id="run")
        self.clock, self.back_at, self.budget_ends = clock, back_at, budget_ends
        self.asked_while_away = 0

    def away(self) -> bool:
        return self.clock() < self.back_at

    def pursue_until(self) -> float:
        return self.budget_ends if self.away() else self.back_at + 1.0

    def observe_publication(self, envelope: Envelope):  # type: ignore[no-untyped-def]
        if self.away():
            self.asked_while_away += 1
            return PublicationUnknown("the broker is away")
        return super().observe_publication(envelope)


def test_an_unknown_send_waits_out_a_broker_outage_past_its_deadline_and_resolves(clock) -> None:  # type: ignore[no-untyped-def]
    # The deadline is 2 s off, the broker comes back after 20 s, within a 60 s budget:
    # the outcome stays unknown while it is away, never a guess, and resolves once back.
    backend = AwayThenBack(clock, back_at=clock() + 20.0, budget_ends=clock() + 60.0)
    backend.start()
    provision(backend)
    backend.lose_next_receipts(1, stored=True)
    published = ladder(backend, clock, envelope(1), BATCH, within=2.0)
    assert published.outcome == Accepted(stream_seq=1, duplicate=True)
    assert backend.asked_while_away > 3  # asked again and again, unknown each time
    assert 20.0 <= sum(clock.slept) < 22.0
    assert stored(backend) == 1


def test_a_broker_away_past_its_budget_leaves_the_send_unknown_at_the_budget(clock) -> None:  # type: ignore[no-untyped-def]
    backend = AwayThenBack(clock, back_at=clock() + 500.0, budget_ends=clock() + 30.0)
    backend.start()
    provision(backend)
    backend.lose_next_receipts(1)
    published = ladder(backend, clock, envelope(1), BATCH, within=2.0)
    assert isinstance(published.outcome, PublicationUnknown)  # MSG-014: never Rejected
    assert sum(clock.slept) == pytest.approx(30.0)


def test_a_broker_given_up_for_good_ends_the_ladder_at_once_not_at_its_deadline(clock) -> None:  # type: ignore[no-untyped-def]
    # The budget runs out 5 s in, the deadline is 30 s off: once the adapter has given
    # the broker up nothing can resolve the send, so the ladder says so then, as the
    # broker being gone (it was a 25 s wait for a run whose broker was gone for good).
    class GivenUp(AwayThenBack):
        def given_up(self) -> str | None:
            return "the broker was unreachable for more than 5 s" if (
                self.clock() >= self.budget_ends) else None

    backend = GivenUp(clock, back_at=clock() + 500.0, budget_ends=clock() + 5.0)
    backend.start()
    provision(backend)
    backend.lose_next_receipts(1)
    with pytest.raises(BrokerUnavailable, match="unreachable for more than 5 s"):
        ladder(backend, clock, envelope(1), BATCH, within=30.0)
    assert 5.0 <= sum(clock.slept) < 6.0


def test_without_an_outage_the_deadline_is_the_deadline(backend, clock) -> None:  # type: ignore[no-untyped-def]
    assert backend.pursue_until() == 0.0  # an in-process broker never goes away
    provision(backend, batch_max_msgs=1)
    ladder(backend, clock, envelope(1), BATCH)
    published = ladder(backend, clock, envelope(2), BATCH, within=2.0)
    assert isinstance(published.outcome, Rejected)
    assert sum(clock.slept) == pytest.approx(2.0)
