"""Groups and messages logged to the Rerun viewer (rerun-sdk, the 'rerun' extra), on one
timeline of event time: what RerunSink and `videoflow tap --rerun` write.

A value becomes entities by its shape:

- an image array (H x W, or H x W x 1, 3 or 4 channels) an Image;
- a number, a bool or a short numeric vector (up to MAX_SERIES values) a scalar series
  (Scalars), one line per element;
- a dict one entity per key under the value's path, each by these rules; a list or
  tuple of numbers a vector, otherwise one entity per item;
- text a TextLog line; anything else (bytes, a large non-image array) a TextLog line
  saying what it is.

A group logs each parent's value under ``{root}/{parent}`` at the group's event time; a
collect window logs each of its samples at the sample's own time, so an IMU's window is
a stretch of its series. A parent missing from a quorum group is cleared at that time
(its image disappears for that instant) and named in ``{root}/notes``, as are the clock
corrections applied when they change and the inputs the node dropped since its last
group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from videoflow.errors import MissingDependency

if TYPE_CHECKING:
    import rerun

EXTRA: Final = "rerun"
"""videoflow's extra that installs rerun-sdk."""

TIMELINE: Final = "event_time"
"""The timeline everything is logged on: the group's (or message's) event time."""

MAX_SERIES: Final = 16
"""The longest numeric vector logged as scalar series (an IMU's 6 axes, a pose's 7);
longer ones are described in a TextLog line rather than drawn as that many lines."""

NOTES: Final = "notes"
"""The entity under the root that annotations go to: missing parents, drops, clock
corrections."""


def require_rerun() -> Any:
    """The rerun module.

    Raises:
        MissingDependency: rerun-sdk is not installed; the message names the extra.
    """
    try:
        import rerun
    except ImportError as error:
        raise MissingDependency(
            f"logging to Rerun needs rerun-sdk, not installed here: pip install "
            f"rerun-sdk (videoflow's extra {EXTRA!r}) ({error})") from error
    return rerun


def check_target(target: str) -> str:
    """A Rerun target as given: a path ending in .rrd (a file), 'spawn' (start a viewer),
    or a viewer's gRPC URL (rerun+http://host:port/proxy).

    Raises:
        ValueError: none of those.
    """
    if not isinstance(target, str) or not (
            target.endswith(".rrd") or target == "spawn" or target.startswith("rerun")):
        raise ValueError(f"a Rerun target is a path ending in .rrd, 'spawn', or a viewer's "
                         f"URL (rerun+http://HOST:PORT/proxy), got {target!r}")
    return target


def open_recording(target: str, application_id: str, recording_id: str | None = None
                   ) -> rerun.RecordingStream:
    """A recording stream sending to target (check_target).

    Raises:
        MissingDependency: rerun-sdk is not installed.
        ValueError: a bad target.
    """
    rr = require_rerun()
    check_target(target)
    recording = rr.RecordingStream(application_id, recording_id=recording_id)
    if target.endswith(".rrd"):
        recording.save(target)
    elif target == "spawn":
        recording.spawn()
    else:
        recording.connect_grpc(target)
    return recording


def group_layout(root: str, sync: list[str], collect: list[str]) -> Any:
    """The viewer's layout for a join's groups (a rerun blueprint): each sync parent's
    entity in a 2D view of its own, in a grid (a camera's frame), each collect parent's
    series in a time series view, and the notes, under them.

    Raises:
        MissingDependency: rerun-sdk is not installed.
    """
    part = require_rerun().escape_entity_path_part
    import rerun.blueprint as rrb

    root = part(root)
    below: list[Any] = [rrb.TimeSeriesView(origin=f"/{root}/{part(p)}", name=p)
                        for p in collect]
    below.append(rrb.TextLogView(origin=f"/{root}/{NOTES}", name=NOTES))
    return rrb.Blueprint(
        rrb.Vertical(rrb.Grid(*(rrb.Spatial2DView(origin=f"/{root}/{part(p)}", name=p)
                                for p in sync)),
                     rrb.Horizontal(*below), row_shares=[3, 1]),
        collapse_panels=True)


class RerunLog:
    """Logs input groups, or single messages, to one recording (module docstring).

    Arguments:
        recording: the rerun.RecordingStream (open_recording).
        root: the entity path everything goes under (the node's name).
        leave_out: keys of dict messages not logged, at any depth (a timestamp
            field, say, whose epoch seconds would dwarf every other series).
    """

    def __init__(self, recording: rerun.RecordingStream, root: str,
                 leave_out: Iterable[str] = ()) -> None:
        self.rr = require_rerun()
        self.recording = recording
        self.root = self.rr.escape_entity_path_part(root)
        self.leave_out = frozenset(leave_out)
        self._corrections: dict[str, float] = {}

    def group(self, event_ts: float | None, members: Mapping[str, Any],
              info: Mapping[str, Mapping[str, Any] | None], dropped: Mapping[str, int]
              ) -> None:
        """Log one input group.

        Arguments:
            event_ts: the group's event time (None: logged without one).
            members: {parent: value}: the message, None for a missing parent, a list of
                samples for a collect window.
            info: {parent: input info} (RuntimeContext.input_info): a collect window's
                event_ts is the list of its samples' times; clock_offset the
                correction applied.
            dropped: inputs dropped since the last group, by reason (only non-zero
                ones are said).
        """
        self._at(event_ts)
        lost: list[str] = []  # what is missing or dropped: a warning
        notes: list[str] = []  # corrections: information
        for parent, value in members.items():
            path = f"{self.root}/{self.rr.escape_entity_path_part(parent)}"
            one = info.get(parent)
            if value is None:
                self.recording.log(path, self.rr.Clear(recursive=True))
                lost.append(f"{parent} missing")
                continue
            times = None if one is None else one.get("event_ts")
            if isinstance(times, list) and isinstance(value, list):
                self._window(path, value, times)
                self._at(event_ts)
            else:
                self._value(path, value)
            offset = 0.0 if one is None else float(one.get("clock_offset") or 0.0)
            if self._corrections.get(parent, 0.0) != offset:
                self._corrections[parent] = offset
                notes.append(f"{parent}'s clock corrected by {offset * 1e3:+.1f} ms")
        drops = sorted((reason, n) for reason, n in dropped.items() if n)
        if drops:
            lost.append("dropped since the last group: " + ", ".join(
                f"{n} {reason}" for reason, n in drops))
        if lost or notes:
            self.recording.log(f"{self.root}/{NOTES}", self.rr.TextLog(
                "; ".join(notes + lost), level="WARN" if lost else "INFO"))

    def message(self, event_ts: float | None, value: Any, name: str | None = None) -> None:
        """Log one message under the root (or root/name) at its event time."""
        self._at(event_ts)
        path = self.root if name is None else (
            f"{self.root}/{self.rr.escape_entity_path_part(name)}")
        self._value(path, value)

    def note(self, event_ts: float | None, text: str, level: str = "WARN") -> None:
        """A line in root/notes at event_ts."""
        self._at(event_ts)
        self.recording.log(f"{self.root}/{NOTES}", self.rr.TextLog(text, level=level))

    def _at(self, event_ts: float | None) -> None:
        if event_ts is None:
            self.recording.disable_timeline(TIMELINE)
        else:
            self.recording.set_time(TIMELINE, timestamp=event_ts)

    def _window(self, path: str, samples: Sequence[Any], times: Sequence[float | None]
                ) -> None:
        """A collect window: each sample at its own time."""
        for sample, ts in zip(samples, times, strict=False):
            self._at(ts)
            self._value(path, sample)

    def _value(self, path: str, value: Any) -> None:
        rr, log = self.rr, self.recording.log
        if isinstance(value, np.ndarray):
            if _is_image(value):
                log(path, rr.Image(value))
            elif value.size <= MAX_SERIES and value.dtype.kind in "biuf":
                log(path, rr.Scalars(value.astype(np.float64).ravel()))
            else:
                log(path, rr.TextLog(f"array {value.dtype} {tuple(value.shape)}"))
        elif isinstance(value, (bool, int, float, np.number)) and not isinstance(value, complex):
            log(path, rr.Scalars(float(value)))
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if key not in self.leave_out:
                    self._value(f"{path}/{rr.escape_entity_path_part(str(key))}", item)
        elif isinstance(value, (list, tuple)):
            if 0 < len(value) <= MAX_SERIES and all(
                    isinstance(v, (int, float)) and math.isfinite(v) for v in value):
                log(path, rr.Scalars(np.asarray(value, dtype=np.float64)))
            else:
                for i, item in enumerate(value[:MAX_SERIES]):
                    self._value(f"{path}/{i}", item)
        elif isinstance(value, str):
            log(path, rr.TextLog(value))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            log(path, rr.TextLog(f"<{len(value)} bytes>"))
        elif value is not None:
            log(path, rr.TextLog(f"{type(value).__name__}"))


def _is_image(array: np.ndarray) -> bool:
    """H x W, or H x W x C with 1, 3 or 4 channels, of a type an image has, and larger
    than a vector (a 4 x 4 matrix is not drawn as a picture)."""
    if array.dtype.kind not in "uf" or array.ndim not in (2, 3):
        return False
    if array.ndim == 3 and array.shape[2] not in (1, 3, 4):
        return False
    return min(array.shape[:2]) >= 8


__all__ = ["EXTRA", "MAX_SERIES", "NOTES", "TIMELINE", "RerunLog", "check_target",
           "group_layout", "open_recording", "require_rerun"]
