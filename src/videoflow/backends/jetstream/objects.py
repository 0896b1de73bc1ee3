"""Objects in a JetStream object store, pipelined: what NatsObjectPayloadStore puts and
gets, in the layout nats-py's ObjectStore (and the nats CLI) read and write.

The layout: an object's bytes are chunks, one message each, on ``$O.<bucket>.C.<nuid>``
(a fresh nuid per put), then one meta message on ``$O.<bucket>.M.<name, base64url>``
(the rollup header keeps only the newest) whose JSON gives the nuid, the size, the chunk
count and a SHA-256 digest of the bytes.

What differs from nats-py's put and get, which cost a 6 MB frame about as much as 50
broker round trips and a quadratic copy:

- put publishes every chunk at once (each a JetStream publish, at most WINDOW in flight)
  and waits for their acknowledgements together, where nats-py waits for each in turn;
  chunks are slices of the caller's buffer (a memoryview), not copies into a staging
  buffer; the existing object is not read first (videoflow never puts a ref twice but
  on a retry, which cleans up after itself).
- get reads the meta message and then every chunk with direct gets (one request each,
  the chunks as one batch: the bucket's stream allows direct gets, as nats-py makes it),
  straight into one buffer of the object's size, where nats-py makes an ordered
  consumer per get and grows a bytes object chunk by chunk (a copy of everything so far
  per chunk). A direct get may be answered by a replica that has not stored the newest
  messages yet: whatever it did not have (a missing meta, fewer chunks) is read again
  from the stream's leader, by subject and through an ordered consumer. Measured on one
  host, a 6.2 MB object: 344-408 MB/s and 12-13 ms of client CPU, against 202-262 MB/s
  and 19-22 ms through the consumer.
- chunks are CHUNK_BYTES, where nats-py's are 128 KiB: fewer messages per object.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from datetime import datetime, timezone
from typing import Final, cast

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ObjectInfo, ObjectMetaOptions

CHUNK_BYTES: Final = 960 * 1024
"""Bytes per chunk message: a 1920x1080x3 frame is 7 of them. Bounded by the server's
max_payload (1 MiB by default) less room for the headers (chunk_bytes). Measured on one
host, put + get + delete of a 6.2 MB frame, median of 4 rounds of 5: 86 MB/s with
128 KiB chunks, 94 with 256 KiB, 99 with 512 KiB, 113 with 960 KiB (nats-py's own put
and get: 11 MB/s)."""

WINDOW: Final = 64
"""Chunk publishes a put keeps in flight: a 32 MB object at once."""

_ROLLUP: Final = {"Nats-Rollup": "sub"}
_DIGEST: Final = "SHA-256="


def chunk_bytes(max_payload: int) -> int:
    """The chunk size for a server whose max_payload is this: CHUNK_BYTES, or less on a
    server that takes smaller messages (a 4 KiB margin for the headers)."""
    return max(1024, min(CHUNK_BYTES, max_payload - 4096))


def meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def chunk_subject(bucket: str, nuid: str) -> str:
    return f"$O.{bucket}.C.{nuid}"


async def put_object(js: JetStreamContext, bucket: str, name: str,
                     data: bytes | bytearray | memoryview, chunk: int,
                     timeout: float) -> ObjectInfo:
    """Store data as object name, pipelined (see the module docstring).

    Arguments:
        chunk: bytes per chunk message (chunk_bytes).
        timeout: seconds each publish may take to be acknowledged.

    Returns:
        the object's info, as its meta message holds it.

    Raises:
        what JetStream raised for a chunk or the meta message; the chunks written are
        purged first (best effort: a lost connection leaves them, as nats-py does).
    """
    view = memoryview(data).cast("B")
    nuid = secrets.token_urlsafe(16)
    subject = chunk_subject(bucket, nuid)
    stream = f"OBJ_{bucket}"
    try:
        pending: list[asyncio.Task[object]] = []
        for offset in range(0, len(view), chunk):
            if len(pending) >= WINDOW:
                await pending.pop(0)
            # A slice of the caller's buffer: nats-py joins it to the PUB line, which
            # any buffer allows, so the chunk is copied once, into the outgoing bytes.
            piece = cast(bytes, view[offset:offset + chunk])
            pending.append(asyncio.ensure_future(js.publish(subject, piece, timeout=timeout)))
        await asyncio.gather(*pending)
        info = ObjectInfo(
            name=name, bucket=bucket, nuid=nuid, size=len(view),
            chunks=-(-len(view) // chunk), mtime=datetime.now(timezone.utc).isoformat(),
            digest=_DIGEST + base64.urlsafe_b64encode(hashlib.sha256(view).digest()).decode(),
            options=ObjectMetaOptions(max_chunk_size=chunk))
        await js.publish(meta_subject(bucket, name), json.dumps(info.as_dict()).encode(),
                         timeout=timeout, headers=_ROLLUP)
    except BaseException as error:
        # Every chunk sent is answered before the purge: the server stores a stream's
        # messages apart from answering API requests, so a chunk still in flight could
        # land after it. Only a caller that gave up (cancelled) does not wait.
        if isinstance(error, asyncio.CancelledError):
            for task in pending:
                task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        try:
            await js.purge_stream(stream, subject=subject)
        except (nats.errors.Error, asyncio.TimeoutError):
            pass  # the error that matters is the one being raised
        raise
    return info


async def object_info(js: JetStreamContext, bucket: str, name: str) -> ObjectInfo | None:
    """The info of object name, None when there is none or it was deleted."""
    try:
        msg = await js.get_last_msg(f"OBJ_{bucket}", meta_subject(bucket, name))
    except nats.js.errors.NotFoundError:
        return None
    if msg.data is None:
        return None
    info = ObjectInfo.from_response(json.loads(msg.data))
    return None if info.deleted else info


async def get_object(js: JetStreamContext, bucket: str, name: str,
                     timeout: float) -> bytearray | None:
    """The bytes of object name, None when there is none or it was deleted.

    Arguments:
        timeout: seconds to wait for each chunk.

    Raises:
        ValueError: the chunks do not add up to the object's size, or their digest is
            not the one its meta message gives.
        nats.errors.TimeoutError: a chunk did not come within timeout.
    """
    direct = await _direct_read(js, bucket, name, timeout)
    if not isinstance(direct, _Unserved):
        return direct
    info = await object_info(js, bucket, name)
    if info is None:
        return None
    size = info.size or 0
    data = bytearray(size)
    if size == 0:
        return data
    assert info.nuid is not None
    sub = await js.subscribe(chunk_subject(bucket, info.nuid), ordered_consumer=True)
    try:
        view, offset = memoryview(data), 0
        while offset < size:
            msg = await sub.next_msg(timeout)
            end = offset + len(msg.data)
            if end > size:
                raise ValueError(f"object {name!r}: chunks hold more than its {size} bytes")
            view[offset:end] = msg.data
            offset = end
    finally:
        await sub.unsubscribe()
    if not _digest_matches(data, info):
        raise ValueError(f"object {name!r}: its bytes do not match its digest")
    return data


class _Unserved:
    """A direct read that must be made again from the stream's leader."""


_UNSERVED: Final = _Unserved()


async def _direct_read(js: JetStreamContext, bucket: str, name: str,
                       timeout: float) -> bytearray | None | _Unserved:
    """get_object by direct gets: the bytes, None for a deleted object, or _UNSERVED
    where the answer may be a lagging replica's (no meta, too few chunks) or the stream
    takes no direct gets."""
    nc = js._nc  # the connection the context requests on (nats-py has no accessor)
    api = f"$JS.API.DIRECT.GET.OBJ_{bucket}"
    try:
        meta = await nc.request(f"{api}.{meta_subject(bucket, name)}", b"", timeout=timeout)
    except nats.errors.NoRespondersError:
        return _UNSERVED  # a stream that takes no direct gets
    if meta.headers and meta.headers.get("Status"):
        return _UNSERVED  # 404 here may be a replica behind the leader
    info = ObjectInfo.from_response(json.loads(meta.data))
    if info.deleted:
        return None
    size, chunks = info.size or 0, info.chunks or 0
    data = bytearray(size)
    if size == 0:
        return data
    view, filled, count = memoryview(data), 0, 0
    ended: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def take(msg: Msg) -> None:
        nonlocal filled, count
        if ended.done():
            return
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None:  # 204: the batch's end; anything else: not served
            ended.set_result(status == "204")
            return
        end = filled + len(msg.data)
        if end > size:
            ended.set_result(False)
            return
        view[filled:end] = msg.data
        filled, count = end, count + 1

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=take)
    try:
        request = {"seq": 1, "next_by_subj": chunk_subject(bucket, cast(str, info.nuid)),
                   "batch": chunks}
        await nc.publish(api, json.dumps(request).encode(), reply=inbox)
        served = await asyncio.wait_for(ended, timeout)
    finally:
        await sub.unsubscribe()
    if not served or (filled, count) != (size, chunks):
        return _UNSERVED
    if not _digest_matches(data, info):
        return _UNSERVED  # judged again on what the leader holds
    return data


def _digest_matches(data: bytearray, info: ObjectInfo) -> bool:
    digest = (info.digest or "").removeprefix(_DIGEST).removeprefix(_DIGEST.upper())
    return hashlib.sha256(data).digest() == base64.urlsafe_b64decode(digest)


__all__ = ["CHUNK_BYTES", "WINDOW", "chunk_bytes", "chunk_subject", "get_object",
           "meta_subject", "object_info", "put_object"]
