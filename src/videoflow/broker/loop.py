"""The JetStream adapter's own event loop: a runner that runs it on whichever thread
waits on it (a keeper thread when none does), the handoffs that carry work onto it,
and the fail-fast connect.

Every MessagingBackend method is synchronous (videoflow.backends.messaging), while
nats-py is asyncio only, so the adapter keeps one loop of its own and runs each broker
call on it with a bound; nothing here knows about streams, deliveries or outcomes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, Generic, TypeVar

from nats.aio.client import Client

from videoflow.broker.failures import describe
from videoflow.broker.link import Outage, connect
from videoflow.broker.options import connect_options_for
from videoflow.errors import BrokerUnavailable

T = TypeVar("T")

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_SECONDS: Final = 5.0
"""How long a clean close (drain of pending publishes included) is given."""

_ERRORS_KEPT: Final = 64
"""error_cb reports remembered; older ones are forgotten so a flapping link cannot
grow the list without bound."""


KEEP_SECONDS: Final = 0.02
"""How long the loop may go unrun before the keeper thread runs it. A caller that
waits on the loop runs it itself; between waits (a node's own code) the loop rests,
and past this the keeper takes it over, so timers, heartbeats and lease renewals
never wait longer than this for a long-running node."""

COALESCE_SECONDS: Final = 0.002
"""A caller that comes back within this lets its handed-over work wait for its next
turn (LoopRunner.turn's unless_within), for one write per batch of them: a sender that
comes back at least that often adds under twice this to its messages' latency, and
one that then stops, twice this (the keeper's backstop). On the producer bench (5,000
outputs) 0.5 ms gave 8,700-11,800 msg/s and 2 ms 14,400-14,900; a sender slower than
one message per COALESCE_SECONDS has each sent at once."""

BURST_GAP_SECONDS: Final = 0.0004
"""A caller that hands work over and comes back sooner than this on average (above
2,500 times a second) is in a burst, and its work is coalesced (COALESCE_SECONDS); one
that comes back later has it sent at once (Pacing). Coalesced, a source paced at 1,000
small messages a second had each wait for the next one's turn: its hop's p50 was
1.8-2.2 ms against 0.8-1.1 ms for the hop after it."""

READ_CHUNK_BYTES: Final = 64 * 1024
"""The most one read of the connection's socket takes. asyncio reads up to 256 KiB at a
time into a fresh bytes object, which glibc maps with mmap (above its 128 KiB
threshold) and, shrunk to what arrived, keeps mapped: three system calls and a page
fault per read (a paced producer's keeper thread made 445 of each in 4 s). From the
heap instead: 4-7% less CPU per message in each stage of a linear flow at 700 msg/s.
A large message takes a few more reads."""

_TURN_PASSES: Final = 8
"""At most this many loop passes in one turn: handing work over takes a few (the
drain, the task it starts, nats-py's flusher), and a turn never blocks."""


class Pacing:
    """Whether a caller that hands work over between stretches of its own (a producer
    between next() calls) is in a burst: away from the loop for less than
    BURST_GAP_SECONDS between two calls, on a moving average of about the last eight,
    each stretch counted up to 4 * BURST_GAP_SECONDS (back from a long pause, a fast
    caller is in a burst again within a dozen calls; one stretch held up by a full
    window of publications leaves it in one).

    Its stretches are timed from the end of one turn to the start of the next, or from
    the last time the loop rested if it ran in between (a publication that waited for
    room in its window ran it): the caller's own time, not the loop's. Counted in, a
    fast producer whose turns went out at once was slowed by them past the gap, and
    then turned at once for good (twice its CPU per message); and a producer whose
    window filled every few outputs was taken for a paced one (a fifth of its rate).
    """

    def __init__(self) -> None:
        self._left_at: float | None = None  # monotonic: the caller's last turn ended
        self._away = 4 * BURST_GAP_SECONDS

    def back(self, now: float, rested_since: float = 0.0) -> bool:
        """The caller is back at now (monotonic).

        Arguments:
            rested_since: when the loop last stopped running (LoopRunner.rested_since).

        Returns:
            whether it is in a burst.
        """
        if self._left_at is not None:
            stretch = min(now - max(self._left_at, rested_since), 4 * BURST_GAP_SECONDS)
            self._away += (stretch - self._away) / 8
        return self._away < BURST_GAP_SECONDS

    def left(self, now: float) -> None:
        """The caller's turn ended at now (monotonic): it is away from here on."""
        self._left_at = now


class LoopRunner:
    """One asyncio loop, run by whichever thread waits on it, with a keeper thread
    that runs it whenever no caller has for KEEP_SECONDS.

    A caller that waits (run, wait_until, a Receipt made with this runner) runs the
    loop on its own thread until what it waits for is done, so the I/O it waits on is
    read, handled and answered on one thread: handing each message between two
    threads cost two thread wake-ups a hop, which on a loaded 2-core host were most
    of a node's latency and much of its CPU. Only one thread runs the loop at a time;
    a second caller waits on its own signal while the first runs it, and takes over
    when it is done. The keeper gives the loop back to a waiting caller at once.

    Arguments:
        name: the keeper thread's name (shows up in thread dumps).
    """

    def __init__(self, name: str = "videoflow-jetstream-loop") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keeper: threading.Thread | None = None
        self._state = threading.Condition(threading.Lock())
        self._driver: int | None = None  # the thread running the loop now
        self._keeper_id: int | None = None
        self._rested_since = 0.0  # when the loop was last let go (monotonic)
        self._kicked = False  # the keeper should run the loop now
        self._flush_due = 0.0  # a coalesced turn's latest send time (monotonic; 0: none)
        self._handed = False  # call_soon left work for the next run of the loop
        self._closing = False
        self._until: Callable[[], bool] | None = None  # what the driver waits for
        self._until_deadline: float | None = None  # and until when (monotonic)
        self._stop_timer: asyncio.TimerHandle | None = None  # stops it then (_arm)
        self._stop_at: float | None = None  # when that timer fires

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop.

        Raises:
            BrokerUnavailable: before start or after stop.
        """
        if self._loop is None:
            raise BrokerUnavailable("the JetStream backend's loop is not running")
        return self._loop

    @property
    def running(self) -> bool:
        return self._loop is not None

    def start(self) -> None:
        """Make a fresh loop and start its keeper thread. Idempotent."""
        if self._loop is not None:
            return
        self._loop = asyncio.new_event_loop()
        self._stop_timer, self._stop_at = None, None  # an old loop's timer is gone with it
        self._closing, self._rested_since = False, time.monotonic()
        keeper = threading.Thread(target=self._keep, args=(self._loop,), name=self.name,
                                  daemon=True)
        keeper.start()
        self._keeper = keeper

    @property
    def rested_since(self) -> float:
        """When a thread last stopped running the loop (monotonic)."""
        return self._rested_since

    def in_loop_thread(self) -> bool:
        """Whether the caller is running the loop right now (inside a callback of it,
        where waiting on the loop would deadlock)."""
        return self._driver is not None and self._driver == threading.get_ident()

    # ------------------------------------------------------------------ who runs it

    def _keep(self, loop: asyncio.AbstractEventLoop) -> None:
        """The keeper: run the loop whenever it has rested for KEEP_SECONDS (or at a
        kick), until a caller asks for it back; run one turn for a coalesced turn
        nobody came back for by its flush time; end at stop."""
        self._keeper_id = me = threading.get_ident()
        state = self._state
        while True:
            flush = False
            with state:
                while not self._closing:
                    if self._driver is None:
                        now = time.monotonic()
                        rest = self._rested_since + KEEP_SECONDS - now
                        if self._kicked or rest <= 0:
                            break
                        if self._flush_due:
                            flush = self._flush_due <= now
                            if flush:
                                break
                            rest = min(rest, self._flush_due - now)
                    else:
                        rest = KEEP_SECONDS  # looked at again, unnotified: see _let_go
                    state.wait(rest)
                if self._closing:
                    return
                self._driver, self._kicked = me, False
            try:
                if flush:
                    self._passes(loop)  # send it, and let go: the caller is still busy
                else:
                    loop.run_forever()  # until a caller reclaims it (_take) or stop
            finally:
                with state:
                    self._driver, self._rested_since = None, time.monotonic()
                    self._flush_due, self._handed = 0.0, False
                    state.notify_all()

    def _take(self) -> bool:
        """Become the thread running the loop: at once when nobody runs it, after the
        keeper hands it back when the keeper does. False when another caller runs it,
        or this thread runs a loop already (this one: no nesting; another one, say a
        caller that is itself a coroutine: two loops cannot run on one thread), or the
        loop is stopped."""
        me, state, loop = threading.get_ident(), self._state, self._loop
        if loop is None or asyncio._get_running_loop() is not None:
            return False
        with state:
            while True:
                driver = self._driver
                if driver is None:
                    self._driver = me
                    return True
                if driver != self._keeper_id or self._closing:
                    return False
                # The keeper runs it: ask for it back, and wait for its release.
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    loop.call_soon_threadsafe(loop.stop)
                state.wait(KEEP_SECONDS)

    def _kick(self) -> None:
        with self._state:
            if self._driver is None and not self._kicked:
                self._kicked = True
                self._state.notify_all()

    def _let_go(self) -> None:
        # Nobody is notified: the keeper looks on its own every KEEP_SECONDS, and a
        # wake-up per wait is the very cost this class avoids. Whatever a coalesced
        # turn left has just gone out with this run.
        with self._state:
            self._driver, self._rested_since = None, time.monotonic()
            self._flush_due, self._handed = 0.0, False

    def _drive(self, done: Callable[[], bool], deadline: float | None) -> None:
        """Run the loop on this thread (holding it) until done() or the deadline."""
        loop = self.loop
        self._until, self._until_deadline = done, deadline
        if deadline is not None and (self._stop_at is None or deadline < self._stop_at):
            self._arm(loop, deadline)
        try:
            while not done() and (deadline is None or time.monotonic() < deadline):
                loop.run_forever()  # stopped by poke, the deadline timer, or a reclaim
        finally:
            self._until, self._until_deadline = None, None

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """Have the loop stopped at `at` (monotonic) for a driver waiting until then.

        One timer serves every wait whose deadline is at or after it, left armed
        when a wait ends: a receive waits with a deadline each time, and a timer
        made and cancelled per message churned the loop's schedule (at 1 kHz, heap
        comparisons were a fifth of the loop's own calls). When it fires for a
        driver whose deadline is later, it is armed again for that one."""
        if self._stop_timer is not None:
            self._stop_timer.cancel()
        self._stop_at = at
        self._stop_timer = loop.call_at(at, self._deadline_due)

    def _deadline_due(self) -> None:
        due, self._stop_at, self._stop_timer = self._stop_at, None, None
        deadline = self._until_deadline
        if deadline is None or due is None or self._loop is None:
            return  # nobody waits with a deadline now
        if deadline <= due:
            self._loop.stop()
        else:
            self._arm(self._loop, deadline)

    def poke(self) -> None:
        """Tell the thread running the loop for a caller that what it waits for may be
        done (called wherever an answer is set; cheap when nobody waits)."""
        until, loop = self._until, self._loop
        if until is None or loop is None or not until():
            return
        if self._driver == threading.get_ident():
            loop.stop()
        else:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(loop.stop)

    # ------------------------------------------------------------------ waiting

    def wait_until(self, done: Callable[[], bool], deadline: float | None,
                   block: Callable[[float], Any]) -> None:
        """Return once done() or at the monotonic deadline (None: no deadline), running
        the loop on this thread meanwhile whenever no other thread does.

        Arguments:
            done: whether the wait is over; looked at on this thread and, while this
                thread runs the loop, by poke.
            deadline: when to give up (the caller sees done() still False).
            block: waits up to the given seconds on a thread-safe signal of done
                (used while another thread runs the loop).
        """
        while not done():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            if self._take():
                try:
                    self._drive(done, deadline)
                finally:
                    self._let_go()
            else:
                self._kick()  # this thread cannot run it: the keeper should, now
                block(KEEP_SECONDS if remaining is None else min(remaining, KEEP_SECONDS))

    def turn(self, unless_within: float = 0.0) -> None:
        """Run what the loop has ready, on this thread, without blocking: what was
        handed over goes out and what has arrived is read. A loop the keeper runs is
        taken back first: left with the keeper, every handoff would wake it, the very
        cost this class avoids. Nothing when another caller runs the loop (it does
        that work itself).

        Arguments:
            unless_within: do nothing when the loop last rested less than this many
                seconds ago. A caller that turns after every message (a fast
                producer) so sends one write per batch of them: a socket write costs
                a wake-up of the server's thread, tens of times a message's own cost.
        """
        loop = self._loop
        if loop is None:
            return
        if unless_within:
            rested = self._rested_since
            if time.monotonic() - rested < unless_within:
                if self._handed and not self._flush_due:
                    # Should the caller not come back (a burst's last message, then a
                    # long next()), the keeper sends it, against KEEP_SECONDS of delay.
                    # Not at the window's end but a window later: a caller that comes
                    # back at least once per window is then always back first and
                    # sends it itself. At the window's end, the keeper sent every
                    # write of a paced producer, and the two threads traded the
                    # interpreter for each (a tenth of its CPU at 700 msg/s).
                    with self._state:
                        if not self._flush_due and self._driver is None:
                            self._flush_due = rested + 2 * unless_within
                            self._state.notify_all()
                return
        if not self._take():
            return
        try:
            self._passes(loop)
        finally:
            self._let_go()

    @staticmethod
    def _passes(loop: asyncio.AbstractEventLoop) -> None:
        """Run the loop's ready callbacks, and what they make ready, without blocking
        (at most _TURN_PASSES passes)."""
        # BaseEventLoop keeps its ready callbacks in _ready; without it (another loop
        # implementation) every pass is run.
        ready = getattr(loop, "_ready", None)
        for _ in range(_TURN_PASSES):
            loop.call_soon(loop.stop)
            loop.run_forever()
            if ready is not None and not ready:
                break

    def call_soon(self, callback: Callable[[], Any]) -> None:
        """Have callback run on the loop: now-ish when a thread runs it (woken when
        that is another thread), else by the next thread that does. Safe from any
        thread.

        Raises:
            BrokerUnavailable: the loop is not running.
        """
        loop = self.loop
        with self._state:
            if self._driver is None or self._driver == threading.get_ident():
                # Nobody is blocked in the loop's select: no wake-up to write. Under
                # the lock, so the keeper cannot start running it in between.
                loop.call_soon(callback)
                self._handed = True
                return
        loop.call_soon_threadsafe(callback)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run coro on the loop and wait for its result, running the loop on the
        caller's thread when no other thread does.

        Arguments:
            coro: the coroutine; it is closed unrun when the loop is not running.
            timeout: seconds to wait for the result (> 0). On expiry the coroutine is
                cancelled — whatever it had already sent stays sent, which is why
                callers map a runner timeout to an unknown outcome, never a refusal.

        Returns:
            what coro returned; an exception it raised is raised here unchanged.

        Raises:
            BrokerUnavailable: the loop is not running.
            TimeoutError: no result within timeout.
            RuntimeError: called from inside the loop (it would deadlock).
        """
        if self._loop is None:
            coro.close()
            raise BrokerUnavailable("the JetStream backend's loop is not running")
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("LoopRunner.run called on its own loop thread")
        given_up: list[bool] = []
        future = asyncio.run_coroutine_threadsafe(_heeded(coro, given_up), self._loop)
        future.add_done_callback(lambda _: self.poke())
        self.wait_until(future.done, time.monotonic() + max(timeout, 0.0),
                        lambda seconds: concurrent.futures.wait((future,), seconds))
        if not future.done():
            given_up.append(True)
            future.cancel()
            raise TimeoutError(f"no result from the backend's loop within {timeout:.3f}s")
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise TimeoutError("the backend's loop cancelled the call") from None

    def stop(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Cancel whatever still runs on the loop, stop the keeper and close the loop.
        Idempotent."""
        loop, keeper = self._loop, self._keeper
        if loop is None or keeper is None:
            return

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_rest(), timeout)
        self._loop, self._keeper = None, None
        with self._state:
            self._closing = True
            self._state.notify_all()
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        keeper.join(timeout)
        if not loop.is_running():
            loop.close()


class LoopWake:
    """One wake-up of the loop shared by several Handoffs: a task that publishes an
    output and then settles an input wakes the loop once for both, and both go out
    on the one write that follows (a wake-up and a socket write each were a fifth
    of a processor's time).

    Arguments:
        runner: the loop the handoffs drain on.
        hold / release: called before and after each drain: a connection holds its
            socket writes for one write of everything the drain sent
            (broker.client.FastHeadersClient.hold_writes).
    """

    def __init__(self, runner: LoopRunner, hold: Callable[[], None] | None = None,
                 release: Callable[[], None] | None = None) -> None:
        self._runner = runner
        self._hold, self._release = hold, release
        self._lock = threading.Lock()
        self._scheduled = False
        self._handoffs: list[Handoff[Any]] = []

    def register(self, handoff: Handoff[Any]) -> None:
        """Drain handoff on every wake-up, after those registered before it."""
        self._handoffs.append(handoff)

    def ring(self) -> None:
        """Have every handoff drained on the loop soon (once, however many ring): at
        once when a thread runs the loop, else by the next thread that does — the
        caller's own next wait or turn, or the keeper (LoopRunner.call_soon).

        Raises:
            BrokerUnavailable / RuntimeError: there is no running loop to wake.
        """
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._runner.call_soon(self._drain)
        except BaseException:
            with self._lock:
                self._scheduled = False
            raise

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False  # a put after this rings again: nothing is missed
        if self._hold is not None:
            self._hold()
        try:
            for handoff in self._handoffs:  # in the order they were made
                handoff.take()
        finally:
            if self._release is not None:
                self._release()


class Handoff(Generic[T]):
    """Work handed from callers' threads to the loop in bursts.

    A caller puts an item and returns; the loop is woken only when it is not woken
    already (the wake, shared with other handoffs), and its drain takes everything
    queued by then — so a burst of calls costs one wake-up and one pass, not one hop
    each, which is what lets settlements and publications be pipelined.

    Arguments:
        wake: the loop's wake-up this handoff drains on.
        drain: called on the loop with every item queued since the last drain.
        fail: called (on any thread) with items that cannot reach the loop, and why;
            it must resolve whatever their callers wait on.
    """

    def __init__(self, wake: LoopWake, drain: Callable[[list[T]], None],
                 fail: Callable[[list[T], str], None]) -> None:
        self._wake, self._drain, self._fail = wake, drain, fail
        self._lock = threading.Lock()
        self._items: list[T] = []
        wake.register(self)

    def put(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
        try:
            self._wake.ring()
        except (BrokerUnavailable, RuntimeError) as error:  # no loop, or a closed one
            self.fail_all(f"the backend's loop is not running: {error}")

    def take(self) -> None:
        """On the loop: drain what is queued."""
        with self._lock:
            items, self._items = self._items, []
        if items:
            self._drain(items)

    def fail_all(self, reason: str) -> None:
        """Hand everything still queued to fail (after the loop stopped, say)."""
        with self._lock:
            items, self._items = self._items, []
        if items:
            self._fail(items, reason)


class ErrorLog:
    """What a connection's error_cb reported, newest last — the only place a refused
    connect, a permissions violation (NATS_FACTS S15) or a publish_async API error (S1)
    shows up at all."""

    def __init__(self) -> None:
        self.reports: list[BaseException] = []

    async def record(self, error: BaseException) -> None:
        """The error_cb itself (nats-py requires a coroutine function)."""
        self.reports.append(error)
        del self.reports[:-_ERRORS_KEPT]

    def texts(self) -> list[str]:
        return [describe(e) for e in self.reports]


async def _heeded(coro: Coroutine[Any, Any, T], given_up: list[bool]) -> T:
    """coro's result. What it raises after its caller gave up on it (LoopRunner.run's
    timeout, already reported as such) is logged at debug and the call ends cancelled,
    as its caller asked: left as it was, asyncio would print "Task exception was never
    retrieved" and a traceback when the task is collected, since the cancelled call's
    future never reads it."""
    try:
        return await coro
    except Exception as error:
        if not given_up:
            raise
        logger.debug("a call given up on ended later: %r", error)
        raise asyncio.CancelledError from error


async def connect_fail_fast(url: str, connect_timeout: float, errors: ErrorLog,
                            outage: Outage | None = None) -> Client:
    """Connect, failing fast, with error_cb recording into errors; once connected, the
    client rides out broker outages within outage's budget (broker.link.connect).

    Arguments:
        url: the server, or several comma-separated (a cluster's seeds).
        connect_timeout: the overall bound of the first connect, in seconds (> 0).
        errors: receives every error_cb report.
        outage: the connection's outage record and budget; None: the default budget,
            unrecorded.

    Returns:
        a connected client, its socket reads bounded (bound_reads).

    Raises:
        BrokerUnavailable: refused (NoServersError), hung handshake (a bare
            asyncio.TimeoutError, S20), the bound elapsed, or credentials refused; the
            message carries the observation_failure reason and error_cb's reports.
        ValueError: connect_timeout is not a finite number > 0, or an empty server list.
    """
    connect_options_for(connect_timeout, True, errors.record)  # validates the timeout
    client = await connect(url, connect_timeout, errors.record, outage)
    bound_reads(client)
    return client


def bound_reads(client: Client, chunk: int = READ_CHUNK_BYTES) -> bool:
    """Have the client's socket read at most chunk bytes at a time (READ_CHUNK_BYTES).

    nats-py 2.15 keeps its asyncio stream in a transport of its own (aio/transport.py,
    TcpTransport: _bare_io_writer is the socket's stream, under TLS too) and offers no
    option for it, hence the reach inside; another shape (a websocket, a later nats-py)
    is left as it is.

    Returns:
        whether the bound was set.
    """
    writer = getattr(getattr(client, "_transport", None), "_bare_io_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is None or not isinstance(getattr(transport, "max_size", None), int):
        return False
    transport.max_size = chunk
    return True


async def registered(client: Client, timeout: float) -> None:
    """Return once the server has processed every command the client wrote before
    the call: a SUB made just before is registered, so a message published after
    this returns, from any connection, reaches it.

    One flush does not prove it: nats-py writes a flush's PING straight to the
    socket, while SUB and PUB wait in its pending buffer for the flusher task, so
    the PING leaves first and its PONG can come back before the server has read
    the SUB. By the first PONG the flusher has written them; the second PING leaves
    after them, and the server answers one connection's commands in order.

    Raises:
        nats.errors.FlushTimeoutError: no PONG within timeout.
    """
    seconds = max(int(math.ceil(timeout)), 1)  # nats-py takes whole seconds
    await client.flush(timeout=seconds)
    await client.flush(timeout=seconds)


async def close_client(client: Client, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
    """Close a client, flushing what it still buffers; never raises (a close that fails
    leaves nothing the caller could do)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.flush(timeout=max(int(timeout), 1)), timeout)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), timeout)


__all__ = [
    "BURST_GAP_SECONDS",
    "CLOSE_TIMEOUT_SECONDS",
    "COALESCE_SECONDS",
    "KEEP_SECONDS",
    "READ_CHUNK_BYTES",
    "ErrorLog",
    "Handoff",
    "LoopWake",
    "LoopRunner",
    "Pacing",
    "bound_reads",
    "close_client",
    "connect_fail_fast",
    "registered",
]
