"""RosbagSource: a producer that replays one topic of a recorded ROS bag (ROS 1 .bag
files, or a ROS 2 bag directory) into a flow, through the rosbags package (the ``ros``
extra: ``pip install rosbags pillow``; no ROS installation).

Each message becomes one output, decoded as videoflow.io.ros_messages says (images as
numpy arrays, IMU and point clouds as structured values, the rest as dicts), stamped
with its event time: its ``header.stamp``, else (no header, or a zero stamp) the time
the bag recorded it.

Pace. speed=None replays as fast as the flow takes it; speed=1.0 at the recorded
pace, 2.0 twice as fast. A message recorded at r is sent at anchor + (r - start) /
speed, where start is the bag's first record time of any topic (not the topic's), so
sources of several topics of one bag keep the recording's spacing between topics. The
record time paces, not the header stamp: the bag's start is on the recorder's clock,
and a sensor's stamps may be on another.

The anchor is the instant (epoch seconds, on the wall clock every process of the
flow shares) at which the bag's start is replayed. Sources of one bag given the same
anchor (``videoflow replay`` computes one, a short delay after its launch) stay
aligned as recorded however far apart their processes started before it, so a time
join's timeout need not outlast their start skew. A source that opens after its
anchor is behind from its first message: it catches up at once (it never sleeps a
negative time), then keeps the pace. Without an anchor each source counts from its
own first next(): sources started together keep the recording's spacing, but one
started later stays that much behind for the whole replay.

With a StartGate as well (videoflow.io.start_gate; ``videoflow replay`` gives one),
the sources of one replay wait for each other: each marks itself up once its bag is
open, and the bag's start is replayed at the anchor or, when the last of them came up
too late for it, a gate's delay after that one. Paced from the anchor alone, a source
whose process opened well after it (started last on a loaded machine) sent its first
seconds at once while the others had long gone on: a time join had given up on it for
its timeout and made their groups without it, and its frames came after as groups of
their own.

A source is replayable (MSGID-6): after a restart it resumes after the outputs already
accepted, and a repeated output carries the id it had, which the broker's duplicate
window drops.

Undecodable messages -- a type the bag has no definition of, bytes its type cannot
read, an image encoding this module does not know -- are counted as the node's
'undecodable' drops (the run report's), logged once per reason, and skipped: the
replay goes on.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from videoflow.core.node import ProducerNode
from videoflow.errors import MissingDependency
from videoflow.io.ros_messages import Undecodable, decode, normalized_type, stamp_of
from videoflow.io.start_gate import StartGate

logger = logging.getLogger(__name__)


class RosbagSource(ProducerNode):
    """A producer replaying one topic of a ROS bag.

    Arguments:
        bag: a ROS 2 bag directory, a ROS 1 .bag file, or several ROS 1 .bag files
            (a split recording).
        topic: the topic to replay.
        speed: None (as fast as the flow takes it) or a positive multiple of the
            recorded pace.
        anchor: with a speed, the instant (epoch seconds) the bag's start is replayed
            at, shared by the sources of one bag; None: the source's first next().
        start_gate: with an anchor, the StartGate of the replay's sources (on one
            host), naming each by its node name: the bag's start is replayed once all
            are up, at the anchor or a gate's delay after the last, whichever is later.
        **node: Node's arguments (name, ...).

    Raises:
        ValueError: no bag, a speed that is not None or a positive number, an anchor
            that is not a finite number, or one without a speed; a start gate without
            an anchor, or one that does not name this source.
    """

    replayable = True

    def __init__(self, bag: str | Path | Sequence[str | Path], topic: str, *,
                 speed: float | None = None, anchor: float | None = None,
                 start_gate: StartGate | None = None, **node: Any) -> None:
        super().__init__(**node)
        paths = [bag] if isinstance(bag, (str, Path)) else list(bag)
        if not paths:
            raise ValueError("RosbagSource: give a bag")
        if speed is not None and (isinstance(speed, bool) or not isinstance(
                speed, (int, float)) or not speed > 0 or speed == float("inf")):
            raise ValueError(f"RosbagSource: speed must be None or a positive number, "
                             f"got {speed!r}")
        if anchor is not None:
            if isinstance(anchor, bool) or not isinstance(anchor, (int, float)) \
                    or not math.isfinite(anchor):
                raise ValueError(f"RosbagSource: anchor must be None or epoch seconds, "
                                 f"got {anchor!r}")
            if speed is None:
                raise ValueError("RosbagSource: an anchor paces a replay: give a speed")
        if start_gate is not None:
            if anchor is None:
                raise ValueError("RosbagSource: a start gate waits to replay from an "
                                 "anchor: give an anchor")
            if self.name not in start_gate.names:
                raise ValueError(f"RosbagSource: the start gate does not name "
                                 f"{self.name!r} (it names {list(start_gate.names)})")
        self.paths = [str(p) for p in paths]
        self.topic, self.speed = topic, speed
        self.anchor = None if anchor is None else float(anchor)
        self.start_gate = start_gate
        self.undecodable = 0
        self._reader: Any = None
        self._messages: Iterator[tuple[Any, int, bytes]] | None = None
        self._reasons: set[str] = set()
        self._errors: tuple[type[Exception], ...] = ()  # what an undecodable one raises

    def open(self) -> None:
        reader, connections, self._errors = self._opened()
        self._reader = reader
        self._start_ns = reader.start_time
        self._t0: float | None = None
        self._messages = reader.messages(connections=connections)
        self._gated = self.start_gate is None
        if self.start_gate is not None:
            self.start_gate.arrive(self.name)

    def message_type(self) -> str:
        """The type of the topic's messages as ROS 2 spells it ('sensor_msgs/msg/Image'),
        from the bag's index: a flow's builder picks what each source feeds by it.

        Raises:
            MissingDependency: rosbags is not installed.
            ValueError: the bag has no such topic.
        """
        reader, connections, _ = self._opened()
        try:
            return normalized_type(connections[0].msgtype)
        finally:
            reader.close()

    def _opened(self) -> tuple[Any, list[Any], tuple[type[Exception], ...]]:
        """The bag open: (reader, the topic's connections, what an undecodable message
        raises).

        Raises:
            MissingDependency: rosbags is not installed.
            ValueError: the bag has no such topic.
        """
        try:
            from rosbags.highlevel import AnyReader, AnyReaderError
            from rosbags.serde import SerdeError
            from rosbags.typesys import Stores, TypesysError, get_typestore
        except ImportError as error:
            raise MissingDependency("RosbagSource needs the rosbags package: "
                                    "pip install rosbags") from error
        errors = (AnyReaderError, SerdeError, TypesysError, Undecodable, KeyError,
                  IndexError, ValueError, struct.error)
        reader = AnyReader([Path(p) for p in self.paths],
                           default_typestore=get_typestore(Stores.LATEST))
        reader.open()
        connections = [c for c in reader.connections if c.topic == self.topic]
        if not connections:
            topics = sorted({c.topic for c in reader.connections})
            reader.close()
            raise ValueError(f"node {self.name!r}: the bag has no topic {self.topic!r} "
                             f"(it has {topics})")
        return reader, connections, errors

    def next(self) -> Any:
        while True:
            connection, record_ns, raw = self._read()
            value = self._decoded(connection, raw)
            if value is None:
                continue
            message, output = value
            if self.speed is not None:
                self._pace(record_ns)
            event = stamp_of(message)
            assert self.context is not None
            self.context.set_event_timestamp(event if event is not None else record_ns * 1e-9)
            return output

    def resume(self, offset: int) -> None:
        """Skip the first offset outputs (undecodable messages make none)."""
        done = 0
        while done < offset:
            connection, _, raw = self._read()
            done += self._decoded(connection, raw, count=False) is not None

    def _read(self) -> tuple[Any, int, bytes]:
        assert self._messages is not None, "open() was not called"
        return next(self._messages)  # StopIteration: the bag's topic is replayed

    def _decoded(self, connection: Any, raw: bytes, count: bool = True
                 ) -> tuple[Any, Any] | None:
        """(deserialized message, output), or None for an undecodable one (counted)."""
        try:
            message = self._reader.deserialize(raw, connection.msgtype)
            return message, decode(connection.msgtype, message)
        except self._errors as error:
            if count:
                self._undecodable(connection.msgtype, error)
            return None

    def _undecodable(self, msgtype: str, error: Exception) -> None:
        self.undecodable += 1
        if self._context is not None:  # outside a run, only self.undecodable counts
            self._context.count_drop("undecodable")
        reason = f"{msgtype}: {type(error).__name__}"
        if reason not in self._reasons:  # once per reason, not per message
            self._reasons.add(reason)
            logger.warning("node %r: undecodable %s message on %s, skipped (%s: %s)",
                           self.name, msgtype, self.topic, type(error).__name__, error)

    def _pace(self, record_ns: int) -> None:
        """Wait until the message recorded at record_ns is due (the module docstring);
        one already due goes at once."""
        offset = (record_ns - self._start_ns) * 1e-9 / (self.speed or 1.0)
        if self.anchor is not None:
            if not self._gated:  # every source up: each reads the same instant
                assert self.start_gate is not None
                self.anchor = max(self.anchor, self.start_gate.t0())
                self._gated = True
            # The wall clock: the one instant every process of the flow reads alike.
            # sleep() counts on the monotonic clock, which the wall clock may trail by
            # a few microseconds (a slewed clock): asked again until it says due.
            due = self.anchor + offset
            while (delay := due - time.time()) > 0:
                time.sleep(delay)
            return
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        delay = self._t0 + offset - now
        if delay > 0:
            time.sleep(delay)

    def close(self) -> None:
        reader, self._reader, self._messages = self._reader, None, None
        if reader is not None:
            reader.close()


__all__ = ["RosbagSource"]
