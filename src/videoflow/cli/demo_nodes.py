"""The demo's nodes: the cameras, the IMU, the fusion join and the verify sink, which
take their first capture instant from one StartGate (videoflow.io.start_gate); and
GroupLog, the sink of a bag replayed into the demo's fusion (demo_flow.fuse_bag).

Module level: every replica runs in a spawned process that imports them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from videoflow.cli.demo_truth import camera_schedule, imu_tally
from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
from videoflow.io.start_gate import StartGate

START_DELAY_S = 0.5
"""How long after the last node's process is up the first capture is (StartGate): the
processes start one after another (spawned, each importing numpy and connecting to the
broker), and a camera that captured before the others were up would start behind."""


def _sleep_until(instant: float) -> None:
    delay = instant - time.time()
    if delay > 0:
        time.sleep(delay)


class Camera(ProducerNode):
    """A camera capturing at fps from the gate's t0: one frame per instant k it does
    not drop, stamped with its own clock. The message carries the ground truth (k).
    With backlog it publishes as fast as it can, the stamps unchanged. With a delay
    each frame reaches the flow that many seconds after its capture (a slow network
    path, a driver's buffer): it is published at its capture instant plus delay, in
    real time even with backlog, its stamp unchanged.

    Arguments:
        index: the camera's number (its name is cam<index>).
        gate: the demo's StartGate.
        fps / instants / frame_size / drop_rate / seed: the simulation's.
        backlog: publish as fast as it can (ignored with a delay).
        delay: seconds each frame is published after its capture instant.
        skew: seconds its clock reads ahead (behind, below 0) beyond its schedule's
            small offset: every stamp carries it.
    """

    def __init__(self, index: int, gate: StartGate, fps: float, instants: int,
                 frame_size: tuple[int, int], drop_rate: float, seed: int,
                 backlog: bool = False, delay: float = 0.0, skew: float = 0.0) -> None:
        super().__init__(name=f"cam{index}")
        self.index, self.gate, self.fps, self.instants = index, gate, fps, instants
        self.frame_size, self.drop_rate, self.seed = frame_size, drop_rate, seed
        self.backlog, self.delay, self.skew = backlog, delay, skew

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
        # A delayed camera is paced among a backlog too: the live one the others run
        # ahead of.
        paced = self.delay > 0 or not self.backlog
        due = capture + self.delay
        if paced:
            _sleep_until(due)
        stamp = capture + self.offset + self.skew + float(self.jitter[k])
        assert self.context is not None
        self.context.set_event_timestamp(stamp)
        width, height = self.frame_size
        frame = np.full((height, width), k % 256, dtype=np.uint8)
        # Behind its schedule (the delay asked for is the schedule, not lag): a busy
        # CPU. A backlog runs ahead of it by design.
        lag_ms = (time.time() - due) * 1000.0 if paced else None
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
    """The join: process(cam0, ..., camN, imu_samples) for each group, the IMU the last
    parent. Its output is a summary of the group (the frames stay here): each frame's
    stamp, first pixel and shape, the IMU window's sample times, their span around the
    frames' mean stamp and their mean angular velocity.

    It fuses the demo's own frames and samples (dicts carrying their stamp and, for a
    frame, its capture instant k) and replayed ones as RosbagSource yields them (a
    numpy image; an Imu dict with its angular_velocity), whose stamps are their event
    times. The ground truth exists only in the simulation: with a gate, the summary
    also says which instant each frame is of, whether its pixels agree, how far behind
    real time it was sent, and its IMU window's tally against the samples that exist
    (imu_tally; hz, samples and window_ms as the IMU's); without one (a replay) those
    are None.

    Arguments:
        gate: the demo's StartGate; None for replayed data.
        hz / samples: the simulated IMU's (imu_range); None without a gate.
        window_ms: the join's IMU window half-width.
        delay: seconds from the first capture until the first input (needs a gate).
        **options: Node's arguments (name, join_policy, ...).
    """

    def __init__(self, gate: StartGate | None, hz: float | None,
                 samples: tuple[int, int] | None, window_ms: float, delay: float = 0.0,
                 **options: Any) -> None:
        super().__init__(**options)
        if gate is None and (delay or hz is not None or samples is not None):
            raise ValueError("Fusion: delay, hz and samples are the simulation's: give its "
                             "gate")
        self.gate, self.hz, self.samples, self.window_ms = gate, hz, samples, window_ms
        self.delay = delay

    def open(self) -> None:
        self.t0: float | None = None
        if self.gate is None:
            return
        self.gate.arrive(self.name)
        if self.delay:
            # A node that starts late: what its parents send meanwhile waits for it on
            # the broker, and it catches up on that backlog.
            self.t0 = self.gate.t0()
            _sleep_until(self.t0 + self.delay)

    def process(self, *inputs: Any) -> dict[str, Any]:
        assert self.context is not None
        *frames, imu = inputs
        *cameras, imu_parent = self.context.parents
        info = self.context.input_info or {}
        stamps = [None if f is None else _stamp(f, info[p]["event_ts"])
                  for p, f in zip(cameras, frames, strict=True)]
        images = [None if f is None else f["frame"] if isinstance(f, dict) else f
                  for f in frames]
        imu_t = [_stamp(s, t) for s, t in zip(imu, info[imu_parent]["event_ts"],
                                               strict=True)] if imu else []
        present = [t for t in stamps if t is not None]
        group_t = sum(present) / len(present)
        offsets_ms = [(t - group_t) * 1000.0 for t in imu_t]
        summary = {
            "stamps": stamps,
            "pixels": [None if i is None else i.flat[0].item() for i in images],
            "shapes": [None if i is None else list(i.shape) for i in images],
            "imu": len(imu),
            "imu_stamps": imu_t,
            "imu_span_ms": [min(offsets_ms), max(offsets_ms)] if imu else None,
            "gyro_mean": np.mean([_gyro(s) for s in imu], axis=0).tolist() if imu else None,
            "fused_at": time.time(),  # a paced replay spreads these over the recording
            "instants": None, "pixels_agree": None, "imu_in_window": None,
            "imu_expected": None, "lag_ms": None,
        }
        if self.gate is not None:
            summary.update(self._truth(frames, present, imu_t))
        return summary

    def _truth(self, frames: list[Any], stamps: list[float],
               imu_t: list[float]) -> dict[str, Any]:
        """The simulation's checks of one group (the frames are the demo cameras')."""
        assert self.gate is not None and self.hz is not None and self.samples is not None
        if self.t0 is None:
            self.t0 = self.gate.t0()  # every node is up: a frame exists
        present = [f for f in frames if f is not None]
        in_window, exist = imu_tally(imu_t, stamps, self.t0, self.hz, self.samples,
                                     self.window_ms)
        lags = [f["lag_ms"] for f in present if f["lag_ms"] is not None]
        return {
            "instants": [None if f is None else f["k"] for f in frames],
            # The pixels say which instant a frame is of: they arrived intact.
            "pixels_agree": all(int(f["frame"][0, 0]) == f["k"] % 256 for f in present),
            "imu_in_window": in_window,
            "imu_expected": exist,
            "lag_ms": max(lags) if lags else None,
        }


def _stamp(value: Any, event_ts: float | None) -> float:
    """A frame's or sample's event time as the join read it (a demo stamp corrected by
    the join's clock_offsets; a replayed one's header stamp, else its record time), or
    its own stamp where it came without one."""
    return float(value["t"]) if event_ts is None else float(event_ts)


def _gyro(sample: dict[str, Any]) -> Any:
    """An IMU sample's angular velocity (x, y, z): the demo's gyro, a replayed
    sensor_msgs/Imu's angular_velocity."""
    return sample["gyro"] if "gyro" in sample else sample["angular_velocity"]


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


class GroupLog(ConsumerNode):
    """Writes each fused group's summary once (a redelivered group is skipped) as a
    JSON line to path; with no path it keeps none, and the run report counts them.

    Arguments:
        path: the file, appended to; None for none.
        **options: Node's arguments (name, ...).
    """

    def __init__(self, path: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.path = path

    def open(self) -> None:
        self.seen: set[str] = set()
        self.out = None if self.path is None else open(self.path, "a")

    def consume(self, summary: dict[str, Any]) -> None:
        assert self.context is not None
        key = self.context.last_input_key
        if key is not None:
            if key in self.seen:
                return
            self.seen.add(key)
        if self.out is not None:
            self.out.write(json.dumps(summary) + "\n")
            self.out.flush()

    def close(self) -> None:
        out = getattr(self, "out", None)
        if out is not None:
            out.close()
