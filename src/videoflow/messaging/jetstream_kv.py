"""Listing a NATS KV bucket's keys without nats-py's watcher.

kv.keys() and kv.watch() can report the end of the initial values before values
already on their way were handed over (nats.py #842), and a listing then silently
misses keys. The bucket's stream says which subjects hold a message; each one's last
message says whether its key is present or a delete/purge marker.
"""

from __future__ import annotations

import asyncio
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
    info = await js.stream_info(stream, subjects_filter=pattern)
    subjects = [subject for subject in (info.state.subjects or {})
                if subject[len(root):].startswith(prefix)]
    limit = asyncio.Semaphore(LIST_CONCURRENCY)

    async def present(subject: str) -> str | None:
        async with limit:
            try:
                last = await js.get_last_msg(stream, subject)
            except nats.js.errors.NotFoundError:  # removed meanwhile
                return None
        operation = (last.headers or {}).get("KV-Operation")
        return None if operation in ("DEL", "PURGE") else subject[len(root):]

    found = await asyncio.gather(*(present(s) for s in subjects))
    return sorted(key for key in found if key is not None)


__all__ = ["LIST_CONCURRENCY", "present_keys"]
