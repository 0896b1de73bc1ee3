"""The reply inbox of a JetStream connection, and messages handed to their handler
inside nats-py's read loop.

Everything here runs on the adapter's loop.

- ReplyMux: one wildcard inbox per connection whose replies resolve waiting futures by
  a counter in the reply subject; settlements (jetstream.delivery_leases) and
  publication receipts (jetstream.outcomes.publish_pipelined) use it. It is nats-py's
  request() (aio/client.py _request_new_style) without the per-call NUID, random
  token, Task and wait_for, which cost more than the acknowledgement itself once
  hundreds are in flight.
- subscribe_inline: a subscription whose messages go to their handler as each is
  parsed (the reply inbox, and every binding's delivery inbox).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from videoflow.broker.client import InlineQueue

NO_RESPONDERS_STATUS = "503"
"""The status header of the server's no-responders answer (nats/aio/client.py)."""


class ReplyMux:
    """Replies to this connection's requests (settlements, publications), by reply
    subject: each reply goes to the callback, or the future, that expected it.

    Arguments:
        client: the connection every request is written on.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self._prefix = ""
        self._subscribing: asyncio.Future[None] | None = None
        self._calls: dict[str, Callable[[Msg], None]] = {}
        self._counter = itertools.count()

    async def start(self) -> None:
        """Subscribe the wildcard inbox, once. No flush is needed: the server handles
        one connection's protocol in order, so the SUB is registered before any request
        written after it is processed, and so before its reply is routed — the same
        reasoning nats-py's own request() relies on (_init_request_sub).

        Raises:
            nats.errors.Error: the subscription could not be written.
        """
        if self._prefix:
            return
        if self._subscribing is None:
            # Shared, so concurrent first settlements make one subscription between them.
            self._subscribing = asyncio.ensure_future(self._subscribe())
        try:
            await asyncio.shield(self._subscribing)
        except nats.errors.Error:
            self._subscribing = None  # the next settlement tries again
            raise

    async def _subscribe(self) -> None:
        inbox = self.client.new_inbox()
        await subscribe_inline(self.client, inbox + ".*", self._dispatch)
        self._prefix = inbox + "."

    def expect(self) -> tuple[str, asyncio.Future[Msg]]:
        """A fresh reply subject and the future its reply resolves (start first)."""
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

        def resolve(msg: Msg) -> None:
            if not future.done():
                future.set_result(msg)

        return self.expect_call(resolve), future

    def expect_call(self, on_reply: Callable[[Msg], None]) -> str:
        """A fresh reply subject whose reply is handed to on_reply, on the loop, once
        (start first). Cheaper than a future when nobody awaits each reply: a
        publication's receipt is filled in from here."""
        key = str(next(self._counter))
        self._calls[key] = on_reply
        return self._prefix + key

    def abandon(self, subject: str) -> None:
        """Stop waiting for subject's reply (timed out or never sent)."""
        self._calls.pop(subject[len(self._prefix):], None)

    @property
    def waiting(self) -> int:
        return len(self._calls)

    def _dispatch(self, msg: Msg) -> None:
        on_reply = self._calls.pop(msg.subject[len(self._prefix):], None)
        if on_reply is not None:
            on_reply(msg)


async def subscribe_inline(client: Client, subject: str,
                           handler: Callable[[Msg], None]) -> Subscription:
    """Subscribe subject with handler called inside nats-py's read loop, as each
    message is parsed (broker.client.InlineQueue), instead of through the
    subscription's queue and a task per subscription awaiting a coroutine callback.

    The subscription has no callback and no byte limit (0: unbounded), so nats-py
    starts no task for it and counts nothing against it. A nats-py whose
    subscriptions keep no asyncio.Queue of pending messages gets the plain way: a
    callback that calls handler.

    Raises:
        nats.errors.Error: the subscription could not be written.
    """
    sub = await client.subscribe(subject, pending_bytes_limit=0)
    if isinstance(getattr(sub, "_pending_queue", None), asyncio.Queue):
        sub._pending_queue = InlineQueue(handler)  # type: ignore[assignment]  # duck-typed
        return sub
    await sub.unsubscribe()

    async def call(msg: Msg) -> None:
        handler(msg)

    return await client.subscribe(subject, cb=call)


def no_responders(reply: Msg) -> bool:
    """Whether a reply is the server's no-responders status: nobody processed the
    request (the durable is gone, NATS_FACTS S14)."""
    headers = reply.headers
    return headers is not None and headers.get("Status") == NO_RESPONDERS_STATUS


__all__ = ["NO_RESPONDERS_STATUS", "ReplyMux", "no_responders", "subscribe_inline"]
