"""Builders shared by the grouping tests: entries, recording handles and a fake clock."""

from __future__ import annotations

from typing import Any

from videoflow.messaging.grouping import EnvelopeEntry


class Clock:
    """A settable clock in seconds."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Handle:
    """Records how the assembler let it go, through the default resolver (a
    ResolvableHandle)."""

    def __init__(self, name: str, log: list[tuple[str, str]] | None = None) -> None:
        self.name = name
        self.events: list[str] = []
        self.log = log

    def discard(self, reason: str) -> None:
        self.events.append(reason)
        if self.log is not None:
            self.log.append((self.name, reason))

    def supersede(self) -> None:
        self.events.append("superseded")
        if self.log is not None:
            self.log.append((self.name, "superseded"))

    def __repr__(self) -> str:
        return f"Handle({self.name})"


def entry(
    trace_id: str, seq: int, event_ts: float | None = None, message: Any = None
) -> EnvelopeEntry:
    return EnvelopeEntry(trace_id, seq, event_ts, message, None, False)
