"""RosbagSource's pace, without a broker: sources of one bag given one anchor send each
message at anchor + (record time - the bag's start) / speed, whenever each was
opened; one opened after its anchor catches up at once, unless a start gate has the
others wait for it; without an anchor a source counts from its own first message. And
a topic's message type, read from the index."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from rosbags.rosbag2 import Writer
from rosbags.typesys import Stores, get_typestore

from videoflow.io import RosbagSource
from videoflow.io.start_gate import StartGate

START_NS = 1_700_000_000 * 10**9
RECORDED = {"/a": [0.0, 0.2, 0.4], "/b": [0.1, 0.3]}
"""Each topic's record times, in seconds after the bag's start (its first message)."""

LATE_S = 0.15
"""How late a message may come on a machine busy with other work; never early."""


class Context:
    """What RosbagSource.next reaches of its replica: the event time it sets."""

    def set_event_timestamp(self, value: float) -> None:
        self.event = value

    def count_drop(self, reason: str) -> None:
        raise AssertionError(f"nothing in this bag is undecodable ({reason})")


@pytest.fixture
def bag(tmp_path: Path) -> Path:
    store = get_typestore(Stores.ROS2_HUMBLE)
    string = store.types["std_msgs/msg/String"]
    path = tmp_path / "paced"
    messages = sorted((START_NS + round(at * 1e9), topic, f"{topic}{i}")
                      for topic, times in RECORDED.items() for i, at in enumerate(times))
    with Writer(path, version=9) as writer:
        connections = {topic: writer.add_connection(topic, string.__msgtype__, typestore=store)
                       for topic in RECORDED}
        for record_ns, topic, text in messages:
            writer.write(connections[topic], record_ns,
                         bytes(store.serialize_cdr(string(data=text), string.__msgtype__)))
    return path


def opened(bag: Path, topic: str, **pace: Any) -> RosbagSource:
    source = RosbagSource(bag, topic, name=topic.strip("/"), **pace)
    source.context = Context()  # type: ignore[assignment]
    source.open()
    return source


def sent_at(source: RosbagSource, count: int) -> list[float]:
    """When each of the next count messages was handed out (epoch seconds)."""
    times = []
    for _ in range(count):
        source.next()
        times.append(time.time())
    return times


def test_sources_of_one_anchor_send_as_recorded_whenever_each_opened(bag: Path) -> None:
    anchor = time.time() + 0.3
    a = opened(bag, "/a", speed=1.0, anchor=anchor)
    time.sleep(0.1)  # b's process starts later, still before the anchor
    b = opened(bag, "/b", speed=1.0, anchor=anchor)
    got: dict[str, list[float]] = {"/a": [], "/b": []}
    try:
        for source, topic in ((a, "/a"), (b, "/b"), (a, "/a"), (b, "/b"), (a, "/a")):
            got[topic] += sent_at(source, 1)  # in recorded order: one thread for both
    finally:
        a.close()
        b.close()
    for topic, times in RECORDED.items():
        for at, sent in zip(times, got[topic], strict=True):
            assert anchor + at <= sent <= anchor + at + LATE_S, (topic, at, sent - anchor)


def test_twice_the_speed_halves_the_offsets(bag: Path) -> None:
    anchor = time.time() + 0.2
    b = opened(bag, "/b", speed=2.0, anchor=anchor)
    try:
        got = sent_at(b, 2)
    finally:
        b.close()
    for at, sent in zip(RECORDED["/b"], got, strict=True):
        assert anchor + at / 2 <= sent <= anchor + at / 2 + LATE_S, (at, sent - anchor)


def test_a_source_opened_after_its_anchor_catches_up_then_keeps_the_pace(bag: Path) -> None:
    anchor = time.time() - 0.25  # the first two of /a are due already
    a = opened(bag, "/a", speed=1.0, anchor=anchor)
    try:
        started = time.time()
        got = sent_at(a, 3)
    finally:
        a.close()
    assert got[1] - started <= LATE_S  # at once: no sleep for what is overdue
    assert anchor + 0.4 <= got[2] <= anchor + 0.4 + LATE_S  # then on time


def test_with_a_start_gate_the_bags_start_waits_for_the_last_source_up(
        bag: Path, tmp_path: Path) -> None:
    gate = StartGate(str(tmp_path), ("a", "b"), 0.1)
    anchor = time.time() + 0.05
    a = opened(bag, "/a", speed=1.0, anchor=anchor, start_gate=gate)
    time.sleep(0.3)  # b's process opens after the anchor has passed
    b = opened(bag, "/b", speed=1.0, anchor=anchor, start_gate=gate)
    up = time.time()  # b marked itself up just before: the last one
    got: dict[str, list[float]] = {"/a": [], "/b": []}
    try:
        for source, topic in ((a, "/a"), (b, "/b"), (a, "/a"), (b, "/b"), (a, "/a")):
            got[topic] += sent_at(source, 1)
    finally:
        a.close()
        b.close()
    # The bag's start is replayed a gate's delay after b was up, for both: a waited.
    start = a.anchor
    assert a.anchor == b.anchor
    assert up - 0.05 + gate.delay <= start <= up + gate.delay
    for topic, times in RECORDED.items():
        for at, sent in zip(times, got[topic], strict=True):
            assert start + at <= sent <= start + at + LATE_S, (topic, at, sent - start)


def test_a_start_gate_keeps_the_anchor_when_every_source_was_up_before_it(
        bag: Path, tmp_path: Path) -> None:
    gate = StartGate(str(tmp_path), ("b",), 0.1)
    anchor = time.time() + 0.4
    b = opened(bag, "/b", speed=1.0, anchor=anchor, start_gate=gate)
    try:
        got = sent_at(b, 1)
    finally:
        b.close()
    assert b.anchor == anchor
    assert anchor + 0.1 <= got[0] <= anchor + 0.1 + LATE_S


def test_a_start_gate_needs_an_anchor_and_must_name_the_source(tmp_path: Path) -> None:
    gate = StartGate(str(tmp_path), ("a",), 0.1)
    with pytest.raises(ValueError, match="give an anchor"):
        RosbagSource("x.bag", "/a", speed=1.0, start_gate=gate, name="a")
    with pytest.raises(ValueError, match=r"does not name 'b' \(it names \['a'\]\)"):
        RosbagSource("x.bag", "/b", speed=1.0, anchor=time.time(), start_gate=gate, name="b")


def test_without_an_anchor_a_source_counts_from_its_own_first_message(bag: Path) -> None:
    b = opened(bag, "/b", speed=1.0)
    try:
        time.sleep(0.3)  # opened long before its first next(): no catching up
        # The source paces on the monotonic clock, from its first next(): read the
        # same clock, before that call, so the origin is at or after start.
        start = time.monotonic()
        got = []
        for _ in range(2):
            b.next()
            got.append(time.monotonic())
    finally:
        b.close()
    # The bag's start is 0.1 s before /b's first message: that much, then 0.2 s more.
    assert start + 0.1 <= got[0] <= start + 0.1 + LATE_S, got[0] - start
    assert start + 0.3 <= got[1] <= start + 0.3 + LATE_S, got[1] - start


@pytest.mark.parametrize("speed, anchor, said", [
    (None, 1_700_000_000.0, "give a speed"),
    (1.0, float("nan"), "anchor"),
    (1.0, float("inf"), "anchor"),
    (1.0, True, "anchor"),
    (1.0, "now", "anchor"),
])
def test_an_anchor_is_a_finite_instant_with_a_speed(speed: Any, anchor: Any,
                                                    said: str) -> None:
    with pytest.raises(ValueError, match=said):
        RosbagSource("x.bag", "/t", speed=speed, anchor=anchor)


def test_a_topics_message_type_is_read_from_the_index(bag: Path) -> None:
    assert RosbagSource(bag, "/a", name="a").message_type() == "std_msgs/msg/String"
    with pytest.raises(ValueError, match=r"no topic '/c'.*'/a', '/b'"):
        RosbagSource(bag, "/c", name="c").message_type()
