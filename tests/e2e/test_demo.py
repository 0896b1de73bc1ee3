"""`videoflow demo` end to end: the flow against a real nats-server and the embedded
one, the command in a subprocess, and its usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from videoflow import demo
from videoflow.core.report import RunReport
from videoflow.server import EmbeddedServer

pytestmark = pytest.mark.timeout(120)

SECONDS = 3.0
SEED = 11
DROP_RATE = 0.1  # 90 instants x 4 cameras: the seed below drops frames, see the first test


def command(*args: str) -> subprocess.CompletedProcess[str]:
    # The videoflow this test imports: the installed package, or PYTHONPATH's.
    env = dict(os.environ)
    env.pop("VIDEOFLOW_NATS_URL", None)
    return subprocess.run([sys.executable, "-m", "videoflow", "demo", *args], env=env,
                          capture_output=True, text=True, timeout=100)


def check(result: demo.DemoResult) -> None:
    """A run whose every group holds one capture instant and that produced what the
    seed says, every captured frame either fused or counted as evicted."""
    assert result.report.outcome == "completed", result.report.format()
    assert result.ok
    assert result.expected is not None
    assert result.groups == result.expected.groups > 0
    assert result.correct == result.groups and result.incorrect == 0
    assert result.correctness == 100.0
    assert result.quorum_groups >= result.expected.quorum_groups > 0
    p50, p99 = result.join_latency_p50_ms, result.join_latency_p99_ms
    assert p50 is not None and p99 is not None and 0 <= p50 <= p99
    # The only drops: frames of instants below the quorum, dropped by the join.
    assert set(result.drops) <= {"fusion"}
    evicted = result.drops.get("fusion", {})
    assert set(evicted) <= {"join_evicted"}
    assert result.frames + evicted.get("join_evicted", 0) == result.expected.frames
    # Every window full: +-20 ms at 400 Hz. A window closes on the IMU's event time, and
    # the wall-time backstop never while its samples wait for the join.
    assert result.imu_per_group is not None and result.imu_per_group[0] >= 16
    assert result.camera_lag_ms is not None and result.camera_lag_ms >= 0


def test_expected_figures_follow_the_seed_and_include_drops() -> None:
    instants = int(SECONDS * 30)
    first = demo.expected(4, instants, DROP_RATE, SEED)
    assert first == demo.expected(4, instants, DROP_RATE, SEED)
    assert first.quorum_groups > 0 and first.evicted > 0
    assert first.frames < 4 * instants
    assert demo.expected(4, instants, 0.0, SEED) == demo.Expected(4 * instants, instants, 0, 0)


def test_a_demo_whose_join_gave_up_on_groups_fails_though_every_group_is_correct() -> None:
    # 8 cameras of VGA frames on a 2-core machine fused 240 of 595 groups, all correct,
    # and the demo printed OK: recall is what the user asked for.
    report = RunReport("demo", "r1", "batch", "nats://x", outcome="completed")
    expected = demo.Expected(frames=2380, groups=595, quorum_groups=85, evicted=30)

    def result(groups: int) -> demo.DemoResult:
        return demo.DemoResult(report, 8, 7, 60.0, 10.0, 1000.0, groups=groups,
                               correct=groups, correctness=100.0, expected=expected)

    assert result(595).ok
    assert not result(240).ok
    assert "demo FAILED" in result(240).format()
    assert not demo.DemoResult(report, 8, 7, 60.0, 10.0, 1000.0, groups=5, correct=5,
                               correctness=100.0).ok  # nothing to check recall against


def test_demo_fuses_every_group_correctly_on_a_nats_server(
        nats_server: EmbeddedServer) -> None:
    result = demo.run_demo(duration=SECONDS, drop_rate=DROP_RATE, seed=SEED,
                           nats_url=nats_server.url, view=False)
    check(result)
    assert result.report.nats_url == nats_server.url
    text = result.format()
    assert "correctness    100.0 %" in text and "demo OK" in text


def test_demo_runs_on_the_embedded_server_without_a_url(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VIDEOFLOW_NATS_URL", raising=False)
    result = demo.run_demo(cameras=3, duration=SECONDS, drop_rate=DROP_RATE, seed=SEED,
                           view=False)
    check(result)
    assert result.quorum == 2


def test_demo_command_prints_json_and_exits_zero() -> None:
    done = command("--duration", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout)
    assert printed["ok"] is True and printed["outcome"] == "completed"
    assert printed["correctness"] == 100.0 and printed["groups"] > 0
    assert printed["join_latency_p50_ms"] is not None
    assert printed["report"]["nodes"]["fusion"]["processed"] == printed["groups"]


@pytest.mark.parametrize(("args", "message"), [
    (("--cameras", "0"), "--cameras must be 1 to 16, got 0"),
    (("--frame-size", "64by48"), "--frame-size is WIDTHxHEIGHT"),
    (("--fps", "120"), "--fps must be above 0 and at most 60"),
])
def test_demo_command_rejects_a_bad_option_in_one_line(args: tuple[str, ...],
                                                       message: str) -> None:
    done = command(*args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("videoflow: error: ") and message in done.stderr


def test_the_start_gate_opens_for_every_process_at_one_instant_once_all_are_up(
    tmp_path: Path,
) -> None:
    gate = demo.StartGate(str(tmp_path), ("cam0", "cam1", "fusion"), delay=0.25)
    gate.arrive("cam0")
    with pytest.raises(TimeoutError, match="cam1, fusion not up after 0.05 s"):
        gate.t0(patience=0.05)
    gate.arrive("cam1")
    gate.arrive("fusion")
    last = max(os.stat(tmp_path / f"{n}.up").st_mtime for n in ("cam0", "cam1", "fusion"))
    gate.arrive("cam0")  # a restarted process: its first mark stands
    again = demo.StartGate(str(tmp_path), ("cam0", "cam1", "fusion"), delay=0.25)
    assert gate.t0() == again.t0() == last + 0.25


def test_build_flow_rejects_options_out_of_range() -> None:
    with pytest.raises(ValueError, match="--drop-rate must be at least 0 and below 1"):
        demo.build_flow(drop_rate=1.0)
    with pytest.raises(ValueError, match="--duration 0.01 s at 30 fps captures no frame"):
        demo.build_flow(duration=0.01)
