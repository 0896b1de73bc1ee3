"""Groups in the Rerun viewer (videoflow.io.rerun_log, RerunSink): logged to an .rrd
and read back with rerun's own reader (rerun.chunk.RrdReader), no display needed. Each
camera's frame is an image entity at its group's event time, a collect window a scalar
series at its samples' times, a missing parent cleared and named, corrections and
drops noted. Without rerun-sdk, asking for it fails at once, naming the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from videoflow.errors import MissingDependency
from videoflow.io import RerunSink
from videoflow.io.rerun_log import RerunLog, check_target, open_recording
from videoflow.io.rerun_sink import group_time

rerun = pytest.importorskip("rerun", reason="rerun-sdk (the 'rerun' extra) not installed")
from rerun_files import read_back, texts  # noqa: E402  (after the skip)


def frame(k: int) -> np.ndarray:
    return np.full((16, 24, 3), k, dtype=np.uint8)


def test_groups_read_back_as_entities_at_their_event_times(tmp_path: Path) -> None:
    path = tmp_path / "groups.rrd"
    log = RerunLog(open_recording(str(path), "videoflow test", "run-1"), "fusion")
    t0, window = 1_700_000_000.0, [0.1 * i for i in range(4)]
    for k in range(3):
        at = t0 + k / 30
        members = {"cam0": frame(k), "cam1": None if k == 1 else frame(k),
                   "imu": [{"gyro": [g, -g, 0.5]} for g in window]}
        info = {"cam0": {"event_ts": at, "clock_offset": 0.0},
                "cam1": None if k == 1 else {"event_ts": at + 0.001,
                                             "clock_offset": -0.02},
                "imu": {"event_ts": [at - 0.004 + 0.0025 * i for i in range(4)],
                        "clock_offset": 0.0}}
        log.group(group_time(info), members, info, {"join_evicted": k})
    log.recording.flush()
    log.recording.disconnect()

    got = read_back(path)
    times = [t0 + k / 30 for k in range(3)]
    assert got["/fusion/cam0"]["event_time"] == pytest.approx(times, abs=1e-6)
    assert len(got["/fusion/cam0"]["Image:buffer"]) == 3
    # cam1 missing at the second group: cleared then, its image at the others.
    cam1 = got["/fusion/cam1"]
    assert cam1["event_time"] == pytest.approx(times, abs=1e-6)
    assert [b is not None for b in cam1["Clear:is_recursive"]] == [False, True, False]
    # The IMU window: each sample at its own time, its three axes one series each.
    gyro = got["/fusion/imu/gyro"]
    assert gyro["event_time"] == pytest.approx(
        [t - 0.004 + 0.0025 * i for t in times for i in range(4)], abs=1e-6)
    assert [list(v) for v in gyro["Scalars:scalars"][:4]] == [
        [g, -g, 0.5] for g in window]
    notes = dict(zip(got["/fusion/notes"]["event_time"],
                     texts(got["/fusion/notes"]), strict=True))
    assert list(notes.values()) == [
        "cam1's clock corrected by -20.0 ms",
        "cam1 missing; dropped since the last group: 1 join_evicted",
        "dropped since the last group: 2 join_evicted"]
    assert list(notes) == pytest.approx(times, abs=1e-6)


def test_values_become_entities_by_their_shape(tmp_path: Path) -> None:
    path = tmp_path / "message.rrd"
    log = RerunLog(open_recording(str(path), "videoflow test"), "node")
    log.message(10.0, {"depth": np.ones((8, 8), np.float32), "pose": np.arange(7.0),
                       "label": "car", "blob": b"\x00" * 5, "score": 0.9,
                       "cloud": np.zeros((1000, 3), np.float32)})
    log.recording.flush()
    log.recording.disconnect()
    got = read_back(path)
    assert got["/node/depth"]["Image:format"][0] is not None
    assert list(got["/node/pose"]["Scalars:scalars"][0]) == list(range(7))
    assert texts(got["/node/label"]) == ["car"]
    assert texts(got["/node/blob"]) == ["<5 bytes>"]
    assert list(got["/node/score"]["Scalars:scalars"][0]) == [0.9]
    assert texts(got["/node/cloud"]) == ["array float32 (1000, 3)"]


def test_a_target_is_a_file_a_spawned_viewer_or_a_viewers_url() -> None:
    for good in ("out.rrd", "spawn", "rerun+http://127.0.0.1:9876/proxy"):
        assert check_target(good) == good
    with pytest.raises(ValueError, match="a path ending in .rrd, 'spawn'"):
        check_target("groups.txt")
    with pytest.raises(ValueError, match="a path ending in .rrd"):
        RerunSink("viewer")


def test_without_rerun_sdk_asking_for_it_fails_at_once_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rerun", None)  # import rerun now raises
    with pytest.raises(MissingDependency,
                       match=r"pip install rerun-sdk \(videoflow's extra 'rerun'\)"):
        RerunSink("groups.rrd", name="shown")
