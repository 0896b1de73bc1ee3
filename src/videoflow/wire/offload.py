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
import threading
from typing import Any, Protocol, runtime_checkable

import msgspec

from videoflow.errors import WireError
from videoflow.wire.numpy_ext import enc_hook, ext_hook

__all__ = [
    "BlobStore",
    "MemoryBlobStore",
    "decode_message",
    "encode_message",
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
