"""Listing a NATS KV bucket's keys, and an object store's objects, without nats-py's
watchers.

kv.keys(), kv.watch() and the object store's list() can report the end of the initial
values before values already on their way were handed over (nats.py #842), and a
listing then silently misses entries. The bucket's stream says which subjects hold a
message; each one's last message says whether its key is present or a delete/purge
marker (for an object, whether its metadata says deleted).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

import nats.js.errors

LIST_CONCURRENCY: Final = 64
"""How many last-message reads a listing keeps in flight."""


async def present_keys(js: Any, bucket: str, prefix: str = "") -> list[str]:
    """Every key of bucket that starts with prefix and is present (not deleted or
    purged), sorted.

    Arguments:
        js: a nats-py JetStreamContext.
        bucket: the KV bucket.
        prefix: a key prefix; one ending at a token boundary ('.') becomes a subject
            filter, so the server lists only that subtree.

    Raises:
        nats.js.errors.NotFoundError: the bucket does not exist.
        nats.errors.Error / TimeoutError: the broker did not answer.
    """
    stream, root = f"KV_{bucket}", f"$KV.{bucket}."
    pattern = f"{root}{prefix}>" if prefix.endswith(".") else f"{root}>"

    def key_of(subject: str, last: Any) -> str | None:
        key = subject[len(root):]
        if not key.startswith(prefix):
            return None
        operation = (last.headers or {}).get("KV-Operation")
        return None if operation in ("DEL", "PURGE") else key

    return await _last_messages(js, stream, pattern, key_of)


async def present_objects(js: Any, bucket: str) -> list[str]:
    """The names of every object of an object store not marked deleted, sorted.

    Raises:
        as present_keys.
    """
    def name_of(_subject: str, last: Any) -> str | None:
        meta = json.loads(last.data)
        return None if meta.get("deleted") else str(meta["name"])

    return await _last_messages(js, f"OBJ_{bucket}", f"$O.{bucket}.M.>", name_of)


async def _last_messages(js: Any, stream: str, pattern: str,
                         read: Callable[[str, Any], str | None]) -> list[str]:
    """read(subject, last message) over every subject of stream matching pattern,
    sorted, without the Nones."""
    info = await js.stream_info(stream, subjects_filter=pattern)
    limit = asyncio.Semaphore(LIST_CONCURRENCY)

    async def one(subject: str) -> str | None:
        async with limit:
            try:
                last = await js.get_last_msg(stream, subject)
            except nats.js.errors.NotFoundError:  # removed meanwhile
                return None
        return read(subject, last)

    reads: list[Awaitable[str | None]] = [one(s) for s in (info.state.subjects or {})]
    return sorted(found for found in await asyncio.gather(*reads) if found is not None)


__all__ = ["LIST_CONCURRENCY", "present_keys", "present_objects"]
