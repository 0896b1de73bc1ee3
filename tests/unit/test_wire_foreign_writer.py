"""docs/WIRE.md proven: envelopes a foreign writer builds from the page decode as
videoflow's own, and videoflow writes exactly those bytes.

Every envelope here is built without videoflow code -- plain lists, ints, str and
bytes following the page, the array extension payloads packed by hand with struct,
all encoded with a plain msgpack writer (msgspec.msgpack.encode, Ext for the extension
types) or written byte by byte. Each is decoded by decode_envelope, the compiled
decoder or the msgspec reference as the process loaded it (conftest checks which;
run the file with VIDEOFLOW_PURE_PYTHON=1 for the other), and by the reference too,
and the other way round videoflow's encoder must write the hand-built bytes
exactly. The messaging API reference names no rule identifier for the wire layout;
the message ids the page tabulates are MSGID-5 and MSGID-6, tested with the
messenger, not here.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

import videoflow.wire.serialization as wire
from videoflow.errors import WireError
from videoflow.messaging.messenger_deliveries import end_marker
from videoflow.wire.serialization import (
    MemoryBlobStore,
    decode_envelope,
    encode_envelope,
    encode_message,
    restore_message,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "WIRE.md"
REFERENCE = wire._reference_decode_envelope

pack = msgspec.msgpack.encode
Ext = msgspec.msgpack.Ext

# --- the page's tables, written out as a foreign writer would -----------------------

V1_FIELDS = ["trace_id", "seq", "message", "metadata", "is_stop_signal"]
V2_FIELDS = ["type", "producer_name", "flow_id", "run_id", "span_id", "parent_span_id",
             "replica_id", "blob_ref"]
V3_FIELDS = ["event_ts", "partition_key", "is_abort", "abort_origin", "abort_error"]
DEFAULTS: dict[str, Any] = {
    # metadata and is_stop_signal are required; a data envelope sends nil and false.
    "metadata": None, "is_stop_signal": False,
    "type": "", "producer_name": "", "flow_id": "", "run_id": "", "span_id": None,
    "parent_span_id": None, "replica_id": 0, "blob_ref": None, "event_ts": None,
    "partition_key": None, "is_abort": False, "abort_origin": None, "abort_error": None,
}
LAYOUT = {1: V1_FIELDS, 2: V1_FIELDS + V2_FIELDS, 3: V1_FIELDS + V2_FIELDS + V3_FIELDS}

FULL: dict[str, Any] = {
    "trace_id": "0123456789abcdef01234567000000a1",
    "seq": 161,
    "message": {"label": "car", "score": 0.875, "box": [10, 20, 64, 48], "raw": b"\x00\xff"},
    "metadata": {"camera": "cam-01"},
    "is_stop_signal": False,
    "type": "frame",
    "producer_name": "detector",
    "flow_id": "flow-7",
    "run_id": "run-1",
    "span_id": "a1b2c3d4e5f60718",
    "parent_span_id": 77,
    "replica_id": 2,
    "blob_ref": None,
    "event_ts": 1767225600.25,
    "partition_key": ["cam", 1],
    "is_abort": False,
    "abort_origin": None,
    "abort_error": None,
}


def by_hand(version: int, fields: dict[str, Any], length: int | None = None) -> list[Any]:
    """The envelope array of the page: the version, then the fields in table order,
    missing ones at their defaults, cut to length elements when given."""
    array = [version] + [fields.get(name, DEFAULTS.get(name)) for name in LAYOUT[version]]
    return array if length is None else array[:length]


def expected(fields: dict[str, Any]) -> dict[str, Any]:
    """The plain dict the page says a reader returns: every v3 field, defaults for
    what was not sent."""
    return {name: fields.get(name, DEFAULTS.get(name)) for name in LAYOUT[3]}


def ext_payload(descr: Any, shape: list[int], data: bytes) -> bytes:
    """An ext 1 / ext 2 payload per the page: u32 LE header length, msgpack
    [descr, shape], raw C-order data."""
    header = pack([descr, shape])
    return struct.pack("<I", len(header)) + header + data


def decoded(data: bytes | bytearray) -> dict[str, Any]:
    """decode_envelope's result, checked against the reference's."""
    result = decode_envelope(data)
    reference = REFERENCE(data)
    assert result.keys() == reference.keys()
    for key, value in result.items():
        # Arrays nest anywhere; equal values with equal dtypes encode alike.
        assert type(value) is type(reference[key]), key
        assert encode_message(value) == encode_message(reference[key]), key
    return result


# --- envelope layouts ------------------------------------------------------------


def test_a_v3_envelope_built_by_hand_decodes_and_is_what_videoflow_writes() -> None:
    """All 19 elements, every field set: the page's v3 layout is the encoder's."""
    data = pack(by_hand(3, FULL))
    assert data[:3] == b"\xdc\x00\x13"  # array 16 of 19, as the page shows
    assert decoded(data) == expected(FULL)
    fields = {k: v for k, v in FULL.items() if k not in ("trace_id", "seq", "message")}
    assert encode_envelope(FULL["message"], trace_id=FULL["trace_id"], seq=FULL["seq"],
                           **fields) == data


def test_a_v1_envelope_built_by_hand_decodes_with_every_later_field_at_its_default() -> None:
    v1 = {k: FULL[k] for k in V1_FIELDS}
    data = pack(by_hand(1, v1))
    assert len(by_hand(1, v1)) == 6
    assert decoded(data) == expected(v1)


def test_a_v2_envelope_built_by_hand_decodes_with_the_v3_fields_at_their_defaults() -> None:
    v2 = {k: FULL[k] for k in V1_FIELDS + V2_FIELDS}
    v2["blob_ref"] = "mem:3"
    data = pack(by_hand(2, v2))
    assert len(by_hand(2, v2)) == 14
    assert decoded(data) == expected(v2)


@pytest.mark.parametrize(("version", "length"), [
    (version, length) for version in (2, 3) for length in range(6, len(LAYOUT[version]) + 1)])
def test_an_envelope_stopped_early_takes_the_defaults_of_what_it_left_off(
        version: int, length: int) -> None:
    """Every field after is_stop_signal has a default, so any cut from 6 elements to
    the version's full length is valid."""
    sent = {name: FULL[name] for name in LAYOUT[version][: length - 1]}
    assert decoded(pack(by_hand(version, FULL, length))) == expected(sent)


def test_the_shortest_envelope_on_the_page_decodes() -> None:
    data = bytes.fromhex("96 01 a1 74 01 c0 c0 c2")
    assert data == pack([1, "t", 1, None, None, False])
    assert decoded(data) == expected({"trace_id": "t", "seq": 1, "message": None,
                                      "metadata": None, "is_stop_signal": False})
    assert "`96 01 a1 74 01 c0 c0 c2`" in PAGE.read_text(encoding="utf-8")


def test_any_msgpack_form_of_a_value_is_accepted() -> None:
    """The page: array 16/32, any integer width, any ext container -- written byte by
    byte here, where msgspec would pick the smallest forms."""
    header = pack(["|u1", [2, 3]])
    payload = struct.pack("<I", len(header)) + header + bytes(range(6))
    data = b"".join([
        b"\xdd" + struct.pack(">I", 6),  # array 32 of 6
        b"\xcd\x00\x03",  # version 3 as uint 16
        b"\xd9\x01t",  # trace_id "t" as str 8
        b"\xcf" + struct.pack(">Q", 7),  # seq 7 as uint 64
        b"\xc9" + struct.pack(">I", len(payload)) + b"\x01" + payload,  # ext 32, type 1
        b"\xde\x00\x00",  # metadata: an empty map 16
        b"\xc2",
    ])
    result = decoded(data)
    assert result["seq"] == 7 and result["metadata"] == {}
    np.testing.assert_array_equal(result["message"],
                                  np.arange(6, dtype=np.uint8).reshape(2, 3), strict=True)


def test_an_int_event_ts_is_read_as_a_float() -> None:
    result = decoded(pack(by_hand(3, {**FULL, "event_ts": 1767225600})))
    assert result["event_ts"] == 1767225600.0 and type(result["event_ts"]) is float


@pytest.mark.parametrize(("array", "match"), [
    (by_hand(1, FULL) + [""], r"envelope v1 has 7 elements; its layout has at most 6"),
    (by_hand(2, FULL) + [None], r"envelope v2 has 15 elements; its layout has at most 14"),
    (by_hand(3, FULL) + [None], r"envelope v3 has 20 elements; its layout has at most 19"),
    (by_hand(3, FULL, 5), r"envelope v3 is missing required field\(s\) is_stop_signal"),
    ([4, *by_hand(3, FULL, 6)[1:]], r"unknown envelope version 4"),
    ([1.0, *by_hand(1, FULL)[1:]], r"unknown envelope version 1\.0"),
    (["3", *by_hand(3, FULL)[1:]], r"unknown envelope version '3'"),
    ([], r"non-empty msgpack array"),
    ([1, b"t", 1, None, None, False], r"field 'trace_id'"),
    ([1, "t", 1, None, None, 0], r"field 'is_stop_signal'"),
    ([1, "t", 1.0, None, None, False], r"field 'seq'"),
    ([1, "t", 1, None, [1], False], r"field 'metadata'"),
    (by_hand(3, {**FULL, "event_ts": True}), r"field 'event_ts'"),
    (by_hand(3, {**FULL, "replica_id": True}), r"field 'replica_id'"),
])
def test_the_reader_rejects_what_the_page_says_it_rejects(array: list[Any], match: str) -> None:
    data = pack(array)
    for decode in (decode_envelope, REFERENCE):
        with pytest.raises(WireError, match=match):
            decode(data)


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(WireError, match="trailing"):
        decode_envelope(pack(by_hand(1, FULL)) + b"\xc0")


# --- messages: the array extensions ----------------------------------------------

ARRAYS = {
    # name: (descr as the page spells it, shape, the array numpy would make of the data)
    "uint8 image 4x6x3": ("|u1", [4, 6, 3], np.arange(72, dtype=np.uint8).reshape(4, 6, 3)),
    "float32 vector": ("<f4", [5], np.array([0.5, -1.25, 3.0, 1e-3, 7.5], dtype=np.float32)),
    "int16 2-D": ("<i2", [3, 4], np.arange(-6, 6, dtype=np.int16).reshape(3, 4)),
    "big-endian float64": (">f8", [2], np.array([1.5, -2.0], dtype=">f8")),
    "bool": ("|b1", [3], np.array([True, False, True])),
    "empty float32": ("<f4", [0, 3], np.zeros((0, 3), dtype=np.float32)),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_an_array_built_by_hand_decodes_and_is_what_videoflow_writes(name: str) -> None:
    descr, shape, want = ARRAYS[name]
    raw = want.tobytes(order="C")  # the elements in C order, in descr's byte order
    data = pack(by_hand(3, {"trace_id": "t", "seq": 1,
                            "message": Ext(1, ext_payload(descr, shape, raw))}))
    array = decoded(data)["message"]
    assert isinstance(array, np.ndarray)
    assert array.dtype == np.dtype(descr) and array.dtype.str == descr
    assert array.shape == tuple(shape)
    np.testing.assert_array_equal(array, want, strict=True)
    assert not array.flags.writeable  # decoded from bytes: a read-only view
    assert encode_envelope(want, trace_id="t", seq=1) == data


def test_an_array_decoded_from_a_bytearray_is_a_writable_view_of_it() -> None:
    """Zero-copy, as the page says: a write to the received buffer shows in the array."""
    raw = bytes(range(6))
    buffer = bytearray(pack(by_hand(3, {"trace_id": "t", "seq": 1,
                                        "message": Ext(1, ext_payload("|u1", [2, 3], raw))})))
    array = decode_envelope(buffer)["message"]
    assert array.flags.writeable
    buffer[buffer.index(raw)] = 99
    assert array[0, 0] == 99


def test_a_fortran_order_array_travels_in_c_order() -> None:
    """The wire has no strides: the encoder writes a Fortran-order array's elements
    in C order, exactly as a foreign writer of the same values would."""
    values = np.arange(6, dtype=np.int16).reshape(2, 3)
    c_order = struct.pack("<6h", 0, 1, 2, 3, 4, 5)
    by_foreign_writer = pack(by_hand(3, {"trace_id": "t", "seq": 1,
                                         "message": Ext(1, ext_payload("<i2", [2, 3], c_order))}))
    assert encode_envelope(np.asfortranarray(values), trace_id="t", seq=1) == by_foreign_writer
    np.testing.assert_array_equal(decoded(by_foreign_writer)["message"], values, strict=True)


@pytest.mark.parametrize(("descr", "raw", "value"), [
    ("<f4", struct.pack("<f", 1.5), np.float32(1.5)),
    ("<i8", struct.pack("<q", -3), np.int64(-3)),
    ("|u1", b"\x07", np.uint8(7)),
])
def test_a_numpy_scalar_built_by_hand_decodes_and_is_what_videoflow_writes(
        descr: str, raw: bytes, value: np.generic) -> None:
    data = pack(by_hand(3, {"trace_id": "t", "seq": 1,
                            "message": Ext(2, ext_payload(descr, [], raw))}))
    scalar = decoded(data)["message"]
    assert type(scalar) is type(value) and scalar == value
    assert encode_envelope(value, trace_id="t", seq=1) == data


def test_arrays_nested_in_a_message_and_in_metadata_decode() -> None:
    image = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    boxes = np.array([[1.0, 2.0, 3.0, 4.0]], dtype="<f4")
    message = {"frame": Ext(1, ext_payload("|u1", [2, 4, 3], image.tobytes())),
               "boxes": [Ext(1, ext_payload("<f4", [1, 4], boxes.tobytes()))]}
    metadata = {"scale": Ext(2, ext_payload("<f8", [], struct.pack("<d", 0.5)))}
    result = decoded(pack(by_hand(3, {"trace_id": "t", "seq": 1, "message": message,
                                      "metadata": metadata})))
    np.testing.assert_array_equal(result["message"]["frame"], image, strict=True)
    np.testing.assert_array_equal(result["message"]["boxes"][0], boxes, strict=True)
    assert result["metadata"]["scale"] == np.float64(0.5)


def test_a_structured_dtype_built_by_hand_decodes() -> None:
    descr = {"names": ["id", "xy"], "formats": ["<i4", ["<f8", [2]]], "offsets": [0, 4],
             "itemsize": 20}
    raw = struct.pack("<i2d", 9, 1.0, 2.0)
    dtype = np.dtype({"names": ["id", "xy"], "formats": ["<i4", ("<f8", (2,))],
                      "offsets": [0, 4], "itemsize": 20})
    data = pack(by_hand(3, {"trace_id": "t", "seq": 1,
                            "message": Ext(1, ext_payload(descr, [1], raw))}))
    array = decoded(data)["message"]
    assert array.dtype == dtype and array["id"][0] == 9
    assert array["xy"][0].tolist() == [1.0, 2.0]
    assert encode_envelope(np.frombuffer(raw, dtype), trace_id="t", seq=1) == data


@pytest.mark.parametrize(("code", "payload", "match"), [
    (1, ext_payload("<u1", [2], b"ab"), r"'<u1' is not canonical \('\|u1'\)"),
    (1, ext_payload("u1", [2], b"ab"), r"unsupported dtype descriptor 'u1'"),
    (1, ext_payload("=i2", [1], b"ab"), r"unsupported dtype descriptor '=i2'"),
    (1, ext_payload("|O", [1], bytes(8)), r"unsupported dtype descriptor '\|O'"),
    (1, ext_payload("|u1", [2, 3], bytes(5)), r"needs 6 bytes, 5 present"),
    (1, ext_payload("|u1", [-1], b""), r"bad header"),
    (1, pack(["|u1", [2]])[:3], r"truncated"),
    (1, struct.pack("<I", 20) + pack(["|u1", [2]]) + b"ab", r"header claims 20 bytes"),
    (1, struct.pack("<I", 3) + pack(["|u1", [2]]) + b"ab", r"bad header"),
    (1, struct.pack("<I", 8) + pack(["|u1", [2], 0]) + b"ab", r"bad header"),
    (2, ext_payload("<f4", [1], bytes(4)), r"numpy scalar extension with shape \(1,\)"),
])
def test_the_reader_rejects_malformed_array_extensions(
        code: int, payload: bytes, match: str) -> None:
    data = pack([3, "t", 1, Ext(code, payload), None, False])
    for decode in (decode_envelope, REFERENCE):
        with pytest.raises(WireError, match=match):
            decode(data)


def test_other_extension_codes_pass_through() -> None:
    message = decoded(pack([3, "t", 1, Ext(5, b"ab"), None, False]))["message"]
    assert isinstance(message, Ext) and (message.code, message.data) == (5, b"ab")


def test_the_worked_example_on_the_page_is_what_videoflow_writes() -> None:
    """The hex dump under 'Worked example' on the page, byte for byte."""
    page = PAGE.read_text(encoding="utf-8")
    section = page.split("### Worked example", 1)[1]
    block = section.split("```", 2)[1]
    dumped = bytearray()
    for line in block.splitlines():
        for token in line.split():
            if re.fullmatch(r"[0-9a-f]{2}", token) is None:
                break
            dumped.append(int(token, 16))
    array = np.arange(6, dtype=np.uint8).reshape(2, 3)
    written = encode_envelope(array, trace_id="t", seq=1)
    assert bytes(dumped) == written and len(written) == 43
    assert written == pack(by_hand(3, {"trace_id": "t", "seq": 1, "message": Ext(
        1, ext_payload("|u1", [2, 3], bytes(range(6))))}))
    scalar = bytes.fromhex("c7 0e 02 06 00 00 00 92 a3 3c 66 34 90 00 00 c0 3f")
    assert scalar in encode_envelope(np.float32(1.5), trace_id="t", seq=1)
    assert "`c7 0e 02`" in page and "`92 a3 3c 66 34 90`" in page


# --- blob references and end markers ---------------------------------------------


def test_a_message_offloaded_by_hand_is_restored_from_its_blob_ref() -> None:
    """message nil plus blob_ref: the stored bytes are the message alone."""
    store = MemoryBlobStore()
    frame = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    ref = store.put(pack({"frame": Ext(1, ext_payload("|u1", [2, 2, 3], frame.tobytes()))}))
    envelope = decoded(pack(by_hand(3, {"trace_id": "t", "seq": 1, "message": None,
                                        "blob_ref": ref})))
    assert envelope["message"] is None and envelope["blob_ref"] == ref
    restored = restore_message(envelope["blob_ref"], store)
    np.testing.assert_array_equal(restored["frame"], frame, strict=True)


def end_marker_by_hand(node: str, replica: int, replicas: int, abort: bool) -> dict[str, Any]:
    """The end-marker table of the page, for a node of flow 'f', run 'r'."""
    return {
        "trace_id": f"{node}:end", "seq": replica, "message": None,
        "metadata": {"replicas": replicas}, "is_stop_signal": not abort,
        "producer_name": node, "flow_id": "f", "run_id": "r", "replica_id": replica,
        "is_abort": abort, "abort_origin": node if abort else None,
        "abort_error": {"type": "RuntimeError", "message": "boom"} if abort else None,
    }


@pytest.mark.parametrize("abort", [False, True], ids=["clean", "abort"])
def test_an_end_marker_built_by_hand_is_what_videoflow_writes(abort: bool) -> None:
    fields = end_marker_by_hand("cam", 1, 2, abort)
    data = pack(by_hand(3, fields))
    assert decoded(data) == expected(fields)
    error = RuntimeError("boom") if abort else None
    assert end_marker("cam", "f", "r", 1, 2, abort, error) == data
