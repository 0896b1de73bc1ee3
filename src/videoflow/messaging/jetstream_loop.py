"""The JetStream adapter's own event loop: a daemon thread, a runner that carries
coroutines over from the caller's thread, and the fail-fast connect.

Part of videoflow.messaging.jetstream_backend. Every MessagingBackend method is
synchronous (videoflow.backends.messaging), while nats-py is asyncio only, so the
adapter runs one loop of its own in a daemon thread and submits each broker call to
it with a bound; nothing here knows about streams, deliveries or outcomes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, Generic, TypeVar

import nats
from nats.aio.client import Client

from videoflow.errors import BrokerUnavailable
from videoflow.messaging.stream_configs import connect_options_for
from videoflow.messaging.verification import observation_failure

T = TypeVar("T")

CLOSE_TIMEOUT_SECONDS: Final = 5.0
"""How long a clean close (drain of pending publishes included) is given."""

_ERRORS_KEPT: Final = 64
"""error_cb reports remembered; older ones are forgotten so a flapping link cannot
grow the list without bound."""


class LoopRunner:
    """One asyncio loop running forever in a daemon thread, and the bridge to it.

    Arguments:
        name: the thread's name (shows up in thread dumps).
    """

    def __init__(self, name: str = "videoflow-jetstream-loop") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop.

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
        """Start a fresh loop in a fresh daemon thread. Idempotent."""
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

    def in_loop_thread(self) -> bool:
        """Whether the caller is on the loop's own thread (where run would deadlock)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run coro on the loop and wait for its result from the caller's thread.

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
            RuntimeError: called from the loop's own thread (it would deadlock).
        """
        if self._loop is None:
            coro.close()
            raise BrokerUnavailable("the JetStream backend's loop is not running")
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("LoopRunner.run called on its own loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=max(timeout, 0.0))
        except concurrent.futures.TimeoutError as error:
            # On 3.11 this is the builtin TimeoutError, which the coroutine itself may
            # have raised (nats.errors.TimeoutError is one): re-raise that unchanged.
            if future.done() and not future.cancelled():
                raise
            future.cancel()
            raise TimeoutError(
                f"no result from the backend's loop within {timeout:.3f}s"
            ) from error
        except concurrent.futures.CancelledError:
            raise TimeoutError("the backend's loop cancelled the call") from None

    def stop(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Cancel whatever still runs on the loop, stop it, join the thread and close
        the loop. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop, self._thread = None, None

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_rest(), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()


class LoopWake:
    """One wake-up of the loop shared by several Handoffs: a task that publishes an
    output and then settles an input wakes the loop once for both, and both go out
    on the one write that follows (a wake-up and a socket write each were a fifth
    of a processor's time).

    Arguments:
        runner: the loop the handoffs drain on.
    """

    def __init__(self, runner: LoopRunner) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._scheduled = False
        self._handoffs: list[Handoff[Any]] = []

    def register(self, handoff: Handoff[Any]) -> None:
        """Drain handoff on every wake-up, after those registered before it."""
        self._handoffs.append(handoff)

    def ring(self) -> None:
        """Have every handoff drained on the loop soon (once, however many ring).

        Raises:
            BrokerUnavailable / RuntimeError: there is no running loop to wake.
        """
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._runner.loop.call_soon_threadsafe(self._drain)
        except BaseException:
            with self._lock:
                self._scheduled = False
            raise

    def _drain(self) -> None:
        with self._lock:
            self._scheduled = False  # a put after this rings again: nothing is missed
        for handoff in self._handoffs:  # in the order they were made
            handoff.take()


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
        return [f"{type(e).__name__}: {e}" for e in self.reports]


async def connect_fail_fast(url: str, connect_timeout: float, errors: ErrorLog) -> Client:
    """Connect once, failing fast, with error_cb recording into errors.

    nats-py retries a refused connect inside _select_next_server whatever
    allow_reconnect says (NATS_FACTS S4, aio/client.py), so the fail-fast options
    (connect_options_for: max_reconnect_attempts=1, reconnect_time_wait=0.1, no
    reconnects) are used and the whole connect is bounded by connect_timeout as well.

    Arguments:
        url: the server.
        connect_timeout: the overall bound in seconds (> 0).
        errors: receives every error_cb report.

    Returns:
        a connected client.

    Raises:
        BrokerUnavailable: refused (NoServersError), hung handshake (a bare
            asyncio.TimeoutError, S20), the bound elapsed, or credentials refused; the
            message carries the observation_failure reason and error_cb's reports.
        ValueError: connect_timeout is not a finite number > 0.
    """
    options = connect_options_for(connect_timeout, True, errors.record)
    try:
        return await asyncio.wait_for(nats.connect(url, **options), connect_timeout)
    except Exception as error:
        reason, detail = observation_failure(error, errors.texts())
        raise BrokerUnavailable(f"cannot connect to {url} ({reason}): {detail}") from error


async def close_client(client: Client, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
    """Close a client, flushing what it still buffers; never raises (a close that fails
    leaves nothing the caller could do)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.flush(timeout=max(int(timeout), 1)), timeout)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), timeout)


__all__ = [
    "CLOSE_TIMEOUT_SECONDS",
    "ErrorLog",
    "Handoff",
    "LoopWake",
    "LoopRunner",
    "close_client",
    "connect_fail_fast",
]
