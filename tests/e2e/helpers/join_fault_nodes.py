"""Nodes of the join-under-faults flows (test_join_under_faults.py): live cameras
captured in real time and fused by event time, one of which dies or goes silent
mid-run. Module level, so the spawned replica processes import them as users'
workers would.

Every camera logs each frame it captures (pid and instant) before it publishes it,
and the fusion logs each group it is handed (its key, the instant of each member or
None, how long after capture it was handed, how long it waited in the join), so the
test knows the ground truth and what the join made of it."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from videoflow.core.node import ConsumerNode, ProducerNode
from videoflow.io.start_gate import StartGate  # one first instant for every process


def _sleep_until(instant: float) -> None:
    delay = instant - time.time()
    if delay > 0:
        time.sleep(delay)


class Camera(ProducerNode):
    """A live camera: frame k is captured at t0 + k/fps, stamped with the camera's
    clock (offset_ms off the true one), and carries its ground truth {cam, k, pid}.
    Live means a process starts at the present: its first frame is the next instant
    to come (instant 0 for the first process, which starts before t0), never an
    instant already past. With replay, a process starts over from instant 0 instead
    and sends the instants already past at once, with their stamps (as
    videoflow.cli.demo's Camera does: its open() resets its instant to 0).

    Faults, at the capture of instant `at`: 'kill' SIGKILLs the process once per
    marker file (the frames before it are confirmed first, so the ground truth holds
    exactly: 0 .. at-1 are on the broker, nothing of `at` is), and its replacement
    takes `reboot` seconds in open() (a device coming up again); 'silent' stops
    capturing and stays alive, ending `linger` seconds after the last instant.

    Every captured frame is logged to <log_dir>/<name>.log as 'pid k waited lag_ms'
    before it is published (waited: 1 when its instant was still to come, 0 for an
    instant already past)."""

    def __init__(self, index: int, gate: StartGate, fps: float, instants: int,
                 offset_ms: float, log_dir: str, fault: str = "", at: int = -1,
                 marker: str = "", linger: float = 0.0, reboot: float = 0.0,
                 replay: bool = False) -> None:
        super().__init__(name=f"cam{index}")
        if fault not in ("", "kill", "silent"):
            raise ValueError(f"unknown fault {fault!r}")
        self.index, self.gate, self.fps, self.instants = index, gate, fps, instants
        self.offset_ms, self.log_dir = offset_ms, log_dir
        self.fault, self.at, self.marker, self.linger = fault, at, marker, linger
        self.reboot, self.replay = reboot, replay

    def open(self) -> None:
        if self.marker and os.path.exists(self.marker):
            time.sleep(self.reboot)
        self.gate.arrive(self.name)
        self.t0: float | None = None
        self.k = 0

    def next(self) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()
            if not self.replay:
                self.k = max(0, math.ceil((time.time() - self.t0) * self.fps))
        if self.k >= self.instants:
            raise StopIteration
        k, self.k = self.k, self.k + 1
        capture = self.t0 + k / self.fps
        waited = capture > time.time()
        _sleep_until(capture)
        if k == self.at and self.fault == "kill" and not os.path.exists(self.marker):
            self._die(k)
        if k == self.at and self.fault == "silent":
            _sleep_until(self.t0 + self.instants / self.fps + self.linger)
            raise StopIteration
        lag_ms = (time.time() - capture) * 1000.0
        with open(Path(self.log_dir) / f"{self.name}.log", "a") as log:
            log.write(f"{os.getpid()} {k} {int(waited)} {lag_ms:.1f}\n")
        assert self.context is not None
        self.context.set_event_timestamp(capture + self.offset_ms / 1000.0)
        return {"cam": self.index, "k": k, "pid": os.getpid()}

    def _die(self, k: int) -> None:
        assert self.context is not None
        self.context._messenger.drain()  # every frame before k is confirmed stored
        partial = self.marker + ".partial"
        Path(partial).write_text(json.dumps({"pid": os.getpid(), "k": k}))
        os.replace(partial, self.marker)
        os.kill(os.getpid(), 9)


class Fuse(ConsumerNode):
    """The time join of the cameras, as a sink: per group it is handed, one JSON line
    in <log_dir>/groups.log: key, instants (per camera, None for one missing),
    pids, latency_ms (from the group's capture instant, the true clock, to this
    call) and wait_ms (the join's own figure: from the group's first member's
    arrival to its hand-over)."""

    def __init__(self, gate: StartGate, fps: float, log_dir: str, **options: Any) -> None:
        super().__init__(**options)
        self.gate, self.fps, self.log_dir = gate, fps, log_dir

    def open(self) -> None:
        self.gate.arrive(self.name)
        self.t0: float | None = None

    def consume(self, *frames: Any) -> None:
        now = time.time()
        assert self.context is not None
        if self.t0 is None:
            self.t0 = self.gate.t0()
        instants = [None if f is None else f["k"] for f in frames]
        present = [k for k in instants if k is not None]
        wait = getattr(self.context._messenger, "last_join_latency", None)
        line = {"key": self.context.last_input_key, "instants": instants,
                "pids": [None if f is None else f["pid"] for f in frames],
                "latency_ms": (now - (self.t0 + min(present) / self.fps)) * 1000.0,
                "wait_ms": None if wait is None else wait * 1000.0}
        with open(Path(self.log_dir) / "groups.log", "a") as log:
            log.write(json.dumps(line) + "\n")
