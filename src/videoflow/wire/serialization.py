"""Envelope encoding: the bytes that travel on every edge of a flow.

An envelope is one msgpack array whose first element is the wire version. Encode
always writes the newest version (3); decode reads every version and returns the
same plain dict for all of them, filling what an older writer did not send with
the defaults below. Bytes that are not a valid envelope raise ``WireError`` -- the
messenger counts them as undecodable -- and never any other exception.

Envelope layout (msgpack array; index: field, msgpack type)::

    v1  [0] 1                      version tag
        [1] trace_id               str
        [2] seq                    int
        [3] message                any (see "Messages" below)
        [4] metadata               map | nil
        [5] is_stop_signal         bool
    v2  [0] 2, [1]-[5] as v1, then
        [6] type                   str          default ''
        [7] producer_name          str          default ''
        [8] flow_id                str          default ''
        [9] run_id                 str          default ''
        [10] span_id               any          default nil
        [11] parent_span_id        any          default nil
        [12] replica_id            int          default 0
        [13] blob_ref              str | nil    default nil
    v3  [0] 3, [1]-[13] as v2, then
        [14] event_ts              float | int | nil   default nil (read as float)
        [15] partition_key         any          default nil
        [16] is_abort              bool         default false
        [17] abort_origin          str | nil    default nil
        [18] abort_error           any          default nil

The five v1 fields are required in every version. A field a version added has a
default and comes after every older field, so a reader also accepts an array that
stops early within its version's added fields (they take their defaults); an
array longer than its version's layout, or a version tag other than 1-3, is
rejected. Encode writes all 19 elements.

Messages are any msgpack value, plus two extension types:

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
and 2 are reserved; any other extension decodes to ``msgspec.msgpack.Ext``.

The envelope is defined by the msgspec Structs below; encode and the reference
decode are msgspec. ``decode_envelope`` is by default a compiled accelerator
(``videoflow.wire._envelope``, built from csrc/) that parses the bytes straight into
the result dict, where msgspec's typed decode plus ``asdict`` costs about twice as
much. It is proven equal to the reference on every input it accepts -- values,
value types and zero-copy arrays (tests/unit/test_wire_compiled.py) -- and defers
to the reference on anything else, so every error and odd case is the reference's.
``VIDEOFLOW_PURE_PYTHON=1`` selects the reference alone; otherwise a missing
compiled module is an ImportError, never a silent slow fallback.

A payload too large to travel inline can be put in a ``BlobStore`` instead: the
envelope then carries ``message=None`` and ``blob_ref`` (see ``offload_message``
and ``restore_message``).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import struct
import threading
import warnings
from functools import lru_cache
from types import ModuleType
from typing import Annotated, Any, Protocol, Union, runtime_checkable

import msgspec
import numpy as np

from videoflow.errors import WireError
from videoflow.native import PURE_PYTHON, not_built

__all__ = [
    "ENVELOPE_VERSION",
    "BlobStore",
    "MemoryBlobStore",
    "OutputEncoder",
    "WireError",
    "decode_envelope",
    "encode_envelope",
    "decode_message",
    "encode_message",
    "offload_message",
    "restore_message",
]

ENVELOPE_VERSION = 3
"""The version encode_envelope writes."""

_EXT_NDARRAY = 1
_EXT_NPSCALAR = 2

# The envelope structs. array_like puts the tag (the version) first and the fields
# after it in declaration order, so each subclass appends its fields to its
# parent's layout -- exactly the schema evolution the module docstring describes.
# gc=False: an envelope is converted to a dict at once and never forms a cycle.


class _EnvelopeV1(
    msgspec.Struct,
    array_like=True,
    frozen=True,
    gc=False,
    forbid_unknown_fields=True,
    tag=1,
    # The default tag field is "type", which v2 uses as a field; with array_like the
    # tag field's name never reaches the wire.
    tag_field="version",
):
    trace_id: str
    seq: int
    message: Any
    metadata: dict[Any, Any] | None
    is_stop_signal: bool


class _EnvelopeV2(_EnvelopeV1, frozen=True, tag=2):
    type: str = ""
    producer_name: str = ""
    flow_id: str = ""
    run_id: str = ""
    span_id: Any = None
    parent_span_id: Any = None
    replica_id: int = 0
    blob_ref: str | None = None


class _EnvelopeV3(_EnvelopeV2, frozen=True, tag=3):
    event_ts: float | None = None
    partition_key: Any = None
    is_abort: bool = False
    abort_origin: str | None = None
    abort_error: Any = None


_VERSIONS: dict[int, type[_EnvelopeV1]] = {1: _EnvelopeV1, 2: _EnvelopeV2, 3: _EnvelopeV3}

_V1_FIELDS = frozenset(_EnvelopeV1.__struct_fields__)
_V2_FIELDS = frozenset(_EnvelopeV2.__struct_fields__)
_V3_DEFAULTS: dict[str, Any] = {
    name: default
    for name, default in zip(
        _EnvelopeV3.__struct_fields__[len(_V1_FIELDS) :],
        _EnvelopeV3.__struct_defaults__,
        strict=True,
    )
}
# What decode adds to an older version's dict. Every default is immutable, so one
# shared mapping per version is safe to copy into every result.
_MISSING_DEFAULTS: dict[type[_EnvelopeV1], dict[str, Any]] = {
    _EnvelopeV1: dict(_V3_DEFAULTS),
    _EnvelopeV2: {k: v for k, v in _V3_DEFAULTS.items() if k not in _V2_FIELDS},
}

_NONE = type(None)
# Accepted Python types per optional field for encode_envelope; None accepts any
# msgpack-able value (the fields the reference types as Any).
_FIELD_TYPES: dict[str, tuple[type, ...] | None] = {
    "metadata": (dict, _NONE),
    "is_stop_signal": (bool,),
    "type": (str,),
    "producer_name": (str,),
    "flow_id": (str,),
    "run_id": (str,),
    "span_id": None,
    "parent_span_id": None,
    "replica_id": (int,),
    "blob_ref": (str, _NONE),
    "event_ts": (float, int, _NONE),
    "partition_key": None,
    "is_abort": (bool,),
    "abort_origin": (str, _NONE),
    "abort_error": None,
}
# bool is an int subclass, but msgpack writes it as true/false, which an int field
# then rejects on every reader; refuse it where only a number is meant.
_NUMBER_ONLY = frozenset({"replica_id", "event_ts"})


# --- numpy extension -------------------------------------------------------------

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


_header_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_ArrayHeader)


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


def _pack_array(array: np.ndarray[Any, Any]) -> bytes:
    descr = _checked_descr(array.dtype)
    header = _header_encoder.encode((descr, array.shape))
    if array.nbytes == 0:
        return _U32.pack(len(header)) + header
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    # A flat uint8 view exports a plain byte buffer even for dtypes (datetime,
    # structured) that refuse the buffer protocol themselves.
    flat = array.reshape(-1).view(np.uint8).data
    return b"".join((_U32.pack(len(header)), header, flat))


def _unpack_array(data: memoryview) -> np.ndarray[Any, Any]:
    size = len(data)
    if size < 4:
        raise WireError(f"array extension truncated: {size} bytes, header length needs 4")
    (header_len,) = _U32.unpack_from(data)
    start = 4 + header_len
    if start > size:
        raise WireError(
            f"array extension truncated: header claims {header_len} bytes, {size - 4} present"
        )
    try:
        header = _header_decoder.decode(data[4:start])
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise WireError(f"array extension: bad header: {exc}") from exc
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


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if isinstance(obj, np.ma.MaskedArray):
            # Its mask would be silently dropped.
            raise TypeError("cannot encode numpy masked arrays in an envelope")
        return msgspec.msgpack.Ext(_EXT_NDARRAY, _pack_array(np.asarray(obj)))
    if isinstance(obj, np.generic):
        return msgspec.msgpack.Ext(_EXT_NPSCALAR, _pack_array(np.asarray(obj)))
    raise TypeError(f"cannot encode objects of type {type(obj).__qualname__} in an envelope")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _EXT_NDARRAY:
        return _unpack_array(data)
    if code == _EXT_NPSCALAR:
        array = _unpack_array(data)
        if array.ndim != 0:
            raise WireError(f"numpy scalar extension with shape {array.shape}")
        return array[()]
    return msgspec.msgpack.Ext(code, bytes(data))


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_envelope_decoder = msgspec.msgpack.Decoder(
    Union[_EnvelopeV1, _EnvelopeV2, _EnvelopeV3],  # noqa: UP007 -- a runtime type value
    ext_hook=_ext_hook,
)
_decode_struct = _envelope_decoder.decode  # bound once: decode_envelope is the hot path
_payload_decoder = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
# Used only to explain a rejected envelope; without ext_hook so it cannot fail on an
# array the typed decode never reached.
_raw_decoder = msgspec.msgpack.Decoder()
_asdict = msgspec.structs.asdict
# msgspec names a position, not a field; these recover which one for the message.
_FIELD_AT = re.compile(r"at `\$\[(\d+)\]")
_TOO_SHORT = re.compile(r"Expected `array` of at least length \d+, got (\d+)")
_TOO_LONG = re.compile(r"Expected `array` of at most length \d+")


# --- envelopes -------------------------------------------------------------------


def encode_envelope(message: Any, *, trace_id: str, seq: int, **fields: Any) -> bytes:
    """Encodes one envelope at the current wire version.

    Arguments:
        message: the payload: any msgpack-able value, bytes, numpy arrays and
            scalars, nested anywhere; None when the payload travels in a blob store.
        trace_id: the originating message's trace id.
        seq: the message's sequence number.
        **fields: any other envelope field by name (metadata, is_stop_signal, type,
            producer_name, flow_id, run_id, span_id, parent_span_id, replica_id,
            blob_ref, event_ts, partition_key, is_abort, abort_origin, abort_error);
            omitted ones take their defaults.

    Returns:
        The msgpack bytes of a v3 envelope.

    Raises:
        TypeError: if a field name is unknown or a field has the wrong type, or if
            the message holds something msgpack cannot carry (object arrays,
            masked arrays, arbitrary objects) -- caller bugs, not wire errors.
        OverflowError: if an int in the envelope is outside msgpack's range
            (-2**63 to 2**64 - 1).
    """
    if trace_id.__class__ is not str:
        raise TypeError(f"envelope field 'trace_id' must be str, got {type(trace_id).__name__}")
    if seq.__class__ is not int and (isinstance(seq, bool) or not isinstance(seq, int)):
        raise TypeError(f"envelope field 'seq' must be int, got {type(seq).__name__}")
    for name, value in fields.items():
        try:
            accepted = _FIELD_TYPES[name]
        except KeyError:
            raise TypeError(f"unknown envelope field {name!r}") from None
        if accepted is None:
            continue
        if not isinstance(value, accepted) or (value.__class__ is bool and name in _NUMBER_ONLY):
            wanted = " | ".join("None" if t is _NONE else t.__name__ for t in accepted)
            raise TypeError(f"envelope field {name!r} must be {wanted}, got {type(value).__name__}")
    metadata = fields.pop("metadata", None)
    is_stop_signal = fields.pop("is_stop_signal", False)
    return _encoder.encode(_EnvelopeV3(trace_id, seq, message, metadata, is_stop_signal, **fields))


class OutputEncoder:
    """Encodes one node replica's data envelopes, as encode_envelope would: the
    fields every output of the replica shares are checked once, here, and only the
    ones that change are checked per output (a producer encodes tens of thousands a
    second, and the checks were most of encode_envelope's time).

    Arguments:
        producer_name / flow_id / run_id / replica_id: as encode_envelope's fields.

    Raises:
        TypeError: a field has the wrong type (as encode_envelope).
    """

    __slots__ = ("_fixed",)

    def __init__(self, *, producer_name: str, flow_id: str, run_id: str,
                 replica_id: int) -> None:
        fixed: dict[str, Any] = dict(producer_name=producer_name, flow_id=flow_id,
                                     run_id=run_id, replica_id=replica_id)
        encode_envelope(None, trace_id="", seq=0, **fixed)  # the same checks, once
        self._fixed = fixed

    def encode(self, message: Any, trace_id: str, seq: int,
               metadata: dict[str, Any] | None = None, event_ts: float | None = None,
               partition_key: Any = None, blob_ref: str | None = None) -> bytes:
        """The msgpack bytes of a v3 data envelope carrying message (None when the
        payload travels by ref, blob_ref).

        Raises:
            TypeError / OverflowError: as encode_envelope.
        """
        if (trace_id.__class__ is not str or seq.__class__ is not int
                or (metadata is not None and metadata.__class__ is not dict)
                or (event_ts is not None and event_ts.__class__ is not float)
                or (blob_ref is not None and blob_ref.__class__ is not str)):
            # The unusual cases (subclasses, ints as times, wrong types) take the
            # checked path, which accepts or refuses them exactly as it always has.
            return encode_envelope(message, trace_id=trace_id, seq=seq, metadata=metadata,
                                   event_ts=event_ts, partition_key=partition_key,
                                   blob_ref=blob_ref, **self._fixed)
        return _encoder.encode(_EnvelopeV3(trace_id, seq, message, metadata, False,
                                           event_ts=event_ts, partition_key=partition_key,
                                           blob_ref=blob_ref, **self._fixed))


def decode_envelope(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decodes an envelope of any known wire version into a plain dict.

    Arguments:
        data: the received bytes. Arrays in the message are views of this buffer
            (zero-copy): read-only for bytes, writable and sharing it otherwise.

    Returns:
        A dict with every v3 key -- trace_id, seq, message, metadata,
        is_stop_signal, type, producer_name, flow_id, run_id, span_id,
        parent_span_id, replica_id, blob_ref, event_ts, partition_key, is_abort,
        abort_origin, abort_error -- older versions' missing ones at their defaults.

    Raises:
        WireError: if data is not a valid envelope (truncated, not msgpack, a field
            missing or mistyped, an unknown version, a malformed array extension).
        TypeError: if data is not a bytes-like object.
    """
    try:
        envelope = _decode_struct(data)
    except msgspec.DecodeError as exc:
        raise WireError(_explain(data, exc)) from exc
    except UnicodeDecodeError as exc:
        # msgspec reports a str that is not UTF-8 this way, not as a DecodeError.
        raise WireError(f"undecodable envelope: a string is not UTF-8: {exc}") from exc
    except (TypeError, RecursionError) as exc:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"decode_envelope needs bytes, bytearray or memoryview, got {type(data).__name__}"
            ) from None
        # msgpack map keys that Python cannot hash, or nesting deeper than the stack.
        raise WireError(f"undecodable envelope: {exc}") from exc
    decoded = _asdict(envelope)
    if envelope.__class__ is not _EnvelopeV3:
        decoded.update(_MISSING_DEFAULTS[envelope.__class__])
    return decoded


def _explain(data: bytes | bytearray | memoryview, exc: msgspec.DecodeError) -> str:
    """Says what is wrong with bytes the envelope decoder rejected.

    Arguments:
        data: the rejected bytes.
        exc: msgspec's error, whose text names a position rather than a field.

    Returns:
        A message naming the version or field at fault where that can be found.
    """
    detail = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return f"undecodable envelope: {detail}"
    try:
        raw = _raw_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, TypeError, RecursionError) as raw_exc:
        # Not even msgpack (e.g. trailing bytes the typed decode never reached).
        return f"undecodable envelope: {raw_exc}"
    if not isinstance(raw, list) or not raw:
        return f"envelope must be a non-empty msgpack array, got {type(raw).__name__}: {detail}"
    version = raw[0]
    if version.__class__ is not int or version not in _VERSIONS:
        known = ", ".join(str(v) for v in _VERSIONS)
        return f"unknown envelope version {version!r} (this reader knows {known})"
    names = _VERSIONS[version].__struct_fields__
    short = _TOO_SHORT.search(detail)
    if short is not None:
        missing = names[int(short.group(1)) - 1 : len(_V1_FIELDS)]
        return f"envelope v{version} is missing required field(s) {', '.join(missing)}"
    if _TOO_LONG.search(detail) is not None:
        return (
            f"envelope v{version} has {len(raw)} elements; its layout has at most {len(names) + 1}"
        )
    where = _FIELD_AT.search(detail)
    if where is not None and 1 <= int(where.group(1)) <= len(names):
        return f"invalid envelope v{version} field {names[int(where.group(1)) - 1]!r}: {detail}"
    return f"invalid envelope v{version}: {detail}"


# --- compiled decoder ------------------------------------------------------------


def _load_compiled() -> ModuleType | None:
    """Imports the compiled envelope decoder, unless VIDEOFLOW_PURE_PYTHON=1.

    Returns:
        The module videoflow.wire._envelope, or None for the reference alone.

    Raises:
        ImportError: if the compiled decoder is not built; a silent fallback to the
            reference would hide a broken build behind a slower, passing decoder.
    """
    if PURE_PYTHON:
        return None
    try:
        from videoflow.wire import _envelope
    except ImportError as exc:
        raise not_built("envelope decoder", "decode with the msgspec reference alone") from exc
    return _envelope


_compiled = _load_compiled()
DECODER_KIND: str = "reference" if _compiled is None else "compiled"
"""Which envelope decoder this process loaded: 'compiled' or 'reference'."""

# The msgspec decode_envelope above defines the result; the compiled decoder
# defers to it for every input it does not fully understand.
_reference_decode_envelope = decode_envelope
if _compiled is not None:
    # Same name, docstring and signature (via __wrapped__) as the reference; a
    # compiled function, so the common case pays no Python frame.
    decode_envelope = functools.update_wrapper(
        _compiled.compose_decode_envelope(
            _compiled.EnvelopeDecoder(
                _EnvelopeV3.__struct_fields__, tuple(_V3_DEFAULTS.values()), _ext_hook
            ),
            _reference_decode_envelope,
        ),
        _reference_decode_envelope,
    )


# --- blob offload ----------------------------------------------------------------


@runtime_checkable
class BlobStore(Protocol):
    """Somewhere to keep payloads too large to travel inline in an envelope."""

    def put(self, data: bytes) -> str:
        """Stores a payload.

        Arguments:
            data: the payload bytes.

        Returns:
            A reference an envelope carries as blob_ref.
        """
        ...

    def get(self, ref: str) -> bytes:
        """Fetches a stored payload.

        Arguments:
            ref: a reference put returned.

        Returns:
            The payload bytes.

        Raises:
            KeyError: if ref is unknown (never stored, or deleted).
        """
        ...

    def delete(self, ref: str) -> None:
        """Drops a stored payload; deleting an unknown ref is not an error, so
        reclamation may safely run twice.

        Arguments:
            ref: a reference put returned.
        """
        ...


class MemoryBlobStore:
    """A BlobStore in this process's memory, for tests and single-process flows."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def put(self, data: bytes) -> str:
        """Stores a payload.

        Arguments:
            data: the payload bytes (copied, so a later change to a bytearray does
                not reach the store).

        Returns:
            A new reference, unique within this store.
        """
        blob = bytes(data)
        with self._lock:
            ref = f"mem:{next(self._ids)}"
            self._blobs[ref] = blob
        return ref

    def get(self, ref: str) -> bytes:
        """Fetches a stored payload.

        Arguments:
            ref: a reference put returned.

        Returns:
            The payload bytes.

        Raises:
            KeyError: if ref is unknown.
        """
        with self._lock:
            try:
                return self._blobs[ref]
            except KeyError:
                raise KeyError(f"unknown blob ref {ref!r}") from None

    def delete(self, ref: str) -> None:
        """Drops a stored payload, if present.

        Arguments:
            ref: a reference put returned.
        """
        with self._lock:
            self._blobs.pop(ref, None)

    def __len__(self) -> int:
        return len(self._blobs)


def encode_message(message: Any) -> bytes:
    """Encodes a message on its own, as offload_message stores it, for a store whose put
    takes more than the bytes (an obligation-keeping PayloadStore); restore_message
    reads it back.

    Raises:
        TypeError: if the message holds something msgpack cannot carry.
    """
    return _encoder.encode(message)


def offload_message(message: Any, store: BlobStore) -> str:
    """Encodes a message on its own and puts it in a blob store.

    Send the envelope with ``message=None`` and ``blob_ref`` set to the result.

    Arguments:
        message: anything encode_envelope accepts as a message.
        store: where to put it.

    Returns:
        The store's reference for the payload.

    Raises:
        TypeError: if the message holds something msgpack cannot carry.
    """
    return store.put(_encoder.encode(message))


def restore_message(ref: str, store: BlobStore) -> Any:
    """Fetches and decodes a message offload_message stored.

    Arguments:
        ref: the envelope's blob_ref.
        store: the store it was put in.

    Returns:
        The message; arrays in it are zero-copy views of the stored bytes.

    Raises:
        KeyError: if the store does not know ref.
        WireError: if the stored bytes do not decode.
    """
    return decode_message(store.get(ref), what=f"offloaded payload {ref!r}")


def decode_message(data: bytes | bytearray | memoryview, what: str = "message") -> Any:
    """Decodes a message encode_message wrote.

    Arguments:
        data: the bytes; arrays in the message are zero-copy views of them.
        what: names the bytes in an error.

    Raises:
        WireError: if the bytes do not decode.
    """
    try:
        return _payload_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, TypeError, RecursionError) as exc:
        # UnicodeDecodeError: a str that is not UTF-8; TypeError: an unhashable map key.
        raise WireError(f"undecodable {what}: {exc}") from exc
