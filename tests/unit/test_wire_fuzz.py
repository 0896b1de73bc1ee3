"""Property tests for the envelope codec: any bytes decode to a dict or raise WireError."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from wire_mutations import MUTATIONS, mutate

from videoflow.errors import WireError
from videoflow.wire.serialization import decode_envelope, encode_envelope

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SEEDS = [
    encode_envelope(
        {
            "frame": np.arange(12, dtype=">i4").reshape(3, 4),
            "score": np.float32(0.5),
            "tags": ["a", {"b": b"\x00\x01"}],
        },
        trace_id="3f2b9c1e",
        seq=7,
        metadata={"camera": "cam-01"},
        type="processor",
        span_id="s",
        replica_id=1,
        event_ts=1.5,
        is_abort=True,
        abort_error={"type": "E"},
    ),
    encode_envelope(
        np.zeros(3, np.dtype([("a", "u1"), ("b", "<f8", (2,))], align=True)),
        trace_id="t",
        seq=2,
    ),
    msgspec.msgpack.encode([1, "t", 0, [1, 2.5, None], None, False]),
    msgspec.msgpack.encode(
        [2, "t", 1, "m", {"k": [1, 2]}, True, "a", "b", "c", "d", None, 5, 0, "mem:1"]
    ),
]


def decodes_or_raises_wire_error(data: bytes) -> None:
    """The codec's contract for untrusted bytes: a full dict, or WireError, nothing else."""
    try:
        decoded = decode_envelope(data)
    except WireError:
        return
    assert isinstance(decoded, dict)
    assert len(decoded) == 18


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_decode_to_a_dict_or_raise_wire_error(data: bytes) -> None:
    decodes_or_raises_wire_error(data)


@FUZZ
@given(st.sampled_from(SEEDS), MUTATIONS)
def test_mutated_envelopes_decode_to_a_dict_or_raise_wire_error(
    seed: bytes, mutations: list[tuple[str, int, int]]
) -> None:
    decodes_or_raises_wire_error(mutate(seed, mutations))


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_every_single_byte_value_at_any_position_is_handled(seed: bytes, data: Any) -> None:
    position = data.draw(st.integers(min_value=0, max_value=len(seed) - 1))
    value = data.draw(st.integers(min_value=0, max_value=255))
    mutated = bytearray(seed)
    mutated[position] = value

    decodes_or_raises_wire_error(bytes(mutated))


# Values msgpack carries natively and that come back as the same Python value.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
DTYPES = (
    hnp.integer_dtypes(endianness="?")
    | hnp.unsigned_integer_dtypes(endianness="?")
    | hnp.floating_dtypes(endianness="?")
    | hnp.complex_number_dtypes(endianness="?")
    | hnp.boolean_dtypes()
    | hnp.datetime64_dtypes(endianness="?")
    | hnp.byte_string_dtypes(min_len=1, max_len=4)
    | hnp.unicode_string_dtypes(endianness="?", min_len=1, max_len=4)
)
ARRAYS = hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
MESSAGES = st.recursive(
    SCALARS | ARRAYS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def assert_same(actual: Any, expected: Any) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        assert actual.tobytes() == expected.tobytes()
    elif isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert actual.keys() == expected.keys()
        for key in expected:
            assert_same(actual[key], expected[key])
    elif isinstance(expected, list):
        assert isinstance(actual, list)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    else:
        assert actual == expected
        assert type(actual) is type(expected)


@settings(max_examples=300, deadline=None)
@given(
    message=MESSAGES,
    trace_id=st.text(max_size=40),
    seq=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    event_ts=st.none() | st.floats(allow_nan=False),
    metadata=st.none() | st.dictionaries(st.text(max_size=8), SCALARS, max_size=4),
    replica_id=st.integers(min_value=0, max_value=1024),
    is_stop_signal=st.booleans(),
)
def test_any_encodable_envelope_round_trips_exactly(
    message: Any,
    trace_id: str,
    seq: int,
    event_ts: float | None,
    metadata: dict[str, Any] | None,
    replica_id: int,
    is_stop_signal: bool,
) -> None:
    data = encode_envelope(
        message,
        trace_id=trace_id,
        seq=seq,
        event_ts=event_ts,
        metadata=metadata,
        replica_id=replica_id,
        is_stop_signal=is_stop_signal,
    )

    decoded = decode_envelope(data)

    assert_same(decoded["message"], message)
    assert decoded["trace_id"] == trace_id
    assert decoded["seq"] == seq
    assert decoded["event_ts"] == event_ts
    assert decoded["metadata"] == metadata
    assert decoded["replica_id"] == replica_id
    assert decoded["is_stop_signal"] is is_stop_signal
