"""The compiled envelope decoder against the msgspec reference it accelerates.

The compiled decoder either leaves an input to the reference (``decode`` returns
None) or returns exactly the reference's dict: equal values of identical types
(bool vs int, float vs int, bytes vs str, list vs tuple), keys in the same order,
and arrays with the same dtype, shape, bytes, read-only flag and memory sharing
with the input. Inputs come from a msgpack writer that picks every legal width
for each value (the encoder only ever writes the shortest), so the parser's
handling of non-canonical forms is exercised too. Runs in both modes: the
compiled module is imported directly, as the grouping differential tests do.
"""

from __future__ import annotations

import importlib
import math
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from wire_mutations import MUTATIONS, mutate

import videoflow.wire.numpy_ext as numpy_ext
import videoflow.wire.serialization as wire
from videoflow.errors import WireError

_envelope = importlib.import_module("videoflow.wire._envelope")

DECODER = _envelope.EnvelopeDecoder(
    wire._EnvelopeV3.__struct_fields__, tuple(wire._V3_DEFAULTS.values()), numpy_ext.ext_hook
)
REFERENCE = wire._reference_decode_envelope
COMPOSED = _envelope.compose_decode_envelope(DECODER, REFERENCE)

DIFF = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- a msgpack writer that picks any legal width ----------------------------------


@dataclass(frozen=True)
class RawExt:
    code: int
    payload: bytes


@dataclass(frozen=True)
class Float32:
    """A float the writer must put on the wire as float32 (exactly representable)."""

    value: float


def _header(
    draw: Any, n: int, fix_base: int | None, fix_max: int, wide: list[tuple[int, str]]
) -> bytes:
    options: list[bytes] = []
    if fix_base is not None and n <= fix_max:
        options.append(bytes([fix_base | n]))
    for code, fmt in wide:
        if n < 1 << (8 * struct.calcsize(fmt)):
            options.append(bytes([code]) + struct.pack(fmt, n))
    return draw(st.sampled_from(options))


def pack(value: Any, draw: Any) -> bytes:
    """Writes value as msgpack, drawing one of the legal encodings at every step."""
    if value is None:
        return b"\xc0"
    if value is True:
        return b"\xc3"
    if value is False:
        return b"\xc2"
    if isinstance(value, int):
        options = []
        if 0 <= value <= 0x7F:
            options.append(bytes([value]))
        if -32 <= value < 0:
            options.append(struct.pack(">b", value))
        for code, fmt in ((0xCC, ">B"), (0xCD, ">H"), (0xCE, ">I"), (0xCF, ">Q")):
            if 0 <= value < 1 << (8 * struct.calcsize(fmt)):
                options.append(bytes([code]) + struct.pack(fmt, value))
        for code, fmt in ((0xD0, ">b"), (0xD1, ">h"), (0xD2, ">i"), (0xD3, ">q")):
            bits = 8 * struct.calcsize(fmt)
            if -(1 << (bits - 1)) <= value < 1 << (bits - 1):
                options.append(bytes([code]) + struct.pack(fmt, value))
        return draw(st.sampled_from(options))
    if isinstance(value, Float32):
        return b"\xca" + struct.pack(">f", value.value)
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        return _header(draw, len(raw), 0xA0, 31, [(0xD9, ">B"), (0xDA, ">H"), (0xDB, ">I")]) + raw
    if isinstance(value, bytes):
        return (
            _header(draw, len(value), None, 0, [(0xC4, ">B"), (0xC5, ">H"), (0xC6, ">I")]) + value
        )
    if isinstance(value, (list, tuple)):
        head = _header(draw, len(value), 0x90, 15, [(0xDC, ">H"), (0xDD, ">I")])
        return head + b"".join(pack(item, draw) for item in value)
    if isinstance(value, dict):
        head = _header(draw, len(value), 0x80, 15, [(0xDE, ">H"), (0xDF, ">I")])
        return head + b"".join(pack(k, draw) + pack(v, draw) for k, v in value.items())
    if isinstance(value, RawExt):
        size = len(value.payload)
        options = []
        fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if size in fixed:
            options.append(bytes([fixed[size]]))
        for code, fmt in ((0xC7, ">B"), (0xC8, ">H"), (0xC9, ">I")):
            if size < 1 << (8 * struct.calcsize(fmt)):
                options.append(bytes([code]) + struct.pack(fmt, size))
        head = draw(st.sampled_from(options))
        return head + struct.pack(">b", value.code) + value.payload
    raise AssertionError(f"cannot pack {value!r}")


# --- generated values ---------------------------------------------------------------

EDGE_INTS = st.sampled_from(
    [0, 1, -1, 127, 128, -32, -33, 255, 256, 2**15, 2**16, 2**31, 2**32, 2**53 + 1]
    + [2**63 - 1, 2**63, -(2**63), 2**64 - 1, -(2**31) - 1, -(2**15) - 1]
)
INTS = EDGE_INTS | st.integers(min_value=-(2**63), max_value=2**64 - 1)
FLOATS = st.floats() | st.floats(width=32).map(Float32)
TEXT = st.text(max_size=40) | st.sampled_from(["", "a", "person", "cam-01", "é", "ab", "abc"])
DTYPES = (
    hnp.integer_dtypes(endianness="?")
    | hnp.unsigned_integer_dtypes(endianness="?")
    | hnp.floating_dtypes(endianness="?")
    | hnp.complex_number_dtypes(endianness="?")
    | hnp.boolean_dtypes()
    | hnp.datetime64_dtypes(endianness="?")
    | hnp.byte_string_dtypes(min_len=1, max_len=4)
)
ARRAYS = hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
NUMPY = ARRAYS.map(lambda a: RawExt(1, numpy_ext.pack_array(a))) | ARRAYS.filter(
    lambda a: a.ndim == 0
).map(lambda a: RawExt(2, numpy_ext.pack_array(a)))
# Ext codes the compiled decoder leaves to the reference: foreign ones, the msgpack
# timestamp (-1), and reserved ones whose payload is not an array.
OTHER_EXT = st.builds(
    RawExt,
    st.sampled_from([-1, 0, 3, 5, 127, -128, 1, 2]),
    st.sampled_from([b"", b"\x00", b"\x00\x00\x00\x01", b"\x00" * 8, b"\x01" * 12, b"\x00" * 16]),
)
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT | st.binary(max_size=40)
KEYS = TEXT | INTS | st.booleans() | st.none() | st.floats(allow_nan=False) | st.binary(max_size=8)
VALUES = st.recursive(
    SCALARS | NUMPY,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(KEYS, children, max_size=5)
        # Keys that are equal in Python (1, 1.0, True) collide in the dict.
        | st.lists(st.tuples(st.sampled_from([1, 1.0, True, "k", "k"]), children), max_size=4).map(
            lambda pairs: _Pairs(pairs)
        )
    ),
    max_leaves=16,
)


class _Pairs(dict):  # type: ignore[type-arg]
    """Map entries written in order, duplicates included (a dict cannot hold them)."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        super().__init__()
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def items(self) -> Any:
        return iter(self.pairs)


# The valid value of each field after the five v1 fields, by position.
HEADER_TEXT = st.sampled_from(["", "processor", "detector", "flow-7", "run-1", "ü"]) | TEXT
FIELD_VALUES = [
    HEADER_TEXT,  # type
    HEADER_TEXT,  # producer_name
    HEADER_TEXT,  # flow_id
    HEADER_TEXT,  # run_id
    VALUES,  # span_id
    VALUES,  # parent_span_id
    INTS,  # replica_id
    st.none() | TEXT,  # blob_ref
    st.none() | FLOATS | INTS,  # event_ts
    VALUES,  # partition_key
    st.booleans(),  # is_abort
    st.none() | HEADER_TEXT,  # abort_origin
    VALUES,  # abort_error
]
# Values the compiled decoder leaves to the reference: other ext codes, and an array
# as a map key (the reference makes it a tuple).
ODD = OTHER_EXT | st.builds(lambda k, v: {(k,): v}, st.integers(0, 3), VALUES)
# Anything, for the odd field given the wrong type.
WRONG = SCALARS | st.lists(INTS, max_size=2) | st.dictionaries(TEXT, INTS, max_size=2)
MAX_EXTRA = {1: 0, 2: 8, 3: 13}


@st.composite
def envelopes(draw: Any) -> bytes:
    """A v1-v3 envelope, written with random widths; now and then one oddity: a
    mistyped field, a bad version tag, or a value only the reference decodes."""
    version = draw(st.sampled_from([1, 2, 3]))
    fields: list[Any] = [
        draw(TEXT),
        draw(INTS),
        draw(VALUES),
        draw(st.none() | st.dictionaries(KEYS, VALUES, max_size=4)),
        draw(st.booleans()),
    ]
    extra = draw(st.integers(0, MAX_EXTRA[version]))
    fields += [draw(strategy) for strategy in FIELD_VALUES[:extra]]
    tag = bytes([version])  # a positive fixint, as every writer puts a small int
    # Hypothesis favours small draws, so the common case is the one at 0.
    oddity = draw(st.integers(0, 15))
    if oddity == 15:
        fields[draw(st.integers(0, len(fields) - 1))] = draw(WRONG)
    elif oddity == 14:
        tag = pack(draw(st.sampled_from([version, 0, 4, 255, -1, True, "3"])), draw)
    elif oddity == 13:
        fields[2] = [fields[2], draw(ODD)]
    head = _header(draw, 1 + len(fields), 0x90, 15, [(0xDC, ">H"), (0xDD, ">I")])
    return head + tag + b"".join(pack(field, draw) for field in fields)


# --- comparison -----------------------------------------------------------------------


def assert_identical(actual: Any, expected: Any, source: Any) -> None:
    """Equal values of identical types, all the way down; arrays as zero-copy views."""
    assert type(actual) is type(expected), (actual, expected)
    if isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        assert actual.tobytes() == expected.tobytes()
        assert actual.flags.writeable == expected.flags.writeable
        assert actual.flags.aligned == expected.flags.aligned
        whole = np.frombuffer(source, np.uint8)
        assert np.shares_memory(actual, whole) == np.shares_memory(expected, whole)
    elif isinstance(expected, np.generic):
        assert actual.dtype == expected.dtype
        assert actual.tobytes() == expected.tobytes()
    elif isinstance(expected, dict):
        assert len(actual) == len(expected)
        for (ka, va), (ke, ve) in zip(actual.items(), expected.items(), strict=True):
            assert_identical(ka, ke, source)
            assert_identical(va, ve, source)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_identical(a, e, source)
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual)
    else:
        assert actual == expected


def reference_outcome(decode: Any, data: Any) -> tuple[str, Any]:
    try:
        return "ok", decode(data)
    except Exception as exc:  # whatever the reference raises, the composed one must too
        return type(exc).__name__, str(exc)


def check_against_reference(data: bytes | bytearray | memoryview) -> bool:
    """Checks one input; returns whether the compiled decoder handled it."""
    decoded = DECODER.decode(data)
    kind, expected = reference_outcome(REFERENCE, data)
    composed_kind, composed = reference_outcome(COMPOSED, data)
    assert composed_kind == kind
    if decoded is None:
        # Left to the reference: the composed decoder's outcome is the reference's.
        if kind == "ok":
            assert_identical(composed, expected, data)
        else:
            assert composed == expected
        return False
    assert kind == "ok", f"compiled decoder accepted what the reference rejects: {expected}"
    assert_identical(decoded, expected, data)
    assert_identical(composed, expected, data)
    return True


BUFFERS = st.sampled_from([bytes, bytearray, lambda b: memoryview(bytes(b))])


# --- differential properties ------------------------------------------------------------


@DIFF
@given(envelopes(), BUFFERS)
def test_generated_envelopes_decode_as_the_reference_decodes_them(data: bytes, kind: Any) -> None:
    check_against_reference(kind(data))


@DIFF
@given(st.binary(max_size=300))
def test_random_bytes_decode_as_the_reference_decodes_them(data: bytes) -> None:
    check_against_reference(data)


@DIFF
@given(envelopes(), MUTATIONS)
def test_mutated_envelopes_decode_as_the_reference_decodes_them(
    seed: bytes, mutations: list[tuple[str, int, int]]
) -> None:
    check_against_reference(mutate(seed, mutations))


@settings(max_examples=50, deadline=None)
@given(envelopes())
def test_every_truncation_of_a_generated_envelope_decodes_as_the_reference(data: bytes) -> None:
    for end in range(len(data)):
        check_against_reference(data[:end])
    check_against_reference(data + b"\xc0")


# --- the fast path stays fast ------------------------------------------------------------

BENCH_HEADER: dict[str, Any] = {
    "metadata": {"camera": "cam-01"},
    "type": "processor",
    "producer_name": "detector",
    "flow_id": "flow-7",
    "run_id": "run-20260101-01",
    "span_id": "a1b2c3d4e5f60718",
    "parent_span_id": "0102030405060708",
    "replica_id": 1,
    "event_ts": 1767225600.123,
}
TYPICAL = {
    "bench small_200B": wire.encode_envelope(
        {"frame": 1234, "label": "person", "score": 0.93, "bbox": [10, 20, 110, 220]},
        trace_id="3f2b9c1e8d7a4f60b5e2c9d8a1f3e7b2",
        seq=1234,
        **BENCH_HEADER,
    ),
    "bench small_200B_bytes": wire.encode_envelope(
        bytes(range(40)), trace_id="3f2b9c1e8d7a4f60b5e2c9d8a1f3e7b2", seq=1234, **BENCH_HEADER
    ),
    "frame": wire.encode_envelope(
        np.zeros((108, 192, 3), np.uint8), trace_id="t", seq=1, **BENCH_HEADER
    ),
    "numpy scalar and nested arrays": wire.encode_envelope(
        {"score": np.float32(0.5), "boxes": [np.arange(8, dtype=">i4").reshape(2, 4)]},
        trace_id="t",
        seq=2,
    ),
    "stop signal": wire.encode_envelope(None, trace_id="t", seq=3, is_stop_signal=True),
    "abort": wire.encode_envelope(
        None,
        trace_id="t",
        seq=4,
        is_abort=True,
        abort_origin="detector",
        abort_error={"type": "ValueError", "message": "bad frame"},
    ),
    "blob ref": wire.encode_envelope(None, trace_id="t", seq=5, blob_ref="mem:1"),
    "v1": msgspec.msgpack.encode([1, "t", 0, [1, 2.5, None], None, False]),
    "v2": msgspec.msgpack.encode(
        [2, "t", 1, "m", {"k": [1, 2]}, True, "a", "b", "c", "d", None, 5, 0, "mem:1"]
    ),
    "v3 stopping early": msgspec.msgpack.encode([3, "t", 1, None, None, False, "processor"]),
}


@pytest.mark.parametrize("name", list(TYPICAL))
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_typical_envelopes_take_the_compiled_path(name: str, kind: type) -> None:
    data = kind(TYPICAL[name])

    assert DECODER.decode(data) is not None, f"the compiled decoder left {name!r} to the reference"
    assert check_against_reference(data)


def test_decode_envelope_is_the_compiled_decoder_unless_pure_python_is_asked_for() -> None:
    if wire.DECODER_KIND == "compiled":
        assert wire.decode_envelope is not wire._reference_decode_envelope
        assert wire.decode_envelope.__wrapped__ is wire._reference_decode_envelope
        assert wire.decode_envelope.__doc__ == wire._reference_decode_envelope.__doc__
    else:
        assert wire.decode_envelope is wire._reference_decode_envelope


def test_compiled_decoder_is_a_compiled_extension() -> None:
    assert _envelope.DECODER_KIND == "compiled"
    assert _envelope.__file__.endswith((".so", ".pyd"))


@pytest.mark.parametrize("flag, expected", [("1", "reference"), ("0", "compiled")])
def test_environment_switch_selects_the_decoder(flag: str, expected: str) -> None:
    env = dict(os.environ, VIDEOFLOW_PURE_PYTHON=flag)
    probe = "from videoflow.wire import serialization as s; print(s.DECODER_KIND)"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_a_missing_compiled_decoder_is_an_import_error_not_a_silent_fallback() -> None:
    env = dict(os.environ, VIDEOFLOW_PURE_PYTHON="0")
    # A None entry in sys.modules makes the import fail as a missing build would.
    probe = (
        "import sys; sys.modules['videoflow.wire._envelope'] = None; "
        "import videoflow.wire.serialization"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert "ImportError: videoflow's compiled envelope decoder is not built" in out.stderr
    assert "VIDEOFLOW_PURE_PYTHON=1" in out.stderr


def test_arrays_from_bytes_are_read_only_views_and_from_bytearray_writable_shared_ones() -> None:
    frame = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    raw = wire.encode_envelope(frame, trace_id="t", seq=1)

    from_bytes = DECODER.decode(raw)["message"]
    buffer = bytearray(raw)
    from_bytearray = DECODER.decode(buffer)["message"]

    assert not from_bytes.flags.writeable
    assert np.shares_memory(from_bytes, np.frombuffer(raw, np.uint8))
    assert from_bytearray.flags.writeable
    from_bytearray[0, 0, 0] = 200
    assert 200 in buffer


# --- cases a generator finds only by luck --------------------------------------------------


def v3(*fields: Any) -> list[Any]:
    return [3, "t", 1, None, None, False, *fields]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(
            msgspec.msgpack.encode(v3("", "", "", "", None, None, 0, None, 2**64 - 1)),
            id="event_ts uint64 max",
        ),
        pytest.param(
            msgspec.msgpack.encode(v3("", "", "", "", None, None, 0, None, -(2**63))),
            id="event_ts int64 min",
        ),
        pytest.param(
            msgspec.msgpack.encode(v3("", "", "", "", None, None, 0, None, 2**53 + 1)),
            id="event_ts 2**53+1",
        ),
        pytest.param(
            b"\x97\x03\xa1t\x01\xc0\xc0\xc2\xca\x3f\xc0\x00\x00", id="float32 where a str belongs"
        ),
        pytest.param(b"\x96\x03\xa1t\x01\xca\x3f\xc0\x00\x00\xc0\xc2", id="float32 message"),
        pytest.param(
            b"\x9f\x03\xa1t\x01\xc0\xc0\xc2\xa0\xa0\xa0\xa0\xc0\xc0\x00\xc0\xca"
            + struct.pack(">f", 0.1),
            id="float32 event_ts",
        ),
        pytest.param(
            b"\x9f\x03\xa1t\x01\xc0\xc0\xc2\xa0\xa0\xa0\xa0\xc0\xc0\x00\xc0\xd0\x85",
            id="int8 event_ts",
        ),
        pytest.param(
            b"\x96\x03\xa1t\x01\x83\x01\xa1a\xc3\xa1b\xcb\x3f\xf0\0\0\0\0\0\0\xa1c\xc0\xc2",
            id="keys 1, True, 1.0 collide",
        ),
        pytest.param(b"\x96\x03\xa1t\x01\x82\xa1k\x01\xa1k\x02\xc0\xc2", id="duplicate key"),
        pytest.param(b"\x96\x03\xa1t\x01\x81\x91\x01\x02\xc0\xc2", id="array key"),
        pytest.param(b"\x96\x03\xa1t\x01\x81\x80\x01\xc0\xc2", id="map key"),
        pytest.param(b"\x96\x03\xa1t\x01\xd6\xff\x00\x00\x00\x01\xc0\xc2", id="timestamp ext"),
        pytest.param(b"\x96\x03\xa1t\x01\xc1\xc0\xc2", id="never-used byte"),
        pytest.param(b"\x96\x03\xa2\xed\xa0\x01\xc0\xc0\xc2", id="surrogate in utf-8"),
        pytest.param(b"\x96\x03\xa1t\x01\xa2\xc3\x28\xc0\xc2", id="invalid utf-8 message"),
        pytest.param(b"\x96\xcc\x03\xa1t\x01\xc0\xc0\xc2", id="version tag as uint8"),
        pytest.param(b"\x96\x03\xa1t\xc3\xc0\xc0\xc2", id="bool seq"),
        pytest.param(
            b"\x9d\x03\xa1t\x01\xc0\xc0\xc2\xa0\xa0\xa0\xa0\xc0\xc0\xc3", id="bool replica_id"
        ),
        pytest.param(b"\x97\x03\xa1t\x01\xc0\xc0\x01\xa0", id="int stop signal"),
        pytest.param(b"\x96\x03\xa1t\x01\xc0\x90\xc2", id="array metadata"),
        pytest.param(
            b"\x96\x03\xa1t\x01\xdd\xff\xff\xff\xff\xc0\xc2", id="array longer than the data"
        ),
        pytest.param(
            b"\x96\x03\xa1t\x01\xdf\xff\xff\xff\xff\xc0\xc2", id="map longer than the data"
        ),
        pytest.param(msgspec.msgpack.encode([1, "t", 0, None, None, False, "x"]), id="v1 too long"),
        pytest.param(msgspec.msgpack.encode([3, "t", 0, None, None]), id="v3 too short"),
        pytest.param(msgspec.msgpack.encode(v3(*([None] * 14))), id="v3 too long"),
    ],
)
def test_edge_inputs_decode_as_the_reference_decodes_them(raw: bytes) -> None:
    check_against_reference(raw)


@pytest.mark.parametrize(
    "depth", [_envelope.MAX_DEPTH - 2, _envelope.MAX_DEPTH, _envelope.MAX_DEPTH + 5, 2000]
)
def test_deep_nesting_decodes_as_the_reference_decodes_it(depth: int) -> None:
    raw = b"\x96\x03\xa1t\x01" + b"\x91" * depth + b"\x01" + b"\xc0\xc2"

    check_against_reference(raw)
    if depth < _envelope.MAX_DEPTH - 1:
        assert DECODER.decode(raw) is not None


def test_repeating_header_strings_are_reused_only_while_their_bytes_match() -> None:
    decoder = _envelope.EnvelopeDecoder(
        wire._EnvelopeV3.__struct_fields__, tuple(wire._V3_DEFAULTS.values()), numpy_ext.ext_hook
    )
    names = ["ab", "abc", "ab", "", "ü", "ab", "ac", "a" * 100, "a" * 100, "ac"]
    for name in names:
        raw = wire.encode_envelope(
            {name: name}, trace_id="t", seq=1, type=name, producer_name=name, abort_origin=name
        )
        decoded = decoder.decode(raw)
        assert decoded is not None
        assert decoded["type"] == decoded["producer_name"] == decoded["abort_origin"] == name
        assert decoded["message"] == {name: name}


def test_header_fields_a_stream_repeats_do_not_leak_into_envelopes_without_them() -> None:
    decoder = _envelope.EnvelopeDecoder(
        wire._EnvelopeV3.__struct_fields__, tuple(wire._V3_DEFAULTS.values()), numpy_ext.ext_hook
    )
    header = {
        "type": "x",
        "producer_name": "p",
        "flow_id": "f",
        "run_id": "r",
        "replica_id": 7,
        "abort_origin": "o",
    }
    sequence = [
        wire.encode_envelope(None, trace_id="t", seq=1, **header),
        wire.encode_envelope(None, trace_id="t", seq=2, **header),
        msgspec.msgpack.encode([1, "t", 3, None, None, False]),
        wire.encode_envelope(None, trace_id="t", seq=4, **header),
        msgspec.msgpack.encode([3, "t", 5, None, None, False, "y"]),
        msgspec.msgpack.encode([2, "t", 6, None, None, False, "x", "p", "f", "r", None, None, 7]),
        wire.encode_envelope(None, trace_id="t", seq=7),
        wire.encode_envelope(None, trace_id="t", seq=8, **{**header, "replica_id": 10**6}),
        wire.encode_envelope(None, trace_id="t", seq=9, **{**header, "replica_id": 10**6}),
        msgspec.msgpack.encode([2, "t", 10, None, None, False]),
    ]
    for raw in sequence:
        decoded = decoder.decode(raw)
        assert decoded is not None
        assert_identical(decoded, REFERENCE(raw), raw)


def test_an_ext_hook_that_raises_leaves_the_input_to_the_reference() -> None:
    raw = wire.encode_envelope(np.zeros(3), trace_id="t", seq=1)
    broken = bytearray(raw)
    # Corrupt the array header's length so _unpack_array raises WireError.
    at = raw.index(b"\xc7") + 3
    broken[at : at + 4] = struct.pack("<I", 10_000)

    assert DECODER.decode(bytes(broken)) is None
    with pytest.raises(WireError, match="array extension truncated"):
        COMPOSED(bytes(broken))


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(memoryview(np.zeros(4, np.int32)), id="int32 memoryview"),
        pytest.param(memoryview(bytes(range(16)))[::2], id="strided memoryview"),
        pytest.param(memoryview(bytes(8)).cast("B", (2, 4)), id="2-d memoryview"),
    ],
)
def test_buffers_other_than_flat_bytes_are_left_to_the_reference(data: memoryview) -> None:
    assert DECODER.decode(data) is None
    check_against_reference(data)


def test_a_released_memoryview_and_a_non_buffer_are_left_to_the_reference() -> None:
    view = memoryview(TYPICAL["v1"])
    view.release()

    assert DECODER.decode(view) is None
    assert DECODER.decode("not bytes") is None
    with pytest.raises(TypeError, match="needs bytes"):
        COMPOSED("not bytes")


def test_the_decoder_refuses_a_layout_it_does_not_parse() -> None:
    with pytest.raises(ValueError, match="not the layout"):
        _envelope.EnvelopeDecoder(("trace_id",), (), numpy_ext.ext_hook)
