"""Flow modules for `videoflow replay` (tests/e2e/test_replay_cli.py): each function
takes the bag's sources and returns the flow; fuse's groups go to $VF_TEST_OUT."""

from __future__ import annotations

import os
import time
from typing import Any

from ros_nodes import JsonLines, StampFusion

from videoflow.cli.demo_flow import fuse_bag
from videoflow.core.constants import BATCH
from videoflow.flow import Flow
from videoflow.io import RosbagSource


def fuse(sources: dict[str, Any]) -> Flow:
    cameras = [node for topic, node in sources.items() if topic != "/imu"]
    imu = sources["/imu"]
    fusion = StampFusion(name="fusion", join_policy={
        "mode": "time", "tolerance_ms": 10.0, "quorum": 1, "timeout_ms": 10_000.0,
        "missing": "drop", "max_pending": 1024, "collect": {"imu": 6.25}})(*cameras, imu)
    sink = JsonLines(os.path.join(os.environ["VF_TEST_OUT"], "groups.jsonl"),
                     name="sink")(fusion)
    return Flow([*cameras, imu], [sink], BATCH, name="replayed")


LATE_OPEN_S = 3.0
"""How long LateOpen's process takes to open, past a one-second start delay."""


class LateOpen(RosbagSource):
    """A RosbagSource whose process is this late to open: a replica started last on a
    loaded machine, after the replay's anchor."""

    def open(self) -> None:
        time.sleep(LATE_OPEN_S)
        super().open()


def fuse_bag_cam1_late(sources: dict[str, Any]) -> Flow:
    """The demo's fusion over the bag (fuse_bag), with /cam1/image's source late to
    open."""
    late = sources["/cam1/image"]
    sources = {**sources, "/cam1/image": LateOpen(
        late.paths, late.topic, speed=late.speed, anchor=late.anchor,
        start_gate=late.start_gate, name=late.name)}
    return fuse_bag(sources)
