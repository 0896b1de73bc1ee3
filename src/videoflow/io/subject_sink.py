"""SubjectSink: a flow's end that publishes to a plain NATS subject, for readers that
know nothing of videoflow (a Go service, a dashboard, nats sub).

Each input group becomes one message on the subject, encoded as asked:

- 'msgpack': the input as msgpack (numpy arrays as the ext types of docs/WIRE.md);
- 'json': the input as JSON (numpy arrays as nested lists, numpy scalars as numbers);
- 'bytes': the input's bytes as they are (bytes, bytearray, memoryview), or a numpy
  array's C-order buffer with its shape and dtype in the SHAPE_HEADER and
  DTYPE_HEADER headers.

A node with several parents (a join) sends the list of its inputs. Headers, on every
message:

- EVENT_TIME_HEADER: the input group's event time, epoch seconds as a decimal number
  (absent when the group has none);
- traceparent: the group's W3C trace continued (RuntimeContext.traceparent), absent
  with tracing off;
- Nats-Msg-Id: '<node>:<input key>', the same when the group is delivered again.

Delivery. When a JetStream stream captures the subject (looked up at open), each
message is published to it as an output of its input group, through the replica's
publication window (RuntimeContext.publish_external: in flight at once, the next
inputs taken meanwhile), and the input acknowledged only once the stream accepted
it; a message sent again after a redelivery (a crash between the stream's accept and
the input's ack) is dropped by the stream's duplicate window, so the stream holds
each group once (at-least-once with deduplication). A subject no stream captures
gets a core NATS publish, flushed before the input is acknowledged: it reached the
server, and whoever was subscribed then (core NATS keeps nothing).

A message the stream refused fails its group, and a core publish that could not be
flushed raises SinkPublishFailed: the delivery policy retries the input as for any
node failure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import nats.errors
import nats.js.errors
import numpy as np

from videoflow.backends.jetstream.outcomes import MSG_ID_HEADER, TRACEPARENT_HEADER
from videoflow.broker.client import encode_headers
from videoflow.core.node import ConsumerNode
from videoflow.io.session import BrokerSession
from videoflow.wire.numpy_ext import enc_hook

EVENT_TIME_HEADER: Final = "Event-Time"
"""The header carrying a message's event time: epoch seconds, a decimal number."""

SHAPE_HEADER: Final = "Videoflow-Shape"
"""A raw numpy payload's shape: its dimensions, comma-separated ('1080,1920,3')."""

DTYPE_HEADER: Final = "Videoflow-Dtype"
"""A raw numpy payload's dtype, as numpy writes it with its byte order ('|u1', '<f4')."""

ENCODINGS: Final = ("msgpack", "json", "bytes")


class SinkPublishFailed(RuntimeError):
    """A SubjectSink's message was refused by the broker or not confirmed in time; the
    input it was made from is retried per the delivery policy."""


class SubjectSink(ConsumerNode):
    """A consumer that publishes each input group to a plain NATS subject.

    Arguments:
        subject: the subject to publish on (no wildcards).
        encoding: 'msgpack', 'json' or 'bytes' (the module docstring).
        url: the broker to publish to; None: the flow's own.
        timeout: seconds a publish may take to be confirmed.
        **node: Node's arguments (name, nb_tasks, delivery, ...).

    Raises:
        ValueError: an empty subject or one with a wildcard, an unknown encoding, a
            timeout that is not a positive number.
    """

    def __init__(self, subject: str, *, encoding: str = "msgpack", url: str | None = None,
                 timeout: float = 5.0, **node: Any) -> None:
        super().__init__(**node)
        if not isinstance(subject, str) or not subject or any(
                c in subject for c in " \t\r\n*>"):
            raise ValueError(f"SubjectSink: subject must be a subject without spaces or "
                             f"wildcards, got {subject!r}")
        if encoding not in ENCODINGS:
            raise ValueError(f"SubjectSink: encoding must be one of {', '.join(ENCODINGS)}, "
                             f"got {encoding!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                timeout > 0):
            raise ValueError(f"SubjectSink: timeout must be a positive number of seconds, "
                             f"got {timeout!r}")
        self.subject, self.encoding, self.url, self.timeout = subject, encoding, url, timeout
        self._session: BrokerSession | None = None
        self.stream: str | None = None

    def open(self) -> None:
        # _context, not context: given a url, the sink also works outside a run.
        url = self.url or (self._context.broker_url if self._context is not None else "")
        if not url:
            raise ValueError(f"node {self.name!r}: no broker to publish to (give url)")
        session = self._session = BrokerSession(url, self.timeout, f"videoflow-sink-{self.name}")
        try:
            self.stream = session.run(
                session.jetstream.find_stream_name_by_subject(self.subject))
        except nats.js.errors.NotFoundError:
            self.stream = None  # core NATS: no stream captures the subject

    def consume(self, *inputs: Any) -> None:
        value = inputs[0] if len(inputs) == 1 else list(inputs)
        data, headers = self.encode(value)
        context = self._context  # None outside a run: no group's headers to add
        if context is not None:
            info = context.input_info or {}
            event_ts = next((i["event_ts"] for i in info.values()
                             if i is not None and i.get("event_ts") is not None), None)
            if isinstance(event_ts, (int, float)):
                headers[EVENT_TIME_HEADER] = repr(float(event_ts))
            traceparent = context.traceparent
            if traceparent is not None:
                headers[TRACEPARENT_HEADER] = traceparent
            key = context.last_input_key
            if key is not None:
                headers[MSG_ID_HEADER] = f"{self.name}:{key}"
        assert self._session is not None, "open() was not called"
        if self.stream is not None and context is not None:
            # In flight through the replica's own publication window: the input is
            # acknowledged once the stream accepted it, and the next ones go out
            # meanwhile (a publish waited for one by one costs a round trip each).
            msg_id = headers.pop(MSG_ID_HEADER, None)
            headers.pop(TRACEPARENT_HEADER, None)  # the window's output carries its own
            context.publish_external(self.subject, data, headers, msg_id)
            return
        try:
            self._session.run(self._send(data, encode_headers(headers)))
        except (nats.errors.Error, TimeoutError) as error:
            raise SinkPublishFailed(
                f"node {self.name!r}: publishing to {self.subject!r} failed: "
                f"{type(error).__name__}: {error}") from error

    async def _send(self, data: bytes, headers: dict[str, str]) -> None:
        assert self._session is not None
        if self.stream is not None:
            await self._session.jetstream.publish(self.subject, data, timeout=self.timeout,
                                                  headers=headers)
        else:
            await self._session.client.publish(self.subject, data, headers=headers)
            await self._session.client.flush(timeout=math.ceil(self.timeout))  # whole seconds

    def encode(self, value: Any) -> tuple[bytes, dict[str, str]]:
        """The message's payload and the headers its encoding adds.

        Raises:
            TypeError: a value the encoding cannot carry.
        """
        if self.encoding == "msgpack":
            return msgspec.msgpack.encode(value, enc_hook=enc_hook), {}
        if self.encoding == "json":
            return json.dumps(value, default=_json_default, separators=(",", ":")
                              ).encode(), {}
        if isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            return array.tobytes(), {SHAPE_HEADER: ",".join(map(str, array.shape)),
                                     DTYPE_HEADER: array.dtype.str}
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value), {}
        raise TypeError(f"node {self.name!r}: encoding 'bytes' takes bytes or a numpy "
                        f"array, got {type(value).__name__}")

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


__all__ = ["DTYPE_HEADER", "ENCODINGS", "EVENT_TIME_HEADER", "SHAPE_HEADER",
           "SinkPublishFailed", "SubjectSink"]
