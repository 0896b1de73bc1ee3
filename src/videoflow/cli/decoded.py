"""How the commands show a decoded message: its event time in UTC, arrays by dtype
and shape, bytes by length (`dlq show`, `tap`, `hz`)."""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np


def when(epoch: float | None) -> str:
    """An epoch time as an operator reads it: UTC, to the millisecond."""
    if epoch is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"


SHOWN_CHARS = 300
"""The most of a dead letter's input `dlq show` prints."""


def describe(value: Any) -> str:
    """A message as `dlq show` prints it: arrays by dtype and shape, bytes by length,
    containers element by element, cut at SHOWN_CHARS."""

    def one(v: Any, depth: int) -> str:
        if isinstance(v, np.ndarray):
            return f"array({v.dtype}, shape {tuple(v.shape)})"
        if isinstance(v, (bytes, bytearray, memoryview)):
            return f"<{len(v)} bytes>"
        if depth > 3:
            return "..."
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k!r}: {one(x, depth + 1)}" for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            inner = ", ".join(one(x, depth + 1) for x in v[:20])
            more = f", ... {len(v) - 20} more" if len(v) > 20 else ""
            return ("[" if isinstance(v, list) else "(") + inner + more + (
                "]" if isinstance(v, list) else ")")
        return repr(v)

    text = one(value, 0)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def input_summary(decoded: dict[str, Any]) -> dict[str, Any]:
    """What a decoded envelope says of its message, as `dlq show`, `tap` and `hz` print
    it: trace and seq, event time, producer and replica, and the message described (or
    its ref, when it went by ref)."""
    ref = decoded["blob_ref"]
    return {"trace_id": decoded["trace_id"], "seq": decoded["seq"],
            "event_ts": decoded["event_ts"], "event_time": when(decoded["event_ts"]),
            "producer": decoded["producer_name"], "replica": decoded["replica_id"],
            "blob_ref": ref,
            "message": None if ref is not None else describe(decoded["message"])}
