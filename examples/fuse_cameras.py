"""Fuse four cameras and an IMU by event time: a complete flow to copy from.

Four simulated cameras capture at 30 fps in real time, each stamping its frames with
its own clock (a constant offset within ±1.5 ms, jitter within ±1 ms) and dropping
2% of them; an IMU samples at 400 Hz. A join node fuses them by event time:

  - tolerance 8 ms: wide enough for one instant's spread across cameras (5 ms at
    most), far below the 33 ms frame period, so two instants never share a group;
  - quorum 3 of 4: a group missing one camera is emitted once its 300 ms timeout
    lapses, with None for that camera; below the quorum it is dropped and counted;
  - collect {"imu": 20 ms}: each group gets every IMU sample within 20 ms of its time.

A sink checks each group against the truth the frames carry (their capture instant).
Every node runs in a process of its own, against the embedded nats-server. The node
classes are at module level and the flow is built under ``__main__``, so those
processes can import this file. `videoflow demo` runs the same flow with options.

Run:  python examples/fuse_cameras.py      (about 15 s: 3 s to start, 6 s of capture)
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from videoflow import ConsumerNode, Flow, ProcessorNode, ProducerNode

FPS, SECONDS, IMU_HZ, DROP_RATE = 30.0, 6.0, 400.0, 0.02


class Camera(ProducerNode):
    """Frames of instant k = 0, 1, ... captured at t0 + k / FPS (real time)."""

    def __init__(self, name: str, t0: float) -> None:
        super().__init__(name=name)
        self.t0 = t0

    def open(self) -> None:
        self.rng = random.Random(self.name)  # seeded: the same drops on every run
        self.offset = self.rng.uniform(-0.0015, 0.0015)
        self.k = -1

    def next(self) -> dict[str, Any]:
        self.k += 1
        while self.rng.random() < DROP_RATE:  # a dropped frame: skip the instant
            self.k += 1
        if self.k >= SECONDS * FPS:
            raise StopIteration
        capture = self.t0 + self.k / FPS
        time.sleep(max(0.0, capture - time.time()))
        self.context.set_event_timestamp(capture + self.offset + self.rng.uniform(-1e-3, 1e-3))
        frame = np.full((48, 64), self.k % 256, dtype=np.uint8)
        return {"camera": self.name, "instant": self.k, "frame": frame}


class Imu(ProducerNode):
    """Samples at IMU_HZ on the true clock, from a window before the first frame."""

    def __init__(self, t0: float) -> None:
        super().__init__(name="imu")
        self.t0, self.j = t0, -8

    def next(self) -> dict[str, Any]:
        t = self.t0 + self.j / IMU_HZ
        if t > self.t0 + SECONDS + 0.02:
            raise StopIteration
        self.j += 1
        time.sleep(max(0.0, t - time.time()))
        self.context.set_event_timestamp(t)
        return {"t": t, "gyro": (0.0, 0.0, 0.01)}


class Fuse(ProcessorNode):
    """One call per group: a frame per camera (None if missing), the IMU window as a
    list. It passes on a summary, not the frames."""

    def process(self, *inputs: Any) -> dict[str, Any]:
        *frames, imu = inputs
        return {"instants": [None if f is None else f["instant"] for f in frames],
                "imu_samples": len(imu)}


class Check(ConsumerNode):
    """Counts groups, quorum groups and groups mixing two capture instants; writes the
    counts to a JSON file when the stream ends."""

    def __init__(self, path: str) -> None:
        super().__init__(name="check")
        self.path = path

    def open(self) -> None:
        self.counts = {"groups": 0, "quorum_groups": 0, "mixed": 0, "imu_samples": 0}

    def consume(self, fused: dict[str, Any]) -> None:
        present = [k for k in fused["instants"] if k is not None]
        self.counts["groups"] += 1
        self.counts["quorum_groups"] += len(present) < len(fused["instants"])
        self.counts["mixed"] += len(set(present)) > 1
        self.counts["imu_samples"] += fused["imu_samples"]

    def close(self) -> None:
        Path(self.path).write_text(json.dumps(self.counts))


def main() -> int:
    t0 = time.time() + 3.0  # every node's process has started by then
    cameras = [Camera(f"cam{i}", t0) for i in range(4)]
    imu = Imu(t0)
    fuse = Fuse(name="fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "quorum": 3, "timeout_ms": 300.0,
        "missing": "drop", "collect": {"imu": 20.0},
    })(*cameras, imu)
    counts_file = Path(tempfile.mkdtemp()) / "counts.json"
    check = Check(str(counts_file))(fuse)

    report = Flow([*cameras, imu], [check], name="fuse-cameras").run()
    print(report.format())
    counts = json.loads(counts_file.read_text())
    groups = counts["groups"]
    print(f"\n{groups} groups fused, {counts['quorum_groups']} with 3 of 4 cameras, "
          f"{counts['mixed']} mixing two capture instants; "
          f"{counts['imu_samples'] / max(groups, 1):.1f} IMU samples per group; "
          f"join latency p50 {report.nodes['fuse'].join_latency_p50_ms or 0:.1f} ms, "
          f"p99 {report.nodes['fuse'].join_latency_p99_ms or 0:.1f} ms")
    return 0 if report.outcome == "completed" and groups and not counts["mixed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
