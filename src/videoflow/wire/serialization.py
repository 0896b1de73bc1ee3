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

Messages are any msgpack value, plus two extension types for numpy arrays and
scalars (ext 1 and 2), decoded zero-copy; their format is in
videoflow.wire.numpy_ext.

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
and ``restore_message``, defined in videoflow.wire.offload and re-exported here,
the path the API reference gives).
"""

from __future__ import annotations

import functools
import re
from types import ModuleType
from typing import Any, Union

import msgspec

from videoflow.errors import WireError
from videoflow.native import PURE_PYTHON, not_built

# The numpy extension's hooks under this module's names: the compiled decoder's tests
# build its EnvelopeDecoder and its array payloads through this module, as it does.
from videoflow.wire.codecs import EXT_CODES
from videoflow.wire.numpy_ext import enc_hook, ext_hook
from videoflow.wire.offload import (
    BlobStore,
    MemoryBlobStore,
    decode_message,
    encode_joined,
    encode_message,
    holds_large_array,
    offload_message,
    restore_message,
)

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


_encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_envelope_decoder = msgspec.msgpack.Decoder(
    Union[_EnvelopeV1, _EnvelopeV2, _EnvelopeV3],  # noqa: UP007 -- a runtime type value
    ext_hook=ext_hook,
)
_decode_struct = _envelope_decoder.decode  # bound once: decode_envelope is the hot path
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
            # checked path, which accepts or refuses them as encode_envelope does.
            return encode_envelope(message, trace_id=trace_id, seq=seq, metadata=metadata,
                                   event_ts=event_ts, partition_key=partition_key,
                                   blob_ref=blob_ref, **self._fixed)
        envelope = _EnvelopeV3(trace_id, seq, message, metadata, False, event_ts=event_ts,
                               partition_key=partition_key, blob_ref=blob_ref,
                               **self._fixed)
        if holds_large_array(message):  # a frame: copied once, not twice
            return encode_joined(envelope)
        return _encoder.encode(envelope)


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
                _EnvelopeV3.__struct_fields__, tuple(_V3_DEFAULTS.values()), ext_hook,
                EXT_CODES,
            ),
            _reference_decode_envelope,
        ),
        _reference_decode_envelope,
    )
