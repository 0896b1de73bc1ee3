"""The JetStream adapter's connection: the loop thread it runs nats-py on, the client
and its JetStream context, riding out an outage, and the calls the backend's parts make
onto the loop (Connection).

The loop runs on the thread that waits on it (broker.loop.LoopRunner): a node's task
thread reads, parks and takes its deliveries, and sends its publications and
settlements, itself, with no wake-up between threads; a keeper thread runs the loop
while the task runs code of its own for longer than KEEP_SECONDS.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from videoflow.backends.jetstream.reply_inbox import ReplyMux
from videoflow.backends.messaging import BrokerUnavailable
from videoflow.broker.client import FastHeadersClient
from videoflow.broker.eager import start_eagerly
from videoflow.broker.link import (
    Outage,
    broker_known_from_env,
    outage_budget_from_env,
    redact_url,
    retry_until,
    transient,
    wait_back,
)
from videoflow.broker.loop import ErrorLog, LoopRunner, LoopWake, close_client, connect_fail_fast

CALL_MARGIN_SECONDS: Final = 2.0
"""Added to a call's own bound when the caller's thread waits for the loop: the inner
bound answers first, and the outer one only catches a loop that is not running."""

BROKER_CALL_SECONDS: Final = 10.0
"""Bound of one provisioning or observation request."""


class Connection:
    """One connection to a NATS JetStream server, on a loop of its own.

    Arguments:
        nats_url: the server, e.g. nats://localhost:4222.
        connect_timeout: the overall bound of connect, in seconds.

    Attributes:
        runner: the loop (started by connect, stopped by close).
        wake: the loop's one wake-up, shared by the handoffs drained on it.
        outage: the connection's outage and its budget (VIDEOFLOW_OUTAGE_BUDGET);
            hooks on_back run when the broker is back.
        errors: what the client reported, for an observation's Unknown.
        client / js: the client and its JetStream context; None while not connected.
        replies: the connection's reply inbox (settlements, publication receipts).
        send_lock: held while a batch of publications is written.
        on_reads_parsed: called on the loop once the bytes of a read have been parsed
            and handled, where the client parses them inline (the receiver's ring).
    """

    def __init__(self, nats_url: str, connect_timeout: float) -> None:
        self.nats_url, self.connect_timeout = nats_url, connect_timeout
        self.errors = ErrorLog()
        self.outage = Outage(outage_budget_from_env(), where=nats_url,
                             known=broker_known_from_env(), what="the messaging connection")
        self.runner = LoopRunner()
        self.wake = LoopWake(self.runner, self._hold_writes, self._write_held)
        self.client: Client | None = None
        self.js: JetStreamContext | None = None
        self.replies: ReplyMux | None = None
        self.send_lock: asyncio.Lock | None = None
        self._pipelined: set[asyncio.Task[None]] = set()
        self._holding: Client | None = None  # the client a drain holds the writes of
        self.on_reads_parsed: Callable[[], None] | None = None

    @property
    def connected(self) -> bool:
        return self.client is not None and self.client.is_connected

    def connect(self) -> bool:
        """Connect on a fresh loop and its keeper thread (LoopRunner). Idempotent.

        Returns:
            True when this call connected, False when connected already.

        Raises:
            BrokerUnavailable: the server cannot be reached within connect_timeout
                (fail-fast options, NATS_FACTS S4).
        """
        if self.client is not None:
            return False
        self.runner.start()
        try:
            client = self.call(
                connect_fail_fast(self.nats_url, self.connect_timeout, self.errors,
                                  self.outage),
                self.outage.first_connect_bound(self.connect_timeout))
        except BaseException:
            self.runner.stop()
            raise
        self.client, self.js = client, client.jetstream()
        if isinstance(client, FastHeadersClient):
            client.after_reads = self._reads_parsed
        self.replies = ReplyMux(client)  # one reply inbox for settlements and receipts
        self.send_lock = asyncio.Lock()
        return True

    async def close_client(self) -> None:
        """On the loop: close the client (flushing what is still buffered)."""
        if self.client is not None:
            await close_client(self.client)

    def forget(self) -> None:
        """Drop the client and stop the loop and its keeper thread (after the close)."""
        self.client, self.js = None, None
        self.runner.stop()

    def call(self, coro: Any, timeout: float) -> Any:
        """Run coro on the loop and wait for it, timeout plus CALL_MARGIN_SECONDS."""
        return self.runner.run(coro, timeout + CALL_MARGIN_SECONDS)

    def ride(self, make: Callable[[JetStreamContext], Coroutine[Any, Any, Any]]) -> Any:
        """make(js)'s idempotent request (a stream, a durable, read back), made again
        while it fails transiently or the broker is away: a replica starting while a
        cluster elects a stream's leader, or while its broker restarts, waits for it
        (broker.link.retry_until) instead of dying on its first timeout.

        Raises:
            BrokerUnavailable: not connected once retry_until passed, or the
                connection was given up.
            the request's error: any that is not transient, or the last one once
                retry_until passed.
        """
        started = time.monotonic()
        while True:
            try:
                _, js = self.require()
                return self.call(make(js), BROKER_CALL_SECONDS)
            except (BrokerUnavailable, TimeoutError, nats.errors.Error) as error:
                away = isinstance(error, BrokerUnavailable)
                until = retry_until(self.outage, started)
                if (self.client is None or not (away or transient(error))
                        or time.monotonic() >= until):
                    raise
                wait_back(self.client, self.outage, until)

    def require(self) -> tuple[Client, JetStreamContext]:
        """The client and its JetStream context.

        Raises:
            BrokerUnavailable: not connected (not_connected says why).
        """
        if self.client is None or self.js is None or not self.client.is_connected:
            raise BrokerUnavailable(self.not_connected())
        return self.client, self.js

    def not_connected(self) -> str:
        """Why nothing can be sent now, in words an operator can act on."""
        if self.outage.given_up is not None:
            return self.outage.given_up
        if self.outage.away:
            return (f"the broker {redact_url(self.nats_url)} is away (reconnecting for up to "
                    f"{self.outage.budget:g} s)")
        return "the JetStream backend is not connected"

    def _reads_parsed(self) -> None:
        if self.on_reads_parsed is not None:
            self.on_reads_parsed()

    def _hold_writes(self) -> None:
        client = self._holding = self.client
        if isinstance(client, FastHeadersClient):
            client.hold_writes()

    def _write_held(self) -> None:
        client, self._holding = self._holding, None
        if isinstance(client, FastHeadersClient):
            client.write_held()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """On the loop: run coro now, and as a task from its first wait, held until it
        is done (pipelined sends: broker.eager.start_eagerly)."""
        start_eagerly(coro, self._pipelined)


__all__ = ["BROKER_CALL_SECONDS", "CALL_MARGIN_SECONDS", "Connection"]
