"""SubjectSource's decoding of one record, without a broker: raw frames shaped by
headers or by the node's arguments (a read-only view, no copy), the encodings, and
where the event time comes from (header in seconds or nanoseconds, a payload field,
a native envelope's, else none: the stream's timestamp is then taken)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from videoflow.errors import WireError
from videoflow.io import DTYPE_HEADER, EVENT_TIME_HEADER, SHAPE_HEADER, SubjectSource
from videoflow.wire.serialization import encode_envelope


def decoded(source: SubjectSource, data: bytes, headers: dict[str, str] | None = None
            ) -> tuple[Any, float | None]:
    return source._decoded(data, headers or {})  # noqa: SLF001  # the one record's step


def test_a_raw_frame_is_shaped_by_its_headers_without_a_copy() -> None:
    data = bytes(range(24))
    frame, event = decoded(SubjectSource(subject="s"), data, {
        SHAPE_HEADER: "2,4,3", DTYPE_HEADER: "|u1", EVENT_TIME_HEADER: "12.5"})
    assert frame.shape == (2, 4, 3) and frame[1, 3, 2] == 23 and event == 12.5
    assert not frame.flags.writeable
    assert np.shares_memory(frame, np.frombuffer(data, np.uint8))  # a view of the payload


def test_a_raw_frame_is_shaped_by_the_nodes_arguments_when_headers_say_nothing() -> None:
    source = SubjectSource(subject="s", shape=(2, 2), dtype="<u2")
    frame, event = decoded(source, np.array([1, 2, 3, 4], "<u2").tobytes())
    assert frame.tolist() == [[1, 2], [3, 4]] and frame.dtype == np.dtype("<u2")
    assert event is None  # the stream's timestamp is taken then
    assert decoded(SubjectSource(subject="s"), b"raw")[0] == b"raw"  # bytes as they are
    with pytest.raises(ValueError):
        decoded(source, b"\x00" * 6)  # not 2x2 of u2


def test_event_times_in_nanoseconds_and_from_a_named_field() -> None:
    assert decoded(SubjectSource(subject="s"), b"x",
                   {EVENT_TIME_HEADER: "1700000000123456789"})[1] == pytest.approx(
        1700000000.123456789)
    source = SubjectSource(subject="s", decode="json", event_time_field="t")
    assert decoded(source, b'{"t": 5.25, "v": 1}') == ({"t": 5.25, "v": 1}, 5.25)
    # The header wins over the field.
    assert decoded(source, b'{"t": 5.25}', {EVENT_TIME_HEADER: "7"})[1] == 7.0
    with pytest.raises(KeyError):
        decoded(source, b'{"v": 1}')  # the named field is missing: undecodable
    with pytest.raises(ValueError):
        decoded(SubjectSource(subject="s"), b"x", {EVENT_TIME_HEADER: "nan"})


def test_msgpack_envelopes_and_a_callable() -> None:
    packed = msgspec.msgpack.encode({"a": [1, 2]})
    assert decoded(SubjectSource(subject="s", decode="msgpack"), packed)[0] == {"a": [1, 2]}
    native = encode_envelope({"k": 3}, trace_id="t", seq=1, event_ts=9.5)
    assert decoded(SubjectSource(subject="s", decode="envelope"), native) == ({"k": 3}, 9.5)
    with pytest.raises(WireError):
        decoded(SubjectSource(subject="s", decode="envelope"), packed)
    source = SubjectSource(subject="s", decode=lambda data, headers: (data, headers["h"]))
    assert decoded(source, b"d", {"h": "v"})[0] == (b"d", "v")


def test_an_end_marker_is_not_taken_for_data() -> None:
    marker = encode_envelope(None, trace_id="t", seq=1, is_stop_signal=True)
    with pytest.raises(ValueError, match="end marker"):
        decoded(SubjectSource(subject="s", decode="envelope"), marker)
