"""A small flow to benchmark: a camera of synthetic frames, a node that measures each
frame's brightness, and a sink that records each measure in a file of its own.

The node classes are at module level, so the processes that run them can import this
module; test_my_flow.py benchmarks the flow with the videoflow_benchmark fixture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from videoflow import ConsumerNode, Flow, ProcessorNode, ProducerNode

WIDTH, HEIGHT = 64, 48
FRAME_BYTES = WIDTH * HEIGHT * 3
"""The size of one frame (RGB, 8 bits a channel): what the benchmark's bytes_per_s of
the camera is counted from."""


class Camera(ProducerNode):
    """frames frames, frame i all of value i % 256, 30 a second in event time (not
    paced: as fast as they go, a replay)."""

    def __init__(self, frames: int, **options: Any) -> None:
        super().__init__(**options)
        self.frames, self.i = frames, 0

    def next(self) -> dict[str, Any]:
        if self.i == self.frames:
            raise StopIteration
        index, self.i = self.i, self.i + 1
        self.context.set_event_timestamp(index / 30.0)
        pixels = np.full((HEIGHT, WIDTH, 3), index % 256, dtype=np.uint8)
        return {"index": index, "pixels": pixels}


class Brightness(ProcessorNode):
    """A frame's mean pixel value."""

    def process(self, frame: dict[str, Any]) -> dict[str, Any]:
        return {"index": frame["index"], "brightness": float(frame["pixels"].mean())}


class Record(ConsumerNode):
    """Writes each measure to <folder>/<index>.txt (a run again writes the same files)."""

    def __init__(self, folder: str, **options: Any) -> None:
        super().__init__(**options)
        self.folder = folder

    def consume(self, measured: dict[str, Any]) -> None:
        path = Path(self.folder) / f"{measured['index']}.txt"
        path.write_text(f"{measured['brightness']:g}\n", encoding="utf-8")


def brightness_flow(folder: str | Path, frames: int = 100) -> Flow:
    """camera -> brightness -> record, its measures written into folder."""
    camera = Camera(frames, name="camera")
    brightness = Brightness(name="brightness")(camera)
    return Flow([camera], [Record(str(folder), name="record")(brightness)],
                name="brightness")
