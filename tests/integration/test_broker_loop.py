"""The loop the JetStream adapter runs nats-py on (videoflow.broker.loop) against a real
nats-server (conftest's fixture chain): LoopRunner on the waiting thread and its keeper,
the fail-fast connect, registered, bounded reads. Never a mock broker."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from jetstream_helpers import (
    Wired,
)
from nats.aio.msg import Msg

from videoflow.broker import loop as jetstream_loop
from videoflow.broker import server as embedded
from videoflow.broker.loop import (
    KEEP_SECONDS,
    READ_CHUNK_BYTES,
    ErrorLog,
    Handoff,
    LoopRunner,
    LoopWake,
    bound_reads,
    close_client,
    connect_fail_fast,
    registered,
)
from videoflow.errors import BrokerUnavailable

pytestmark = pytest.mark.timeout(60)


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



def test_a_wake_holds_writes_over_each_drain_and_releases_them_when_a_drain_fails(
    runner: LoopRunner, caplog: pytest.LogCaptureFixture,
) -> None:
    # A connection holds its socket writes while the handoffs drain (one write for all
    # they sent); a drain that raises must not leave them held for good.
    calls: list[object] = []
    wake = LoopWake(runner, hold=lambda: calls.append("hold"),
                    release=lambda: calls.append("release"))

    def broken(items: list[int]) -> None:
        calls.append(("broken", items))
        raise RuntimeError("a bug in a drain")

    first: Handoff[int] = Handoff(wake, lambda items: calls.append(("first", items)),
                                  lambda *_: None)
    second: Handoff[int] = Handoff(wake, broken, lambda *_: None)
    first.put(1)
    runner.turn()
    assert calls == ["hold", ("first", [1]), "release"]
    calls.clear()
    first.put(2)
    second.put(3)
    with caplog.at_level(logging.ERROR):
        runner.turn()
    assert calls == ["hold", ("first", [2]), ("broken", [3]), "release"]
    assert "a bug in a drain" in caplog.text  # the loop's handler reported it



def test_each_wait_ends_at_its_own_deadline_whichever_came_first(runner: LoopRunner) -> None:
    # One timer serves every wait whose deadline is at or after it: a wait with a
    # later deadline than the armed timer must not end at the timer, and one with an
    # earlier deadline must not wait for it.
    def never() -> bool:
        return False

    def waited(seconds: float) -> float:
        started = time.monotonic()
        runner.wait_until(never, started + seconds, time.sleep)
        return time.monotonic() - started

    assert 0.05 <= waited(0.05) < 0.5
    assert 0.3 <= waited(0.3) < 0.8   # later than the timer armed for the first
    finished = threading.Event()

    def finish() -> None:
        finished.set()
        runner.poke()

    early = threading.Thread(target=runner.wait_until,
                             args=(finished.is_set, time.monotonic() + 5.0, time.sleep))
    early.start()  # arms a timer 5 s out, and is done long before it
    time.sleep(0.1)
    runner.call_soon(finish)
    early.join(2.0)
    assert not early.is_alive()
    assert 0.02 <= waited(0.02) < 0.5  # earlier than the armed timer: its own
    finished.clear()
    early = threading.Thread(target=runner.wait_until,
                             args=(finished.is_set, time.monotonic() + 0.2, time.sleep))
    early.start()  # arms a timer 0.2 s out, done before it
    time.sleep(0.05)
    runner.call_soon(finish)
    early.join(2.0)
    # That timer fires during this wait, which goes on to its own deadline.
    assert 0.5 <= waited(0.5) < 1.0



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

