"""The MessagingBackend contract, one suite for every adapter: each body below runs
against the memory adapter and against JetStream on a real nats-server (conftest's
``harness``, parametrised by ``backend_kind``). A body uses only the contract and the
harness (receivers of one run, receive with a timeout, let time pass for leases), so
an adapter that fails here breaks a promise, not a test detail.

Covered: the publish / receive / settle Completed round trip; a batch of
settlements (settle_many, settle_async) gives each its own result; Retry redelivers;
Terminal needs a record ref (DELIV-15), and a delivery is terminated only once its
dead letter is accepted in the flow's dead-letter stream; a message out of deliveries is unresolved,
never "nothing pending" (MSG-012); a duplicate msg_id is Accepted(duplicate=True)
with the original sequence; a channel nobody provisioned is Rejected(retryable=False);
observations are Known for what exists and Unknown('missing') — never zero — for what
does not (MSG-012). And the negative controls: a stale token settles Stale (MSG-011);
a redelivery supersedes the earlier token; a crash lets leases lapse and the message
comes back with attempt + 1; a quiesce hands parked work to a survivor at once, not
after ack_wait (RUN-030).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from videoflow.backends.messaging import (
    Accepted,
    ChannelId,
    Completed,
    Envelope,
    Known,
    MessagingBackend,
    Rejected,
    Retry,
    SettleConfirmed,
    SettleStale,
    SubscriptionId,
    SubscriptionObservation,
    Terminal,
    Unknown,
)
from videoflow.messaging.dead_letters import dead_letter, dead_letter_for

if TYPE_CHECKING:  # the harness fixture's type; pytest itself never imports conftest by name
    from conftest import Harness

pytestmark = pytest.mark.timeout(60)

SHORT_ACK_WAIT = 2.0
"""A lease a test lets lapse: on JetStream it is waited out in real time."""

LONG_ACK_WAIT = 30.0
"""A lease no test waits out: whatever comes back before it was handed back."""

CRASH_ACK_WAIT = 3.0
"""The crash test's lease: it must outlast a shutdown, a bind and a quiet receive."""

LAPSE = SHORT_ACK_WAIT + 0.5
"""Long enough after a delivery for its lease to have lapsed."""

HAND_BACK_SECONDS = 1.0
"""RUN-030: parked work reaches a survivor within this, not after ack_wait."""


# ------------------------------------------------------------------------ helpers


def data(harness: Harness, payload: bytes, msg_id: str | None = None) -> Envelope:
    return Envelope(harness.channel, "data", payload, msg_id)


def publish(harness: Harness, backend: MessagingBackend, *payloads: bytes) -> list[int]:
    seqs = []
    for payload in payloads:
        outcome = backend.publish(data(harness, payload), time.monotonic() + 5.0)
        assert isinstance(outcome, Accepted), outcome
        assert outcome.duplicate is False
        seqs.append(outcome.stream_seq)
    return seqs


def observed(backend: MessagingBackend, sub: SubscriptionId) -> SubscriptionObservation:
    observation = backend.observe_subscription(sub)
    assert isinstance(observation, Known), observation
    return observation.value


def stored(harness: Harness, backend: MessagingBackend) -> int:
    observation = backend.observe_channel(harness.channel)
    assert isinstance(observation, Known), observation
    return observation.value.messages


# ------------------------------------------------------------------ basic promises


def test_publish_receive_settle_completed_round_trip(harness: Harness) -> None:
    backend = harness.receiver()
    harness.provision(backend, SHORT_ACK_WAIT)
    (seq,) = publish(harness, backend, b"frame-1")

    (delivery,) = harness.receive(backend, harness.wait)
    received_at = time.monotonic()
    assert (delivery.data, delivery.stream_seq, delivery.num_delivered) == (b"frame-1", seq, 1)
    assert (delivery.token.subscription, delivery.token.attempt) == (harness.sub, 1)
    assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()

    # Settled for good: not redelivered once its lease would have lapsed.
    harness.let_pass(LAPSE, since=received_at)
    assert harness.receive(backend, harness.quiet) == []
    assert observed(backend, harness.sub).nothing_pending
    assert stored(harness, backend) == 0  # reliable_work: acked by every reader, gone


def test_retry_redelivers_the_message_with_the_next_attempt(harness: Harness) -> None:
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)
    (seq,) = publish(harness, backend, b"frame-1")
    (first,) = harness.receive(backend, harness.wait)

    assert backend.settle(first.token, Retry(), "s-1") == SettleConfirmed()

    (again,) = harness.receive(backend, harness.wait)
    assert (again.data, again.stream_seq, again.num_delivered) == (b"frame-1", seq, 2)
    assert backend.settle(again.token, Completed(), "s-2") == SettleConfirmed()


def test_retry_with_a_delay_redelivers_only_after_the_delay(harness: Harness) -> None:
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)
    publish(harness, backend, b"frame-1")
    (first,) = harness.receive(backend, harness.wait)

    assert backend.settle(first.token, Retry(delay=SHORT_ACK_WAIT), "s-1") == SettleConfirmed()
    assert harness.receive(backend, harness.quiet) == []

    harness.let_pass(SHORT_ACK_WAIT)
    (again,) = harness.receive(backend, harness.wait)
    assert again.num_delivered == 2


def test_terminal_needs_a_record_ref_and_then_never_redelivers(harness: Harness) -> None:
    with pytest.raises(ValueError, match="record_ref"):
        Terminal("")
    with pytest.raises(ValueError, match="record_ref"):
        Terminal("   ")

    backend = harness.receiver()
    harness.provision(backend, SHORT_ACK_WAIT)
    publish(harness, backend, b"poison")
    (delivery,) = harness.receive(backend, harness.wait)
    received_at = time.monotonic()

    assert backend.settle(delivery.token, Terminal("dlq://flow/run/1"), "s-1") == \
        SettleConfirmed()
    harness.let_pass(LAPSE, since=received_at)
    assert harness.receive(backend, harness.quiet) == []
    assert observed(backend, harness.sub).nothing_pending


def test_duplicate_msg_id_is_accepted_as_a_duplicate_of_the_original(
    harness: Harness,
) -> None:
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)
    deadline = time.monotonic() + 5.0

    first = backend.publish(data(harness, b"a", "m-1"), deadline)
    between = backend.publish(data(harness, b"b", "m-2"), deadline)
    again = backend.publish(data(harness, b"a", "m-1"), deadline)

    assert isinstance(first, Accepted) and first.duplicate is False
    assert isinstance(between, Accepted) and between.stream_seq > first.stream_seq
    assert again == Accepted(first.stream_seq, duplicate=True)
    assert stored(harness, backend) == 2


def test_publish_to_an_unprovisioned_channel_is_rejected_for_good(harness: Harness) -> None:
    backend = harness.receiver()
    nowhere = Envelope(ChannelId("flow", "run", "nowhere"), "data", b"x")

    outcome = backend.publish(nowhere, time.monotonic() + 5.0)

    assert isinstance(outcome, Rejected), outcome
    assert outcome.retryable is False


def test_observations_are_known_when_present_and_missing_never_zero_when_absent(
    harness: Harness,
) -> None:
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)

    # Known(zero) for a subscription that exists and holds nothing.
    empty = observed(backend, harness.sub)
    assert (empty.available, empty.leased, empty.unresolved) == (0, 0, 0)
    floor = backend.observe_ack_floor(harness.sub)
    assert isinstance(floor, Known) and floor.value == 0

    publish(harness, backend, b"a")
    assert len(harness.receive_all(backend, 1, harness.wait)) == 1  # counted once taken
    one = observed(backend, harness.sub)
    assert (one.available, one.leased) == (0, 1) and not one.nothing_pending

    ghost = SubscriptionId("ghost", harness.channel)
    no_channel = SubscriptionId("sink", ChannelId("flow", "run", "nowhere"))
    for absent in (ghost, no_channel):
        observation = backend.observe_subscription(absent)
        assert isinstance(observation, Unknown), observation
        assert observation.reason == "missing"
        with pytest.raises(TypeError, match="not truth-testable"):
            bool(observation)
    channel = backend.observe_channel(no_channel.channel)
    assert isinstance(channel, Unknown) and channel.reason == "missing"
    floor = backend.observe_ack_floor(ghost)
    assert isinstance(floor, Unknown) and floor.reason == "missing"


def test_observations_read_together_answer_each_subscription_in_order(
    harness: Harness,
) -> None:
    # What a join's status reads for all its parents at once: each subscription its
    # own answer, a missing one Unknown beside the others' counts, never 0 for it.
    # Both messages are taken first: a PubAck does not wait for the stream's consumers
    # to count the message (seen once in CI: two acked, consumer_info counting one),
    # while a delivery is counted by the time it arrives, and a lease no test waits
    # out keeps the counts still while they are read.
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)
    publish(harness, backend, b"a", b"b")
    assert len(harness.receive_all(backend, 2, harness.wait)) == 2
    ghost = SubscriptionId("ghost", harness.channel)
    first, missing, again = backend.observe_subscriptions([harness.sub, ghost, harness.sub])
    for seen in (first, again):
        assert isinstance(seen, Known), seen
        assert (seen.value.available, seen.value.leased) == (0, 2), seen
        assert seen.value == observed(backend, harness.sub)
    assert isinstance(missing, Unknown) and missing.reason == "missing"
    assert backend.observe_subscriptions([]) == []


def test_backlog_counts_what_waits_for_a_subscription_without_a_round_trip(
    harness: Harness,
) -> None:
    # What a time join reads before each sweep (GroupAssembler.heard): what was
    # stored and not yet taken waits, parked or still on the broker; what was taken
    # does not; once all is taken the backlog reads 0, and Unknown (never 0) for a
    # subscription nothing is known of.
    first = harness.receiver()  # makes the durable, so the stream keeps what follows
    spec = harness.provision(first, LONG_ACK_WAIT)
    assert first.stop_receiving() == 0
    publish(harness, first, b"a", b"b", b"c", b"d", b"e")  # stored before this bind:
    backend = harness.receiver()  # every delivery's count is the stream's final one
    harness.bind(backend, spec)
    taken = harness.receive(backend, harness.wait, credit=2)
    assert len(taken) in (1, 2)
    waiting = backend.backlog(harness.sub)
    assert isinstance(waiting, Known) and waiting.value == 5 - len(taken), waiting
    rest = harness.receive_all(backend, 5 - len(taken), harness.wait)
    assert len(taken) + len(rest) == 5
    emptied = backend.backlog(harness.sub)
    assert isinstance(emptied, Known) and emptied.value == 0, emptied
    ghost = backend.backlog(SubscriptionId("ghost", harness.channel))
    assert isinstance(ghost, Unknown), ghost


def test_backlog_of_messages_stored_after_the_latest_answer_is_at_least_what_is_parked(
    harness: Harness,
) -> None:
    # Without a round trip the broker's count is the one its latest delivery carried:
    # messages stored after it may be missing from it, never counted twice. Anything
    # parked always counts, so a parent whose input waits here is never read as idle.
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)
    publish(harness, backend, b"a", b"b", b"c", b"d", b"e")
    taken = harness.receive(backend, harness.wait, credit=1)
    assert len(taken) == 1
    deadline = time.monotonic() + harness.wait
    while backend.prefetched(harness.sub) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting = backend.backlog(harness.sub)
    assert isinstance(waiting, Known), waiting
    assert backend.prefetched(harness.sub) <= waiting.value <= 4, waiting


def test_a_message_out_of_deliveries_is_unresolved_never_nothing_pending(
    harness: Harness,
) -> None:
    backend = harness.receiver()
    harness.provision(backend, SHORT_ACK_WAIT, max_deliver=1)
    publish(harness, backend, b"a")
    (delivery,) = harness.receive(backend, harness.wait)
    received_at = time.monotonic()

    harness.let_pass(LAPSE, since=received_at)  # its only attempt lapses
    assert harness.receive(backend, harness.quiet) == []
    deadline = time.monotonic() + harness.wait
    while observed(backend, harness.sub).unresolved == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # JetStream learns it from an advisory, asynchronously

    after = observed(backend, harness.sub)
    assert after.unresolved == 1 and not after.nothing_pending  # MSG-012
    assert stored(harness, backend) == 1  # retained, not silently gone
    assert delivery.num_delivered == 1


# ----------------------------------------------------------- negative controls


def test_a_batch_of_settlements_gives_each_its_own_result(harness: Harness) -> None:
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)
    seqs = publish(harness, backend, b"a", b"b", b"c", b"d")
    got = harness.receive_all(backend, 4, harness.wait)
    assert sorted(d.stream_seq for d in got) == seqs
    a, b, c, d = sorted(got, key=lambda delivery: delivery.stream_seq)
    assert backend.settle(b.token, Completed(), "s-b") == SettleConfirmed()

    # One stale settlement in a batch says nothing about the others, and a Retry in
    # the middle of Completed ones is applied as itself.
    results = backend.settle_many([(a.token, Completed(), "m-a"), (b.token, Completed(), "m-b"),
                                   (c.token, Retry(), "m-c")])
    assert [type(r) for r in results] == [SettleConfirmed, SettleStale, SettleConfirmed]
    (again,) = harness.receive(backend, harness.wait)
    assert (again.stream_seq, again.num_delivered) == (c.stream_seq, 2)

    # settle_async resolves to what settle would return, in order of submission.
    futures = [backend.settle_async(again.token, Completed(), "x-c"),
               backend.settle_async(d.token, Completed(), "x-d"),
               backend.settle_async(d.token, Completed(), "x-d-again")]
    assert [type(f.result(timeout=10)) for f in futures] == [SettleConfirmed, SettleConfirmed,
                                                             SettleStale]
    with pytest.raises(TypeError, match="not a settle outcome"):
        backend.settle_async(d.token, "done", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a settle outcome"):
        backend.settle_many_async([(d.token, Completed(), "y"), (d.token, "done", "z")])  # type: ignore[list-item]

    # settle_many_async: a receipt each, in order, each its own answer.
    publish(harness, backend, b"e", b"f")
    e, f = sorted(harness.receive_all(backend, 2, harness.wait),
                  key=lambda delivery: delivery.stream_seq)
    receipts = backend.settle_many_async([(e.token, Completed(), "y-e"),
                                          (d.token, Completed(), "y-d"),
                                          (f.token, Completed(), "y-f")])
    assert [type(r.result(timeout=10)) for r in receipts] == [SettleConfirmed, SettleStale,
                                                              SettleConfirmed]
    assert observed(backend, harness.sub).nothing_pending
    assert stored(harness, backend) == 0


def test_a_delivery_is_terminated_only_once_its_dead_letter_is_accepted(
    harness: Harness,
) -> None:
    backend = harness.receiver()
    harness.provision(backend, SHORT_ACK_WAIT)
    publish(harness, backend, b"poison")
    (delivery,) = harness.receive(backend, harness.wait)
    received_at = time.monotonic()
    record = dead_letter_for(harness.channel.flow, harness.channel.run, harness.sub.consumer,
                             harness.channel.node, delivery.stream_seq, delivery.num_delivered,
                             "poison", delivery.data, ValueError("bad frame"), time.time())

    # No dead-letter stream yet: refused for good, and the delivery stays alive (DELIV-15).
    refused = dead_letter(backend, delivery.token, record, time.monotonic() + 5)
    assert isinstance(refused.published.outcome, Rejected) and refused.settled is None
    assert not refused.published.outcome.retryable

    backend.ensure_dead_letters("dlq-1")
    backend.ensure_dead_letters("dlq-2")  # idempotent
    done = dead_letter(backend, delivery.token, record, time.monotonic() + 5)
    assert isinstance(done.published.outcome, Accepted) and done.settled == SettleConfirmed()
    # Retried (an unknown outcome, say): one record, and the same settlement id gets
    # the first answer; a different settlement of the spent token is stale.
    again = dead_letter(backend, delivery.token, record, time.monotonic() + 5)
    assert again.published.outcome == Accepted(done.published.outcome.stream_seq, duplicate=True)
    assert again.settled == SettleConfirmed()
    assert isinstance(backend.settle(delivery.token, Completed(), "other"), SettleStale)

    # Terminated for good: not redelivered once its lease would have lapsed.
    harness.let_pass(LAPSE, since=received_at)
    assert harness.receive(backend, harness.quiet) == []
    assert observed(backend, harness.sub).nothing_pending


def test_a_settled_token_is_stale_and_a_retried_settlement_is_idempotent(
    harness: Harness,
) -> None:
    backend = harness.receiver()
    harness.provision(backend, LONG_ACK_WAIT)
    publish(harness, backend, b"a")
    (delivery,) = harness.receive(backend, harness.wait)

    assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()
    assert backend.settle(delivery.token, Completed(), "s-1") == SettleConfirmed()
    assert isinstance(backend.settle(delivery.token, Completed(), "s-2"), SettleStale)
    assert isinstance(backend.settle(delivery.token, Terminal("dlq://x"), "s-3"), SettleStale)
    assert backend.renew(delivery.token).state == "stale"


def test_a_token_of_another_receiver_or_an_earlier_binding_is_stale(harness: Harness) -> None:
    backend = harness.receiver()
    spec = harness.provision(backend, SHORT_ACK_WAIT)
    (seq,) = publish(harness, backend, b"a")
    (delivery,) = harness.receive(backend, harness.wait)
    received_at = time.monotonic()
    old = delivery.token

    other = harness.receiver()
    harness.bind(other, spec)
    assert isinstance(other.settle(old, Completed(), "s-other"), SettleStale)

    # A new operation id rebinds: the earlier binding's tokens are stale (MSG-011).
    rebound = backend.ensure_subscription(spec, "rebind")
    assert rebound.generation > old.generation
    assert isinstance(backend.settle(old, Terminal("dlq://x"), "s-old"), SettleStale)
    assert backend.renew(old).state == "stale"

    # Nothing reached the broker for those: the message's lease lapses and it comes
    # back, to whichever receiver is fetching, as the next attempt.
    other.stop_receiving()
    harness.let_pass(LAPSE, since=received_at)
    (again,) = harness.receive(backend, harness.wait)
    assert (again.stream_seq, again.num_delivered) == (seq, 2)
    assert again.token.generation == rebound.generation
    assert backend.settle(again.token, Completed(), "s-new") == SettleConfirmed()


def test_a_redelivery_supersedes_the_earlier_token(harness: Harness) -> None:
    backend = harness.receiver()
    harness.provision(backend, SHORT_ACK_WAIT)
    (seq,) = publish(harness, backend, b"a")
    (first,) = harness.receive(backend, harness.wait)
    received_at = time.monotonic()

    harness.let_pass(LAPSE, since=received_at)  # the lease lapses unsettled
    (second,) = harness.receive(backend, harness.wait)
    assert (second.stream_seq, second.num_delivered) == (seq, first.num_delivered + 1)

    # The stale handle neither terminates nor settles the attempt that replaced it.
    assert isinstance(backend.settle(first.token, Terminal("dlq://x"), "s-old"), SettleStale)
    assert backend.renew(first.token).state == "stale"
    assert backend.settle(second.token, Completed(), "s-new") == SettleConfirmed()
    assert observed(backend, harness.sub).nothing_pending


def test_a_crash_lets_leases_lapse_and_the_message_returns_with_the_next_attempt(
    harness: Harness,
) -> None:
    crashing = harness.receiver()
    # A lease with room for the crash, the survivor's bind and a quiet receive inside it.
    spec = harness.provision(crashing, CRASH_ACK_WAIT)
    (seq,) = publish(harness, crashing, b"a")
    (held,) = harness.receive(crashing, harness.wait)
    received_at = time.monotonic()

    crashing.shutdown(hand_back=False)
    survivor = harness.receiver()
    harness.bind(survivor, spec)
    # Nothing was handed back: the lease still holds the message.
    quiet = harness.receive(survivor, harness.quiet)
    assert time.monotonic() - received_at < CRASH_ACK_WAIT, "the quiet check outlasted the lease"
    assert quiet == []

    harness.let_pass(CRASH_ACK_WAIT + 0.5, since=received_at)
    (back,) = harness.receive(survivor, harness.wait)
    assert (back.stream_seq, back.data, back.num_delivered) == (seq, b"a",
                                                                 held.num_delivered + 1)
    assert survivor.settle(back.token, Completed(), "s-1") == SettleConfirmed()


def test_a_quiesce_hands_parked_work_to_a_survivor_at_once(harness: Harness) -> None:
    retiring = harness.receiver()
    spec = harness.provision(retiring, LONG_ACK_WAIT)
    seqs = publish(harness, retiring, b"a", b"b", b"c")
    (in_hand,) = harness.receive(retiring, harness.wait)
    wait_until_parked(retiring, harness.sub, 2, harness.wait)
    survivor = harness.receiver()
    harness.bind(survivor, spec)

    started = time.monotonic()
    assert retiring.stop_receiving() == 2
    handed_back = time.monotonic()
    taken = harness.receive_all(survivor, 2, HAND_BACK_SECONDS)
    arrived = time.monotonic()

    assert sorted(d.stream_seq for d in taken) == sorted(set(seqs) - {in_hand.stream_seq})
    # The quiesce may wait out a pull in flight (JetStream: fetch_timeout) before it
    # hands back; once it has, the survivor has the work at once, not after ack_wait.
    assert handed_back - started < HAND_BACK_SECONDS, \
        f"stop_receiving took {handed_back - started:.2f}s"
    assert arrived - handed_back < HAND_BACK_SECONDS, \
        f"the survivor had the work {arrived - handed_back:.2f}s after the hand-back"
    assert all(d.num_delivered == 2 for d in taken)
    # Idempotent, and what was handed out stays the retiring receiver's to settle.
    assert retiring.stop_receiving() == 0
    assert retiring.settle(in_hand.token, Completed(), "s-kept") == SettleConfirmed()
    for n, delivery in enumerate(taken):
        assert survivor.settle(delivery.token, Completed(), f"s-{n}") == SettleConfirmed()


def wait_until_parked(backend: MessagingBackend, sub: SubscriptionId, count: int,
                      timeout: float) -> None:
    """Wait until backend's prefetch holds count deliveries of sub (a real broker's pull
    loop fills it in the background)."""
    deadline = time.monotonic() + timeout
    while backend.prefetched(sub) < count:
        assert time.monotonic() < deadline, f"parked {backend.prefetched(sub)} of {count}"
        time.sleep(0.02)
