"""Benchmarks of my_flow.brightness_flow with videoflow's pytest plugin.

    pytest examples/benchmark_my_flow --benchmark-autosave
    (change a node)
    pytest examples/benchmark_my_flow --benchmark-compare --benchmark-compare-fail=min:25%

The first run saves its timings (in .benchmarks/); the second compares with the latest
saved and fails if a run's best time grew by more than 25 %. With --benchmark-disable
the flow runs once, untimed, and the test still checks what it did. What each node did
is in the saved JSON, under each benchmark's extra_info["videoflow"].
"""

from __future__ import annotations

from pathlib import Path

from my_flow import FRAME_BYTES, brightness_flow

from videoflow.testing.bench import FlowBenchmark

FRAMES = 100


def test_brightness_flow(videoflow_benchmark: FlowBenchmark, tmp_path: Path) -> None:
    report = videoflow_benchmark(brightness_flow(tmp_path, FRAMES), rounds=3,
                                 frame_bytes={"camera": FRAME_BYTES})

    assert report.outcome == "completed", report.format()
    assert {name: node.processed for name, node in report.nodes.items()} == {
        "camera": 0, "brightness": FRAMES, "record": FRAMES}
    assert not any(node.dropped_total or node.dead_lettered for node in report.nodes.values())
    measures = {int(p.stem): float(p.read_text()) for p in tmp_path.glob("*.txt")}
    assert measures == {i: float(i % 256) for i in range(FRAMES)}
