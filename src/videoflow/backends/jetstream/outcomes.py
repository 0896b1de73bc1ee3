"""Publication outcomes on JetStream: one publish, typed as the contract says
(MSG-013, MSG-014), and the idempotent re-publish that resolves an unknown one.

These are coroutines for the adapter's own loop; they never raise for anything the
broker answered or failed to answer.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from videoflow.backends.jetstream.reply_inbox import ReplyMux, no_responders
from videoflow.backends.messaging import (
    Accepted,
    ChannelId,
    Envelope,
    PublicationUnknown,
    PublicationUnresolvable,
    PublishOutcome,
    Receipt,
    Rejected,
)
from videoflow.backends.messaging_types import trusted_accepted
from videoflow.broker.client import (
    LARGE_PAYLOAD,
    FastHeadersClient,
    HeaderBlock,
    encode_headers,
    written_as_is,
)
from videoflow.broker.failures import JSErrorCode

MSG_ID_HEADER: Final = "Nats-Msg-Id"
"""The header JetStream deduplicates on inside the stream's duplicate_window."""

TRACEPARENT_HEADER: Final = "traceparent"
"""The header an envelope's W3C trace context travels in (Envelope.traceparent)."""

_ID_AND_TRACE: Final = b"NATS/1.0\r\nNats-Msg-Id: %s\r\ntraceparent: %s\r\n\r\n"
"""The header block of an output with both (publish_headers)."""


def rejection_for(error: nats.js.errors.APIError) -> Rejected:
    """A JetStream API refusal of a publish as Rejected, retryable when waiting helps.

    A full DiscardPolicy.NEW stream answers 503 with STORE_FAILED (S8) — acks free
    room, so retryable; any other 503 is the server being unable right now, also
    retryable. Everything else (400 size or expected-stream refusals,
    MESSAGE_TOO_LARGE / STREAM_NOT_MATCH, a 500) refuses this message as it is: not
    retryable.
    """
    retryable = error.err_code == JSErrorCode.STORE_FAILED or error.code == 503
    text = error.description or str(error)
    return Rejected(f"refused by the stream ({error.code}/{error.err_code}): {text}",
                    retryable=retryable)


_decode_json = msgspec.json.Decoder().decode


async def no_stream_refusal(js: JetStreamContext, subject: str) -> Rejected:
    """The refusal of a publish nobody answered (503 no responders): whether waiting
    helps depends on why. No stream captures the subject: waiting does not create one,
    so not retryable (MSG-013). A stream that captures it exists: its replicas are
    electing a leader (a clustered stream answers nothing for a few seconds), so
    retryable. The lookup itself unanswered (the meta leader being elected too):
    retryable, as nothing says the stream is missing."""
    try:
        stream = await js.find_stream_name_by_subject(subject)
    except nats.js.errors.NotFoundError:
        return Rejected(f"no stream captures {subject}", retryable=False)
    except (nats.errors.Error, asyncio.TimeoutError) as error:
        return Rejected(f"no stream answered for {subject}, and the streams could not be "
                        f"looked up ({type(error).__name__}); a cluster may be electing "
                        "its leaders", retryable=True)
    return Rejected(f"stream {stream} did not answer for {subject}: it has no leader "
                    "right now (a cluster electing one)", retryable=True)

def publish_headers(envelope: Envelope) -> dict[str, str] | None:
    """The NATS headers an envelope is published with: its own (an external
    publication's), its msg_id as Nats-Msg-Id (the broker deduplicates on it) and its
    W3C trace context as traceparent, encoded once (broker.client.encode_headers);
    None when it has none."""
    msg_id, traceparent = envelope.msg_id, envelope.traceparent
    if envelope.headers:
        pairs = dict(envelope.headers)
        if msg_id is not None:
            pairs[MSG_ID_HEADER] = msg_id
        if traceparent is not None:
            pairs[TRACEPARENT_HEADER] = traceparent
        return encode_headers(pairs)
    if traceparent is None:
        return None if msg_id is None else encode_headers({MSG_ID_HEADER: msg_id})
    if msg_id is None:
        return encode_headers({TRACEPARENT_HEADER: traceparent})
    if written_as_is(msg_id) and written_as_is(traceparent):
        # Every output's pair: its block written here, as encode_headers would write
        # it, without going through the pairs (a third of a producer's header cost).
        return HeaderBlock({MSG_ID_HEADER: msg_id, TRACEPARENT_HEADER: traceparent},
                           _ID_AND_TRACE % (msg_id.encode(), traceparent.encode()))
    return encode_headers({MSG_ID_HEADER: msg_id, TRACEPARENT_HEADER: traceparent})


async def publish_once(
    js: JetStreamContext, subject: str, envelope: Envelope, timeout: float
) -> PublishOutcome:
    """Publish one envelope with JetStreamContext.publish and type the answer.

    The synchronous publish is used, never publish_async: a stream's API refusal never
    reaches a publish_async future and the future has no timeout (NATS_FACTS S1, S2).

    Arguments:
        js: a JetStream context on the adapter's loop.
        subject: the envelope's subject.
        envelope: what to send; its msg_id becomes the Nats-Msg-Id header, so a retry
            of the same msg_id inside the duplicate window is answered duplicate.
        timeout: seconds to wait for the PubAck; <= 0 sends nothing.

    Returns:
        Accepted(seq, duplicate) for a PubAck (duplicate is None on a first store,
        NATS_FACTS §2, hence bool()); for a publish nobody answered (503 no
        responders), no_stream_refusal's verdict: not retryable when no stream captures
        the subject, retryable while its stream elects a leader; Rejected
        (retryable=False) when the payload exceeds max_payload client-side; Rejected
        per rejection_for for an APIError;
        Rejected(retryable=True) when nothing was sent (the deadline had already passed,
        or the connection was closed or draining before the send); PublicationUnknown
        when no PubAck arrived in time — the message is often stored anyway (S3), so a
        lost receipt is never a rejection (MSG-014) — or for any other failure after
        the send began.
    """
    if timeout <= 0:
        return Rejected("the deadline passed before the send; nothing was sent",
                        retryable=True)
    headers = publish_headers(envelope)
    try:
        ack = await js.publish(subject, envelope.data, timeout=timeout, headers=headers)
    except nats.js.errors.NoStreamResponseError:
        return await no_stream_refusal(js, subject)
    except nats.js.errors.APIError as error:
        return rejection_for(error)
    except nats.errors.MaxPayloadError as error:
        return Rejected(f"larger than the server's max_payload: {error}", retryable=False)
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError) as error:
        # Raised by the client before anything is written (aio/client.py publish).
        return Rejected(f"not connected; nothing was sent ({type(error).__name__})",
                        retryable=True)
    except (asyncio.TimeoutError, nats.errors.TimeoutError):
        # MSG-014 / S3: the send is on the wire; stored or not, nobody knows.
        return PublicationUnknown(f"no PubAck within {timeout:.3f}s")
    except asyncio.CancelledError:
        raise
    except Exception as error:  # after the send began nothing can be concluded
        return PublicationUnknown(f"publish failed after the send: "
                                  f"{type(error).__name__}: {error}")
    return Accepted(stream_seq=ack.seq, duplicate=bool(ack.duplicate))


async def publish_pipelined(
    client: Client,
    replies: ReplyMux,
    batch: Sequence[tuple[str, Envelope, float, Receipt[PublishOutcome]]],
    send_lock: asyncio.Lock,
    js: JetStreamContext | None = None,
) -> None:
    """Publish envelopes all at once, each a request whose reply is its PubAck, and
    fill in each receipt as publish_once would type the answer, as soon as it arrives.

    It is what JetStreamContext.publish_async does, without its faults: a stream's
    refusal reaches that message's own receipt instead of never resolving its future
    (NATS_FACTS S1), and every wait is bounded (S2). Nothing waits here for the
    replies: each fills in its receipt from the reply inbox, and one timer per batch
    answers the ones still open at the batch's last deadline, so a publisher's
    window moves receipt by receipt instead of batch by batch.

    Arguments:
        client / replies: the connection, and its reply inbox (jetstream.reply_inbox).
        batch: (subject, envelope, monotonic deadline, receipt) in the order to send.
        send_lock: held while writing, so batches go out in the order they were made
            (asyncio.Lock is first come, first served).
        js: when given, a publish nobody answered is typed by looking its stream up
            (no_stream_refusal: retryable while a cluster elects the stream's leader);
            without it, it is 'no stream captures' (not retryable).

    Every receipt is answered: Rejected(retryable=True) for one whose deadline had
    passed before the send (nothing sent), Accepted for its PubAck, Rejected for a
    refusal, PublicationUnknown for a PubAck that did not arrive before the batch's
    last deadline (MSG-014). A caller cancelled mid-send answers the rest itself.
    """
    expiry = _BatchExpiry(replies)
    async with send_lock:
        try:
            await replies.start()
        except nats.errors.Error as error:
            refused = Rejected(f"could not subscribe for receipts; nothing was sent: "
                               f"{error}", retryable=True)
            for *_, receipt in batch:
                receipt.set_result(refused)
            return
        now = time.monotonic()
        # A small message goes through the fast client's publish_now where it can:
        # nats-py's publish makes and awaits two coroutines for each.
        fast = client if isinstance(client, FastHeadersClient) else None
        for subject, envelope, deadline, receipt in batch:
            if deadline <= now:
                receipt.set_result(Rejected("the deadline passed before the send; "
                                            "nothing was sent", retryable=True))
                continue
            headers = publish_headers(envelope)
            inbox = replies.expect_call(functools.partial(_fill, subject, receipt, js,
                                                          expiry))
            data = envelope.data
            try:
                if (fast is not None and len(data) < LARGE_PAYLOAD
                        and (headers is None or type(headers) is HeaderBlock)):
                    if fast.publish_now(subject, inbox, data, headers):
                        await fast.flush_over()
                else:
                    await client.publish(subject, data, reply=inbox, headers=headers)
            except nats.errors.MaxPayloadError as error:
                outcome: PublishOutcome = Rejected(
                    f"larger than the server's max_payload: {error}", retryable=False)
            except (nats.errors.ConnectionClosedError,
                    nats.errors.ConnectionDrainingError) as error:
                outcome = Rejected(f"not connected; nothing was sent "
                                   f"({type(error).__name__})", retryable=True)
            except nats.errors.Error as error:
                outcome = PublicationUnknown(f"publish failed during the send: "
                                             f"{type(error).__name__}: {error}")
            else:
                expiry.sent.append((inbox, receipt))
                expiry.open += 1
                continue
            replies.abandon(inbox)
            receipt.set_result(outcome)
    if expiry.open:  # some PubAck still to come (all may have, during a send's wait)
        last = max(deadline for _, _, deadline, _ in batch)
        expiry.timer = asyncio.get_running_loop().call_later(
            max(last - time.monotonic(), 0.0), expiry.expire)


class _BatchExpiry:
    """A pipelined batch's receipts, how many are still open, and the timer that
    answers those at the batch's last deadline (MSG-014). The timer is cancelled once
    every receipt is answered, as nearly every batch's are long before: a timer that
    fired to find nothing open was a wake-up of the loop per batch, at 1 kHz one per
    output, about a tenth of a pass-through's loop passes. (A cancelled timer never wakes
    the loop: it is dropped once it reaches the head of the schedule.)"""

    __slots__ = ("open", "replies", "sent", "timer")

    def __init__(self, replies: ReplyMux) -> None:
        self.replies = replies
        self.sent: list[tuple[str, Receipt[PublishOutcome]]] = []
        self.open = 0
        self.timer: asyncio.TimerHandle | None = None

    def answered(self) -> None:
        """One receipt of the batch was answered."""
        self.open -= 1
        if self.open <= 0 and self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def expire(self) -> None:
        """The batch's last deadline: every receipt still open is unknown."""
        self.timer = None
        for inbox, receipt in self.sent:
            if not receipt.done():
                self.replies.abandon(inbox)
                # MSG-014 / S3: the send is on the wire; stored or not, nobody knows.
                receipt.set_result(PublicationUnknown("no PubAck before the deadline"))


def _fill(subject: str, receipt: Receipt[PublishOutcome], js: JetStreamContext | None,
          expiry: _BatchExpiry, reply: Msg) -> None:
    if js is not None and no_responders(reply):
        # Called inside the read loop: the lookup that types the refusal (an unknown
        # stream, or one electing its leader) runs as a task of its own.
        task = asyncio.get_running_loop().create_task(no_stream_refusal(js, subject))
        _LOOKUPS.add(task)
        task.add_done_callback(functools.partial(_filled_after_lookup, receipt, expiry))
        return
    receipt.set_result(receipt_outcome(subject, reply))
    expiry.answered()


_LOOKUPS: set[asyncio.Task[Rejected]] = set()
"""The stream lookups under way (a task must be referenced until it is done)."""


def _filled_after_lookup(receipt: Receipt[PublishOutcome], expiry: _BatchExpiry,
                         task: asyncio.Task[Rejected]) -> None:
    _LOOKUPS.discard(task)
    if task.cancelled():
        outcome: PublishOutcome = PublicationUnknown(
            "the backend shut down during a stream lookup")
    else:
        error = task.exception()
        outcome = task.result() if error is None else Rejected(
            f"no stream answered, and the lookup failed: {error!r}", retryable=True)
    receipt.set_result(outcome)  # unless the batch's deadline answered it meanwhile
    expiry.answered()


def receipt_outcome(subject: str, reply: Msg) -> PublishOutcome:
    """Type the server's answer to a publish request, as JetStreamContext.publish reads
    it (nats/js/client.py): no responders means no stream captures the subject; a JSON
    'error' is a refusal; otherwise a PubAck (duplicate absent on a first store,
    NATS_FACTS §2)."""
    if no_responders(reply):
        return Rejected(f"no stream captures {subject}", retryable=False)  # MSG-013
    try:
        answer = _decode_json(reply.data)  # several times json.loads' speed
    except msgspec.DecodeError as error:
        return PublicationUnknown(f"an unreadable PubAck: {error}")
    if not isinstance(answer, dict):
        return PublicationUnknown(f"an unreadable PubAck: {answer!r}")
    refused = answer.get("error")
    if refused is not None:
        try:
            nats.js.errors.APIError.from_error(refused)  # raises the typed error
        except nats.js.errors.APIError as refusal:
            return rejection_for(refusal)
        except (KeyError, TypeError) as unreadable:
            return PublicationUnknown(f"an unreadable refusal {refused!r}: {unreadable!r}")
    seq = answer.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        return PublicationUnknown(f"a PubAck without a stream sequence: {answer!r}")
    return trusted_accepted(seq, bool(answer.get("duplicate")))


class PublicationLedger:
    """First-send times of msg_ids whose outcome may have to be resolved later, so
    observe_publication can tell whether a re-publish still falls inside the stream's
    duplicate window (MSG-014).

    Sends are kept as batches in time order, one entry per batch of publications: a
    batch costs one append however many it holds, where a key per publication cost a
    producer 4% of its time, and pruning costs what it removes. Looking one msg_id up
    walks the batches, oldest first, each turned into a set on the first walk that
    reaches it; only an unknown outcome looks up.

    Arguments:
        clock: a monotonic clock (time.monotonic).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # [time, serial, the batch's keys (a list, a set once looked through)];
        # publishers on several threads share the ledger, hence the lock.
        self._batches: deque[list[Any]] = deque()
        self._serial = 0
        # A resolved key's sends up to the serial it was resolved at are forgotten.
        self._resolved: dict[tuple[ChannelId, str], int] = {}
        self._lock = threading.Lock()

    def sent(self, envelope: Envelope, horizon: float) -> None:
        """Record the first send of envelope's msg_id (a later send keeps the first
        time: the window runs from the first copy the broker may hold) and forget the
        ones sent more than horizon seconds ago."""
        self.sent_all((envelope,), horizon)

    def sent_all(self, envelopes: Iterable[Envelope], horizon: float) -> None:
        """sent for each of envelopes, sent now: one clock read, one lock and one entry
        for a batch."""
        now = self.clock()
        keys = [(e.channel, e.msg_id) for e in envelopes if e.msg_id is not None]
        with self._lock:
            batches = self._batches
            while batches and now - batches[0][0] >= horizon:
                batches.popleft()
            if self._resolved and len(self._resolved) >= _RESOLVED_KEPT:
                oldest = batches[0][1] if batches else self._serial + 1
                self._resolved = {k: at for k, at in self._resolved.items() if at >= oldest}
            if keys:
                self._serial += 1
                batches.append([now, self._serial, keys])

    def first_sent(self, envelope: Envelope) -> float | None:
        if envelope.msg_id is None:
            return None
        key = (envelope.channel, envelope.msg_id)
        with self._lock:
            after = self._resolved.get(key, 0)
            for batch in self._batches:
                at, serial, keys = batch
                if serial <= after:
                    continue
                if isinstance(keys, list):
                    keys = batch[2] = set(keys)
                if key in keys:
                    return at
        return None

    def resolved(self, envelope: Envelope) -> None:
        if envelope.msg_id is not None:
            with self._lock:
                self._resolved[(envelope.channel, envelope.msg_id)] = self._serial

    def __len__(self) -> int:
        """How many msg_ids are remembered (a walk of every batch: for tests)."""
        with self._lock:
            return len({key for _, serial, keys in self._batches for key in keys
                        if serial > self._resolved.get(key, 0)})


_RESOLVED_KEPT: Final = 1024
"""Resolved keys the ledger keeps before it drops those older than every batch."""


async def observe_by_republish(
    js: JetStreamContext,
    stream: str,
    subject: str,
    envelope: Envelope,
    ledger: PublicationLedger,
    timeout: float,
) -> PublishOutcome:
    """Resolve an earlier PublicationUnknown by re-publishing the same msg_id.

    Inside the stream's duplicate_window (read back from stream_info, never assumed)
    the broker answers duplicate=True with the original seq when the first send was
    stored, and stores it now when it was not — one accepted copy either way (NATS_FACTS
    §2 (d), S3). Outside it a re-publish could store a second copy, so nothing is sent.

    Arguments:
        js: a JetStream context.
        stream: the channel's stream (its duplicate_window bounds the answer).
        subject / envelope: as publish_once.
        ledger: where the first send was recorded; an envelope it does not know is
            treated as sent now (the caller asks right after an unknown outcome).
        timeout: bound for the stream read and the re-publish each.

    Returns:
        PublicationUnresolvable without a msg_id or beyond the window;
        PublicationUnknown when the window could not be read or the re-publish got no
        answer either (ask again); otherwise publish_once's outcome.
    """
    if envelope.msg_id is None:
        return PublicationUnresolvable("no msg_id: a re-publish could store a duplicate")
    first = ledger.first_sent(envelope)
    try:
        info = await asyncio.wait_for(js.stream_info(stream), timeout)
    except asyncio.CancelledError:
        raise
    except Exception as error:
        return PublicationUnknown(f"the duplicate window of {stream} could not be read: "
                                  f"{type(error).__name__}: {error}")
    window = info.config.duplicate_window or 0.0
    if first is not None and ledger.clock() - first >= window:
        return PublicationUnresolvable(
            f"the first send is outside {stream}'s duplicate window ({window:g}s)")
    outcome = await publish_once(js, subject, envelope, timeout)
    if isinstance(outcome, Accepted):
        ledger.resolved(envelope)
    return outcome


__all__ = [
    "MSG_ID_HEADER",
    "TRACEPARENT_HEADER",
    "PublicationLedger",
    "no_stream_refusal",
    "observe_by_republish",
    "publish_headers",
    "publish_once",
    "publish_pipelined",
    "receipt_outcome",
    "rejection_for",
]
