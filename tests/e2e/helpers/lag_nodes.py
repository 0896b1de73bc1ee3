"""Nodes of the lagging-camera flows (test_lagging_camera.py): cameras sending frames
into a time join, some running ahead (a recorded source, a driver that buffers), one
live, or one whose frames arrive seconds late. Module level, so the spawned replica
processes import them as users' workers would.

Every frame carries its true capture time as its event time, so every instant should
fuse; the fusion (FrameFuse) logs each group it is handed."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from videoflow.core.node import ConsumerNode, ProducerNode
from videoflow.io.start_gate import StartGate


def _sleep_until(instant: float) -> None:
    delay = instant - time.time()
    if delay > 0:
        time.sleep(delay)


class FrameCamera(ProducerNode):
    """A camera of `shape` frames (uint8, filled with k % 256): frame k is captured at
    t0 + k/fps and stamped with that time.

    Arguments:
        pace: 'backlog' publishes every frame as fast as the flow takes it (a recorded
            source); 'live' publishes frame k at its capture time plus delay (a slow
            network path or a driver's buffer: delay seconds late, from the first frame
            on).
        die_at: SIGKILL this process before publishing instant die_at (once: a marker
            file says it happened), after the frames before it are confirmed; its
            replacement is a live camera starting at the next instant to come after
            reboot seconds in open() (past the last instant: it only ends its stream).
    """

    def __init__(self, index: int, gate: StartGate, fps: float, instants: int,
                 shape: tuple[int, ...], pace: str = "live", delay: float = 0.0,
                 die_at: int = -1, marker: str = "", reboot: float = 0.0) -> None:
        super().__init__(name=f"cam{index}")
        if pace not in ("live", "backlog"):
            raise ValueError(f"unknown pace {pace!r}")
        self.index, self.gate, self.fps, self.instants = index, gate, fps, instants
        self.shape, self.pace, self.delay = shape, pace, delay
        self.die_at, self.marker, self.reboot = die_at, marker, reboot

    def open(self) -> None:
        self.restarted = bool(self.marker) and os.path.exists(self.marker)
        if self.restarted:
            time.sleep(self.reboot)
        self.gate.arrive(self.name)
        self.t0: float | None = None
        self.k = 0

    def next(self) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()
            if self.restarted:  # live: the next instant to come, none already past
                self.k = max(0, math.ceil((time.time() - self.t0) * self.fps))
        if self.k >= self.instants:
            raise StopIteration
        k, self.k = self.k, self.k + 1
        capture = self.t0 + k / self.fps
        if self.pace == "live":
            _sleep_until(capture + self.delay)
        if k == self.die_at and not self.restarted:
            assert self.context is not None
            self.context._messenger.drain()  # every frame before k is confirmed stored
            with open(self.marker, "w") as made:
                made.write(str(os.getpid()))
            os.kill(os.getpid(), 9)
        assert self.context is not None
        self.context.set_event_timestamp(capture)
        return {"cam": self.index, "k": k, "pid": os.getpid(), "sent": time.time(),
                "frame": np.full(self.shape, k % 256, dtype=np.uint8)}


class FrameFuse(ConsumerNode):
    """The time join of the cameras, as a sink: per group it is handed, one JSON line
    in <log_dir>/groups.log: instants (per camera, None for one missing), when each
    camera handed its frame to the flow (sent, epoch s; its next() returned it only
    once the put of its frame before was admitted) and whether every frame held its
    instant's pixels, first to last."""

    def __init__(self, log_dir: str, gate: StartGate, **options: Any) -> None:
        super().__init__(**options)
        self.log_dir, self.gate = log_dir, gate

    def open(self) -> None:
        self.gate.arrive(self.name)

    def consume(self, *frames: Any) -> None:
        instants = [None if f is None else f["k"] for f in frames]
        whole = all(f is None or (int(f["frame"].flat[0]) == f["k"] % 256
                                  and int(f["frame"].flat[-1]) == f["k"] % 256)
                    for f in frames)
        with open(Path(self.log_dir) / "groups.log", "a") as log:
            log.write(json.dumps({"instants": instants, "whole": whole, "sent": [
                None if f is None else f["sent"] for f in frames]}) + "\n")


def fused(log_dir: Path) -> list[dict[str, Any]]:
    """The groups FrameFuse logged, in order."""
    path = log_dir / "groups.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
