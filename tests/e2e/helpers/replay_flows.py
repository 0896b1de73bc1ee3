"""A flow module for `videoflow replay` (tests/e2e/test_replay_cli.py): its function
takes the bag's sources and returns the flow; the groups go to $VF_TEST_OUT."""

from __future__ import annotations

import os
from typing import Any

from ros_nodes import JsonLines, StampFusion

from videoflow.core.constants import BATCH
from videoflow.flow import Flow


def fuse(sources: dict[str, Any]) -> Flow:
    cameras = [node for topic, node in sources.items() if topic != "/imu"]
    imu = sources["/imu"]
    fusion = StampFusion(name="fusion", join_policy={
        "mode": "time", "tolerance_ms": 10.0, "quorum": 1, "timeout_ms": 10_000.0,
        "missing": "drop", "max_pending": 1024, "collect": {"imu": 6.25}})(*cameras, imu)
    sink = JsonLines(os.path.join(os.environ["VF_TEST_OUT"], "groups.jsonl"),
                     name="sink")(fusion)
    return Flow([*cameras, imu], [sink], BATCH, name="replayed")
