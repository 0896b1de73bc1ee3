"""Nodes for the rosbag replay and SubjectSource tests: a fusion node that reports, per
group, its cameras' stamps and first pixels and its IMU window's stamps, a sink that
writes each group once, as a JSON line, and a SubjectSource decoding that says which
process (replica) read each record."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from videoflow.core.node import ConsumerNode, ProcessorNode


class StampFusion(ProcessorNode):
    """(cam0, cam1, imu window) -> what the test checks of the group."""

    def process(self, *inputs: Any) -> dict[str, Any]:
        assert self.context is not None
        info = self.context.input_info or {}
        *frames, imu = inputs
        cameras = [p for p in self.context.parents if p != "imu"]
        return {
            "stamps": [None if f is None else info[p]["event_ts"]
                       for p, f in zip(cameras, frames, strict=True)],
            "pixels": [None if f is None else int(f[0, 0, 0]) for f in frames],
            "shapes": [None if f is None else list(f.shape) for f in frames],
            "imu": list(info["imu"]["event_ts"]) if imu else [],
            "imu_ok": all(isinstance(s["angular_velocity"], np.ndarray)
                          and s["angular_velocity"].shape == (3,) for s in imu),
            "at": time.time(),  # when fused: a paced replay spreads these out
        }


class JsonLines(ConsumerNode):
    """Appends each group's value to path, once per group (a redelivery skipped)."""

    def __init__(self, path: str, **options: Any) -> None:
        super().__init__(**options)
        self.path = path

    def open(self) -> None:
        self.seen: set[str] = set()

    def consume(self, value: Any) -> None:
        assert self.context is not None
        key = self.context.last_input_key
        if key in self.seen:
            return
        self.seen.add(str(key))
        with open(self.path, "a") as out:
            out.write(json.dumps(value, default=_plain) + "\n")
            out.flush()
            os.fsync(out.fileno())


def json_with_pid(data: bytes, headers: dict[str, str]) -> dict[str, Any]:
    """A JSON record as SubjectSource(decode=...) reads it, with the id of the process
    that read it: each replica of a source is a process of its own."""
    return {**json.loads(data), "pid": os.getpid()}


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value).__name__)


def read_lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
