"""Builders shared by the grouping tests: entries, recording handles, a fake clock, and
an assembler that resolves what it lets go of at once (as the messenger does)."""

from __future__ import annotations

from typing import Any

from videoflow.messaging.grouping import SUPERSEDED, EnvelopeEntry


class Clock:
    """A settable clock in seconds."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Handle:
    """Records how the assembler let it go (resolve_released calls it)."""

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


def resolve_released(assembler: Any) -> None:
    """Hands each (handle, reason) the assembler let go of to the handle, in order:
    supersede() for SUPERSEDED, discard(reason) otherwise."""
    for handle, reason in assembler.take_released():
        if reason == SUPERSEDED:
            handle.supersede()
        else:
            handle.discard(reason)


class Resolving:
    """An assembler whose every call is followed by resolve_released: the tests read
    each handle's events as soon as the call that let it go returns."""

    def __init__(self, assembler: Any) -> None:
        self.inner = assembler

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not callable(found) or name == "take_released":
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            result = found(*args, **kwargs)
            resolve_released(self.inner)
            return result

        return call


def entry(
    trace_id: str, seq: int, event_ts: float | None = None, message: Any = None
) -> EnvelopeEntry:
    return EnvelopeEntry(trace_id, seq, event_ts, message, None, False)
