"""The numpy extension of the wire format: how arrays and numpy scalars travel
inside a message (the msgpack extension types an envelope's message may hold).

Messages are any msgpack value, plus three extension types (their codes and the
codec registry: videoflow.wire.codecs):

- ext 3, a numpy ndarray encoded by a registered codec (codecs' docstring): built
  here from a node's codec choices (code_message), read back here into an array of
  the dtype and shape its header names;
- ext 1, numpy ndarray; ext 2, numpy scalar (a 0-d array that decodes to the
  scalar). Payload::

      u32 little-endian H | H bytes: msgpack [descr, shape] | raw data

  ``shape`` is an array of non-negative ints (empty for a scalar) and the raw data
  is exactly prod(shape) * itemsize bytes in C order. ``descr`` is either the
  canonical ``dtype.str`` of a plain dtype (kinds b i u f c m M S U V, e.g.
  '|u1', '>f8', '<M8[ns]', '<U5') -- the byte-order character is kept, so
  big-endian data round-trips as big-endian -- or, for a structured dtype, a map
  {"names": [str], "formats": [descr], "offsets": [int], "itemsize": int} whose
  formats may also be [descr, shape] for a subarray field. Object dtypes, and
  structured dtypes with titles, are refused at encode.

Decoding an array is zero-copy: it is ``np.frombuffer`` over the received buffer.
Arrays decoded from ``bytes`` are therefore read-only (copy one to write to it),
arrays decoded from a ``bytearray`` share and pin that buffer, and an array may be
unaligned (numpy handles that; copy it if a kernel needs alignment). Ext codes 1
to 3 are reserved; any other extension decodes to ``msgspec.msgpack.Ext``. An array
decoded from ext 3 is the codec's own, writable array.

enc_hook and ext_hook are the msgspec hooks every encoder and decoder of messages
(videoflow.wire.serialization, videoflow.wire.offload) is built with; the compiled
envelope decoder calls ext_hook for what it does not parse itself.
"""

from __future__ import annotations

import math
import re
import struct
import sys
import time
import warnings
from functools import lru_cache
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from videoflow.errors import CodecError, MissingDependency, WireError
from videoflow.wire import codecs
from videoflow.wire.codecs import EXT_CODED, EXT_NDARRAY, EXT_NPSCALAR, CodecChoice

__all__ = ["EXT_NDARRAY", "CodedArray", "array_parts", "code_message", "enc_hook",
           "ext_hook", "masked", "pack_array"]


_U32 = struct.Struct("<I")
_PLAIN_KINDS = frozenset("biufcmMSUV")
# The shape dtype.str always has; anything else is refused before numpy parses it.
_PLAIN_DESCR = re.compile(r"[<>|][biufcmMSUV]\d+(?:\[\w+\])?")
_MAX_DESCR_DEPTH = 8

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


_Shape = tuple[_NonNegative, ...]


class _StructuredDescr(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    names: list[str]
    # Each a descriptor in turn; msgspec cannot type that recursion through a union
    # of a Struct and a tuple, so _field_descr validates every entry as it is used.
    formats: list[Any]
    offsets: list[_NonNegative]
    itemsize: _NonNegative


# A field's format: plain, structured, or [descr, shape] for a subarray field.
_FieldDescr = Union[str, _StructuredDescr, tuple[Any, _Shape]]  # noqa: UP007 -- runtime value


class _ArrayHeader(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    descr: Union[str, _StructuredDescr]  # noqa: UP007 -- resolved by msgspec at runtime
    shape: _Shape


class _CodedHeader(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    codec: str
    descr: Union[str, _StructuredDescr]  # noqa: UP007 -- resolved by msgspec at runtime
    shape: _Shape


_header_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_ArrayHeader)
_coded_decoder = msgspec.msgpack.Decoder(_CodedHeader)


@lru_cache(maxsize=256)
def _plain_dtype(descr: str) -> np.dtype[Any]:
    """Parses a plain dtype descriptor read from the wire.

    Arguments:
        descr: a descriptor as ``dtype.str`` spells it.

    Returns:
        The dtype; cached, since a stream repeats a handful of them.

    Raises:
        WireError: if descr is not the canonical spelling of a plain dtype.
    """
    if _PLAIN_DESCR.fullmatch(descr) is None:
        raise WireError(f"array extension: unsupported dtype descriptor {descr!r}")
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError) as exc:
        raise WireError(f"array extension: bad dtype descriptor {descr!r}: {exc}") from exc
    if dtype.str != descr:
        raise WireError(
            f"array extension: dtype descriptor {descr!r} is not canonical ({dtype.str!r})"
        )
    return dtype


def _field_descr(obj: Any) -> Any:
    try:
        return msgspec.convert(obj, _FieldDescr)
    except msgspec.ValidationError as exc:
        raise WireError(f"array extension: bad field format in dtype descriptor: {exc}") from exc


def _dtype_from_descr(descr: Any, depth: int = 0) -> np.dtype[Any]:
    """Builds the dtype a wire descriptor names.

    Arguments:
        descr: a decoded descriptor (see the module docstring): str, _StructuredDescr
            or a (descr, shape) tuple.
        depth: nesting level, bounded so a hostile header cannot recurse deeply.

    Returns:
        The dtype.

    Raises:
        WireError: if the descriptor is malformed or names no valid dtype.
    """
    if isinstance(descr, str):
        return _plain_dtype(descr)
    if depth >= _MAX_DESCR_DEPTH:
        raise WireError("array extension: dtype descriptor nested too deeply")
    if isinstance(descr, tuple):
        base, shape = descr
        spec: Any = (_dtype_from_descr(_field_descr(base), depth + 1), shape)
    else:
        if not len(descr.names) == len(descr.formats) == len(descr.offsets):
            raise WireError("array extension: structured descriptor lists differ in length")
        spec = {
            "names": descr.names,
            "formats": [_dtype_from_descr(_field_descr(f), depth + 1) for f in descr.formats],
            "offsets": descr.offsets,
            "itemsize": descr.itemsize,
        }
    try:
        # numpy may warn about odd but legal specs; from the wire, treat that as bad.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return np.dtype(spec)
    except (TypeError, ValueError, OverflowError, Warning) as exc:
        raise WireError(f"array extension: bad structured dtype: {exc}") from exc


def _descr_for(dtype: np.dtype[Any]) -> str | dict[str, Any] | list[Any]:
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return [_descr_for(base), list(shape)]
    if dtype.names is not None:
        fields = dtype.fields
        assert fields is not None  # names and fields come together
        formats: list[Any] = []
        offsets: list[int] = []
        for name in dtype.names:
            field = fields[name]
            if len(field) > 2:
                raise TypeError(f"cannot encode structured dtype with field titles: {dtype}")
            formats.append(_descr_for(field[0]))
            offsets.append(field[1])
        return {
            "names": list(dtype.names),
            "formats": formats,
            "offsets": offsets,
            "itemsize": dtype.itemsize,
        }
    if dtype.kind not in _PLAIN_KINDS:
        raise TypeError(f"cannot encode numpy dtype {dtype} (kind {dtype.kind!r}) in an envelope")
    return dtype.str


@lru_cache(maxsize=256)
def _checked_descr(dtype: np.dtype[Any]) -> str | dict[str, Any]:
    """Describes a dtype for the wire, proving the description round-trips.

    Arguments:
        dtype: the dtype of an array being encoded.

    Returns:
        The descriptor (cached per dtype, so the proof runs once).

    Raises:
        TypeError: if the dtype holds objects, has titles, or would not come back equal.
    """
    if dtype.hasobject:
        raise TypeError(f"cannot encode numpy arrays of object dtype ({dtype}) in an envelope")
    descr = _descr_for(dtype)
    try:
        wire = _header_decoder.decode(_header_encoder.encode((descr, ())))
        back = _dtype_from_descr(wire.descr)
    except (WireError, msgspec.DecodeError) as exc:
        raise TypeError(f"numpy dtype {dtype} does not survive the wire: {exc}") from exc
    if back != dtype:
        raise TypeError(f"numpy dtype {dtype} does not survive the wire (reads back as {back})")
    assert not isinstance(descr, list)  # subarray dtypes only occur as fields
    return descr


def pack_array(array: np.ndarray[Any, Any]) -> bytes:
    head, raw = array_parts(array)
    return head if raw is None else b"".join((head, raw.data))


def array_parts(array: np.ndarray[Any, Any]) -> tuple[bytes, np.ndarray[Any, Any] | None]:
    """An array's ext 1/2 payload in two parts, not joined: its head (the u32 length
    and the [descr, shape] header) and its raw data as a flat C-ordered uint8 array
    (the array's own memory when it is C-contiguous; None when it holds no bytes).

    Raises:
        TypeError: a dtype the wire cannot carry.
    """
    descr = _checked_descr(array.dtype)
    header = _header_encoder.encode((descr, array.shape))
    head = _U32.pack(len(header)) + header
    if array.nbytes == 0:
        return head, None
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    # A flat uint8 view exports a plain byte buffer even for dtypes (datetime,
    # structured) that refuse the buffer protocol themselves.
    return head, array.reshape(-1).view(np.uint8)


def masked(array: np.ndarray[Any, Any]) -> bool:
    """Whether array is a numpy masked array, which the wire refuses (its mask would be
    lost), without importing numpy.ma: numpy loads it on first touch, 90 ms, which made
    a camera's first frame three frame periods late. An array can only be masked once
    something has imported numpy.ma."""
    if type(array) is np.ndarray:
        return False
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(array, ma.MaskedArray)


def _read_header(data: memoryview, decoder: msgspec.msgpack.Decoder[Any], what: str,
                 ) -> tuple[Any, int]:
    """An extension payload's header (u32 length, then msgpack), decoded, and where the
    data after it starts.

    Raises:
        WireError: the payload is too short for its header, or the header is malformed.
    """
    size = len(data)
    if size < 4:
        raise WireError(f"{what} truncated: {size} bytes, header length needs 4")
    (header_len,) = _U32.unpack_from(data)
    if 4 + header_len > size:
        raise WireError(
            f"{what} truncated: header claims {header_len} bytes, {size - 4} present")
    try:
        return decoder.decode(data[4:4 + header_len]), 4 + header_len
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise WireError(f"{what}: bad header: {exc}") from exc


def _unpack_array(data: memoryview) -> np.ndarray[Any, Any]:
    size = len(data)
    header, start = _read_header(data, _header_decoder, "array extension")
    dtype = _dtype_from_descr(header.descr)
    if dtype.subdtype is not None:
        raise WireError("array extension: top-level subarray dtype")
    shape = header.shape
    count = math.prod(shape)
    if count * dtype.itemsize != size - start:
        raise WireError(
            f"array extension: shape {shape} of {dtype} needs {count * dtype.itemsize} bytes, "
            f"{size - start} present"
        )
    try:
        if dtype.itemsize == 0:
            # frombuffer cannot view zero-width items; there is no data to share.
            return np.empty(shape, dtype)
        return np.frombuffer(data, dtype, count, start).reshape(shape)
    except (ValueError, TypeError, MemoryError) as exc:
        raise WireError(f"array extension: cannot build {dtype} array {shape}: {exc}") from exc


class CodedArray:
    """An array a codec encoded, standing in for it in a message until it is encoded
    (enc_hook writes it as ext 3)."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


def pack_coded(array: np.ndarray[Any, Any], choice: CodecChoice) -> bytes:
    """array's ext 3 payload, encoded by the codec chosen (one whose takes accepted
    it), counted in the codec's counts.

    Raises:
        TypeError: a dtype the wire cannot carry.
    """
    descr = _checked_descr(array.dtype)
    started = time.perf_counter()
    data = choice.codec.encode(array, choice.options)
    header = _header_encoder.encode((choice.name, descr, array.shape))
    codecs.count_encoded(choice.name, array.nbytes, len(data), started)
    return _U32.pack(len(header)) + header + data


def code_message(message: Any, choices: tuple[CodecChoice, ...]) -> Any:
    """message with each array in it (in its dicts, lists and tuples) of
    MIN_CODED_BYTES or more that one of choices takes replaced by a CodedArray, the
    first that takes it encoding it; message itself when none is. The message is not
    changed in place."""
    if isinstance(message, np.ndarray):
        if message.nbytes < codecs.MIN_CODED_BYTES or masked(message):
            return message
        for choice in choices:
            if choice.codec.takes(message):
                return CodedArray(pack_coded(message, choice))
        return message
    if isinstance(message, dict):
        coded = {key: code_message(value, choices) for key, value in message.items()}
        return coded if any(coded[k] is not v for k, v in message.items()) else message
    if isinstance(message, (list, tuple)) and not hasattr(message, "_fields"):
        items = [code_message(value, choices) for value in message]
        if all(a is b for a, b in zip(items, message, strict=True)):
            return message
        return items if isinstance(message, list) else tuple(items)
    return message


def _unpack_coded(data: memoryview) -> np.ndarray[Any, Any]:
    header, start = _read_header(data, _coded_decoder, "coded array extension")
    dtype = _dtype_from_descr(header.descr)
    shape = header.shape
    try:
        codec = codecs.require(header.codec)
    except (ValueError, MissingDependency) as exc:
        raise CodecError(f"coded array extension: cannot read codec {header.codec!r} "
                         f"here: {exc}") from exc
    started = time.perf_counter()
    try:
        array = codec.decode(data[start:], dtype, shape)
    except Exception as exc:  # whatever the codec's library raises for bad bytes
        raise CodecError(f"coded array extension: codec {header.codec!r} could not "
                         f"decode its bytes: {exc!r}") from exc
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != shape:
        got = (getattr(array, "dtype", type(array).__name__), getattr(array, "shape", None))
        raise CodecError(f"coded array extension: codec {header.codec!r} decoded "
                        f"{got[0]} {got[1]}, the header names {dtype} {shape}")
    codecs.count_decoded(header.codec, started)
    return array


def enc_hook(obj: Any) -> Any:
    if type(obj) is CodedArray:
        return msgspec.msgpack.Ext(EXT_CODED, obj.payload)
    if isinstance(obj, np.ndarray):
        if masked(obj):
            # Its mask would be silently dropped.
            raise TypeError("cannot encode numpy masked arrays in an envelope")
        return msgspec.msgpack.Ext(EXT_NDARRAY, pack_array(np.asarray(obj)))
    if isinstance(obj, np.generic):
        return msgspec.msgpack.Ext(EXT_NPSCALAR, pack_array(np.asarray(obj)))
    raise TypeError(f"cannot encode objects of type {type(obj).__qualname__} in an envelope")


def ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_NDARRAY:
        return _unpack_array(data)
    if code == EXT_NPSCALAR:
        array = _unpack_array(data)
        if array.ndim != 0:
            raise WireError(f"numpy scalar extension with shape {array.shape}")
        return array[()]
    if code == EXT_CODED:
        return _unpack_coded(data)
    return msgspec.msgpack.Ext(code, bytes(data))
