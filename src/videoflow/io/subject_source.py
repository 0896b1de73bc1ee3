"""SubjectSource: a flow's start that reads what any NATS client publishes -- a camera
SDK, a GStreamer pipeline, a Go service -- from a JetStream stream, through a durable
consumer of its own.

Where it reads. stream names an existing stream (subject, if given too, filters it).
subject alone: the stream that captures it; with create=True, when none does, a stream
is made over it (``vf-src-<subject>``, limits retention, file storage), so what core
NATS publishers send from then on is kept. The durable (``vf-<flow>-<node>`` unless
named) outlives runs: a new run goes on from where the last one acknowledged.

Decoding (decode=):

- 'bytes': the payload as it is; with a shape and a dtype, from the SHAPE_HEADER and
  DTYPE_HEADER headers (what SubjectSink writes: '1080,1920,3' and '|u1') or from the
  node's shape and dtype arguments, a read-only numpy array viewing the payload;
- 'json', 'msgpack' (numpy arrays as docs/WIRE.md's ext types);
- 'envelope': a native videoflow envelope (docs/WIRE.md), its message and event time;
- a callable f(data: bytes, headers: dict) returning the value.

Event time, the first of: the EVENT_TIME_HEADER header (epoch seconds, or nanoseconds
when above 1e14); the payload's event_time_field (a mapping's key); a native
envelope's event_ts; the time the stream stored the message.

Delivery. Each record becomes one output whose id is minted from its stream sequence
(MSGID-6: '<node>:src:<seq>'), and the record is acknowledged once that output is
accepted (ack-after-process). A record redelivered after a crash is published again
with the same id, which the broker's duplicate window drops. A record that does not
decode is counted as an 'undecodable' drop, written to the flow's dead-letter stream
(reason 'undecodable', its bytes as they came) and terminated; the flow goes on.

Ending. With count, after that many records (distinct ones: a record delivered again,
its ack_wait out while the source held it, is handed out again but not counted again);
with idle_end, once nothing came for
that many seconds; else when the flow is stopped (videoflow stop, a quiesce).

Replicas. With nb_tasks replicas, each process binds the one durable and they share
its records, each taking what its own fetches get (a record goes to one of them; one
redelivered may go to another, under the id it had). Each replica ends on its own:
after idle_end seconds in which its fetches got nothing, or at the flow's stop.
count is refused there: it counts one replica's records, which no replica knows the
others' share of, so with N records and count=N none would reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import msgspec
import nats.errors
import nats.js.errors
import numpy as np
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from videoflow.core.context import event_time
from videoflow.core.naming import dlq_subject_for, sanitize
from videoflow.core.node import ProducerNode
from videoflow.errors import WireError
from videoflow.io.session import BrokerSession
from videoflow.io.subject_sink import DTYPE_HEADER, EVENT_TIME_HEADER, SHAPE_HEADER
from videoflow.messaging.dead_letters import (
    dead_letter_for,
    dead_letter_record_id,
    encode_dead_letter,
)
from videoflow.wire.numpy_ext import ext_hook
from videoflow.wire.serialization import decode_envelope

DECODINGS: Final = ("bytes", "json", "msgpack", "envelope")
NANOSECONDS_ABOVE: Final = 1e14
"""An event time above this is nanoseconds (1e14 seconds is three million years)."""

FETCH_SECONDS: Final = 0.5
"""How long one fetch waits for records: the most a stop waits to be noticed."""


class SubjectSource(ProducerNode):
    """A producer reading records any NATS client published (the module docstring).

    Arguments:
        stream: the stream to read; None: the one capturing subject.
        subject: the subject to read (a filter of stream, or what finds it).
        create: make a stream over subject when none captures it.
        decode: 'bytes', 'json', 'msgpack', 'envelope' or a callable(data, headers).
        shape / dtype: a raw numpy payload's, when its headers do not say.
        event_time_field: the payload's key holding its event time.
        durable: the consumer's name (default vf-<flow>-<node>).
        count / idle_end: end after count records / idle_end seconds of none (count
            with one replica only: the module docstring).
        url: the broker; None: the flow's own.
        batch: records asked for at once.
        ack_wait: seconds the broker waits for a record's ack before redelivering it.
        timeout: seconds a broker call may take.
        **node: Node's arguments.

    Raises:
        ValueError: neither stream nor subject, an unknown decoding, a shape without
            a dtype, bad numbers, count with nb_tasks above 1.
    """

    replayable = True

    def __init__(self, stream: str | None = None, *, subject: str | None = None,
                 create: bool = False,
                 decode: str | Callable[[bytes, dict[str, str]], Any] = "bytes",
                 shape: tuple[int, ...] | None = None, dtype: str | None = None,
                 event_time_field: str | None = None, durable: str | None = None,
                 count: int | None = None, idle_end: float | None = None,
                 url: str | None = None, batch: int = 64, ack_wait: float = 30.0,
                 timeout: float = 5.0, **node: Any) -> None:
        super().__init__(**node)
        if not stream and not subject:
            raise ValueError("SubjectSource: give a stream, a subject or both")
        if not callable(decode) and decode not in DECODINGS:
            raise ValueError(f"SubjectSource: decode must be one of {', '.join(DECODINGS)} "
                             f"or a callable, got {decode!r}")
        if (shape is None) != (dtype is None):
            raise ValueError("SubjectSource: give shape and dtype together")
        for label, value, whole in (("count", count, True), ("idle_end", idle_end, False),
                                    ("batch", batch, True), ("ack_wait", ack_wait, False),
                                    ("timeout", timeout, False)):
            if value is None and label in ("count", "idle_end"):
                continue
            if (isinstance(value, bool) or not isinstance(value, int if whole else (int, float))
                    or not value > 0 or not math.isfinite(value)):
                raise ValueError(f"SubjectSource: {label} must be a positive "
                                 f"{'int' if whole else 'number'}, got {value!r}")
        if count is not None and self.nb_tasks > 1:
            raise ValueError(f"SubjectSource: count ends one replica after its own count "
                             f"records, and the {self.nb_tasks} replicas share the records: "
                             "end them with idle_end (or a stop)")
        self.stream, self.subject, self.create = stream, subject, create
        self.decode = decode
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.dtype = None if dtype is None else np.dtype(dtype).str
        self.event_time_field, self.durable = event_time_field, durable
        self.count, self.idle_end, self.url = count, idle_end, url
        self.batch, self.ack_wait, self.timeout = batch, ack_wait, timeout
        self._session: BrokerSession | None = None

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        context = self._context  # None outside a run: then the url and durable given
        url = self.url or (context.broker_url if context is not None else "")
        if not url:
            raise ValueError(f"node {self.name!r}: no broker to read from (give url)")
        self._session = BrokerSession(url, self.timeout, f"videoflow-source-{self.name}")
        flow = context.flow_id if context is not None else "flow"
        self.durable_name = self.durable or f"vf-{sanitize(flow)}-{sanitize(self.name)}"
        try:
            self.stream_name = self._session.run(self._bind())
        except BaseException:
            self.close()
            raise
        self._records: deque[Any] = deque()  # fetched, not yet handed out
        self._unacked: deque[Any] = deque()  # handed out, in output order
        self._acked_outputs = 0  # of the outputs accepted, those whose record is acked
        self._taken = 0  # distinct records taken (by stream sequence, with count)
        self._taken_seqs: set[int] | None = None if self.count is None else set()
        self._last_record = time.monotonic()
        self._fetching: Any = None  # the prefetch's awaitable, while one is out
        self._acks: list[asyncio.Future[None]] = []

    async def _bind(self) -> str:
        assert self._session is not None
        js = self._session.jetstream
        stream = self.stream
        if stream is None:
            assert self.subject is not None
            try:
                stream = await js.find_stream_name_by_subject(self.subject)
            except nats.js.errors.NotFoundError:
                if not self.create:
                    raise ValueError(f"node {self.name!r}: no stream captures "
                                     f"{self.subject!r} (create=True makes one)") from None
                stream = f"vf-src-{sanitize(self.subject)}"
                await js.add_stream(name=stream, subjects=[self.subject])
        config = ConsumerConfig(
            durable_name=self.durable_name, ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL, ack_wait=self.ack_wait,
            max_ack_pending=max(4 * self.batch, 256),
            filter_subject=self.subject if self.stream is not None else None)
        # Bound, not pull_subscribe's own creation (NATS_FACTS: it ignores a config).
        await js.add_consumer(stream, config)
        self._sub = await js.pull_subscribe_bind(self.durable_name, stream=stream)
        return stream

    def resume(self, offset: int) -> None:
        """Nothing to skip: the durable redelivers what was not acknowledged, and what
        of it was published before has the same id (MSGID-6), dropped by the broker."""

    def close(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        try:
            if hasattr(self, "_unacked"):  # open() bound the durable
                self._ack_accepted(session)  # after the task drained: every one resolved
                session.run(_settled(self._acks, self._fetching))
        finally:
            session.close()

    # ------------------------------------------------------------------ records

    def next(self) -> Any:
        session, context = self._session, self.context
        assert session is not None and context is not None, "open() was not called"
        while True:
            # Each time round, not once per call: while it waits for records, the
            # outputs it handed out are accepted, and their records must be acked for
            # the broker to deliver more (a durable holds at most max_ack_pending).
            self._ack_accepted(session)
            if self.count is not None and self._taken >= self.count:
                raise StopIteration
            msg = self._next_record(session)
            if msg is None:
                if context.stop_requested or (
                        self.idle_end is not None
                        and time.monotonic() - self._last_record >= self.idle_end):
                    raise StopIteration
                continue
            self._last_record = time.monotonic()
            if self._taken_seqs is None:
                self._taken += 1
            elif (seq := msg.metadata.sequence.stream) not in self._taken_seqs:
                # A record delivered again (its ack_wait ran out first) is handed out
                # again, its output deduplicated by the broker (MSGID-6), but it is
                # not another record: counted, it would end the source that many
                # records short of count.
                self._taken_seqs.add(seq)
                self._taken += 1
            headers = msg.headers or {}
            try:
                value, event_ts = self._decoded(msg.data, headers)
            except (WireError, msgspec.DecodeError, ValueError, TypeError, KeyError,
                    UnicodeDecodeError) as error:
                self._dead_letter(session, msg, error)
                continue
            if event_ts is None:
                event_ts = msg.metadata.timestamp.timestamp()
            context.set_event_timestamp(event_ts)
            context.set_source_offset(msg.metadata.sequence.stream)
            self._unacked.append(msg)
            return value

    def _next_record(self, session: BrokerSession) -> Any:
        if not self._records:
            fetching, self._fetching = self._fetching, None
            try:
                got = session.run(fetching if fetching is not None else self._fetch(),
                                  FETCH_SECONDS + self.timeout)
            except (nats.errors.TimeoutError, TimeoutError):
                return None
            self._records.extend(got)
            # The next batch is asked for while this one is handed out: the broker's
            # round trip overlaps the node's work instead of adding to it.
            if self.count is None or self._taken + len(self._records) < self.count:
                self._fetching = self._prefetch(session)
        return self._records.popleft() if self._records else None

    async def _fetch(self) -> list[Any]:
        msgs: list[Any] = await self._sub.fetch(self.batch, timeout=FETCH_SECONDS)
        return msgs

    def _prefetch(self, session: BrokerSession) -> Any:
        """A fetch started on the session's loop now, awaited by the next
        _next_record (a coroutine that waits for the task)."""
        task: asyncio.Future[list[Any]] | None = None

        def start() -> None:
            nonlocal task
            task = asyncio.ensure_future(self._fetch())

        session.runner.call_soon(start)
        session.runner.turn()  # the request goes out now, not when the loop next runs

        async def result() -> list[Any]:
            while task is None:  # start has not run yet: it runs before this resumes
                await asyncio.sleep(0)
            return await task

        return result()

    def _decoded(self, data: bytes, headers: dict[str, str]) -> tuple[Any, float | None]:
        """(value, event time or None) of one record.

        Raises:
            WireError, msgspec.DecodeError, ValueError, TypeError, KeyError: it does
                not decode as asked.
        """
        event_ts = _seconds(headers[EVENT_TIME_HEADER]) if EVENT_TIME_HEADER in headers \
            else None
        decode = self.decode
        if callable(decode):
            value = decode(data, headers)
        elif decode == "json":
            value = json.loads(data)
        elif decode == "msgpack":
            value = msgspec.msgpack.decode(data, ext_hook=ext_hook)
        elif decode == "envelope":
            envelope = decode_envelope(data)
            if envelope["is_stop_signal"] or envelope["is_abort"]:
                raise ValueError("an end marker, not a data envelope")
            value = envelope["message"]
            if event_ts is None and envelope["event_ts"] is not None:
                # Checked here, where a bad one dead-letters its record, not in the
                # setter, where it would stop the source.
                event_ts = event_time(envelope["event_ts"], "the envelope's event_ts")
        else:
            value = self._raw(data, headers)
        if event_ts is None and self.event_time_field is not None:
            event_ts = _seconds(value[self.event_time_field])
        return value, event_ts

    def _raw(self, data: bytes, headers: dict[str, str]) -> Any:
        if SHAPE_HEADER in headers or DTYPE_HEADER in headers:
            shape = tuple(int(d) for d in headers[SHAPE_HEADER].split(","))
            dtype = np.dtype(headers[DTYPE_HEADER])
        elif self.shape is not None:
            shape, dtype = self.shape, np.dtype(self.dtype)
        else:
            return data
        return np.frombuffer(data, dtype=dtype).reshape(shape)  # read-only, no copy

    # ------------------------------------------------------------------ settling

    def _ack_accepted(self, session: BrokerSession) -> None:
        """Acknowledge the records whose outputs the broker accepted (a producer's
        outputs resolve in the order they were published)."""
        assert self.context is not None
        accepted = self.context.accepted_outputs
        done = []
        while self._unacked and self._acked_outputs < accepted:
            done.append(self._unacked.popleft())
            self._acked_outputs += 1
        if done:
            # Sent on the session's loop without being waited for (close waits for
            # the last): a lost ack redelivers the record, whose output the broker
            # then drops as a duplicate.
            self._acks = [a for a in self._acks if not a.done()]

            def start() -> None:
                self._acks.append(asyncio.ensure_future(_ack_all(done)))

            session.runner.call_soon(start)

    def _dead_letter(self, session: BrokerSession, msg: Any, error: BaseException) -> None:
        """A record that does not decode: counted, kept in the dead-letter stream, then
        terminated (so it is never redelivered)."""
        context = self.context
        assert context is not None
        context.count_drop("undecodable")
        seq = msg.metadata.sequence.stream
        record = dead_letter_for(context.flow_id, context.run_id, self.name,
                                 self.stream_name, seq, msg.metadata.num_delivered,
                                 "undecodable", msg.data, error, time.time())
        session.run(session.jetstream.publish(
            dlq_subject_for(context.flow_id, context.run_id, self.name),
            encode_dead_letter(record), timeout=self.timeout,
            headers={"Nats-Msg-Id": dead_letter_record_id(context.run_id, self.name,
                                                          self.stream_name, seq)}))
        session.run(msg.term())


async def _ack_all(msgs: list[Any]) -> None:
    for msg in msgs:
        await msg.ack()


async def _settled(acks: list[asyncio.Future[None]], fetching: Any) -> None:
    """Wait for the acks sent; let an outstanding prefetch end (what it got is not
    acknowledged: redelivered to the next reader after ack_wait)."""
    await asyncio.gather(*acks)
    if fetching is not None:
        with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
            await fetching


def _seconds(value: Any) -> float:
    """An event time in epoch seconds from seconds or nanoseconds (str or number).

    Raises:
        ValueError / TypeError: not a number.
    """
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"an event time must be finite, got {value!r}")
    return number / 1e9 if abs(number) > NANOSECONDS_ABOVE else number


__all__ = ["DECODINGS", "SubjectSource"]
