"""`videoflow replay BAG --topics ... --into MODULE:ATTR`: a bag's topics, each a
RosbagSource, into the flow the user's function builds from them, run to its end; at
the recorded pace, into the demo's fusion (videoflow.cli.demo_flow:fuse_bag)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ros_nodes import read_lines
from test_cli import environment, videoflow
from test_rosbag_replay import CAMERAS, fusion_bag

pytestmark = pytest.mark.timeout(180)


def test_replay_runs_a_bags_topics_through_the_users_flow(tmp_path: Path) -> None:
    bag, truth = fusion_bag(tmp_path / "rig", 2)
    out = tmp_path / "out"
    out.mkdir()
    done = videoflow("replay", str(bag), "--topics", "/cam0/image", "/cam1/image", "/imu",
                     "--into", "replay_flows:fuse", "--ephemeral", "--json",
                     env=environment(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "completed"
    assert report["nodes"]["cam0_image"]["emitted"] == len(truth["cam0"])
    assert report["nodes"]["imu"]["emitted"] == len(truth["imu"])
    captured = {k for cam in CAMERAS for k in truth[cam]}
    assert len(read_lines(out / "groups.jsonl")) == len(captured)


def test_replay_at_the_recorded_pace_into_the_demos_fusion(tmp_path: Path) -> None:
    bag, truth = fusion_bag(tmp_path / "rig.bag", 1)
    # --speed: every topic paced from one anchor, 5 s after launch (the embedded
    # broker, the run's streams and its five processes start meanwhile), so the demo's
    # fusion joins them with its paced timeout (1 s).
    done = videoflow("replay", str(bag), "--topics", "/cam0/image", "/cam1/image", "/imu",
                     "--into", "videoflow.cli.demo_flow:fuse_bag", "--speed", "1",
                     "--start-delay", "5", "--ephemeral", "--json", env=environment(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "completed"
    captured = {k for cam in CAMERAS for k in truth[cam]}
    assert report["nodes"]["fusion"]["emitted"] == len(captured)  # one group per instant
    assert report["nodes"]["groups"]["processed"] == len(captured)
    assert not any(report["nodes"]["fusion"]["dropped"].values())
    assert report["nodes"]["imu"]["emitted"] == len(truth["imu"])


def test_a_replay_waits_for_its_last_source_to_open_before_the_bags_first_instant(
        tmp_path: Path) -> None:
    # One source's process opens 3 s after the anchor (a replica started last on a
    # loaded machine). Paced from the anchor alone, the other camera's frames went
    # first: the fusion's paced timeout (1 s) emitted their groups without cam1, and
    # cam1's frames, caught up at once, made groups of their own. The sources wait for
    # each other (a StartGate), and the bag's start is replayed after the last is up.
    bag, truth = fusion_bag(tmp_path / "rig.bag", 1)
    done = videoflow("replay", str(bag), "--topics", "/cam0/image", "/cam1/image", "/imu",
                     "--into", "replay_flows:fuse_bag_cam1_late", "--speed", "1",
                     "--start-delay", "1", "--ephemeral", "--json",
                     env=environment(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    captured = {k for cam in CAMERAS for k in truth[cam]}
    assert report["nodes"]["fusion"]["emitted"] == len(captured), report["nodes"]["fusion"]
    assert not any(report["nodes"]["fusion"]["dropped"].values())
    assert report["outcome"] == "completed"


@pytest.mark.parametrize("arguments, said", [
    (["nowhere", "--topics", "/a", "--into", "replay_flows:fuse"], "no bag at nowhere"),
    (["BAG", "--topics", "/a", "/a", "--into", "replay_flows:fuse"], "names a topic twice"),
    (["BAG", "--topics", "/a", "--into", "replay_flows:nothing"], "has no attribute"),
    (["BAG", "--topics", "/a", "--into", "replay_flows:fuse", "--speed", "-2"],
     "must be a number above 0"),
    (["BAG", "--topics", "/a", "--into", "replay_flows:fuse", "--start-delay", "2"],
     "--start-delay paces a replay: give --speed too"),
])
def test_replay_refuses_what_it_cannot_run_in_one_line(arguments: list[str], said: str,
                                                       tmp_path: Path) -> None:
    bag = tmp_path / "bag"
    bag.mkdir()
    done = videoflow("replay", *[str(bag) if a == "BAG" else a for a in arguments],
                     env=environment(tmp_path))
    assert done.returncode != 0
    assert said in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
