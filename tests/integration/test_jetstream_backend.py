"""The JetStream adapter's layers against a real nats-server (conftest's fixture chain):
its own loop thread and fail-fast connect, typed publication outcomes (MSG-013/014),
and receiving with fenced settlement (MSG-011). Never a mock broker."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from videoflow.backends.jetstream.backend import (
    ACK_CONFIRM_SECONDS,
    FETCH_TIMEOUT_SECONDS,
    JetStreamMessagingBackend,
    channel_spec_for,
    consumer_credit,
    subscription_spec_for,
)
from videoflow.backends.jetstream.configs import consumer_config_for, stream_config_for
from videoflow.backends.jetstream.outcomes import (
    PublicationLedger,
    observe_by_republish,
    publish_once,
)
from videoflow.backends.jetstream.streams import ensure_consumer, ensure_stream
from videoflow.backends.jetstream.subscription_receiver import (
    PullRefused,
    SubscriptionReceiver,
    bind_receiver,
)
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    Completed,
    Delivery,
    DeliveryToken,
    Envelope,
    IncompatibleProfile,
    Known,
    PublicationUnknown,
    PublicationUnresolvable,
    Rejected,
    Retry,
    SettleConfirmed,
    SettleResult,
    SettleStale,
    SettleUnknown,
    SubscriptionId,
    Terminal,
    Unknown,
)
from videoflow.broker import loop as jetstream_loop
from videoflow.broker import server as embedded
from videoflow.broker.loop import (
    KEEP_SECONDS,
    READ_CHUNK_BYTES,
    ErrorLog,
    LoopRunner,
    bound_reads,
    close_client,
    connect_fail_fast,
    registered,
)
from videoflow.core.constants import BATCH
from videoflow.core.naming import (
    control_subject_for,
    dlq_stream_name,
    dlq_subject_for,
    stream_name_for,
    subject_for,
)
from videoflow.errors import BrokerUnavailable
from videoflow.messaging.dead_letters import dead_letter, dead_letter_for, decode_dead_letter
from videoflow.messaging.publication import Published, publish_until_known
from videoflow.run.worker import _stop_signals

pytestmark = pytest.mark.timeout(60)

FLOW, RUN = "flow", "run"


class Wired:
    """A runner with a connected client and its JetStream context, all on the
    runner's loop — how the backend holds them."""

    def __init__(self, url: str) -> None:
        self.runner = LoopRunner()
        self.runner.start()
        self.errors = ErrorLog()
        self.client: Client = self.runner.run(connect_fail_fast(url, 5.0, self.errors), 10)
        self.js: JetStreamContext = self.client.jetstream()

    def run(self, coro, timeout: float = 20.0):  # type: ignore[no-untyped-def]
        return self.runner.run(coro, timeout)

    def close(self) -> None:
        self.runner.run(close_client(self.client), 10)
        self.runner.stop()


@pytest.fixture
def wired(nats_server: embedded.EmbeddedServer):  # type: ignore[no-untyped-def]
    w = Wired(nats_server.url)
    try:
        yield w
    finally:
        w.close()


def batch_channel(
    wired: Wired, node: str, max_msgs: int = 10_000, ack_wait: int = 30, max_deliver: int = 5,
    max_ack_pending: int | None = None,
) -> tuple[str, str]:
    """A BATCH (INTEREST, DiscardPolicy.NEW) stream for node with one data durable
    reading it, so published messages are retained. Returns (stream, subject)."""
    stream = stream_name_for(FLOW, RUN, node)
    config = stream_config_for(FLOW, RUN, node, BATCH, batch_max_msgs=max_msgs)
    verified = wired.run(ensure_stream(wired.js, config))
    assert verified.mismatches == ()
    durable = consumer_config_for(FLOW, RUN, "child", node, ack_wait=ack_wait,
                                  max_deliver=max_deliver)
    if max_ack_pending is not None:
        durable.max_ack_pending = max_ack_pending
    wired.run(ensure_consumer(wired.js, stream, durable))
    return stream, subject_for(FLOW, RUN, node)


# ------------------------------------------------------------------ layer 1: the loop


async def which_thread() -> int:
    """The thread the loop runs a coroutine on."""
    return threading.get_ident()


async def thread_after(seconds: float) -> int:
    """The thread the loop runs a coroutine on once it has slept `seconds`."""
    await asyncio.sleep(seconds)
    return threading.get_ident()


@pytest.fixture
def runner():  # type: ignore[no-untyped-def]
    made = LoopRunner()
    made.start()
    try:
        yield made
    finally:
        made.stop()


def test_runner_propagates_results_and_exceptions_run_on_the_waiting_thread() -> None:
    runner = LoopRunner()
    runner.start()
    try:
        # Nobody else runs the loop: the caller runs it while it waits.
        assert runner.run(which_thread(), timeout=5) == threading.get_ident()

        async def boom() -> None:
            raise KeyError("from the loop")

        with pytest.raises(KeyError, match="from the loop"):
            runner.run(boom(), timeout=5)
        with pytest.raises(TimeoutError, match="within"):
            runner.run(asyncio.sleep(10), timeout=0.2)
    finally:
        runner.stop()
    assert not runner.running
    with pytest.raises(BrokerUnavailable, match="not running"):
        runner.run(asyncio.sleep(0), timeout=1)


def test_the_keeper_runs_the_loop_while_no_caller_waits_and_hands_it_back(
    runner: LoopRunner,
) -> None:
    ran: list[int] = []
    # Handed over, then the caller busy with code of its own: the keeper runs the
    # loop once it has rested KEEP_SECONDS, so the callback does not wait for the
    # caller's next wait.
    runner.call_soon(lambda: ran.append(threading.get_ident()))
    time.sleep(10 * KEEP_SECONDS)
    assert ran and ran[0] != threading.get_ident()
    # A waiting caller takes the loop back from the keeper. The coroutine's first step
    # may still run on the keeper, which holds the loop when the call is handed over
    # (the caller's request to let go is queued behind it); what runs once the keeper
    # has let go -- after a pause far longer than that handover -- runs on the caller.
    started = time.monotonic()
    assert runner.run(thread_after(0.2), timeout=5) == threading.get_ident()
    assert time.monotonic() - started < 1.2


def test_a_coalesced_turn_nobody_comes_back_for_is_sent_by_the_keeper(
    monkeypatch: pytest.MonkeyPatch, runner: LoopRunner,
) -> None:
    # A fast producer's last output before a long next(): its turn was skipped to
    # batch writes. The keeper sends it at the end of the coalescing window, not only
    # once the loop has rested KEEP_SECONDS (made long here, so only that can pass).
    monkeypatch.setattr(jetstream_loop, "KEEP_SECONDS", 30.0)
    ran: list[int] = []
    runner.turn()  # the loop has just run
    runner.call_soon(lambda: ran.append(threading.get_ident()))
    runner.turn(unless_within=0.05)  # back within the window: skipped
    assert ran == []
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran and ran[0] != threading.get_ident()
    # Sent, the keeper lets go: the next caller runs the loop itself (what runs after
    # a pause: the keeper may be finishing its pass when the call is handed over).
    assert runner.run(thread_after(0.2), timeout=5) == threading.get_ident()


def test_a_caller_back_once_per_coalescing_window_sends_its_work_itself(
    monkeypatch: pytest.MonkeyPatch, runner: LoopRunner,
) -> None:
    # A paced producer comes back every ~1 ms, inside the window: its first call after
    # the window sends what waited, on its own thread. The keeper's backstop comes a
    # window later, so it never has to wake for it (a wake-up and a trade of the
    # interpreter between two threads per write).
    monkeypatch.setattr(jetstream_loop, "KEEP_SECONDS", 30.0)
    window = 0.25
    ran: list[int] = []
    runner.turn()
    started = time.monotonic()
    runner.call_soon(lambda: ran.append(threading.get_ident()))
    runner.turn(unless_within=window)  # within the window: skipped
    time.sleep(0.6 * window)
    runner.turn(unless_within=window)  # still within it: skipped
    assert ran == []
    time.sleep(max(0.0, started + 1.2 * window - time.monotonic()))
    runner.turn(unless_within=window)  # past it, before the keeper's backstop
    assert ran == [threading.get_ident()]


def test_two_threads_waiting_on_one_runner_both_get_their_answers(runner: LoopRunner) -> None:
    async def nap(seconds: float) -> tuple[float, int]:
        await asyncio.sleep(seconds)
        return seconds, threading.get_ident()

    answers: dict[str, tuple[float, int]] = {}

    def other() -> None:
        answers["other"] = runner.run(nap(0.2), timeout=5)

    thread = threading.Thread(target=other)
    thread.start()
    answers["main"] = runner.run(nap(0.4), timeout=5)
    thread.join(5)
    # One ran the loop for both; neither waited past its own answer's bound.
    assert answers["main"][0] == 0.4 and answers["other"][0] == 0.2
    assert {answers["main"][1], answers["other"][1]} <= {threading.get_ident(),
                                                        thread.ident}


def test_connect_and_close_on_the_runner_loop(nats_server: embedded.EmbeddedServer) -> None:
    runner = LoopRunner()
    runner.start()
    try:
        errors = ErrorLog()
        client = runner.run(connect_fail_fast(nats_server.url, 5.0, errors), timeout=10)
        assert client.is_connected
        runner.run(close_client(client), timeout=10)
        assert client.is_closed
        assert errors.reports == []
    finally:
        runner.stop()


def test_registered_writes_its_ping_after_the_subscription(wired: Wired) -> None:
    # Why `registered` exists: one flush's PING leaves before a SUB still in nats-py's
    # pending buffer, so its PONG proves nothing; `registered`'s last PING follows it.
    transport = wired.client._transport
    assert transport is not None
    wire: list[bytes] = []
    write, writelines = transport.write, transport.writelines

    def record(data: bytes) -> None:
        wire.append(bytes(data).split(b" ")[0].strip())
        write(data)

    def record_lines(lines: list[bytes]) -> None:
        wire.extend(bytes(data).split(b" ")[0].strip() for data in lines)
        writelines(lines)

    async def subscribe_then(settle: Callable[[], Awaitable[None]]) -> list[bytes]:
        wire.clear()

        async def ignore(_msg: Msg) -> None:
            pass

        await wired.client.subscribe("registered.probe", cb=ignore)
        await settle()
        return list(wire)

    transport.write, transport.writelines = record, record_lines  # type: ignore[method-assign, assignment]
    try:
        once = wired.run(subscribe_then(lambda: wired.client.flush(timeout=5)))
        assert once.index(b"PING") < once.index(b"SUB"), once  # the nats-py fact
        twice = wired.run(subscribe_then(lambda: registered(wired.client, 5)))
        assert twice.index(b"SUB") < len(twice) - 1 - twice[::-1].index(b"PING"), twice
    finally:
        transport.write, transport.writelines = write, writelines  # type: ignore[method-assign]


def test_a_connection_reads_in_bounded_chunks_and_a_larger_message_still_arrives_whole(
    nats_server: embedded.EmbeddedServer,
) -> None:
    # bound_reads reaches inside nats-py (no option exists): on the nats-py this
    # project pins it must take hold, or every socket read maps memory again.
    runner = LoopRunner()
    runner.start()
    try:
        client = runner.run(connect_fail_fast(nats_server.url, 5.0, ErrorLog()), timeout=10)
        assert bound_reads(client) is True  # connect_fail_fast already set it; again is fine
        payload = bytes(range(256)) * (3 * READ_CHUNK_BYTES // 256 + 7)

        async def echo() -> bytes:
            sub = await client.subscribe("bounded.reads")
            await client.publish("bounded.reads", payload)
            return (await sub.next_msg(timeout=5)).data

        assert runner.run(echo(), timeout=10) == payload
        runner.run(close_client(client), timeout=10)
    finally:
        runner.stop()


def test_a_refused_connect_fails_fast_with_broker_unavailable(tmp_path: Path) -> None:
    with embedded.start(tmp_path / "gone") as server:
        url = server.url
    # The server is stopped: its port now refuses. S4: without the fail-fast options
    # nats-py would retry for about two minutes.
    runner = LoopRunner()
    runner.start()
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="unreachable"):
            runner.run(connect_fail_fast(url, 30.0, ErrorLog()), timeout=40)
        assert time.monotonic() - started < 5.0
    finally:
        runner.stop()


def test_runner_keeps_a_timeout_the_coroutine_raised_itself() -> None:
    runner = LoopRunner()
    runner.start()
    try:
        async def own_timeout() -> None:
            raise TimeoutError("the coroutine's own")

        with pytest.raises(TimeoutError, match="the coroutine's own"):
            runner.run(own_timeout(), timeout=5)
    finally:
        runner.stop()



def test_what_a_call_raises_after_its_caller_gave_up_prints_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A payload put cut off by a broker outage ends like this: its caller timed out
    # (an unknown outcome, reported as such), then the call's clean-up raised. asyncio
    # would print "Task exception was never retrieved" and a traceback on stderr.
    caplog.set_level(logging.DEBUG)
    runner = LoopRunner()
    runner.start()
    ended = threading.Event()
    try:
        async def fails_late() -> None:
            try:
                await asyncio.sleep(30)
            finally:
                await asyncio.sleep(0.2)  # its clean-up outlives the cancel
                ended.set()
                raise ValueError("after the caller left")  # noqa: B012

        with pytest.raises(TimeoutError):
            runner.run(fails_late(), timeout=0.2)
        assert ended.wait(5)
        runner.run(asyncio.sleep(0.1), timeout=5)  # the loop ends the task meanwhile
        gc.collect()  # asyncio reports an unread exception when its task is collected
    finally:
        runner.stop()
    assert not [r for r in caplog.records
                if r.name == "asyncio" and r.levelno >= logging.ERROR], caplog.text
    assert any("after the caller left" in r.getMessage() for r in caplog.records
               if r.name == "videoflow.broker.loop")


# ------------------------------------------------- layer 2: publication outcomes


def envelope(node: str, data: bytes = b"payload", msg_id: str | None = None) -> Envelope:
    return Envelope(ChannelId(FLOW, RUN, node), "data", data, msg_id)


def test_publish_is_accepted_once_and_a_repeated_msg_id_is_a_duplicate(wired: Wired) -> None:
    _, subject = batch_channel(wired, "src")
    first = wired.run(publish_once(wired.js, subject, envelope("src", msg_id="m-1"), 5))
    again = wired.run(publish_once(wired.js, subject, envelope("src", msg_id="m-1"), 5))
    other = wired.run(publish_once(wired.js, subject, envelope("src", msg_id="m-2"), 5))
    assert first == Accepted(stream_seq=1, duplicate=False)
    assert again == Accepted(stream_seq=1, duplicate=True)
    assert other == Accepted(stream_seq=2, duplicate=False)


def test_a_subject_no_stream_captures_is_rejected_not_retryable(wired: Wired) -> None:
    outcome = wired.run(publish_once(wired.js, "vf.flow.run.nobody", envelope("nobody"), 5))
    assert isinstance(outcome, Rejected)
    assert outcome.retryable is False
    assert "no stream captures" in outcome.reason


def test_a_full_discard_new_stream_is_rejected_retryable(wired: Wired) -> None:
    _, subject = batch_channel(wired, "full", max_msgs=1)
    assert isinstance(wired.run(publish_once(wired.js, subject, envelope("full"), 5)), Accepted)
    outcome = wired.run(publish_once(wired.js, subject, envelope("full"), 5))
    assert isinstance(outcome, Rejected)
    assert outcome.retryable is True  # S8: 503 / 10077, acks free room
    assert "10077" in outcome.reason


def test_an_expired_deadline_sends_nothing(wired: Wired) -> None:
    stream, subject = batch_channel(wired, "late")
    outcome = wired.run(publish_once(wired.js, subject, envelope("late"), 0.0))
    assert isinstance(outcome, Rejected) and outcome.retryable is True
    info = wired.run(wired.js.stream_info(stream))
    assert info.state.messages == 0


def test_a_lost_puback_is_unknown_and_observe_publication_resolves_it(
    wired: Wired, nats_server: embedded.EmbeddedServer, freeze
) -> None:
    stream, subject = batch_channel(wired, "frozen")
    ledger = PublicationLedger()
    sent = envelope("frozen", msg_id="m-frozen")
    with freeze(nats_server):  # only this test's own server
        ledger.sent(sent, horizon=120.0)
        outcome = wired.run(publish_once(wired.js, subject, sent, 0.5))
    assert isinstance(outcome, PublicationUnknown)  # MSG-014: never Rejected
    resolved = wired.run(observe_by_republish(wired.js, stream, subject, sent, ledger, 5))
    # S3: the frozen server stored it once it resumed; the re-publish is a duplicate.
    assert resolved == Accepted(stream_seq=1, duplicate=True)
    assert wired.run(wired.js.stream_info(stream)).state.messages == 1
    assert ledger.first_sent(sent) is None


def test_observe_publication_outside_the_window_or_without_msg_id_is_unresolvable(
    wired: Wired,
) -> None:
    stream, subject = batch_channel(wired, "old")
    now = [1000.0]
    ledger = PublicationLedger(clock=lambda: now[0])
    sent = envelope("old", msg_id="m-old")
    ledger.sent(sent, horizon=120.0)
    now[0] += 121.0  # past stream_config_for's 120 s duplicate_window
    outcome = wired.run(observe_by_republish(wired.js, stream, subject, sent, ledger, 5))
    assert isinstance(outcome, PublicationUnresolvable)
    bare = wired.run(observe_by_republish(wired.js, stream, subject, envelope("old"),
                                          ledger, 5))
    assert isinstance(bare, PublicationUnresolvable)
    assert wired.run(wired.js.stream_info(stream)).state.messages == 0


# ------------------------------------------------ layer 3: receiving and settlement


def bound(wired: Wired, node: str, generation: int = 0, prefetch: int = 4,
          ack_confirm: float = 2.0) -> SubscriptionReceiver:
    sub = SubscriptionId("child", ChannelId(FLOW, RUN, node))

    async def bind() -> SubscriptionReceiver:
        return await bind_receiver(wired.client, sub, stream_name_for(FLOW, RUN, node),
                                   "child--from--" + node, generation, prefetch=prefetch,
                                   fetch_timeout=0.5, ack_confirm_seconds=ack_confirm)

    return wired.run(bind())


def publish(wired: Wired, node: str, count: int) -> None:
    subject = subject_for(FLOW, RUN, node)
    for i in range(count):
        outcome = wired.run(publish_once(wired.js, subject, envelope(node, b"m%d" % i), 5))
        assert isinstance(outcome, Accepted)


def take(wired: Wired, receiver: SubscriptionReceiver, credit: int = 1, wait: float = 5.0):  # type: ignore[no-untyped-def]
    """Up to credit deliveries, gathered until that many arrived or wait passed: the
    pull loop parks each message as it arrives, so one take may see only part of what
    the server is sending. Taken from this thread, as receive_any takes them."""
    deadline = time.monotonic() + wait
    got = receiver.take_ready(credit)
    while len(got) < credit and time.monotonic() < deadline:
        time.sleep(0.005)
        got += receiver.take_ready(credit - len(got))
    return got


def ack_floor(wired: Wired, node: str) -> int:
    info = wired.run(wired.js.consumer_info(stream_name_for(FLOW, RUN, node),
                                            "child--from--" + node))
    return info.ack_floor.stream_seq


def test_completed_is_confirmed_by_the_server_and_moves_the_ack_floor(wired: Wired) -> None:
    batch_channel(wired, "acked")
    publish(wired, "acked", 2)
    receiver = bound(wired, "acked")
    first, second = take(wired, receiver, credit=2)
    assert (first.stream_seq, first.num_delivered, first.data) == (1, 1, b"m0")
    assert first.token.generation == 0
    assert wired.run(receiver.leases.settle(first.token, Completed(), "s-1")) == SettleConfirmed()
    assert wired.run(receiver.leases.settle(second.token, Completed(), "s-2")) == SettleConfirmed()
    assert ack_floor(wired, "acked") == 2
    # The same settlement id again is the first answer, not a second ack.
    assert wired.run(receiver.leases.settle(first.token, Completed(), "s-1")) == SettleConfirmed()
    wired.run(receiver.stop())


def test_a_stale_token_is_settle_stale_and_sends_nothing(wired: Wired) -> None:
    batch_channel(wired, "stale")
    publish(wired, "stale", 1)
    receiver = bound(wired, "stale", generation=3)
    (delivery,) = take(wired, receiver)
    older_binding = DeliveryToken(delivery.token.subscription, delivery.stream_seq,
                                  delivery.num_delivered, generation=2)
    assert isinstance(wired.run(receiver.leases.settle(older_binding, Terminal("dlq:1"), "x")),
                      SettleStale)
    assert wired.run(receiver.leases.settle(delivery.token, Completed(), "a")) == SettleConfirmed()
    # Settled: a second, different settlement of the same token sends nothing.
    assert isinstance(wired.run(receiver.leases.settle(delivery.token, Retry(0.0), "b")),
                      SettleStale)
    assert wired.run(receiver.leases.renew(delivery.token)).state == "stale"
    wired.run(receiver.stop())


def test_redelivery_after_ack_wait_increments_num_delivered_and_fences_the_first_token(
    wired: Wired,
) -> None:
    batch_channel(wired, "lapse", ack_wait=1)
    publish(wired, "lapse", 1)
    receiver = bound(wired, "lapse")
    (first,) = take(wired, receiver)
    (again,) = take(wired, receiver, wait=10.0)  # the lease lapses after ack_wait=1s
    assert again.stream_seq == first.stream_seq
    assert again.num_delivered == first.num_delivered + 1
    assert isinstance(wired.run(receiver.leases.settle(first.token, Completed(), "old")),
                      SettleStale)
    assert wired.run(receiver.leases.settle(again.token, Completed(), "new")) == SettleConfirmed()
    assert ack_floor(wired, "lapse") == 1
    wired.run(receiver.stop())


def test_retry_with_delay_and_terminal_are_confirmed(wired: Wired) -> None:
    batch_channel(wired, "retry")
    publish(wired, "retry", 2)
    receiver = bound(wired, "retry")
    retried, terminated = take(wired, receiver, credit=2)
    started = time.monotonic()
    assert wired.run(receiver.leases.settle(retried.token, Retry(0.5), "r")) == SettleConfirmed()
    assert wired.run(receiver.leases.settle(terminated.token, Terminal("dlq:seq-2"), "t")) == (
        SettleConfirmed())
    (redelivered,) = take(wired, receiver, wait=5.0)
    assert time.monotonic() - started >= 0.4  # the NAK's delay was honoured
    assert (redelivered.stream_seq, redelivered.num_delivered) == (1, 2)
    assert wired.run(receiver.leases.settle(redelivered.token, Completed(), "c")) == (
        SettleConfirmed())
    assert ack_floor(wired, "retry") == 2  # the terminated message never comes back
    assert take(wired, receiver, wait=1.0) == []
    wired.run(receiver.stop())


def test_an_unconfirmed_ack_is_settle_unknown_and_may_be_retried(
    wired: Wired, nats_server: embedded.EmbeddedServer, freeze
) -> None:
    batch_channel(wired, "unconfirmed")
    publish(wired, "unconfirmed", 1)
    receiver = bound(wired, "unconfirmed", ack_confirm=0.5)
    (delivery,) = take(wired, receiver)
    with freeze(nats_server):  # only this test's own server
        outcome = wired.run(receiver.leases.settle(delivery.token, Completed(), "u"))
    assert isinstance(outcome, SettleUnknown)  # PAY-004: never assumed
    assert receiver.leases.live(delivery.token)
    assert wired.run(receiver.leases.settle(delivery.token, Completed(), "u")) == SettleConfirmed()
    wired.run(receiver.stop())


def test_hand_back_returns_parked_deliveries_to_a_survivor_at_once(wired: Wired) -> None:
    batch_channel(wired, "quiesce")
    publish(wired, "quiesce", 3)
    leaving = bound(wired, "quiesce", prefetch=4)
    (in_hand,) = take(wired, leaving)

    async def parked_all() -> int:
        while leaving.parked < 2:
            await asyncio.sleep(0.05)
        await leaving.stop()
        return await leaving.hand_back(parked_only=True)

    assert wired.run(parked_all()) == 2  # RUN-030
    survivor = bound(wired, "quiesce", generation=1)
    got = take(wired, survivor, credit=2, wait=5.0)
    while len(got) < 2:
        got += take(wired, survivor, credit=2, wait=5.0)
    assert sorted(d.stream_seq for d in got) == [2, 3]
    # What was handed out stays the leaving receiver's to settle.
    assert wired.run(leaving.leases.settle(in_hand.token, Completed(), "kept")) == SettleConfirmed()
    wired.run(survivor.stop())


def test_a_take_wakes_the_pull_loop_only_once_it_made_room_to_ask_for(wired: Wired) -> None:
    """With a request open, the pull loop asks again once half its depth is free. A
    take that frees less leaves it asleep: a reader that keeps up takes every
    delivery as it arrives, and woken for each take, to find nothing to ask for, the
    loop cost it several turns a message. The take that frees enough wakes it, and
    the room is asked for at once."""
    batch_channel(wired, "room")
    publish(wired, "room", 4)  # the first request's (no size seen yet: 4)
    sub = SubscriptionId("child", ChannelId(FLOW, RUN, "room"))
    # A fetch far longer than the test: the open request does not expire meanwhile.
    receiver = wired.run(bind_receiver(wired.client, sub, stream_name_for(FLOW, RUN, "room"),
                                       "child--from--room", 0, prefetch=8,
                                       fetch_timeout=60.0, ack_confirm_seconds=2.0))

    def asked() -> int:
        return sum(pull.remaining for pull in list(receiver._pulls.values()))

    deadline = time.monotonic() + 5
    # The 4 parked, and a second request, for the 4 more the depth of 8 holds, open.
    while not (receiver.parked == 4 and asked() == 4 and receiver._space_waiting):
        assert time.monotonic() < deadline, (receiver.parked, asked())
        time.sleep(0.005)
    wakes: list[int] = []
    space = receiver._space
    real_set = space.set

    def counted() -> None:
        wakes.append(receiver.parked)
        real_set()

    space.set = counted  # type: ignore[method-assign]
    for taken in range(1, 4):  # an eighth, a quarter, three eighths of the depth free
        assert len(receiver.take_ready(1)) == 1
        time.sleep(0.2)  # the keeper runs the loop meanwhile: a wake would have run
        assert (wakes, asked()) == ([], 4), taken
    assert len(receiver.take_ready(1)) == 1  # half the depth free: ask for it
    deadline = time.monotonic() + 5
    while asked() < 8:
        assert time.monotonic() < deadline, (wakes, asked())
        time.sleep(0.005)
    assert wakes == [0]
    wired.run(receiver.stop())


# ------------------------------------------------- the assembled backend


def test_the_constructor_signature_is_the_reference_one() -> None:
    params = [
        (p.name, None if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(JetStreamMessagingBackend).parameters.values()
    ]
    assert params == [
        ("nats_url", None), ("flow_id", None), ("run_id", None), ("flow_type", None),
        ("prefetch", 4), ("fetch_timeout", 1.0), ("ack_confirm_seconds", 2.0),
        ("keepalive", True), ("connect_timeout", 30.0), ("byte_budget", None),
    ]
    assert (ACK_CONFIRM_SECONDS, FETCH_TIMEOUT_SECONDS) == (2.0, 1.0)


@pytest.fixture
def backends(nats_server: embedded.EmbeddedServer):  # type: ignore[no-untyped-def]
    made: list[JetStreamMessagingBackend] = []

    def make(**options: object) -> JetStreamMessagingBackend:
        options.setdefault("fetch_timeout", 0.5)
        backend = JetStreamMessagingBackend(nats_server.url, FLOW, RUN, BATCH,
                                            **options)  # type: ignore[arg-type]
        backend.start()
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        for backend in made:
            backend.shutdown(hand_back=False)


def data_sub(node: str, consumer: str = "child") -> SubscriptionId:
    return SubscriptionId(consumer, ChannelId(FLOW, RUN, node))


def provisioned(backend: JetStreamMessagingBackend, node: str, ack_wait: float = 30.0,
                max_deliver: int = 5, op: str = "op-1", consumer: str = "child",
                byte_credit: int = 0, credit: int | None = None) -> SubscriptionId:
    sub = data_sub(node, consumer)
    backend.ensure_channel(channel_spec_for(FLOW, RUN, node, BATCH, RELIABLE_WORK,
                                            required=[sub]), "chan")
    backend.ensure_subscription(
        subscription_spec_for(sub, ack_wait, max_deliver,
                              consumer_credit(1, False) if credit is None else credit,
                              byte_credit), op)
    return sub


def send(backend: JetStreamMessagingBackend, node: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        outcome = backend.publish(envelope(node, b"m%d" % i, msg_id=f"{node}-{i}"),
                                  time.monotonic() + 5)
        assert isinstance(outcome, Accepted), outcome


def receive_n(backend: JetStreamMessagingBackend, sub: SubscriptionId, n: int,
              wait: float = 5.0) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        got += backend.receive(sub, n - len(got), 0, min(deadline, time.monotonic() + 1))
    return got


def test_start_capabilities_and_shutdown(backends, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    assert backend.connected
    caps = backend.capabilities()
    assert caps.backend == "jetstream" and caps.durable is True
    assert isinstance(caps.max_payload, Known) and caps.max_payload.value > 0
    assert caps.replicas == Unknown("unread")
    provisioned(backend, "caps")
    caps = backend.capabilities()
    assert (caps.replicas, caps.storage) == (Known(1), Known("file"))
    backend.shutdown()
    assert not backend.connected
    # Shut down: nothing is sent, nothing is claimed.
    late = backend.publish(envelope("caps"), time.monotonic() + 5)
    assert isinstance(late, Rejected) and late.retryable is True
    assert backend.observe_channel(ChannelId(FLOW, RUN, "caps")).reason == "unreachable"  # type: ignore[union-attr]
    assert backend.close([ChannelId(FLOW, RUN, "caps")], "g").complete is False
    assert backend.stop_receiving() == 0
    backend.shutdown()  # idempotent
    with embedded.start(tmp_path / "gone") as server:
        url = server.url
    refused = JetStreamMessagingBackend(url, FLOW, RUN, BATCH, connect_timeout=5.0)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="unreachable"):
        refused.start()
    assert time.monotonic() - started < 5.0
    assert not refused.connected


def test_publish_receive_settle_and_observe_end_to_end(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    spec = channel_spec_for(FLOW, RUN, "e2e", BATCH, RELIABLE_WORK)
    first = backend.ensure_channel(spec, "c-1")
    assert (first.created, first.name, first.mismatches) == (True, "vf-flow-run-e2e", ())
    assert backend.ensure_channel(spec, "c-2").created is False
    sub = data_sub("e2e")
    verified = backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, 5), "s-1")
    assert (verified.created, verified.generation, verified.name) == (
        True, 0, "child--from--e2e")
    assert backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, 5), "s-1") == (
        verified)
    send(backend, "e2e", 3)
    got = receive_n(backend, sub, 3)
    assert [(d.stream_seq, d.data) for d in got] == [(1, b"m0"), (2, b"m1"), (3, b"m2")]
    assert backend.resident_bytes() == 6
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known)
    assert (observed.value.available, observed.value.leased) == (0, 3)
    for i, delivery in enumerate(got):
        assert backend.settle(delivery.token, Completed(), f"done-{i}") == SettleConfirmed()
    assert backend.observe_ack_floor(sub) == Known(3)
    channel = backend.observe_channel(ChannelId(FLOW, RUN, "e2e"))
    assert isinstance(channel, Known) and channel.value.last_seq == 3
    assert channel.value.retention == "interest"
    assert backend.observe_channel(ChannelId(FLOW, RUN, "nothing")) == Unknown(
        "missing", "stream not found")
    assert backend.observe_subscription(data_sub("nothing")).reason == "missing"  # type: ignore[union-attr]


def test_a_replica_count_the_server_cannot_keep_is_incompatible(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    spec = channel_spec_for(FLOW, RUN, "r3", BATCH, RELIABLE_WORK, replicas=3)
    with pytest.raises(IncompatibleProfile, match="replicas"):
        backend.ensure_channel(spec, "c")
    with pytest.raises(IncompatibleProfile, match="only reliable_work and live_latest"):
        backend.ensure_channel(channel_spec_for(FLOW, RUN, "ctl", BATCH, "durable_control"),
                               "c")


def test_a_rebind_raises_the_generation_and_fences_earlier_tokens(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = provisioned(backend, "rebind")
    send(backend, "rebind", 1)
    (held,) = receive_n(backend, sub, 1)
    again = backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, 5), "op-2")
    assert again.generation == 1 and again.created is False
    assert isinstance(backend.settle(held.token, Completed(), "old"), SettleStale)
    assert backend.supersede(held.token) is False


def test_stop_receiving_hands_parked_work_to_a_survivor_at_once(backends) -> None:  # type: ignore[no-untyped-def]
    leaving, survivor = backends(), backends()
    sub = provisioned(leaving, "quiet")
    send(leaving, "quiet", 4)
    (in_hand,) = receive_n(leaving, sub, 1)
    deadline = time.monotonic() + 5
    while leaving.prefetched(sub) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leaving.stop_receiving() == 3  # RUN-030
    assert leaving.stop_receiving() == 0
    provisioned(survivor, "quiet")
    got = receive_n(survivor, sub, 3, wait=5.0)
    assert sorted(d.stream_seq for d in got) == [2, 3, 4]
    assert leaving.settle(in_hand.token, Completed(), "kept") == SettleConfirmed()


def test_shutdown_hands_back_what_was_handed_out(backends) -> None:  # type: ignore[no-untyped-def]
    leaving, survivor = backends(), backends()
    sub = provisioned(leaving, "bye")
    send(leaving, "bye", 1)
    (in_hand,) = receive_n(leaving, sub, 1)
    leaving.shutdown()
    provisioned(survivor, "bye")
    (redelivered,) = receive_n(survivor, sub, 1, wait=5.0)
    assert (redelivered.stream_seq, redelivered.num_delivered) == (1, 2)


def test_leaving_never_waits_out_an_open_pull_request_nor_strands_what_follows(backends) -> None:  # type: ignore[no-untyped-def]
    # A receiver with nothing to read keeps a pull request open for fetch_timeout.
    # Quiesce and shutdown withdraw its inbox instead of waiting for the request to
    # end (which held every node's exit for up to fetch_timeout), and the server then
    # hands nothing to the dropped request: what is published next goes to a
    # survivor at once, not after ack_wait (RUN-030).
    long_fetch = 20.0
    for leave in ("stop_receiving", "shutdown"):
        node = f"idle-{leave.replace('_', '-')}"
        leaving = backends(fetch_timeout=long_fetch)
        sub = provisioned(leaving, node, ack_wait=60.0)
        time.sleep(0.3)  # its pull loop has a request open on the server by now
        started = time.monotonic()
        getattr(leaving, leave)()
        assert time.monotonic() - started < long_fetch / 4, leave
        survivor = backends()
        provisioned(survivor, node, ack_wait=60.0)
        send(survivor, node, 2)
        got = receive_n(survivor, sub, 2, wait=5.0)
        assert sorted(d.stream_seq for d in got) == [1, 2], leave
        assert all(d.num_delivered == 1 for d in got), leave


def test_admission_skips_are_acked_and_reported_off_the_loop(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = data_sub("admit")
    skipped: list[tuple[int, bool]] = []
    assert backend.set_admission(
        sub, lambda d: d.data != b"m1",
        lambda d: skipped.append((d.stream_seq, threading.current_thread().daemon)))
    provisioned(backend, "admit")
    send(backend, "admit", 3)
    got = receive_n(backend, sub, 2)
    assert [d.data for d in got] == [b"m0", b"m2"]
    deadline = time.monotonic() + 5
    while not skipped and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.skipped(sub) == 1
    assert [seq for seq, _ in skipped] == [2]
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.dropped == 1


def test_a_lease_is_kept_alive_while_the_caller_runs_code_of_its_own(backends) -> None:  # type: ignore[no-untyped-def]
    # A node's long call: the caller touches nothing for three ack_waits. The keeper
    # runs the loop meanwhile, so the keepalive renews the lease (ack_wait / 3) and the
    # message is neither redelivered nor its token made stale (MSG-011).
    backend = backends()
    sub = provisioned(backend, "longcall", ack_wait=1.0)
    send(backend, "longcall", 1)
    (delivery,) = receive_n(backend, sub, 1)
    time.sleep(3.0)
    assert backend.settle(delivery.token, Completed(), "done") == SettleConfirmed()
    assert receive_n(backend, sub, 1, wait=1.5) == []


def test_a_waiting_receiver_parks_and_takes_on_its_own_thread(backends) -> None:  # type: ignore[no-untyped-def]
    # No thread hands a delivery over: the caller waiting in receive runs the loop, so
    # the admission filter (which runs where deliveries are parked) runs on it.
    backend = backends()
    sub = provisioned(backend, "inline")
    seen: list[int] = []
    backend.set_admission(sub, lambda delivery: seen.append(threading.get_ident()) or True)
    other = threading.Thread(target=send, args=(backends(), "inline", 1))
    other.start()
    (delivery,) = receive_n(backend, sub, 1)
    other.join(5)
    assert seen == [threading.get_ident()]
    assert backend.settle(delivery.token, Completed(), "done") == SettleConfirmed()


def test_sigterm_while_the_task_waits_in_the_loop_quiesces_it(backends) -> None:  # type: ignore[no-untyped-def]
    # RUN-030 from the worker's SIGTERM handler, landing while the main thread runs the
    # loop inside a receive: the parked deliveries still go back at once.
    backend = backends()
    sub, idle = provisioned(backend, "leaving"), provisioned(backend, "idle")
    send(backend, "leaving", 3)
    deadline = time.monotonic() + 5
    while backend.prefetched(sub) < 3 and time.monotonic() < deadline:
        backend.receive_any([idle], 1, 0, time.monotonic() + 0.05)
    assert backend.prefetched(sub) == 3

    class Quiescing:  # what the handler calls: Task.quiesce
        handed: int | None = None

        def quiesce(self) -> None:
            self.handed = backend.stop_receiving()

    task = Quiescing()
    with _stop_signals(task, sigint_quiesces=False):  # type: ignore[arg-type]
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        assert backend.receive_any([idle], 1, 0, time.monotonic() + 1.5) == []
        timer.join()
    deadline = time.monotonic() + 5
    while task.handed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert task.handed == 3 and backend.prefetched(sub) == 0


def test_max_deliveries_advisory_and_mark_exhausted_count_as_unresolved(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(keepalive=False)
    sub = provisioned(backend, "exhaust", ack_wait=1.0, max_deliver=1)
    send(backend, "exhaust", 1)
    (only,) = receive_n(backend, sub, 1)
    deadline = time.monotonic() + 10
    unresolved = 0
    while time.monotonic() < deadline:  # S11: fires on a later pull after the lapse
        observed = backend.observe_subscription(sub)
        assert isinstance(observed, Known)
        unresolved = observed.value.unresolved
        if unresolved:
            break
        time.sleep(0.2)
    assert unresolved == 1  # MSG-012: never "nothing pending"
    assert not observed.value.nothing_pending
    backend.mark_exhausted(sub, None)
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.unresolved == 2


def test_a_settled_terminal_clears_a_ledger_mark(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = provisioned(backend, "marked")
    send(backend, "marked", 1)
    (delivery,) = receive_n(backend, sub, 1)
    backend.mark_exhausted(sub, delivery.stream_seq)
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.unresolved == 1
    assert backend.settle(delivery.token, Terminal("dlq:1"), "t") == SettleConfirmed()
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.unresolved == 0


def test_the_byte_budget_pauses_the_pull_loops(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(byte_budget=2)
    sub = provisioned(backend, "budget")
    send(backend, "budget", 4)
    deadline = time.monotonic() + 5
    while backend.budget_waits() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.budget_waits() >= 1  # RUN-025
    assert backend.prefetched(sub) < 4
    # Settling frees the budget and the rest flows, never more resident than the
    # budget plus the one message in flight when it filled (RUN-025's tolerance).
    seen: list[int] = []
    deadline = time.monotonic() + 10
    while len(seen) < 4 and time.monotonic() < deadline:
        got = receive_n(backend, sub, 4 - len(seen), wait=0.5)
        assert backend.resident_bytes() <= 2 + 2, backend.resident_bytes()
        for delivery in got:
            assert backend.settle(delivery.token, Completed(), f"b-{delivery.stream_seq}") == (
                SettleConfirmed())
        seen += [d.stream_seq for d in got]
    assert sorted(seen) == [1, 2, 3, 4]


def test_receive_any_gathers_from_several_subscriptions(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    left, right = provisioned(backend, "left"), provisioned(backend, "right")
    started = time.monotonic()
    assert backend.receive_any([left, right], 4, 0, time.monotonic() + 0.3) == []
    assert time.monotonic() - started >= 0.25
    send(backend, "left", 1)
    send(backend, "right", 1)
    got: list[tuple[SubscriptionId, Delivery]] = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        got += backend.receive_any([left, right], 4, 0, time.monotonic() + 1)
    assert sorted(s.channel.node for s, _ in got) == ["left", "right"]


def test_control_stop_and_close_by_ownership(backends, wired: Wired) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    heard = threading.Event()
    backend.subscribe_control(heard.set)
    wired.run(wired.client.publish(control_subject_for(FLOW, RUN), b""))
    assert heard.wait(5)
    config = stream_config_for(FLOW, RUN, "owned", BATCH, generation="g1")
    wired.run(ensure_stream(wired.js, config))
    owned = ChannelId(FLOW, RUN, "owned")
    assert backend.close([owned], "g2").removed == ()
    cleaned = backend.close([owned], "g1")
    assert (cleaned.removed, cleaned.complete) == (("vf-flow-run-owned",), True)
    assert backend.observe_channel(owned) == Unknown("missing", "stream not found")


def test_publish_and_observe_publication_through_the_backend(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    provisioned(backend, "pub")
    sent = envelope("pub", msg_id="only-once")
    assert backend.publish(sent, time.monotonic() + 5) == Accepted(1)
    assert backend.observe_publication(sent) == Accepted(1, duplicate=True)
    assert isinstance(backend.observe_publication(envelope("pub")), PublicationUnresolvable)
    refused = backend.publish(envelope("unprovisioned"), time.monotonic() + 5)
    assert isinstance(refused, Rejected) and refused.retryable is False


def test_an_eos_subscription_binds_this_process_durable_and_sees_the_marker(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    provisioned(backend, "ended")
    eos = SubscriptionId("child", ChannelId(FLOW, RUN, "ended"), kind="eos")
    verified = backend.ensure_subscription(subscription_spec_for(eos, 30.0, 5, 1), "eos")
    assert verified.name == f"child--eos--ended--{backend.instance_id}"
    marker = Envelope(ChannelId(FLOW, RUN, "ended"), "eos", b"EOS", "eos-1")
    assert isinstance(backend.publish(marker, time.monotonic() + 5), Accepted)
    (seen,) = receive_n(backend, eos, 1)
    assert seen.data == b"EOS"
    assert backend.settle(seen.token, Completed(), "eos-ack") == SettleConfirmed()
    # The data durable filters to the data subject and never sees the marker.
    assert backend.receive(data_sub("ended"), 1, 0, time.monotonic() + 0.5) == []


def test_receive_respects_byte_credit_and_loses_nothing(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = provisioned(backend, "bytes")
    send(backend, "bytes", 3)  # 2 bytes each
    deadline = time.monotonic() + 5
    while backend.prefetched(sub) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    first = backend.receive(sub, 3, 3, time.monotonic() + 1)
    assert [d.stream_seq for d in first] == [1]  # a second would pass 3 bytes
    rest = receive_n(backend, sub, 2)
    assert [d.stream_seq for d in rest] == [2, 3]


# ------------------------------------------------- layer 5: pipelined settlement


def consumer_state(wired: Wired, node: str) -> tuple[int, int, int]:
    """(ack floor stream seq, num_ack_pending, num_pending) of node's durable."""
    info = wired.run(wired.js.consumer_info(stream_name_for(FLOW, RUN, node),
                                            "child--from--" + node))
    return info.ack_floor.stream_seq, info.num_ack_pending, info.num_pending


def test_a_confirmed_batch_means_every_ack_in_it_was_applied(wired: Wired) -> None:
    # The soundness of confirming a run of plain +ACKs by the reply to the request
    # after them (jetstream.delivery_leases): the moment settle_batch returns, the server must
    # hold every one of them as acknowledged — checked with nothing else in between,
    # on batches as large as a prefetch gets, several times over.
    batch_channel(wired, "pipelined", max_ack_pending=200)
    receiver = bound(wired, "pipelined", prefetch=200)
    settled = 0
    for round_no in range(5):
        publish(wired, "pipelined", 200)
        got: list[Delivery] = []
        deadline = time.monotonic() + 10
        while len(got) < 200 and time.monotonic() < deadline:
            got += take(wired, receiver, credit=200 - len(got))
        assert len(got) == 200
        results = wired.run(receiver.leases.settle_batch(
            [(d.token, Completed(), f"r{round_no}-{d.stream_seq}") for d in got]))
        assert results == [SettleConfirmed()] * 200
        settled += 200
        assert consumer_state(wired, "pipelined") == (settled, 0, 0)
    wired.run(receiver.stop())


def test_a_batch_keeps_each_settlement_s_own_result_and_outcome(wired: Wired) -> None:
    batch_channel(wired, "mixed")
    publish(wired, "mixed", 5)
    receiver = bound(wired, "mixed", prefetch=5)
    got = take(wired, receiver, credit=5)
    assert len(got) == 5
    stale = got[1].token
    assert receiver.leases.supersede(stale)  # retired locally: must not be sent
    results = wired.run(receiver.leases.settle_batch([
        (got[0].token, Completed(), "a"),
        (stale, Completed(), "b"),
        (got[2].token, Retry(0.0), "c"),
        (got[3].token, Terminal("dlq:mixed-4"), "d"),
        (got[4].token, Completed(), "e"),
    ]))
    assert [type(r) for r in results] == [SettleConfirmed, SettleStale, SettleConfirmed,
                                          SettleConfirmed, SettleConfirmed]
    # The retried one comes back as attempt 2; the superseded one was never settled,
    # so it comes back once its lease lapses, not now; the terminated one never.
    (again,) = take(wired, receiver)
    assert (again.stream_seq, again.num_delivered) == (got[2].stream_seq, 2)
    assert wired.run(receiver.leases.settle(again.token, Completed(), "f")) == SettleConfirmed()
    # A repeated settlement id of a settled token gives its first result, sending nothing.
    assert wired.run(receiver.leases.settle_batch([(got[0].token, Completed(), "a")])) == [
        SettleConfirmed()]
    floor, ack_pending, pending = consumer_state(wired, "mixed")
    assert (floor, ack_pending, pending) == (1, 1, 0)  # seq 2 still leased to nobody
    wired.run(receiver.stop())


def test_a_batch_to_a_vanished_durable_is_unknown_even_for_its_plain_acks(wired: Wired) -> None:
    # Negative control for the run rule: the +ACKs before the request are silently
    # lost when the durable is gone (S14), and only the request's no-responders reply
    # says so -- every settlement of the run must be unknown, none confirmed.
    stream, _ = batch_channel(wired, "vanished")
    publish(wired, "vanished", 4)
    receiver = bound(wired, "vanished", prefetch=4)
    got = take(wired, receiver, credit=4)
    assert len(got) == 4
    wired.run(receiver.stop())
    wired.run(wired.js.delete_consumer(stream, "child--from--vanished"))
    results = wired.run(receiver.leases.settle_batch(
        [(d.token, Completed(), f"v-{d.stream_seq}") for d in got]))
    assert all(isinstance(r, SettleUnknown) and "durable is gone" in r.reason
               for r in results), results
    assert all(receiver.leases.live(d.token) for d in got)  # PAY-004: nothing released


def test_a_batch_to_a_frozen_server_is_unknown_and_asks_again_after(
    wired: Wired, nats_server: embedded.EmbeddedServer, freeze
) -> None:
    batch_channel(wired, "frozen-batch")
    publish(wired, "frozen-batch", 3)
    receiver = bound(wired, "frozen-batch", prefetch=3, ack_confirm=0.5)
    got = take(wired, receiver, credit=3)
    assert len(got) == 3
    items = [(d.token, Completed(), f"f-{d.stream_seq}") for d in got]
    with freeze(nats_server):  # only this test's own server
        frozen = wired.run(receiver.leases.settle_batch(items))
    assert all(isinstance(r, SettleUnknown) for r in frozen), frozen
    assert wired.run(receiver.leases.settle_batch(items)) == [SettleConfirmed()] * 3
    assert consumer_state(wired, "frozen-batch") == (3, 0, 0)
    wired.run(receiver.stop())


def test_settle_async_from_many_threads_confirms_every_delivery(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(prefetch=120)
    sub = provisioned(backend, "async", credit=120)
    send(backend, "async", 120)
    got = receive_n(backend, sub, 120)
    assert len(got) == 120

    def settle_share(share: list[Delivery]) -> list[SettleResult]:
        futures = [backend.settle_async(d.token, Completed(), f"a-{d.stream_seq}")
                   for d in share]
        return [f.result(timeout=10) for f in futures]

    with ThreadPoolExecutor(4) as pool:
        results = [r for part in pool.map(settle_share, [got[i::4] for i in range(4)])
                   for r in part]
    assert results == [SettleConfirmed()] * 120
    assert backend.observe_ack_floor(sub) == Known(120)
    repeated = backend.settle_many([(got[0].token, Completed(), "a-1"),
                                    (got[1].token, Completed(), "other-id")])
    assert repeated[0] == SettleConfirmed() and isinstance(repeated[1], SettleStale)
    with pytest.raises(TypeError, match="not a settle outcome"):
        backend.settle_async(got[0].token, "done", "x")  # type: ignore[arg-type]


def test_settlements_queued_at_shutdown_resolve_unknown_never_hang(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(prefetch=8)
    sub = provisioned(backend, "late-settle", credit=8)
    send(backend, "late-settle", 8)
    got = receive_n(backend, sub, 8)
    assert len(got) == 8
    futures = [backend.settle_async(d.token, Completed(), f"l-{d.stream_seq}") for d in got]
    backend.shutdown(hand_back=False)
    results = [f.result(timeout=10) for f in futures]
    # Each is either confirmed (it went out before the close) or unknown -- never stale,
    # never missing, never an exception.
    assert all(isinstance(r, (SettleConfirmed, SettleUnknown)) for r in results), results
    late = backend.settle_async(got[0].token, Completed(), "after")
    assert isinstance(late.result(timeout=1), SettleStale)


def test_pipelined_publications_keep_their_order_and_each_its_own_outcome(backends) -> None:  # type: ignore[no-untyped-def]
    # The faults of nats-py's publish_async (S1: a refusal never resolves its future;
    # S2: no timeout) must not come back through publish_async here: on a stream that
    # fills up midway, each publication gets its own Accepted or Rejected, in order.
    backend = backends()
    spec = channel_spec_for(FLOW, RUN, "pipe", BATCH, RELIABLE_WORK, required=[data_sub("pipe")],
                            batch_max_msgs=150)
    backend.ensure_channel(spec, "chan")
    backend.ensure_subscription(subscription_spec_for(data_sub("pipe"), 30.0, 5, 5), "op")
    deadline = time.monotonic() + 10
    futures = [backend.publish_async(envelope("pipe", b"m%d" % i, msg_id=f"pipe-{i}"), deadline)
               for i in range(200)]
    outcomes = [f.result(timeout=15) for f in futures]
    accepted = [o for o in outcomes if isinstance(o, Accepted)]
    assert [o.stream_seq for o in accepted] == list(range(1, 151))  # in submission order
    assert outcomes[:150] == accepted
    assert all(isinstance(o, Rejected) and o.retryable and "10077" in o.reason
               for o in outcomes[150:]), outcomes[150:]
    # A msg_id sent again inside the duplicate window is the duplicate of its original.
    again = backend.publish_async(envelope("pipe", b"m3", msg_id="pipe-3"), deadline)
    assert again.result(timeout=5) == Accepted(stream_seq=4, duplicate=True)
    # A passed deadline sends nothing.
    late = backend.publish_async(envelope("pipe", b"late", msg_id="late"), time.monotonic())
    assert isinstance(late.result(timeout=5), Rejected) and late.result().retryable
    nowhere = backend.publish_async(envelope("nobody"), deadline).result(timeout=5)
    assert isinstance(nowhere, Rejected) and not nowhere.retryable  # MSG-013


def test_pipelined_publications_to_a_frozen_server_are_unknown_then_observed(
    backends, nats_server: embedded.EmbeddedServer, freeze  # type: ignore[no-untyped-def]
) -> None:
    backend = backends()
    provisioned(backend, "frozen-pub")
    sent = [envelope("frozen-pub", b"f%d" % i, msg_id=f"frozen-pub-{i}") for i in range(5)]
    with freeze(nats_server):  # only this test's own server
        deadline = time.monotonic() + 0.5
        outcomes = [f.result(timeout=5) for f in
                    [backend.publish_async(env, deadline) for env in sent]]
    assert all(isinstance(o, PublicationUnknown) for o in outcomes), outcomes  # MSG-014
    observed = [backend.observe_publication(env) for env in sent]
    # S3: the frozen server stored them once it resumed; each re-publish is a duplicate.
    assert observed == [Accepted(stream_seq=i + 1, duplicate=True) for i in range(5)]


def test_a_durable_deleted_under_a_running_pull_loop_is_refused_without_a_spin(
    wired: Wired,
) -> None:
    # S14: with the durable gone every pull request is refused at once (503 no
    # responders); the loop must keep the refusal for observation and ask again a
    # fetch later, not hammer the server.
    stream, _ = batch_channel(wired, "deleted")
    receiver = bound(wired, "deleted")  # fetch_timeout 0.5
    wired.run(wired.js.delete_consumer(stream, "child--from--deleted"))
    time.sleep(1.6)
    refusals = receiver.refusals
    assert 1 <= refusals <= 5, refusals  # about one per fetch_timeout, not thousands
    assert isinstance(receiver.last_error, PullRefused)
    assert receiver.receiving  # it keeps trying: the durable may be provisioned again
    wired.run(receiver.stop())


def test_the_publication_ladder_resolves_a_receipt_lost_to_a_frozen_server(
    backends, nats_server: embedded.EmbeddedServer, freeze  # type: ignore[no-untyped-def]
) -> None:
    backend = backends()
    provisioned(backend, "ladder")
    sent = envelope("ladder", b"x", msg_id="ladder-1")
    result: list[Published] = []
    with freeze(nats_server):  # only this test's own server
        worker = threading.Thread(target=lambda: result.append(publish_until_known(
            backend, sent, BATCH, time.monotonic() + 20, attempt_seconds=0.5)))
        worker.start()
        time.sleep(1.0)  # the first attempt's receipt is lost: unknown, then observed
    worker.join(20)
    (published,) = result
    # S3: the frozen server stored it once it resumed; the observation says so.
    assert published.outcome == Accepted(stream_seq=1, duplicate=True), published
    assert published.attempts >= 2 and published.stat == "duplicate"
    channel = backend.observe_channel(ChannelId(FLOW, RUN, "ladder"))
    assert isinstance(channel, Known) and channel.value.messages == 1


def test_dead_letters_land_in_the_flow_scoped_stream_on_the_node_s_subject(
    backends, wired: Wired  # type: ignore[no-untyped-def]
) -> None:
    backend = backends()
    sub = provisioned(backend, "dl-source")
    send(backend, "dl-source", 1)
    (delivery,) = receive_n(backend, sub, 1)
    backend.ensure_dead_letters("dlq")
    record = dead_letter_for(FLOW, RUN, "child", "dl-source", delivery.stream_seq,
                             delivery.num_delivered, "poison", delivery.data,
                             ValueError("bad"), time.time())
    done = dead_letter(backend, delivery.token, record, time.monotonic() + 5)
    assert isinstance(done.published.outcome, Accepted) and done.settled == SettleConfirmed()
    stored = wired.run(wired.js.get_msg(dlq_stream_name(FLOW), done.published.outcome.stream_seq))
    assert stored.subject == dlq_subject_for(FLOW, RUN, "child")
    assert decode_dead_letter(stored.data) == record
    info = wired.run(wired.js.stream_info(dlq_stream_name(FLOW)))
    assert (info.config.retention, info.config.max_age) == ("limits", 7 * 24 * 3600.0)
    # Teardown of the run never takes the flow's dead letters with it (STREAM-8).
    backend.close([ChannelId(FLOW, RUN, "dl-source")], "any")
    assert wired.run(wired.js.stream_info(dlq_stream_name(FLOW))).state.messages == 1
