"""Nodes of the differential test (test_simulate_differential.py): cameras that send a
script as fast as the flow takes it, a fusion naming each group's frames, and a sink
that writes what it consumed. Module level, so replica processes import them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode


class ScriptedCamera(ProducerNode):
    """Sends frames (k, event time) in order, each stamped with its event time."""

    def __init__(self, name: str, frames: list[tuple[int, float]]) -> None:
        super().__init__(name=name)
        self.frames = frames

    def open(self) -> None:
        self.index = 0

    def next(self) -> dict[str, Any]:
        if self.index >= len(self.frames):
            raise StopIteration
        k, event_ts = self.frames[self.index]
        self.index += 1
        self.context.set_event_timestamp(event_ts)
        return {"k": k}


class NameFrames(ProcessorNode):
    """Each camera's frame number in the group, None where it is missing."""

    def process(self, *frames: Any) -> list[int | None]:
        return [None if f is None else f["k"] for f in frames]


class WriteConsumed(ConsumerNode):
    """Writes what it consumed, as JSON, when it closes."""

    def __init__(self, path: str) -> None:
        super().__init__(name="sink")
        self.path = path

    def open(self) -> None:
        self.seen: list[Any] = []

    def consume(self, fused: Any) -> None:
        self.seen.append(fused)

    def close(self) -> None:
        Path(self.path).write_text(json.dumps(self.seen))
