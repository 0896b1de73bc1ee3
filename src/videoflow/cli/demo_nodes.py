"""The demo's nodes: the cameras, the IMU, the fusion join and the verify sink, and
the StartGate that gives every process of the flow one first capture instant.

Module level: every replica runs in a spawned process that imports them.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from videoflow.cli.demo_truth import camera_schedule, imu_tally
from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode

START_DELAY_S = 0.5
"""How long after the last node's process is up the first capture is (StartGate): the
processes start one after another (spawned, each importing numpy and connecting to the
broker), and a camera that captured before the others were up would start behind."""

GATE_PATIENCE_S = 120.0
"""How long a producer waits for every node's process to be up before it fails."""


@dataclass(frozen=True)
class StartGate:
    """The first capture instant, the same for every process of the flow: each node
    marks itself up (arrive, in open) with a file in a shared directory, and the
    producers capture from delay seconds after the last mark's time (t0), which every
    process reads from the same files. Capture does not start while some cameras are
    still starting: they would begin behind real time, silent for the join's timeout.

    Arguments:
        directory: the shared directory (the flow's temporary one).
        names: every node of the flow.
        delay: seconds from the last node up to the first capture.
    """

    directory: str
    names: tuple[str, ...]
    delay: float

    def arrive(self, name: str) -> None:
        """Mark name up. A restarted process marks nothing new: the first mark stays."""
        try:
            with open(os.path.join(self.directory, f"{name}.up"), "x"):
                pass
        except FileExistsError:
            pass

    def t0(self, patience: float = GATE_PATIENCE_S) -> float:
        """Wait until every node is up, and return the first capture instant (epoch s).

        Raises:
            TimeoutError: some node was not up within patience seconds.
        """
        paths = [os.path.join(self.directory, f"{name}.up") for name in self.names]
        deadline = time.monotonic() + patience
        while True:
            missing = [name for name, path in zip(self.names, paths, strict=True)
                       if not os.path.exists(path)]
            if not missing:
                return max(os.stat(path).st_mtime for path in paths) + self.delay
            if time.monotonic() > deadline:
                raise TimeoutError(f"demo: {', '.join(missing)} not up after {patience:g} s")
            time.sleep(0.01)


def _sleep_until(instant: float) -> None:
    delay = instant - time.time()
    if delay > 0:
        time.sleep(delay)


class Camera(ProducerNode):
    """A camera capturing at fps from the gate's t0: one frame per instant k it does
    not drop, stamped with its own clock. The message carries the ground truth (k).
    With backlog it publishes as fast as it can, the stamps unchanged."""

    def __init__(self, index: int, gate: StartGate, fps: float, instants: int,
                 frame_size: tuple[int, int], drop_rate: float, seed: int,
                 backlog: bool = False) -> None:
        super().__init__(name=f"cam{index}")
        self.index, self.gate, self.fps, self.instants = index, gate, fps, instants
        self.frame_size, self.drop_rate, self.seed = frame_size, drop_rate, seed
        self.backlog = backlog

    def open(self) -> None:
        self.offset, self.dropped, self.jitter = camera_schedule(
            self.seed, self.index, self.instants, self.drop_rate, self.fps)
        self.k = 0
        self.gate.arrive(self.name)
        self.t0: float | None = None

    def next(self) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()
        while self.k < self.instants and self.dropped[self.k]:
            self.k += 1  # a dropped frame: the camera skips the instant
        if self.k >= self.instants:
            raise StopIteration
        k, self.k = self.k, self.k + 1
        capture = self.t0 + k / self.fps
        if not self.backlog:
            _sleep_until(capture)
        stamp = capture + self.offset + float(self.jitter[k])
        assert self.context is not None
        self.context.set_event_timestamp(stamp)
        width, height = self.frame_size
        frame = np.full((height, width), k % 256, dtype=np.uint8)
        # Behind real time: a busy CPU. A backlog runs ahead of it by design.
        lag_ms = None if self.backlog else (time.time() - capture) * 1000.0
        return {"camera": self.name, "k": k, "t": stamp, "lag_ms": lag_ms, "frame": frame}


class Imu(ProducerNode):
    """An IMU sampling at hz on the true clock, at t0 + j/hz for j in samples
    (imu_range). With backlog it publishes as fast as it can, the stamps unchanged."""

    def __init__(self, gate: StartGate, hz: float, samples: tuple[int, int],
                 backlog: bool = False) -> None:
        super().__init__(name="imu")
        self.gate, self.hz, self.backlog = gate, hz, backlog
        self.j, self.end = samples

    def open(self) -> None:
        self.gate.arrive(self.name)
        self.t0: float | None = None

    def next(self) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()
        if self.j >= self.end:
            raise StopIteration
        j, self.j = self.j, self.j + 1
        t = self.t0 + j / self.hz  # imu_tally counts the samples from the same sum
        if not self.backlog:
            _sleep_until(t)
        assert self.context is not None
        self.context.set_event_timestamp(t)
        return {"t": t, "gyro": (0.0, 0.0, 0.1 * math.sin(t))}


class Fusion(ProcessorNode):
    """The join: process(cam0, ..., camN, imu_samples) for each group. Its output is a
    summary of the group (the frames stay here), with its IMU window's tally against
    the samples that exist (imu_tally; hz, samples and window_ms as the IMU's)."""

    def __init__(self, gate: StartGate, hz: float, samples: tuple[int, int],
                 window_ms: float, delay: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.gate, self.hz, self.samples, self.window_ms = gate, hz, samples, window_ms
        self.delay = delay

    def open(self) -> None:
        self.gate.arrive(self.name)
        self.t0: float | None = None
        if self.delay:
            # A node that starts late: what its parents send meanwhile waits for it on
            # the broker, and it catches up on that backlog.
            self.t0 = self.gate.t0()
            _sleep_until(self.t0 + self.delay)

    def process(self, *inputs: Any) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()  # every node is up: a frame exists
        *frames, imu = inputs
        present = [f for f in frames if f is not None]
        group_t = sum(f["t"] for f in present) / len(present)
        offsets_ms = [(s["t"] - group_t) * 1000.0 for s in imu]
        in_window, exist = imu_tally([s["t"] for s in imu], [f["t"] for f in present],
                                     self.t0, self.hz, self.samples, self.window_ms)
        lags = [f["lag_ms"] for f in present if f["lag_ms"] is not None]
        return {
            "instants": [None if f is None else f["k"] for f in frames],
            # The pixels say which instant a frame is of: they arrived intact.
            "pixels_agree": all(int(f["frame"][0, 0]) == f["k"] % 256 for f in present),
            "imu": len(imu),
            "imu_in_window": in_window,
            "imu_expected": exist,
            "imu_span_ms": [min(offsets_ms), max(offsets_ms)] if imu else None,
            "lag_ms": max(lags) if lags else None,
        }


class Verify(ConsumerNode):
    """Checks every fused group against the ground truth; close() writes the counts
    as JSON to path."""

    def __init__(self, path: str, cameras: int, gate: StartGate) -> None:
        super().__init__(name="verify")
        self.path, self.cameras, self.gate = path, cameras, gate

    def open(self) -> None:
        self.gate.arrive(self.name)
        self.seen: set[str] = set()
        self.groups = self.quorum_groups = self.correct = self.frames = 0
        self.imu_in_window = self.imu_expected = 0
        self.lag_ms: float | None = None  # None: no frame said (a backlog)
        self.imu_counts: list[int] = []
        self.imu_span_ms: list[float] = []  # [earliest, latest], once a window held one

    def consume(self, summary: dict[str, Any]) -> None:
        assert self.context is not None
        key = self.context.last_input_key
        if key is not None:  # a redelivered group is counted once
            if key in self.seen:
                return
            self.seen.add(key)
        instants = [k for k in summary["instants"] if k is not None]
        self.groups += 1
        self.frames += len(instants)
        self.quorum_groups += len(instants) < self.cameras
        self.correct += len(set(instants)) == 1 and summary["pixels_agree"]
        self.imu_counts.append(summary["imu"])
        self.imu_in_window += summary["imu_in_window"]
        self.imu_expected += summary["imu_expected"]
        if summary["lag_ms"] is not None:
            self.lag_ms = max(self.lag_ms or 0.0, summary["lag_ms"])
        if summary["imu_span_ms"] is not None:
            low, high = summary["imu_span_ms"]
            span = self.imu_span_ms or [low, high]
            self.imu_span_ms = [min(span[0], low), max(span[1], high)]

    def close(self) -> None:
        if not hasattr(self, "seen"):  # open() never ran
            return
        counts = {"groups": self.groups, "quorum_groups": self.quorum_groups,
                  "correct": self.correct, "incorrect": self.groups - self.correct,
                  "frames": self.frames, "imu_counts": self.imu_counts,
                  "imu_in_window": self.imu_in_window, "imu_expected": self.imu_expected,
                  "imu_span_ms": self.imu_span_ms or None, "lag_ms": self.lag_ms}
        partial = Path(self.path).with_suffix(".partial")
        partial.write_text(json.dumps(counts))
        partial.replace(self.path)  # the reader never sees half a file
