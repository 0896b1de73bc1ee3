"""Messages on their own, apart from an envelope: the counter BlobStore a payload too
large to travel inline is put in, and the message codec it is stored with.

The envelope then carries ``message=None`` and ``blob_ref`` (see ``offload_message``
and ``restore_message``). ``encode_message`` / ``decode_message`` are the same codec
for a store whose put takes more than the bytes (an obligation-keeping PayloadStore,
videoflow.backends.payload). Messages carry numpy arrays and scalars as the wire's
extension types (videoflow.wire.numpy_ext). Every name here is re-exported by
videoflow.wire.serialization, the path the API reference gives.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import msgspec
import numpy as np

from videoflow.errors import WireError
from videoflow.wire.codecs import EXT_NDARRAY
from videoflow.wire.numpy_ext import array_parts, enc_hook, ext_hook, masked

__all__ = [
    "GATHER_ABOVE_BYTES",
    "BlobStore",
    "GatheredMessage",
    "MemoryBlobStore",
    "decode_message",
    "encode_joined",
    "encode_message",
    "gather_message",
    "holds_large_array",
    "offload_message",
    "restore_message",
]

# One encoder and decoder for messages alone, with the numpy extension hooks.
_encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_payload_decoder = msgspec.msgpack.Decoder(ext_hook=ext_hook)


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


GATHER_ABOVE_BYTES: Final = 64 * 1024
"""Arrays from this size on stay out of gather_message's encoding, pieces of their own.
msgpack writes their extension with a 32-bit length (ext 32) from 64 KiB on."""

_EXT32: Final = struct.Struct(">BIb")  # its code, the length, the type
_EXT32_CODE: Final = 0xC9
_FIXEXT16: Final = 0xD8


@dataclass(frozen=True)
class GatheredMessage:
    """A message encoded as encode_message encodes it, left in pieces: the encoding's
    own bytes between its large arrays, and each array's raw data as the array's own
    memory, never copied. Joined (bytes(gathered)), the pieces are encode_message's
    bytes exactly; a store that writes them with one gathering call (os.pwritev)
    copies each frame once, where joining and encoding copied it twice before.

    Attributes:
        pieces: the buffers, in order.
        nbytes: their total length, the encoded message's.
        anchor: where, in the encoded message, the largest array's raw data starts
            (0 with none).
        address: that data's address in memory, None with no array: a store that
            writes it so its offset in a page is the same as in memory keeps the
            kernel's copy fast (a shift of a few dozen bytes made it 3-4x slower) and
            gives readers an array aligned as the producer's was.
    """

    pieces: tuple[Any, ...]
    nbytes: int
    anchor: int = 0
    address: int | None = None

    def __bytes__(self) -> bytes:
        return self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)

    def __len__(self) -> int:
        return self.nbytes


class _Gatherer(threading.local):
    """Each thread's gathering encoder: the hook keeps a call's large arrays aside and
    leaves a placeholder in their place (a fixext 16: this thread's random prefix, the
    call's count, the array's number), found again in the encoding afterwards."""

    def __init__(self) -> None:
        self.encoder = msgspec.msgpack.Encoder(enc_hook=self.hook)
        self.prefix = os.urandom(8)
        self.calls = itertools.count()
        self.token = b""
        self.above = GATHER_ABOVE_BYTES
        self.arrays: list[tuple[bytes, np.ndarray[Any, Any]]] = []

    def hook(self, obj: Any) -> Any:
        if (isinstance(obj, np.ndarray) and obj.nbytes >= self.above
                and obj.nbytes < (1 << 32) - (1 << 16) and not masked(obj)):
            head, raw = array_parts(np.asarray(obj))  # as enc_hook: a subclass's data
            assert raw is not None  # nbytes >= above > 0
            if not self.arrays:  # this call's first: its token
                self.token = self.prefix + (next(self.calls) & 0xFFFFFFFF).to_bytes(4, "big")
            self.arrays.append((head, raw))
            return msgspec.msgpack.Ext(EXT_NDARRAY,
                                       self.token + len(self.arrays).to_bytes(4, "big"))
        return enc_hook(obj)


_gatherer = _Gatherer()


def gather_message(message: Any, above: int = GATHER_ABOVE_BYTES) -> bytes | GatheredMessage:
    """Encodes a message as encode_message does, its arrays of above bytes or more left
    as pieces of their own (see GatheredMessage).

    Returns:
        encode_message's bytes when no array is that large, else a GatheredMessage.

    Raises:
        TypeError: if the message holds something msgpack cannot carry.
    """
    state = _gatherer
    state.above = above
    try:
        encoded = state.encoder.encode(message)
    finally:
        arrays, state.arrays = state.arrays, []
    if not arrays:
        return encoded
    token = state.token
    pieces: list[Any] = []
    start = total = anchor = 0
    largest: np.ndarray[Any, Any] | None = None
    for k, (head, raw) in enumerate(arrays, 1):
        marker = bytes((_FIXEXT16, EXT_NDARRAY)) + token + k.to_bytes(4, "big")
        at = encoded.find(marker, start)
        if at < 0 or encoded.find(marker, at + 1) >= 0:
            # The message's own bytes hold a placeholder (8 random bytes and a count:
            # never in practice): encoded whole instead, never wrong.
            return encode_message(message)
        ext = _EXT32.pack(_EXT32_CODE, len(head) + raw.nbytes, EXT_NDARRAY)
        pieces += (encoded[start:at], ext + head)
        total += at - start + len(ext) + len(head)
        if largest is None or raw.nbytes > largest.nbytes:
            largest, anchor = raw, total
        pieces.append(raw)
        total += raw.nbytes
        start = at + len(marker)
    pieces.append(encoded[start:])
    total += len(encoded) - start
    assert largest is not None
    return GatheredMessage(tuple(p for p in pieces if len(p)), total, anchor,
                           largest.ctypes.data)


def encode_joined(obj: Any) -> bytes:
    """obj's msgpack bytes, as encode_message makes them, with each large array copied
    once: its pieces (gather_message) joined into the result, where enc_hook joins an
    array's head and data into an extension and msgspec copies that into its buffer
    again. For a 6.2 MB frame in an envelope, 0.26 ms against 0.64 ms here with a
    replica's allocator (run.allocator; 0.3 against 1.6 without it).

    Raises:
        TypeError: if obj holds something msgpack cannot carry.
    """
    gathered = gather_message(obj)
    if isinstance(gathered, GatheredMessage):
        return b"".join(gathered.pieces)
    return gathered


def holds_large_array(message: Any) -> bool:
    """Whether message is, or is a dict holding, an array of GATHER_ABOVE_BYTES or more
    (encode_joined's case): a look that costs a small message next to nothing. Arrays
    deeper inside are not looked for, and are encoded the usual way."""
    cls = message.__class__
    if cls is np.ndarray:
        return bool(message.nbytes >= GATHER_ABOVE_BYTES)
    if cls is dict:
        for value in message.values():
            if value.__class__ is np.ndarray and value.nbytes >= GATHER_ABOVE_BYTES:
                return True
    return False


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
