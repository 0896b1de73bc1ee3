"""The flow of the three-host test (test_hosts.py): videoflow's demo fusion (cameras
and an IMU -> a time join -> a verifying sink, videoflow.cli.demo_flow), sized by the
environment: VF_TEST_CAMERAS, VF_TEST_FPS, VF_TEST_SECONDS, VF_TEST_FRAME (WxH), the
summary file VF_TEST_SUMMARY, VF_TEST_CODEC, the flow's codec ('' for none),
VF_TEST_TIMEOUT_MS, the join's silence backstop (the demo's 300 ms when unset), and
VF_TEST_DISORDER_MS, its JoinPolicy.disorder_ms (0 when unset)."""

from __future__ import annotations

import os

from videoflow.cli.demo_flow import build_flow
from videoflow.flow import Flow
from videoflow.wire.codecs import parse_codecs


def fusion() -> Flow:
    width, height = (int(n) for n in os.environ.get("VF_TEST_FRAME", "1280x720").split("x"))
    flow = build_flow(int(os.environ.get("VF_TEST_CAMERAS", "4")),
                      float(os.environ.get("VF_TEST_FPS", "30")),
                      float(os.environ.get("VF_TEST_SECONDS", "1")), (width, height),
                      imu_hz=400.0, drop_rate=0.0, summary_path=os.environ["VF_TEST_SUMMARY"])
    flow.codec = parse_codecs(os.environ.get("VF_TEST_CODEC") or None)
    (fusion_node,) = flow.consumers[0].parents
    policy = dict(fusion_node.join_policy)
    if timeout := os.environ.get("VF_TEST_TIMEOUT_MS"):
        policy["timeout_ms"] = float(timeout)
    if disorder := os.environ.get("VF_TEST_DISORDER_MS"):
        policy["disorder_ms"] = float(disorder)
    fusion_node.join_policy = policy
    return flow
