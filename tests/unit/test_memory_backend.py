"""The MessagingBackend contract, exercised on the in-process memory adapter.

The bodies are written against the contract only (a ``backend``, a ``peer`` receiver of
the same run on the same broker, and a ``clock`` to let time pass), so they can later be
parametrised over the JetStream adapter: swap the fixtures, keep the tests. Only the
fixtures and the fault-injection helper (``lose_next_receipts``) are memory-specific.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    DURABLE_CONTROL,
    LIVE_LATEST,
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    ChannelSpec,
    Completed,
    Delivery,
    Envelope,
    IncompatibleProfile,
    Known,
    PublicationUnknown,
    PublicationUnresolvable,
    PublishOutcome,
    Rejected,
    Retry,
    SettleConfirmed,
    SettleStale,
    SubscriptionId,
    SubscriptionObservation,
    SubscriptionSpec,
    Terminal,
    Unknown,
)

CHANNEL = ChannelId("flow", "run", "source")
SUB = SubscriptionId("sink", CHANNEL)
OTHER_SUB = SubscriptionId("audit", CHANNEL)
EOS_SUB = SubscriptionId("sink", CHANNEL, kind="eos")
ACK_WAIT = 10.0


class FakeClock:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(clock: FakeClock) -> MemoryBroker:
    return MemoryBroker(clock=clock, duplicate_window=120.0)


@pytest.fixture
def make_receiver(broker: MemoryBroker) -> Iterator[Callable[..., MemoryMessagingBackend]]:
    made: list[MemoryMessagingBackend] = []

    def make(**kwargs: object) -> MemoryMessagingBackend:
        receiver = MemoryMessagingBackend(broker, flow_id="flow", run_id="run",
                                          **kwargs)  # type: ignore[arg-type]
        receiver.start()
        made.append(receiver)
        return receiver

    yield make
    for receiver in made:
        if receiver.connected:
            receiver.shutdown(hand_back=False)


@pytest.fixture
def backend(make_receiver: Callable[..., MemoryMessagingBackend]) -> MemoryMessagingBackend:
    return make_receiver()


@pytest.fixture
def peer(make_receiver: Callable[..., MemoryMessagingBackend]) -> MemoryMessagingBackend:
    """A second process of the same run on the same broker: the survivor."""
    return make_receiver()


# ------------------------------------------------------------------------ helpers


def now() -> float:
    return time.monotonic()


def channel_spec(profile: str = RELIABLE_WORK, **limits: object) -> ChannelSpec:
    return ChannelSpec(CHANNEL, profile, **limits)  # type: ignore[arg-type]


def sub_spec(sub: SubscriptionId = SUB, max_deliver: int = -1, credit: int = 16,
             byte_credit: int = 0) -> SubscriptionSpec:
    return SubscriptionSpec(sub, ACK_WAIT, max_deliver, credit, byte_credit)


def provision(backend: MemoryMessagingBackend, profile: str = RELIABLE_WORK,
              subs: tuple[SubscriptionSpec, ...] = (), **limits: object) -> None:
    specs = subs or (sub_spec(),)
    backend.ensure_channel(channel_spec(profile, **limits), "provision-channel")
    for spec in specs:
        backend.ensure_subscription(spec, f"bind-{spec.id.consumer}-{spec.id.kind}")


def bind(receiver: MemoryMessagingBackend, *specs: SubscriptionSpec) -> None:
    for spec in specs or (sub_spec(),):
        receiver.ensure_subscription(spec, f"bind-{spec.id.consumer}-{spec.id.kind}")


def data(payload: bytes, msg_id: str | None = None) -> Envelope:
    return Envelope(CHANNEL, "data", payload, msg_id)


def publish(backend: MemoryMessagingBackend, *payloads: bytes) -> list[int]:
    seqs = []
    for payload in payloads:
        outcome = backend.publish(data(payload), now() + 1.0)
        assert isinstance(outcome, Accepted), outcome
        seqs.append(outcome.stream_seq)
    return seqs


def receive(receiver: MemoryMessagingBackend, credit: int = 1,
            sub: SubscriptionId = SUB) -> list[Delivery]:
    return receiver.receive(sub, credit, 0, now())


def observed(receiver: MemoryMessagingBackend,
             sub: SubscriptionId = SUB) -> SubscriptionObservation:
    observation = receiver.observe_subscription(sub)
    assert isinstance(observation, Known), observation
    return observation.value


def stored(receiver: MemoryMessagingBackend) -> int:
    observation = receiver.observe_channel(CHANNEL)
    assert isinstance(observation, Known), observation
    return observation.value.messages


# ----------------------------------------------------------------- provisioning


def test_ensure_channel_reads_back_created_then_existing(backend: MemoryMessagingBackend) -> None:
    first = backend.ensure_channel(channel_spec(), "op-1")
    again = backend.ensure_channel(channel_spec(), "op-2")
    assert first.created and not again.created
    assert first.honoured and first.name == again.name


def test_ensure_channel_with_other_retention_is_an_immutable_mismatch(
    backend: MemoryMessagingBackend,
) -> None:
    backend.ensure_channel(channel_spec(RELIABLE_WORK), "op-1")
    with pytest.raises(IncompatibleProfile, match="retention"):
        backend.ensure_channel(channel_spec(LIVE_LATEST), "op-2")


def test_profile_without_channel_level_meaning_is_refused(backend: MemoryMessagingBackend) -> None:
    with pytest.raises(IncompatibleProfile, match="durable_control"):
        backend.ensure_channel(channel_spec(DURABLE_CONTROL), "op-1")


def test_replicas_the_broker_cannot_keep_are_reported_not_trusted(
    backend: MemoryMessagingBackend,
) -> None:
    verified = backend.ensure_channel(channel_spec(replicas=3), "op-1")
    assert not verified.honoured
    assert any(m.startswith("replicas") for m in verified.mismatches)


def test_credit_other_than_provisioned_is_a_mismatch(
    backend: MemoryMessagingBackend, peer: MemoryMessagingBackend,
) -> None:
    provision(backend, subs=(sub_spec(credit=8),))
    verified = peer.ensure_subscription(sub_spec(credit=4), "bind")
    assert not verified.created
    assert any(m.startswith("credit") for m in verified.mismatches)  # MSG-017


def test_capabilities_are_known_for_an_adapter_that_observes_itself(
    backend: MemoryMessagingBackend,
) -> None:
    caps = backend.capabilities()
    assert caps.durable is False
    assert {RELIABLE_WORK, LIVE_LATEST} <= caps.profiles
    for part in (caps.max_payload, caps.replicas, caps.storage):
        assert isinstance(part, Known)


def test_subjects_separate_data_from_eos(backend: MemoryMessagingBackend) -> None:
    assert backend.subject_for(CHANNEL, "data") == "vf.flow.run.source"
    assert backend.subject_for(CHANNEL, "eos") == "vf.flow.run.source._eos"


# -------------------------------------------------------------------- publishing


def test_publish_to_a_channel_nobody_provisioned_is_rejected_for_good(
    backend: MemoryMessagingBackend,
) -> None:
    outcome = backend.publish(data(b"x"), now() + 1.0)
    assert isinstance(outcome, Rejected) and outcome.retryable is False


def test_publish_is_accepted_with_increasing_sequences(backend: MemoryMessagingBackend) -> None:
    provision(backend)
    assert publish(backend, b"a", b"b", b"c") == [1, 2, 3]
    channel = backend.observe_channel(CHANNEL)
    assert isinstance(channel, Known)
    assert (channel.value.first_seq, channel.value.last_seq, channel.value.messages) == (1, 3, 3)


def test_duplicate_msg_id_inside_the_window_is_accepted_as_a_duplicate_of_the_original(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    first = backend.publish(data(b"a", "m-1"), now() + 1.0)
    publish(backend, b"between")
    again = backend.publish(data(b"a", "m-1"), now() + 1.0)
    assert first == Accepted(1)
    assert again == Accepted(1, duplicate=True)
    assert stored(backend) == 2


def test_duplicate_window_lapses_and_the_same_msg_id_is_stored_again(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    backend.publish(data(b"a", "m-1"), now() + 1.0)
    clock.advance(121.0)
    again = backend.publish(data(b"a", "m-1"), now() + 1.0)
    assert again == Accepted(2)


def test_reliable_work_full_channel_rejects_new_retryably_and_keeps_the_old(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend, RELIABLE_WORK, batch_max_msgs=2)
    publish(backend, b"a", b"b")
    outcome = backend.publish(data(b"c"), now() + 1.0)
    assert isinstance(outcome, Rejected) and outcome.retryable is True
    assert [d.data for d in receive(backend, 5)] == [b"a", b"b"]


def test_reliable_work_frees_room_once_acknowledged(backend: MemoryMessagingBackend) -> None:
    provision(backend, RELIABLE_WORK, batch_max_msgs=1)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()
    assert publish(backend, b"b") == [2]


def test_live_latest_full_channel_evicts_the_oldest_and_counts_it_dropped(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend, LIVE_LATEST, realtime_buffer=2)
    publish(backend, b"a", b"b", b"c")
    assert stored(backend) == 2
    assert [d.data for d in receive(backend, 5)] == [b"b", b"c"]
    assert observed(backend).dropped == 1


def test_max_bytes_bounds_a_channel_too(backend: MemoryMessagingBackend) -> None:
    provision(backend, RELIABLE_WORK, max_bytes=4)
    publish(backend, b"ab", b"cd")
    outcome = backend.publish(data(b"e"), now() + 1.0)
    assert isinstance(outcome, Rejected) and outcome.retryable is True


def test_lost_receipt_of_a_stored_send_resolves_as_a_duplicate(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    envelope = data(b"a", "m-1")
    backend.lose_next_receipts(1, stored=True)
    assert isinstance(backend.publish(envelope, now() + 1.0), PublicationUnknown)
    assert backend.observe_publication(envelope) == Accepted(1, duplicate=True)
    assert stored(backend) == 1


def test_lost_send_resolves_by_storing_exactly_one_copy(backend: MemoryMessagingBackend) -> None:
    provision(backend)
    envelope = data(b"a", "m-1")
    backend.lose_next_receipts(1, stored=False)
    assert isinstance(backend.publish(envelope, now() + 1.0), PublicationUnknown)
    assert backend.observe_publication(envelope) == Accepted(1)
    assert backend.observe_publication(envelope) == Accepted(1, duplicate=True)
    assert stored(backend) == 1


def test_unknown_publication_beyond_the_window_is_unresolvable(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    envelope = data(b"a", "m-1")
    backend.lose_next_receipts(1, stored=True)
    backend.publish(envelope, now() + 1.0)
    clock.advance(121.0)
    assert isinstance(backend.observe_publication(envelope), PublicationUnresolvable)
    assert stored(backend) == 1


# ---------------------------------------------------------------------- retention


def test_interest_retention_keeps_a_message_until_every_subscription_acked(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend, subs=(sub_spec(SUB), sub_spec(OTHER_SUB)))
    publish(backend, b"a")
    (mine,) = receive(backend, sub=SUB)
    backend.settle(mine.token, Completed(), "s-1")
    assert stored(backend) == 1
    (theirs,) = receive(backend, sub=OTHER_SUB)
    backend.settle(theirs.token, Completed(), "s-2")
    assert stored(backend) == 0


def test_limits_retention_keeps_acknowledged_messages(backend: MemoryMessagingBackend) -> None:
    provision(backend, LIVE_LATEST, realtime_buffer=5)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    backend.settle(delivery.token, Completed(), "s-1")
    assert stored(backend) == 1
    assert observed(backend).nothing_pending


def test_required_subscription_keeps_messages_published_before_it_binds(
    backend: MemoryMessagingBackend,
) -> None:
    backend.ensure_channel(ChannelSpec(CHANNEL, RELIABLE_WORK, required=(SUB,)), "op")
    publish(backend, b"early")
    bind(backend)
    assert [d.data for d in receive(backend)] == [b"early"]


def test_eos_subscription_sees_only_eos_markers(backend: MemoryMessagingBackend) -> None:
    provision(backend, subs=(sub_spec(SUB), sub_spec(EOS_SUB)))
    publish(backend, b"a")
    backend.publish(Envelope(CHANNEL, "eos", b"end"), now() + 1.0)
    assert [d.data for d in receive(backend, 5, sub=EOS_SUB)] == [b"end"]
    assert [d.data for d in receive(backend, 5, sub=SUB)] == [b"a"]


# ---------------------------------------------------------------------- settlement


def test_first_delivery_carries_attempt_one_and_its_sequence(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    (seq,) = publish(backend, b"a")
    (delivery,) = receive(backend)
    assert (delivery.num_delivered, delivery.stream_seq, delivery.data) == (1, seq, b"a")
    assert delivery.token.attempt == 1


def test_completed_is_confirmed_and_never_redelivered(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()
    clock.advance(ACK_WAIT * 3)
    assert receive(backend) == []
    assert observed(backend).nothing_pending


def test_a_retried_settlement_is_idempotent_and_a_second_one_is_stale(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()
    assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()
    assert isinstance(backend.settle(delivery.token, Completed(), "s-2"), SettleStale)


def test_lapsed_lease_redelivers_with_the_next_attempt_and_the_old_token_goes_stale(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    publish(backend, b"a")
    (first,) = receive(backend)
    clock.advance(ACK_WAIT + 1)
    (second,) = receive(backend)
    assert second.stream_seq == first.stream_seq and second.num_delivered == 2
    # MSG-011: the superseded handle cannot settle — let alone terminate — the new one.
    assert isinstance(backend.settle(first.token, Terminal("dlq:1"), "s-old"), SettleStale)
    assert backend.settle(second.token, Completed(), "s-new") == SettleConfirmed()


def test_a_redelivery_to_another_receiver_makes_the_holders_token_stale(
    backend: MemoryMessagingBackend, peer: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    bind(peer)
    publish(backend, b"a")
    (first,) = receive(backend)
    clock.advance(ACK_WAIT + 1)
    (second,) = receive(peer)
    assert second.num_delivered == 2
    assert isinstance(backend.settle(first.token, Completed(), "s-1"), SettleStale)
    assert backend.renew(first.token).state == "stale"
    assert peer.settle(second.token, Completed(), "s-2") == SettleConfirmed()


def test_renewed_lease_is_not_redelivered(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    clock.advance(ACK_WAIT * 0.8)
    assert backend.renew(delivery.token).state == "extended"
    clock.advance(ACK_WAIT * 0.8)
    assert receive(backend) == []
    assert observed(backend).leased == 1


def test_retry_is_redelivered_no_earlier_than_its_delay(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    assert backend.settle(delivery.token, Retry(5.0), "s-1") == SettleConfirmed()
    clock.advance(4.9)
    assert receive(backend) == []
    assert not observed(backend).nothing_pending
    clock.advance(0.2)
    (again,) = receive(backend)
    assert again.num_delivered == 2


def test_terminal_requires_a_record_reference() -> None:
    with pytest.raises(ValueError, match="DELIV-15"):
        Terminal("  ")


def test_terminal_is_confirmed_and_never_redelivered(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    assert backend.settle(delivery.token, Terminal("dlq:1"), "s-1") == SettleConfirmed()
    clock.advance(ACK_WAIT * 3)
    assert receive(backend) == []


def test_exhausted_deliveries_are_unresolved_never_nothing_pending(
    backend: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend, subs=(sub_spec(max_deliver=2),))
    publish(backend, b"a")
    (first,) = receive(backend)
    clock.advance(ACK_WAIT + 1)
    (last,) = receive(backend)
    clock.advance(ACK_WAIT + 1)
    assert receive(backend) == []  # max_deliver reached: the broker gives up on it
    observation = observed(backend)
    assert observation.unresolved == 1 and not observation.nothing_pending  # MSG-012
    # The dead letter recorded, the last attempt terminates it and clears the count.
    assert backend.settle(last.token, Terminal("dlq:1"), "s-1") == SettleConfirmed()
    assert observed(backend).nothing_pending
    assert stored(backend) == 0


def test_retry_of_the_last_allowed_attempt_exhausts_it(backend: MemoryMessagingBackend) -> None:
    provision(backend, subs=(sub_spec(max_deliver=1),))
    publish(backend, b"a")
    (delivery,) = receive(backend)
    backend.settle(delivery.token, Retry(0.0), "s-1")
    assert receive(backend) == []
    assert observed(backend).unresolved == 1


def test_mark_exhausted_counts_unresolved_until_terminated(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    (seq,) = publish(backend, b"a")
    (delivery,) = receive(backend)
    backend.mark_exhausted(SUB, seq)
    assert observed(backend).unresolved == 1
    backend.settle(delivery.token, Terminal("dlq:1"), "s-1")
    assert observed(backend).unresolved == 0


def test_mark_exhausted_is_cleared_when_the_message_leaves_the_channel(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend, LIVE_LATEST, realtime_buffer=1)
    (seq,) = publish(backend, b"a")
    backend.mark_exhausted(SUB, seq)
    publish(backend, b"b")  # evicts a
    assert observed(backend).unresolved == 0


def test_supersede_retires_a_live_token(backend: MemoryMessagingBackend) -> None:
    provision(backend)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    assert backend.supersede(delivery.token) is True
    assert backend.supersede(delivery.token) is False
    assert isinstance(backend.settle(delivery.token, Completed(), "s-1"), SettleStale)


def test_rebinding_makes_tokens_of_the_earlier_binding_stale(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    publish(backend, b"a")
    (delivery,) = receive(backend)
    verified = backend.ensure_subscription(sub_spec(), "rebind")
    assert verified.generation == delivery.token.generation + 1
    assert isinstance(backend.settle(delivery.token, Completed(), "s-1"), SettleStale)


def test_repeating_a_binding_operation_is_idempotent(backend: MemoryMessagingBackend) -> None:
    backend.ensure_channel(channel_spec(), "op")
    first = backend.ensure_subscription(sub_spec(), "bind")
    assert backend.ensure_subscription(sub_spec(), "bind") == first


# ------------------------------------------------------------- quiesce and crash


def test_stop_receiving_hands_parked_work_to_a_survivor_at_once(
    make_receiver: Callable[..., MemoryMessagingBackend], peer: MemoryMessagingBackend,
) -> None:
    retiring = make_receiver(prefetch=4)
    provision(retiring)
    bind(peer)
    publish(retiring, b"a", b"b", b"c", b"d")
    (held,) = receive(retiring, 1)
    assert retiring.prefetched(SUB) == 3
    assert retiring.stop_receiving() == 3  # RUN-030
    assert retiring.stop_receiving() == 0  # idempotent
    assert retiring.prefetched(SUB) == 0
    # No clock advance: the survivor has them now, not after ack_wait.
    assert sorted(d.data for d in receive(peer, 5)) == [b"b", b"c", b"d"]
    assert receive(retiring, 5) == []
    # What was handed out stays the holder's to settle.
    assert retiring.settle(held.token, Completed(), "s-1") == SettleConfirmed()


def test_graceful_shutdown_hands_back_what_is_held_but_unsettled(
    backend: MemoryMessagingBackend, peer: MemoryMessagingBackend,
) -> None:
    provision(backend)
    bind(peer)
    publish(backend, b"a", b"b")
    done, held = receive(backend, 2)
    backend.settle(done.token, Completed(), "s-1")
    backend.shutdown()
    (again,) = receive(peer, 5)
    assert again.data == held.data and again.num_delivered == 2


def test_a_crash_lets_leases_lapse_and_the_work_returns_with_the_next_attempt(
    backend: MemoryMessagingBackend, peer: MemoryMessagingBackend, clock: FakeClock,
) -> None:
    provision(backend)
    bind(peer)
    publish(backend, b"a")
    (held,) = receive(backend)
    backend.shutdown(hand_back=False)
    assert receive(peer) == []  # nothing handed back: the lease still runs
    assert observed(peer).leased == 1
    clock.advance(ACK_WAIT + 1)
    (again,) = receive(peer)
    assert again.stream_seq == held.stream_seq and again.num_delivered == held.num_delivered + 1


# ---------------------------------------------------------- credit and budgets


def test_competing_receivers_never_get_the_same_message(
    backend: MemoryMessagingBackend, peer: MemoryMessagingBackend,
) -> None:
    provision(backend)
    bind(peer)
    publish(backend, *[bytes([i]) for i in range(6)])
    mine = receive(backend, 2)
    theirs = receive(peer, 10)
    assert len(mine) + len(theirs) + backend.prefetched(SUB) == 6
    assert not {d.stream_seq for d in mine} & {d.stream_seq for d in theirs}


def test_broker_credit_bounds_what_is_leased(backend: MemoryMessagingBackend) -> None:
    provision(backend, subs=(sub_spec(credit=2),))
    publish(backend, b"a", b"b", b"c")
    assert len(receive(backend, 5)) == 2
    assert observed(backend).leased == 2 and observed(backend).available == 1


def test_byte_budget_pauses_fetching_and_counts_the_wait(
    make_receiver: Callable[..., MemoryMessagingBackend],
) -> None:
    receiver = make_receiver(prefetch=10, byte_budget=5)
    provision(receiver)
    publish(receiver, b"abc", b"def", b"ghi")
    receive(receiver, 10)
    assert receiver.resident_bytes() == 6  # over by at most one message (RUN-025)
    assert receiver.budget_waits() >= 1


def test_resident_bytes_counts_parked_and_handed_out_until_settled(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    publish(backend, b"abc", b"de")
    (first,) = receive(backend, 1)
    assert backend.resident_bytes() == 5
    backend.settle(first.token, Completed(), "s-1")
    assert backend.resident_bytes() == 2


def test_byte_credit_of_receive_bounds_a_batch_but_always_hands_one(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    publish(backend, b"abcd", b"ef")
    assert len(backend.receive(SUB, 5, 2, now())) == 1


def test_admission_filter_acks_refused_deliveries_and_reports_them(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    skipped: list[bytes] = []
    assert backend.set_admission(SUB, lambda d: d.data != b"skip",
                                 lambda d: skipped.append(d.data)) is True
    publish(backend, b"keep", b"skip", b"keep2")
    assert [d.data for d in receive(backend, 5)] == [b"keep", b"keep2"]
    assert skipped == [b"skip"] and backend.skipped(SUB) == 1
    assert observed(backend).dropped == 1


def test_receive_any_returns_from_every_ready_subscription(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend, subs=(sub_spec(SUB), sub_spec(OTHER_SUB)))
    publish(backend, b"a")
    got = backend.receive_any([SUB, OTHER_SUB], 5, 0, now())
    assert sorted(sub.consumer for sub, _ in got) == ["audit", "sink"]


def test_receive_waits_until_the_deadline_for_a_publish(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    timer = threading.Timer(0.05, lambda: publish(backend, b"late"))
    timer.start()
    try:
        got = backend.receive(SUB, 1, 0, now() + 2.0)
    finally:
        timer.join()
    assert [d.data for d in got] == [b"late"]


# ------------------------------------------------------------------- observations


def test_missing_things_are_unknown_never_zero(backend: MemoryMessagingBackend) -> None:
    for observation in (backend.observe_channel(CHANNEL), backend.observe_subscription(SUB),
                        backend.observe_ack_floor(SUB)):
        assert isinstance(observation, Unknown) and observation.reason == "missing"


def test_an_empty_subscription_is_known_zero(backend: MemoryMessagingBackend) -> None:
    provision(backend)
    assert observed(backend) == SubscriptionObservation(0, 0, 0, 0)


def test_ack_floor_advances_only_over_a_settled_prefix(backend: MemoryMessagingBackend) -> None:
    provision(backend, LIVE_LATEST, realtime_buffer=10)
    publish(backend, b"a", b"b", b"c")
    first, second, _ = receive(backend, 3)
    assert backend.observe_ack_floor(SUB) == Known(0)
    backend.settle(second.token, Completed(), "s-2")
    assert backend.observe_ack_floor(SUB) == Known(0)
    backend.settle(first.token, Completed(), "s-1")
    assert backend.observe_ack_floor(SUB) == Known(2)


def test_ack_floor_is_readable_from_a_receiver_that_never_bound_it(
    backend: MemoryMessagingBackend, peer: MemoryMessagingBackend,
) -> None:
    provision(backend)
    assert peer.observe_ack_floor(SUB) == Known(0)


# ------------------------------------------------------------- control and close


def test_control_callback_runs_on_the_backends_loop(
    backend: MemoryMessagingBackend, broker: MemoryBroker,
) -> None:
    heard = threading.Event()
    seen_loop: list[object] = []

    def on_stop() -> None:
        import asyncio

        seen_loop.append(asyncio.get_running_loop())
        heard.set()

    backend.subscribe_control(on_stop)
    assert broker.publish_stop("flow", "run") == 1
    assert heard.wait(2.0)
    assert seen_loop == [backend.loop]


def test_close_removes_owned_channels_of_its_generation_only(
    make_receiver: Callable[..., MemoryMessagingBackend],
) -> None:
    ours = make_receiver(generation="g1")
    theirs = make_receiver(generation="g2")
    other = ChannelId("flow", "run", "other")
    ours.ensure_channel(channel_spec(), "op")
    theirs.ensure_channel(ChannelSpec(other, RELIABLE_WORK), "op")
    result = ours.close([CHANNEL, other], "g1")
    assert result.complete and result.remaining == ()
    assert result.removed == ("vf-flow-run-source",)
    assert isinstance(ours.observe_channel(CHANNEL), Unknown)
    assert isinstance(ours.observe_channel(other), Known)
    assert ours.close([CHANNEL], "g1").removed == ("vf-flow-run-source",)  # already gone


def test_a_parked_delivery_redelivered_elsewhere_is_never_handed_out(
    make_receiver: Callable[..., MemoryMessagingBackend], peer: MemoryMessagingBackend,
    clock: FakeClock,
) -> None:
    slow = make_receiver(prefetch=2)
    provision(slow)
    bind(peer)
    publish(slow, b"a", b"b")
    (first,) = receive(slow, 1)  # b is parked under a running lease
    clock.advance(ACK_WAIT + 1)
    taken = receive(peer, 5)
    assert sorted(d.data for d in taken) == [b"a", b"b"]
    assert receive(slow, 5) == []  # the stale parked b is dropped, not handed out
    assert slow.resident_bytes() == len(first.data)


def test_rebinding_releases_what_the_earlier_binding_held(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    publish(backend, b"abc")
    receive(backend)
    backend.ensure_subscription(sub_spec(), "rebind")
    assert backend.resident_bytes() == 0


def test_a_shut_down_backend_refuses_to_publish_retryably(
    backend: MemoryMessagingBackend,
) -> None:
    provision(backend)
    backend.shutdown()
    assert not backend.connected
    for outcome in (backend.publish(data(b"a", "m-1"), now() + 1.0),
                    backend.observe_publication(data(b"a", "m-1"))):
        assert isinstance(outcome, Rejected) and outcome.retryable is True


def test_a_payload_above_max_payload_is_rejected_for_good(
    make_receiver: Callable[..., MemoryMessagingBackend], broker: MemoryBroker,
) -> None:
    receiver = make_receiver()
    provision(receiver)
    outcome = receiver.publish(data(b"x" * (broker.max_payload + 1)), now() + 1.0)
    assert isinstance(outcome, Rejected) and outcome.retryable is False


def test_dead_letters_are_kept_per_flow_filterable_by_run_and_node_for_a_week(
    make_receiver: Callable[..., MemoryMessagingBackend], broker: MemoryBroker, clock: FakeClock
) -> None:
    backend = make_receiver()
    with pytest.raises(KeyError):
        broker.dead_letters("flow")  # no dead-letter stream until one is ensured
    backend.ensure_dead_letters("dlq")

    def dead(run: str, node: str, data: bytes, msg_id: str) -> PublishOutcome:
        return backend.publish(Envelope(ChannelId("flow", run, node), "dlq", data, msg_id),
                               clock() + 1)

    assert dead("run", "fusion", b"a", "dlq:fusion:cam:1") == Accepted(1)
    assert dead("run", "sink", b"b", "dlq:sink:fusion:4") == Accepted(2)
    assert dead("run-2", "fusion", b"c", "dlq:fusion:cam:9") == Accepted(3)
    assert dead("run", "fusion", b"a", "dlq:fusion:cam:1") == Accepted(1, duplicate=True)
    assert broker.dead_letters("flow") == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert broker.dead_letters("flow", run="run") == [(1, b"a"), (2, b"b")]
    assert broker.dead_letters("flow", run="run", node="sink") == [(2, b"b")]
    assert backend.subject_for(ChannelId("flow", "run", "sink"), "dlq") == "vf.flow._dlq.run.sink"
    clock.advance(7 * 24 * 3600)  # STREAM-8: a week, then they age out
    assert broker.dead_letters("flow") == []


def test_an_external_subject_is_refused_for_good(backend: MemoryMessagingBackend) -> None:
    # The in-process broker holds the flow's channels only: a plain subject outside
    # them is captured by no stream (the JetStream adapter's publish goes to the
    # stream capturing it; tests/e2e/test_subject_sink.py).
    provision(backend)
    outcome = backend.publish(Envelope(CHANNEL, "data", b"x", subject="rig.out"), now() + 1.0)
    assert isinstance(outcome, Rejected) and not outcome.retryable
    assert "rig.out" in outcome.reason
