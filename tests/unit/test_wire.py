"""Envelope wire format: layout per version, numpy extension, errors, blob offload, shim."""

from __future__ import annotations

import gc
import struct
import subprocess
import sys
from typing import Any

import msgspec
import numpy as np
import pytest

import videoflow.serialization as shim
import videoflow.wire.serialization as wire
from videoflow.errors import WireError
from videoflow.wire.offload import GATHER_ABOVE_BYTES, holds_large_array
from videoflow.wire.serialization import (
    BlobStore,
    MemoryBlobStore,
    decode_envelope,
    encode_envelope,
    offload_message,
    restore_message,
)

V3_KEYS = {
    "trace_id",
    "seq",
    "event_ts",
    "message",
    "metadata",
    "is_stop_signal",
    "type",
    "producer_name",
    "flow_id",
    "run_id",
    "span_id",
    "parent_span_id",
    "replica_id",
    "blob_ref",
    "partition_key",
    "is_abort",
    "abort_origin",
    "abort_error",
}

V2_DEFAULTS = {
    "type": "",
    "producer_name": "",
    "flow_id": "",
    "run_id": "",
    "span_id": None,
    "parent_span_id": None,
    "replica_id": 0,
    "blob_ref": None,
}
V3_DEFAULTS = {
    "event_ts": None,
    "partition_key": None,
    "is_abort": False,
    "abort_origin": None,
    "abort_error": None,
}

ALL_FIELDS = {
    "metadata": {"camera": "cam-01", "roi": [0, 0, 64, 64]},
    "is_stop_signal": True,
    "type": "processor",
    "producer_name": "detector",
    "flow_id": "flow-7",
    "run_id": "run-1",
    "span_id": "a1b2c3d4e5f60718",
    "parent_span_id": 77,
    "replica_id": 2,
    "blob_ref": "mem:9",
    "event_ts": 1767225600.25,
    "partition_key": ["cam", 1],
    "is_abort": True,
    "abort_origin": "upstream-node",
    "abort_error": {"type": "RuntimeError", "message": "boom"},
}


def v3_layout(**overrides: Any) -> list[Any]:
    """The documented v3 array, field by field, independent of the module's structs."""
    fields: dict[str, Any] = {
        "trace_id": "t-1",
        "seq": 5,
        "message": None,
        "metadata": None,
        "is_stop_signal": False,
        **V2_DEFAULTS,
        **V3_DEFAULTS,
    }
    fields.update(overrides)
    return [
        3,
        fields["trace_id"],
        fields["seq"],
        fields["message"],
        fields["metadata"],
        fields["is_stop_signal"],
        fields["type"],
        fields["producer_name"],
        fields["flow_id"],
        fields["run_id"],
        fields["span_id"],
        fields["parent_span_id"],
        fields["replica_id"],
        fields["blob_ref"],
        fields["event_ts"],
        fields["partition_key"],
        fields["is_abort"],
        fields["abort_origin"],
        fields["abort_error"],
    ]


def array_ext(descr: Any, shape: Any, data: bytes, *, code: int = 1) -> msgspec.msgpack.Ext:
    """A hand-built array extension, laid out as the module docstring documents."""
    header = msgspec.msgpack.encode([descr, shape])
    return msgspec.msgpack.Ext(code, struct.pack("<I", len(header)) + header + data)


def envelope_with_message(message: Any) -> bytes:
    return msgspec.msgpack.encode(v3_layout(message=message))


def assert_same(actual: Any, expected: Any) -> None:
    """Deep equality that also demands exact numpy dtypes and bit-equal array data."""
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        assert actual.tobytes() == np.ascontiguousarray(expected).tobytes()
    elif isinstance(expected, np.generic):
        assert type(actual) is type(expected)
        assert actual.dtype == expected.dtype
        assert actual.tobytes() == expected.tobytes()
    elif isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert actual.keys() == expected.keys()
        for key in expected:
            assert_same(actual[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, list)
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
    else:
        assert actual == expected
        assert type(actual) is type(expected)


# --- envelope layout and versions ------------------------------------------------


def test_round_trip_preserves_every_field() -> None:
    data = encode_envelope({"n": 1}, trace_id="t-1", seq=9, **ALL_FIELDS)

    decoded = decode_envelope(data)

    expected = {"trace_id": "t-1", "seq": 9, "message": {"n": 1}, **ALL_FIELDS}
    expected["partition_key"] = ["cam", 1]
    assert decoded == expected


def test_decode_returns_every_v3_key_with_defaults_when_only_required_given() -> None:
    decoded = decode_envelope(encode_envelope("hello", trace_id="t", seq=0))

    assert set(decoded) == V3_KEYS
    assert decoded == {
        "trace_id": "t",
        "seq": 0,
        "message": "hello",
        "metadata": None,
        "is_stop_signal": False,
        **V2_DEFAULTS,
        **V3_DEFAULTS,
    }


def test_decode_returns_a_plain_dict() -> None:
    decoded = decode_envelope(encode_envelope(1, trace_id="t", seq=0))

    assert type(decoded) is dict


def test_encode_writes_the_documented_v3_layout() -> None:
    data = encode_envelope({"n": 1}, trace_id="t-1", seq=9, **ALL_FIELDS)

    assert msgspec.msgpack.decode(data) == v3_layout(
        trace_id="t-1", seq=9, message={"n": 1}, **ALL_FIELDS
    )


def test_encode_always_writes_version_3_first() -> None:
    raw = msgspec.msgpack.decode(encode_envelope(None, trace_id="t", seq=1))

    assert raw[0] == wire.ENVELOPE_VERSION == 3
    assert len(raw) == 19


def test_decode_reads_a_v1_payload_and_fills_later_fields_with_defaults() -> None:
    v1 = msgspec.msgpack.encode([1, "t-1", 4, {"x": [1, 2]}, {"m": 1}, True])

    decoded = decode_envelope(v1)

    assert decoded == {
        "trace_id": "t-1",
        "seq": 4,
        "message": {"x": [1, 2]},
        "metadata": {"m": 1},
        "is_stop_signal": True,
        **V2_DEFAULTS,
        **V3_DEFAULTS,
    }


def test_decode_reads_a_v2_payload_and_fills_v3_fields_with_defaults() -> None:
    v2 = msgspec.msgpack.encode(
        [2, "t-2", 8, "msg", None, False, "producer", "cam", "f", "r", "s1", "s0", 3, "mem:1"]
    )

    decoded = decode_envelope(v2)

    assert decoded == {
        "trace_id": "t-2",
        "seq": 8,
        "message": "msg",
        "metadata": None,
        "is_stop_signal": False,
        "type": "producer",
        "producer_name": "cam",
        "flow_id": "f",
        "run_id": "r",
        "span_id": "s1",
        "parent_span_id": "s0",
        "replica_id": 3,
        "blob_ref": "mem:1",
        **V3_DEFAULTS,
    }


def test_decode_lets_a_writer_omit_trailing_fields_its_version_added() -> None:
    short_v3 = msgspec.msgpack.encode([3, "t", 1, None, None, False, "processor"])

    decoded = decode_envelope(short_v3)

    assert decoded["type"] == "processor"
    assert decoded["producer_name"] == ""
    assert decoded["event_ts"] is None
    assert set(decoded) == V3_KEYS


def test_event_ts_written_as_int_reads_back_as_float() -> None:
    decoded = decode_envelope(encode_envelope(None, trace_id="t", seq=1, event_ts=17))

    assert decoded["event_ts"] == 17.0
    assert type(decoded["event_ts"]) is float


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_accepts_bytes_bytearray_and_memoryview(kind: type) -> None:
    data = encode_envelope([1, b"raw"], trace_id="t", seq=3)

    decoded = decode_envelope(kind(data))

    assert decoded["message"] == [1, b"raw"]
    assert decoded["seq"] == 3


def test_decode_refuses_a_non_buffer_with_type_error() -> None:
    with pytest.raises(TypeError, match="needs bytes, bytearray or memoryview, got str"):
        decode_envelope("not bytes")  # type: ignore[arg-type]


def test_foreign_extension_types_round_trip_as_ext() -> None:
    ext = msgspec.msgpack.Ext(42, b"opaque")

    decoded = decode_envelope(encode_envelope({"e": ext}, trace_id="t", seq=1))

    assert decoded["message"] == {"e": ext}


# --- encode-side caller errors ---------------------------------------------------


def test_unknown_field_name_raises_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="unknown envelope field 'colour'"):
        encode_envelope(None, trace_id="t", seq=1, colour="red")


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("metadata", [1, 2], "'metadata' must be dict | None, got list"),
        ("is_stop_signal", 1, "'is_stop_signal' must be bool, got int"),
        ("type", None, "'type' must be str, got NoneType"),
        ("replica_id", "2", "'replica_id' must be int, got str"),
        ("replica_id", True, "'replica_id' must be int, got bool"),
        ("blob_ref", 5, "'blob_ref' must be str | None, got int"),
        ("event_ts", "now", "'event_ts' must be float | int | None, got str"),
        ("event_ts", False, "'event_ts' must be float | int | None, got bool"),
        ("is_abort", None, "'is_abort' must be bool, got NoneType"),
        ("abort_origin", 3, "'abort_origin' must be str | None, got int"),
    ],
)
def test_encode_refuses_a_mistyped_field_with_type_error(
    field: str, value: Any, pattern: str
) -> None:
    with pytest.raises(TypeError, match=pattern):
        encode_envelope(None, trace_id="t", seq=1, **{field: value})


def test_encode_refuses_a_non_str_trace_id_and_a_non_int_seq() -> None:
    with pytest.raises(TypeError, match="'trace_id' must be str, got int"):
        encode_envelope(None, trace_id=5, seq=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'seq' must be int, got bool"):
        encode_envelope(None, trace_id="t", seq=True)


def test_encode_refuses_an_unencodable_message_with_type_error() -> None:
    with pytest.raises(TypeError, match="cannot encode objects of type object"):
        encode_envelope({"x": object()}, trace_id="t", seq=1)


# --- numpy extension -------------------------------------------------------------

PLAIN_DTYPES: list[Any] = [
    "|u1",
    "<i2",
    ">i4",
    "<u8",
    "<f2",
    ">f4",
    "<f8",
    ">f8",
    "<c8",
    ">c16",
    "|b1",
    "<M8[ns]",
    ">M8[D]",
    "<m8[s]",
    "|S3",
    "<U5",
    ">U2",
    "|V4",
]

STRUCTURED_DTYPES: list[Any] = [
    np.dtype([("x", "<f4"), ("y", ">i8")]),
    np.dtype([("a", "u1"), ("b", "<f8")], align=True),
    np.dtype([("p", ">f4", (2, 3)), ("n", [("t", "<M8[us]"), ("s", "|S4")])]),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i4"], "offsets": [0, 8], "itemsize": 16}),
]


def sample_array(dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Arbitrary but deterministic contents of the given dtype and shape."""
    size = int(np.prod(shape)) * dtype.itemsize
    raw = (np.arange(size, dtype=np.uint64) * 37 % 251).astype(np.uint8).tobytes()
    if dtype.kind == "b":
        raw = bytes(b & 1 for b in raw)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


@pytest.mark.parametrize("shape", [(), (0,), (7,), (2, 3, 4), (0, 5)])
@pytest.mark.parametrize("dtype", PLAIN_DTYPES + STRUCTURED_DTYPES, ids=str)
def test_arrays_round_trip_with_exact_dtype_shape_and_bytes(
    dtype: Any, shape: tuple[int, ...]
) -> None:
    array = sample_array(np.dtype(dtype), shape)

    decoded = decode_envelope(encode_envelope(array, trace_id="t", seq=1))["message"]

    assert_same(decoded, array)


def test_big_endian_data_stays_big_endian() -> None:
    array = np.arange(4, dtype=">u4")

    decoded = decode_envelope(encode_envelope(array, trace_id="t", seq=1))["message"]

    assert decoded.dtype.byteorder == ">"
    assert decoded.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[:, ::2],
        lambda a: a.T,
        lambda a: a[::-1],
        lambda a: np.asfortranarray(a),
        lambda a: a[1:, 1:3],
    ],
    ids=["strided", "transposed", "reversed", "fortran", "sliced"],
)
def test_non_contiguous_arrays_are_encoded_as_their_c_order_contents(view: Any) -> None:
    source = view(np.arange(24, dtype="<i4").reshape(4, 6))

    decoded = decode_envelope(encode_envelope(source, trace_id="t", seq=1))["message"]

    assert decoded.flags.c_contiguous
    assert_same(decoded, source)


def test_arrays_nested_anywhere_in_the_message_round_trip() -> None:
    message = {
        "boxes": [np.ones((2, 4), "<f4"), {"mask": np.zeros((3, 3), "|b1")}],
        "frame": np.arange(6, dtype=">u2").reshape(2, 3),
        "label": "person",
        "raw": b"\x00\x01",
    }

    decoded = decode_envelope(
        encode_envelope(message, trace_id="t", seq=1, metadata={"a": np.int64(3)})
    )

    assert_same(decoded["message"], message)
    assert_same(decoded["metadata"], {"a": np.int64(3)})


@pytest.mark.parametrize(
    "scalar",
    [
        np.float32(1.5),
        np.int8(-3),
        np.uint64(2**63 + 1),
        np.bool_(True),
        np.float64(0.1),
        np.datetime64("2026-01-01T00:00:00", "ns"),
        np.complex64(1 + 2j),
    ],
    ids=repr,
)
def test_numpy_scalars_round_trip_as_scalars_of_the_same_dtype(scalar: np.generic) -> None:
    decoded = decode_envelope(encode_envelope([scalar], trace_id="t", seq=1))["message"]

    assert_same(decoded, [scalar])


def test_object_dtype_is_refused_at_encode() -> None:
    with pytest.raises(TypeError, match="object dtype"):
        encode_envelope(np.array([{}, 1], dtype=object), trace_id="t", seq=1)


def test_structured_dtype_holding_objects_is_refused_at_encode() -> None:
    dtype = np.dtype([("a", "<i4"), ("o", "O")])

    with pytest.raises(TypeError, match="object dtype"):
        encode_envelope(np.zeros(2, dtype), trace_id="t", seq=1)


def test_structured_dtype_with_titles_is_refused_at_encode() -> None:
    dtype = np.dtype([(("Title", "a"), "<i4")])

    with pytest.raises(TypeError, match="field titles"):
        encode_envelope(np.zeros(2, dtype), trace_id="t", seq=1)


def test_masked_arrays_are_refused_rather_than_losing_the_mask() -> None:
    with pytest.raises(TypeError, match="masked arrays"):
        encode_envelope(np.ma.masked_array([1, 2], mask=[False, True]), trace_id="t", seq=1)


def test_encoding_an_array_does_not_import_numpy_ma() -> None:
    # numpy loads numpy.ma on first touch (about 90 ms): a camera's first frame paid it.
    code = ("import sys, numpy as np\n"
            "from videoflow.wire.serialization import encode_envelope\n"
            "encode_envelope({'frame': np.zeros((4, 4), np.uint8)}, trace_id='t', seq=1)\n"
            "print('numpy.ma' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)

    assert done.stdout.strip() == "False"


def test_a_masked_array_subclass_is_refused_too() -> None:
    class Labelled(np.ma.MaskedArray):
        pass

    with pytest.raises(TypeError, match="masked arrays"):
        encode_envelope(Labelled([1, 2], mask=[True, False]), trace_id="t", seq=1)


def test_array_decoded_from_bytes_is_read_only() -> None:
    decoded = decode_envelope(encode_envelope(np.arange(3), trace_id="t", seq=1))["message"]

    assert not decoded.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        decoded[0] = 5


def test_array_decoded_from_bytearray_is_writable_and_shares_the_buffer() -> None:
    buffer = bytearray(encode_envelope(np.zeros(4, "|u1"), trace_id="t", seq=1))

    decoded = decode_envelope(buffer)["message"]
    decoded[:] = 7

    assert decoded.flags.writeable
    assert buffer.count(b"\x07\x07\x07\x07") == 1


def test_decoding_a_1080p_frame_does_not_copy_the_pixels() -> None:
    frame = np.random.default_rng(0).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    data = encode_envelope(frame, trace_id="t", seq=1)

    decoded = decode_envelope(data)["message"]

    assert np.shares_memory(decoded, np.frombuffer(data, np.uint8))
    base = decoded
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview)
    assert base.obj is data
    assert np.array_equal(decoded, frame)


def test_decoded_array_keeps_its_buffer_alive_after_the_input_is_dropped() -> None:
    data = encode_envelope(np.arange(1000, dtype="<i8"), trace_id="t", seq=1)
    decoded = decode_envelope(data)["message"]

    del data
    gc.collect()

    assert decoded.sum() == sum(range(1000))


# --- bad wire input --------------------------------------------------------------


def test_every_truncation_of_a_valid_envelope_raises_wire_error() -> None:
    data = encode_envelope(
        {"a": np.arange(3, dtype="<f8"), "b": "text"}, trace_id="t", seq=1, **ALL_FIELDS
    )

    for end in range(len(data)):
        with pytest.raises(WireError, match="truncated|missing required|undecodable"):
            decode_envelope(data[:end])


def test_empty_input_raises_wire_error_saying_truncated() -> None:
    with pytest.raises(WireError, match="truncated"):
        decode_envelope(b"")


@pytest.mark.parametrize(
    ("index", "value", "pattern"),
    [
        (1, 5, "field 'trace_id': Expected `str`, got `int`"),
        (2, "5", "field 'seq': Expected `int`, got `str`"),
        (4, [1], "field 'metadata'"),
        (5, 0, "field 'is_stop_signal': Expected `bool`"),
        (6, None, "field 'type'"),
        (12, 1.5, "field 'replica_id'"),
        (13, 7, "field 'blob_ref'"),
        (14, "noon", "field 'event_ts'"),
        (16, None, "field 'is_abort'"),
        (17, 1, "field 'abort_origin'"),
    ],
)
def test_a_mistyped_field_raises_wire_error_naming_it(index: int, value: Any, pattern: str) -> None:
    layout = v3_layout()
    layout[index] = value

    with pytest.raises(WireError, match=pattern):
        decode_envelope(msgspec.msgpack.encode(layout))


def test_an_unknown_future_version_raises_wire_error() -> None:
    future = msgspec.msgpack.encode([4, "t", 1, None, None, False])

    known = r"unknown envelope version 4 \(this reader knows 1, 2, 3\)"
    with pytest.raises(WireError, match=known):
        decode_envelope(future)


def test_a_version_tag_of_the_wrong_type_raises_wire_error() -> None:
    with pytest.raises(WireError, match="unknown envelope version '3'"):
        decode_envelope(msgspec.msgpack.encode(["3", "t", 1, None, None, False]))


def test_a_missing_required_field_raises_wire_error_naming_it() -> None:
    with pytest.raises(WireError, match="v1 is missing required field.*is_stop_signal"):
        decode_envelope(msgspec.msgpack.encode([1, "t", 1, None, None]))
    with pytest.raises(WireError, match=r"v3 is missing required field\(s\) seq, message"):
        decode_envelope(msgspec.msgpack.encode([3, "t"]))


def test_more_elements_than_the_version_defines_raises_wire_error() -> None:
    too_long_v1 = msgspec.msgpack.encode([1, "t", 1, None, None, False, "extra"])

    with pytest.raises(WireError, match="v1 has 7 elements; its layout has at most 6"):
        decode_envelope(too_long_v1)


@pytest.mark.parametrize(
    ("payload", "pattern"),
    [
        (b"\xc1", "undecodable envelope: MessagePack data is malformed"),
        (b"GET / HTTP/1.1\r\n", "undecodable envelope|must be a non-empty msgpack array"),
        (msgspec.msgpack.encode({"trace_id": "t"}), "must be a non-empty msgpack array"),
        (msgspec.msgpack.encode([]), "must be a non-empty msgpack array"),
        (msgspec.msgpack.encode(7), "must be a non-empty msgpack array, got int"),
        (encode_envelope(None, trace_id="t", seq=1) + b"\x00", "trailing characters"),
        (b"\x96\x01\xa2\xff\xfe\x00\xc0\xc0\xc2", "UTF-8"),  # msgspec >= 0.23 says it itself
        (b"\x96\x01\xa1t\x00\x81\x80\x01\xc0\xc2", "map keys must be hashable"),
        (b"\x96\x01\xa1t\x00" + b"\x91" * 100_000 + b"\xc0\xc0\xc2", "recursion depth"),
    ],
    ids=[
        "reserved-opcode",
        "http-text",
        "map-not-array",
        "empty-array",
        "bare-int",
        "trailing-bytes",
        "invalid-utf8",
        "unhashable-key",
        "nested-too-deep",
    ],
)
def test_non_envelope_bytes_raise_wire_error(payload: bytes, pattern: str) -> None:
    with pytest.raises(WireError, match=pattern):
        decode_envelope(payload)


def test_wire_error_is_a_value_error_carrying_the_msgspec_cause() -> None:
    with pytest.raises(ValueError, match="unknown envelope version") as caught:
        decode_envelope(msgspec.msgpack.encode([9, "t", 1, None, None, False]))

    assert isinstance(caught.value, WireError)
    assert isinstance(caught.value.__cause__, msgspec.ValidationError)


@pytest.mark.parametrize(
    ("ext", "pattern"),
    [
        (msgspec.msgpack.Ext(1, b"\x01\x00"), "array extension truncated: 2 bytes"),
        (msgspec.msgpack.Ext(1, struct.pack("<I", 99) + b"\x92"), "header claims 99 bytes"),
        (msgspec.msgpack.Ext(1, struct.pack("<I", 1) + b"\xc1"), "bad header"),
        (array_ext("|u1", [-1], b""), "bad header"),
        (array_ext("|u1", [1, 2, 3], b"", code=1), "needs 6 bytes, 0 present"),
        (array_ext(5, [1], b"\x00"), "bad header"),
        (array_ext("|u1", "1", b"\x00"), "bad header"),
        (array_ext("|O8", [1], b"\x00" * 8), "unsupported dtype descriptor '|O8'"),
        (array_ext("int32", [1], b"\x00" * 4), "unsupported dtype descriptor 'int32'"),
        (array_ext("<u1", [1], b"\x00"), "not canonical"),
        (array_ext("<f8", [3], b"\x00" * 23), "needs 24 bytes, 23 present"),
        (array_ext("<f8", [3], b"\x00" * 25), "needs 24 bytes, 25 present"),
        (array_ext("<M8[parsec]", [1], b"\x00" * 8), "bad dtype descriptor"),
        (
            array_ext(
                {"names": ["a"], "formats": ["<i4", "<i4"], "offsets": [0], "itemsize": 4},
                [1],
                b"\x00" * 4,
            ),
            "differ in length",
        ),
        (
            array_ext(
                {"names": ["a"], "formats": ["<i4"], "offsets": [2], "itemsize": 4},
                [1],
                b"\x00" * 4,
            ),
            "bad structured dtype",
        ),
        (
            array_ext(
                {"names": ["a"], "formats": [["|O8", [2]]], "offsets": [0], "itemsize": 16},
                [1],
                b"\x00" * 16,
            ),
            "unsupported dtype descriptor",
        ),
        (
            array_ext(
                {"names": ["a"], "formats": [{"x": 1}], "offsets": [0], "itemsize": 4},
                [1],
                b"\x00" * 4,
            ),
            "bad field format",
        ),
        (
            array_ext(
                {"names": ["a"], "formats": ["<i4"], "offsets": [0], "itemsize": 4, "extra": 1},
                [1],
                b"\x00" * 4,
            ),
            "bad header",
        ),
        (array_ext("<i4", [2], b"\x00" * 8, code=2), "numpy scalar extension with shape"),
    ],
    ids=[
        "payload-shorter-than-length-prefix",
        "header-longer-than-payload",
        "header-not-msgpack",
        "negative-dimension",
        "data-missing",
        "descr-not-str-or-map",
        "shape-not-array",
        "object-dtype",
        "dtype-by-name",
        "non-canonical-descr",
        "one-byte-short",
        "one-byte-long",
        "bad-datetime-unit",
        "structured-lists-differ",
        "structured-field-past-itemsize",
        "structured-object-field",
        "structured-bad-field-format",
        "structured-unknown-key",
        "scalar-with-shape",
    ],
)
def test_malformed_array_extension_raises_wire_error(
    ext: msgspec.msgpack.Ext, pattern: str
) -> None:
    with pytest.raises(WireError, match=pattern):
        decode_envelope(envelope_with_message({"frame": ext}))


def test_structured_descriptor_nested_too_deeply_raises_wire_error() -> None:
    descr: Any = "<i4"
    for _ in range(20):
        descr = {"names": ["a"], "formats": [descr], "offsets": [0], "itemsize": 4}

    with pytest.raises(WireError, match="nested too deeply"):
        decode_envelope(envelope_with_message(array_ext(descr, [1], b"\x00" * 4)))


def test_hand_built_array_extension_decodes_per_the_documented_layout() -> None:
    ext = array_ext(">i2", [2, 2], struct.pack(">4h", 1, -2, 3, -4))

    decoded = decode_envelope(envelope_with_message(ext))["message"]

    assert decoded.dtype == np.dtype(">i2")
    assert decoded.tolist() == [[1, -2], [3, -4]]


# --- blob offload ----------------------------------------------------------------


def test_memory_blob_store_puts_gets_and_deletes() -> None:
    store = MemoryBlobStore()

    ref = store.put(b"payload")

    assert store.get(ref) == b"payload"
    store.delete(ref)
    with pytest.raises(KeyError, match="unknown blob ref"):
        store.get(ref)


def test_memory_blob_store_get_of_an_unknown_ref_raises_key_error() -> None:
    with pytest.raises(KeyError, match="mem:404"):
        MemoryBlobStore().get("mem:404")


def test_memory_blob_store_delete_of_an_unknown_ref_is_a_no_op() -> None:
    store = MemoryBlobStore()

    store.delete("never-stored")

    assert len(store) == 0


def test_memory_blob_store_copies_mutable_input() -> None:
    store = MemoryBlobStore()
    data = bytearray(b"abc")

    ref = store.put(data)  # type: ignore[arg-type]
    data[0] = ord("z")

    assert store.get(ref) == b"abc"


def test_memory_blob_store_refs_are_unique() -> None:
    store = MemoryBlobStore()

    refs = {store.put(b"x") for _ in range(100)}

    assert len(refs) == 100


def test_memory_blob_store_satisfies_the_blob_store_protocol() -> None:
    assert isinstance(MemoryBlobStore(), BlobStore)


def test_envelope_carries_a_blob_ref_in_place_of_an_offloaded_payload() -> None:
    store = MemoryBlobStore()
    frame = np.arange(30, dtype="<u2").reshape(5, 6)
    payload_bytes = encode_envelope(frame, trace_id="blob", seq=0)
    ref = store.put(payload_bytes)

    decoded = decode_envelope(encode_envelope(None, trace_id="t", seq=1, blob_ref=ref))

    assert decoded["message"] is None
    assert decoded["blob_ref"] == ref
    assert_same(decode_envelope(store.get(decoded["blob_ref"]))["message"], frame)


def test_offload_and_restore_message_round_trip_through_a_store() -> None:
    store = MemoryBlobStore()
    message = {"frame": np.ones((4, 4, 3), np.uint8), "meta": [1, "a"]}

    ref = offload_message(message, store)
    decoded = decode_envelope(encode_envelope(None, trace_id="t", seq=1, blob_ref=ref))
    restored = restore_message(decoded["blob_ref"], store)

    assert_same(restored, message)


def test_restore_message_of_corrupt_stored_bytes_raises_wire_error() -> None:
    store = MemoryBlobStore()
    ref = store.put(b"\xc1\xc1")

    with pytest.raises(WireError, match="undecodable offloaded payload 'mem:1'"):
        restore_message(ref, store)


def test_restore_message_of_an_unknown_ref_raises_key_error() -> None:
    with pytest.raises(KeyError, match="mem:7"):
        restore_message("mem:7", MemoryBlobStore())


# --- frozen shim -----------------------------------------------------------------


def test_shim_all_equals_the_wire_modules_all() -> None:
    assert list(shim.__all__) == list(wire.__all__)


def test_shim_defines_no_public_name_beyond_all() -> None:
    # Not '@py_builtins' and '@pytest_ar': pytest rewrites the asserts of every module of
    # a distribution with a pytest plugin (videoflow.testing.plugin), and leaves those.
    public = {name for name in vars(shim) if name.isidentifier() and not name.startswith("_")}

    assert public == set(wire.__all__)
    for name in wire.__all__:
        assert getattr(shim, name) is getattr(wire, name)


def test_payload_encoded_through_the_shim_decodes_through_the_wire_module() -> None:
    data = shim.encode_envelope({"a": np.arange(3)}, trace_id="t", seq=1, flow_id="f")

    decoded = wire.decode_envelope(data)

    assert_same(decoded["message"], {"a": np.arange(3)})
    assert decoded["flow_id"] == "f"


def test_payload_encoded_through_the_wire_module_decodes_through_the_shim() -> None:
    data = wire.encode_envelope([1, 2], trace_id="t", seq=2, is_stop_signal=True)

    decoded = shim.decode_envelope(data)

    assert decoded["message"] == [1, 2]
    assert decoded["is_stop_signal"] is True


def test_shim_raises_the_same_wire_error() -> None:
    assert shim.WireError is WireError
    with pytest.raises(WireError, match="truncated"):
        shim.decode_envelope(b"\x96")


# --- OutputEncoder: a replica's data envelopes, the shared fields checked once -----

_FIXED = dict(producer_name="cam", flow_id="f", run_id="r", replica_id=2)


@pytest.mark.parametrize(
    "fields",
    [
        dict(),
        dict(metadata={"k": 1}, event_ts=12.5, partition_key="left"),
        dict(event_ts=3),  # an int time takes the checked path, accepted as before
        dict(metadata=None, event_ts=None, partition_key=(1, 2)),
        dict(blob_ref="store/abc", event_ts=1.5),
    ],
)
def test_output_encoder_writes_what_encode_envelope_writes(fields: dict[str, Any]) -> None:
    message = {"frame": np.arange(6, dtype=np.uint8).reshape(2, 3), "i": 7}
    encoder = wire.OutputEncoder(**_FIXED)
    assert (encoder.encode(message, "trace", 9, **fields)
            == encode_envelope(message, trace_id="trace", seq=9, **_FIXED, **fields))


def _large_messages() -> list[Any]:
    frame = np.arange(480 * 640 * 3, dtype=np.uint32).astype(np.uint8).reshape(480, 640, 3)
    return [
        frame,  # an array alone
        {"frame": frame, "i": 7, "t": 1.5},
        {"left": frame, "right": frame[::-1].copy(), "depth": np.ones((256, 256), ">f4")},
        {"strided": frame[:, ::2]},  # not contiguous: copied into order, then joined
        {"nested": {"frame": frame}},  # deeper than holds_large_array looks: as before
        [frame, 1],
    ]


@pytest.mark.parametrize("index", range(6))
def test_output_encoder_joins_a_large_array_into_the_same_bytes(index: int) -> None:
    # A frame is copied once (encode_joined) instead of twice; the bytes are
    # encode_envelope's all the same, and decode to the same arrays.
    message = _large_messages()[index]
    encoder = wire.OutputEncoder(**_FIXED)
    data = encoder.encode(message, "trace", 9, event_ts=2.5)
    assert type(data) is bytes
    assert data == encode_envelope(message, trace_id="trace", seq=9, event_ts=2.5, **_FIXED)
    assert _same(wire.decode_envelope(data)["message"], message)


def _same(got: Any, sent: Any) -> bool:
    """Whether a decoded message is the one sent: arrays equal in dtype and values."""
    if isinstance(sent, np.ndarray):
        return bool(got.dtype == sent.dtype and np.array_equal(got, sent))
    if isinstance(sent, dict):
        return got.keys() == sent.keys() and all(_same(got[k], v) for k, v in sent.items())
    if isinstance(sent, (list, tuple)):
        return len(got) == len(sent) and all(_same(a, b) for a, b in zip(got, sent,
                                                                          strict=True))
    return bool(got == sent)


def test_holds_large_array_looks_at_the_message_and_its_dict_values_only() -> None:
    big, small = np.zeros(GATHER_ABOVE_BYTES, np.uint8), np.zeros(16, np.uint8)
    assert holds_large_array(big) and holds_large_array({"a": 1, "f": big})
    assert not holds_large_array(small) and not holds_large_array({"f": small, "i": 1})
    assert not holds_large_array({"deep": {"f": big}}) and not holds_large_array([big])
    assert not holds_large_array(np.zeros(GATHER_ABOVE_BYTES - 1, np.uint8))


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        (dict(metadata=[1]), "'metadata' must be dict | None, got list"),
        (dict(event_ts="now"), "'event_ts' must be float | int | None, got str"),
        (dict(event_ts=True), "'event_ts' must be float | int | None, got bool"),
        (dict(blob_ref=5), "'blob_ref' must be str | None, got int"),
    ],
)
def test_output_encoder_refuses_what_encode_envelope_refuses(
        fields: dict[str, Any], pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        wire.OutputEncoder(**_FIXED).encode(None, "t", 1, **fields)


def test_output_encoder_checks_its_shared_fields_once_at_construction() -> None:
    with pytest.raises(TypeError, match="'replica_id' must be int, got bool"):
        wire.OutputEncoder(producer_name="cam", flow_id="f", run_id="r", replica_id=True)
    with pytest.raises(TypeError, match="'trace_id' must be str, got int"):
        wire.OutputEncoder(**_FIXED).encode(None, 5, 1)  # type: ignore[arg-type]
