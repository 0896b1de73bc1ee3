"""Rosbag replay into the demo's fusion flow (videoflow.cli.demo_flow.fuse_bag), on a
real nats-server: bags written here with the rosbags package (ROS 1 and ROS 2), two
cameras at 30 Hz with jittered stamps and 5% of their frames dropped, and an IMU at
400 Hz. Every group the time join fuses is checked against the stamps written, and
every IMU window against the samples that exist around it. A bag with messages
videoflow cannot read is counted and the replay goes on."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ros_nodes import JsonLines, read_lines
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

from videoflow.broker import server as embedded
from videoflow.cli.demo_flow import REPLAY_FAST_TIMEOUT_MS, REPLAY_PACED_TIMEOUT_MS, fuse_bag
from videoflow.cli.demo_truth import IMU_WINDOW_MS, in_window
from videoflow.core.constants import BATCH
from videoflow.flow import Flow
from videoflow.io import RosbagSource
from videoflow.io.ros_messages import stamp_of

pytestmark = pytest.mark.timeout(180)

T0 = 1_700_000_000
FPS, IMU_HZ, INSTANTS = 30, 400, 60
CAMERAS = ("cam0", "cam1")
WINDOW_MS = IMU_WINDOW_MS  # fuse_bag's: 8 sample periods either side at 400 Hz
RECORD_DELAY_NS = 1_000_000  # the bag records each message 1 ms after its stamp
ANCHOR_DELAY_S = 10.0
"""A paced replay's bag start is this long after the flow is built: the run's streams
are made and its five processes started meanwhile (their sources opened 2 to 7 s
after it on a 2-core machine busy with benchmarks). A source up later would catch up,
and the replay would no longer span the recording's time, as the test checks."""


def seconds(stamp: float) -> tuple[int, int]:
    sec = int(stamp)
    return sec, int(round((stamp - sec) * 1e9))


class Bag:
    """A bag being written: ROS 1 (one .bag file) or ROS 2 (a directory), its
    messages sorted by record time at the end."""

    def __init__(self, path: Path, ros: int) -> None:
        self.path, self.ros = path, ros
        self.store = get_typestore(Stores.ROS1_NOETIC if ros == 1 else Stores.ROS2_HUMBLE)
        self.pending: list[tuple[int, str, str, bytes]] = []

    def header(self, stamp: float | None) -> Any:
        time_type = self.store.types["builtin_interfaces/msg/Time"]
        header = self.store.types["std_msgs/msg/Header"]
        sec, nanosec = seconds(stamp) if stamp is not None else (0, 0)
        if self.ros == 1:
            return header(seq=0, stamp=time_type(sec=sec, nanosec=nanosec), frame_id="")
        return header(stamp=time_type(sec=sec, nanosec=nanosec), frame_id="")

    def add(self, topic: str, message: Any, record_ns: int) -> None:
        msgtype = message.__msgtype__
        raw = (self.store.serialize_ros1 if self.ros == 1 else self.store.serialize_cdr)(
            message, msgtype)
        self.pending.append((record_ns, topic, msgtype, bytes(raw)))

    def add_raw(self, topic: str, msgtype: str, raw: bytes, record_ns: int) -> None:
        self.pending.append((record_ns, topic, msgtype, raw))

    def image(self, stamp: float, fill: int, encoding: str = "rgb8") -> Any:
        image = self.store.types["sensor_msgs/msg/Image"]
        return image(header=self.header(stamp), height=6, width=8, encoding=encoding,
                     is_bigendian=0, step=24, data=np.full(6 * 24, fill, np.uint8))

    def imu(self, stamp: float, i: int) -> Any:
        types = self.store.types
        vector, quaternion = types["geometry_msgs/msg/Vector3"], types[
            "geometry_msgs/msg/Quaternion"]
        zeros = np.zeros(9, np.float64)
        return types["sensor_msgs/msg/Imu"](
            header=self.header(stamp), orientation=quaternion(x=0.0, y=0.0, z=0.0, w=1.0),
            orientation_covariance=zeros, angular_velocity=vector(x=float(i), y=0.0, z=0.0),
            angular_velocity_covariance=zeros,
            linear_acceleration=vector(x=0.0, y=0.0, z=9.81),
            linear_acceleration_covariance=zeros)

    def write(self) -> Path:
        if self.ros == 1:
            from rosbags.rosbag1 import Writer as Writer1
            writer: Any = Writer1(self.path)
        else:
            from rosbags.rosbag2 import Writer as Writer2
            writer = Writer2(self.path, version=9)
        with writer:
            connections: dict[str, Any] = {}
            for record_ns, topic, msgtype, raw in sorted(self.pending, key=lambda m: m[0]):
                if topic not in connections:
                    connections[topic] = writer.add_connection(topic, msgtype,
                                                               typestore=self.store)
                writer.write(connections[topic], record_ns, raw)
        return self.path


def fusion_bag(path: Path, ros: int, seed: int = 3) -> tuple[Path, dict[str, Any]]:
    """Two cameras and an IMU; returns the bag and the truth: per camera, instant ->
    stamp (seconds, as decoded); the IMU's stamps, and per stamp its sample's angular
    velocity x (imu_x)."""
    rng = random.Random(seed)
    bag = Bag(path, ros)
    truth: dict[str, Any] = {cam: {} for cam in CAMERAS}
    for k in range(INSTANTS):
        for cam in CAMERAS:
            if rng.random() < 0.05:
                continue  # a dropped frame
            sec, nanosec = seconds(T0 + k / FPS + rng.uniform(-0.002, 0.002))
            stamp = sec + nanosec * 1e-9
            truth[cam][k] = stamp
            bag.add(f"/{cam}/image", bag.image(stamp, k % 256), int(stamp * 1e9) + RECORD_DELAY_NS)
    # The IMU from a window before the first instant to one after the last.
    lead = int(np.ceil((WINDOW_MS + 10) / 1000 * IMU_HZ))
    imu_stamps, imu_x = [], {}
    for i in range(-lead, INSTANTS * IMU_HZ // FPS + lead):
        sec, nanosec = seconds(T0 + i / IMU_HZ)
        stamp = sec + nanosec * 1e-9
        imu_stamps.append(stamp)
        imu_x[stamp] = float(i)
        bag.add("/imu", bag.imu(stamp, i), int(stamp * 1e9) + RECORD_DELAY_NS)
    truth["imu"], truth["imu_x"] = imu_stamps, imu_x
    return bag.write(), truth


@pytest.mark.parametrize("ros, speed", [(1, None), (2, None), (2, 1.0)],
                         ids=["ros1-fast", "ros2-fast", "ros2-recorded-pace"])
def test_a_bag_replayed_into_a_fusion_flow_gives_every_group_and_imu_window(
        ros: int, speed: float | None, nats_server: embedded.EmbeddedServer,
        tmp_path: Path) -> None:
    bag, truth = fusion_bag(tmp_path / ("fusion.bag" if ros == 1 else "fusion"), ros)
    # Paced, every source replays the bag's start at one anchor (what videoflow replay
    # --speed does): the topics reach the join as recorded, however far apart the
    # processes started before it, and the join's timeout has only a source's stall,
    # or its opening later than the anchor, to outlast: fuse_bag's 1 s (once 10 s,
    # when each source paced from its own first frame and the start skew of a loaded
    # machine stayed for the whole replay). As fast as the flow takes them, each
    # source runs through its topic on its own, seconds apart, and the join waits
    # 10 s for a silent one. Either way a frame a camera dropped is found missing by
    # its next frame's watermark, not by the timeout.
    anchor = None if speed is None else time.time() + ANCHOR_DELAY_S
    topics = {**{cam: f"/{cam}/image" for cam in CAMERAS}, "imu": "/imu"}
    sources = {topic: RosbagSource(bag, topic, speed=speed, anchor=anchor, name=name)
               for name, topic in topics.items()}
    out = tmp_path / "groups.jsonl"
    flow = fuse_bag(sources, str(out))
    fusion = flow.consumers[0].parents[0]
    assert fusion.join_policy is not None and fusion.join_policy["timeout_ms"] == (
        REPLAY_FAST_TIMEOUT_MS if speed is None else REPLAY_PACED_TIMEOUT_MS)
    report = flow.run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    for cam in CAMERAS:
        assert report.nodes[cam].emitted == len(truth[cam])
    assert report.nodes["imu"].emitted == len(truth["imu"])
    groups = read_lines(out)
    if speed is not None:
        # Paced: the groups were fused over a time of the recording's order (2 s; at
        # least half of it, so a fusion node that starts late and catches up on its
        # first groups still passes), where as fast as the flow takes them they come
        # within a fraction of it.
        fused = max(g["fused_at"] for g in groups) - min(g["fused_at"] for g in groups)
        assert fused >= INSTANTS / FPS / speed / 2, fused

    by_instant: dict[int, dict[str, Any]] = {}
    for group in groups:
        present = [s for s in group["stamps"] if s is not None]
        k = round((present[0] - T0) * FPS)
        assert k not in by_instant, f"instant {k} fused twice"
        by_instant[k] = group
    # Every instant a camera captured is one group, of exactly its frames, stamps as
    # written, pixels of that instant, images decoded to their shape.
    captured = {k for cam in CAMERAS for k in truth[cam]}
    assert set(by_instant) == captured
    w = WINDOW_MS / 1000.0
    for k, group in by_instant.items():
        assert group["stamps"] == [truth[cam].get(k) for cam in CAMERAS], k
        assert group["pixels"] == [k % 256 if k in truth[cam] else None for cam in CAMERAS]
        assert all(s in (None, [6, 8, 3]) for s in group["shapes"])
        # The IMU window holds every sample within it of the group's time (the stamp
        # of one of its frames), and nothing else; each sample decoded (sample i's
        # angular velocity is (i, 0, 0)), the fusion's mean is theirs.
        windows = [[s for s in truth["imu"] if in_window(s, t, w)]
                   for t in group["stamps"] if t is not None]
        assert sorted(group["imu_stamps"]) in windows, (k, group["imu_stamps"])
        assert group["imu"] == len(group["imu_stamps"])
        mean = float(np.mean([truth["imu_x"][s] for s in group["imu_stamps"]]))
        assert group["gyro_mean"] == pytest.approx([mean, 0.0, 0.0]), k


def test_undecodable_messages_are_counted_and_the_replay_goes_on(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    bag = Bag(tmp_path / "odd", 2)
    thing = """std_msgs/Header header
string label
float64[] values
"""
    bag.store.register(get_types_from_msg(thing, "acme/msg/Thing"))
    good = [k for k in range(12) if k not in (3, 7, 9)]
    for k in range(12):
        stamp = T0 + k * 0.1
        record = int(stamp * 1e9)
        if k == 3:  # bytes an Image cannot be read from
            bag.add_raw("/cam/image", "sensor_msgs/msg/Image", b"\x00\x01\x00\x00junk", record)
        elif k in (7, 9):  # an encoding no decoder knows
            bag.add("/cam/image", bag.image(stamp, k, encoding="weird42"), record)
        else:
            bag.add("/cam/image", bag.image(stamp, k), record)
        thing_type = bag.store.types["acme/msg/Thing"]
        bag.add("/thing", thing_type(header=bag.header(None), label=f"t{k}",
                                     values=np.array([k, 0.5])), record + 1)
    path = bag.write()

    images = RosbagSource(path, "/cam/image", name="images")
    things = RosbagSource(path, "/thing", name="things")
    image_out, thing_out = tmp_path / "images.jsonl", tmp_path / "things.jsonl"
    sinks = [JsonLines(str(image_out), name="image_sink")(images),
             JsonLines(str(thing_out), name="thing_sink")(things)]
    report = Flow([images, things], sinks, BATCH, name="oddbag").run(nats_server.url,
                                                                       view=False)
    assert report.outcome == "completed", report.format()
    assert report.nodes["images"].dropped.get("undecodable") == 3
    assert report.nodes["images"].emitted == len(good)
    assert sorted(int(np.asarray(i)[0][0][0]) for i in read_lines(image_out)) == good
    # A type of its own (not one videoflow decodes specially): a dict of its fields,
    # the header left out; an unset stamp gives the record time as event time.
    got = read_lines(thing_out)
    assert sorted(got, key=lambda t: t["label"]) == sorted(
        ({"label": f"t{k}", "values": [float(k), 0.5]} for k in range(12)),
        key=lambda t: t["label"])
    assert report.nodes["things"].dropped.get("undecodable", 0) == 0


def test_a_missing_topic_names_the_ones_there(tmp_path: Path) -> None:
    bag = Bag(tmp_path / "small", 2)
    bag.add("/cam/image", bag.image(T0, 1), T0 * 10**9)
    source = RosbagSource(bag.write(), "/nope", name="src")
    with pytest.raises(ValueError, match=r"no topic '/nope'.*'/cam/image'"):
        source.open()


@pytest.mark.parametrize("speed", [0, -1.0, float("inf"), float("nan"), True, "fast"])
def test_a_speed_that_is_not_a_positive_number_is_refused(speed: Any) -> None:
    with pytest.raises(ValueError, match="speed"):
        RosbagSource("x.bag", "/t", speed=speed)


def test_stamp_of_is_the_header_stamp_or_none() -> None:
    store = get_typestore(Stores.ROS2_HUMBLE)
    time_type, header = store.types["builtin_interfaces/msg/Time"], store.types[
        "std_msgs/msg/Header"]

    class Stamped:
        def __init__(self, sec: int, nanosec: int) -> None:
            self.header = header(stamp=time_type(sec=sec, nanosec=nanosec), frame_id="")

    assert stamp_of(Stamped(5, 250_000_000)) == 5.25
    assert stamp_of(Stamped(0, 0)) is None
    assert stamp_of(object()) is None
