"""``videoflow demo``: simulated cameras and an IMU fused by event time, checked end to end.

The flow the library is built for, runnable with nothing but ``pip install``: it
starts the embedded nats-server (or uses --nats-url) and captures for 10 s, from
half a second after every node's process is up (about 20 s in all, start-up and
wind-down included)::

    videoflow demo                          # the live view, then the figures
    videoflow demo --cameras 6 --json       # machine output
    videoflow demo --backlog                # the replay case: producers ahead of the join
    videoflow demo --fusion-delay 10        # the join starts 10 s late and catches up

    cam0 ─┐
    cam1 ─┤
    cam2 ─┼─> fusion (time join: tolerance 8 ms, quorum 3 of 4, IMU window ±20 ms) ─> verify
    cam3 ─┤
    imu  ─┘

- Each camera is a producer of its own process capturing at 30 fps in real time:
  it sleeps until each capture instant k, then stamps the frame with its own clock,
  t0 + k/fps + offset + jitter (a constant offset within ±1.5 ms, jitter within
  ±1 ms), and skips 2% of the instants (a dropped frame). Offsets, jitter and drops
  come from a seeded generator, so the drops of a run are known before it starts.
  With --backlog the producers skip the sleeping and publish as fast as they can;
  the stamps are the same.
- The IMU samples at 400 Hz on the true clock, at t0 + j/hz, from before the first
  group's window to after the last one's; a group takes every sample within 20 ms of
  its time (a collect parent). The window is a whole number of sample periods long
  (imu_window_ms), 20 ms exactly at 400, 1000 and 2000 Hz.
- With --fusion-delay the fusion node takes its first input that long after the
  first capture: what the cameras and the IMU sent meanwhile waits on the broker,
  and the join, going by event time, loses none of it.
- The fusion node sees one camera frame per parent, None for a camera missing from a
  quorum group (emitted with 3 of 4 present once the missing camera's next frame
  shows its frame is not coming; after 300 ms of silence, for a camera that stopped),
  and the IMU window as a list. It counts the IMU samples that exist within the
  group's window and sends on a small summary, not the frames.
- The verify sink checks every fused group against the ground truth each frame
  carries (its capture instant k): a group is correct when all its frames belong to
  one capture instant, never a merge of two. It writes its counts to a JSON file.

The join puts a frame in the group whose time (the stamp of the frame that seeded
it) is nearest to its stamp and within the tolerance. One instant's stamps differ by
at most the spread, 2 × (offset + jitter) = 5 ms, and two instants' by at least the
frame period less the spread, so with spread ≤ tolerance < period - spread a frame
always joins its own instant's group and never a neighbour's. Up to 60 fps the
figures above hold (8 ms < 16.7 - 5 ms at 60 fps); above it the period leaves no
room for them, so the offsets, jitter and tolerance shrink with the period, keeping
their proportions at 60 fps (Timing): at the cap, 240 fps, ±0.375 ms, ±0.25 ms and a
2 ms tolerance against a 4.17 ms period. The quorum is all cameras but one (at least
one): one missing frame still yields a group, two do not. An instant with fewer
frames than the quorum is dropped by the join and counted (``join_evicted``, one per
frame); the demo predicts those counts from the seed.

Exit code 0 when the run completed and its recall checks hold: every group is
correct, the groups and quorum groups fused are the ones the seed predicts, and the
windows hold at least 99 % of the IMU samples that exist within them (DemoResult.
failures names each check that failed); 1 otherwise, 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from videoflow.cli.common import EXIT_FAILED, CommandError, nats_url_option
from videoflow.core.constants import BATCH
from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
from videoflow.core.report import RunReport
from videoflow.flow import Flow
from videoflow.run.progress import LiveView

DEFAULT_SEED = 7
MAX_CAMERAS = 16
"""Each camera is a process of its own; beyond this a laptop is mostly switching."""

MAX_FPS = 240.0
"""Above 60 fps the skews and the tolerance shrink with the frame period (Timing)."""

MAX_IMU_HZ = 2000.0

REFERENCE_FPS = 60.0
"""Up to this frame rate the three figures below hold; above it they scale with the
frame period (Timing)."""

CLOCK_OFFSET_MS = 1.5  # each camera's clock is off by a constant within this
JITTER_MS = 1.0  # and each stamp by a random amount within this
TOLERANCE_MS = 8.0
TIMEOUT_MS = 300.0
IMU_WINDOW_MS = 20.0  # the aim; imu_window_ms rounds it to whole sample periods
MIN_IMU_COMPLETENESS = 99.0
"""The share (%) of the IMU samples that exist within the groups' windows that the
windows must hold."""

LAG_WARNING_MS = 100.0  # cameras this far behind real time may make the figures drift
START_DELAY_S = 0.5
"""How long after the last node's process is up the first capture is (StartGate): the
processes start one after another (spawned, each importing numpy and connecting to the
broker), and a camera that captured before the others were up would start behind."""

GATE_PATIENCE_S = 120.0
"""How long a producer waits for every node's process to be up before it fails."""


# --------------------------------------------------------------------------------------
# Timing and ground truth
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """The cameras' clock skews and the join's tolerance at one frame rate.

    Up to REFERENCE_FPS they are CLOCK_OFFSET_MS, JITTER_MS and TOLERANCE_MS; above
    it all three shrink with the frame period, keeping their proportions to it at
    REFERENCE_FPS, so spread_ms <= tolerance_ms < period_ms - spread_ms holds at every
    frame rate (the module docstring says why that separates instants).

    Attributes:
        period_ms: the frame period.
        offset_ms / jitter_ms: a camera's constant clock offset, and each stamp's
            jitter, lie within plus or minus these.
        tolerance_ms: the join's tolerance.
    """

    period_ms: float
    offset_ms: float
    jitter_ms: float
    tolerance_ms: float

    @property
    def skew_ms(self) -> float:
        """The most a stamp lies from its capture instant."""
        return self.offset_ms + self.jitter_ms

    @property
    def spread_ms(self) -> float:
        """The most two stamps of one capture instant differ by (two cameras at
        opposite extremes)."""
        return 2.0 * self.skew_ms


def timing_for(fps: float) -> Timing:
    """The Timing at fps (above 0)."""
    scale = min(1.0, REFERENCE_FPS / fps)
    return Timing(period_ms=1000.0 / fps, offset_ms=CLOCK_OFFSET_MS * scale,
                  jitter_ms=JITTER_MS * scale, tolerance_ms=TOLERANCE_MS * scale)


def imu_window_ms(hz: float) -> float:
    """The IMU window's half-width at hz: IMU_WINDOW_MS rounded so the whole window
    spans a whole number n of sample periods (at least one). A window of n periods
    holds n samples wherever the group's time falls between samples (n + 1 only with
    both ends exactly on one), so its count does not hang on which frame's stamp the
    group's time is (imu_tally)."""
    periods = max(1, round(2.0 * IMU_WINDOW_MS / 1000.0 * hz))
    return 1000.0 * periods / (2.0 * hz)


def imu_range(hz: float, seconds: float, fps: float) -> tuple[int, int]:
    """The IMU's samples, j in [first, end) at t0 + j/hz: from a window and the
    largest skew before the first capture instant to as far after the last, so every
    group's window is full and the last one closes on a sample beyond it."""
    lead = math.ceil((imu_window_ms(hz) + timing_for(fps).skew_ms) / 1000.0 * hz)
    return -lead, math.ceil(seconds * hz) + lead


def in_window(s: float, t: float, w: float) -> bool:
    """Whether the join puts a collect sample at s (seconds) in the window w (seconds)
    of a group whose time is t: the collect core's own test, float for float
    (_grouping_ref, TimeCore._emit)."""
    return t - w <= s <= t + w and abs(s - t) <= w


def imu_tally(delivered: list[float], stamps: list[float], t0: float, hz: float,
              samples: tuple[int, int], window_ms: float) -> tuple[int, int]:
    """One group's IMU window against the samples that exist.

    The group's time is the stamp of the frame that seeded it (the first of its
    frames the join read; _grouping_ref, TimeCore.add), which the fusion node cannot
    see: it is one of the frames' stamps. The one taken is the stamp whose window
    holds the most delivered samples (all of them, when the join keeps its rule), and
    of those the one whose window holds the most samples. With imu_window_ms every
    stamp's window holds as many samples, so the count is exact, but for a stamp
    whose window has both ends on a sample to the float: it holds one more, and if
    it is not the group's own the count errs low by that one (never high).

    Arguments:
        delivered: the window's sample times (seconds), as the IMU stamped them.
        stamps: the group's frames' stamps (seconds).
        t0 / hz / samples: the IMU's samples, t0 + j/hz for j in [first, end).
        window_ms: the join's window half-width.

    Returns:
        (delivered samples within the window, samples that exist within it).
    """
    w = window_ms / 1000.0  # as JoinPolicy hands the window to the core
    first, end = samples
    got = set(delivered)
    tallies = []
    for t in stamps:
        low = max(first, math.floor((t - w - t0) * hz) - 1)
        high = min(end, math.ceil((t + w - t0) * hz) + 2)
        exist = {s for s in (t0 + j / hz for j in range(low, high)) if in_window(s, t, w)}
        tallies.append((len(got & exist), len(exist)))
    return max(tallies, default=(0, 0))


def camera_schedule(seed: int, index: int, instants: int, drop_rate: float,
                    fps: float = 30.0) -> tuple[float, np.ndarray, np.ndarray]:
    """One camera's clock and drops, the same in every process for one seed.

    Returns:
        (clock offset in s, dropped[k] as bools, jitter[k] in s) over the instants;
        the offset and jitter within timing_for(fps)'s bounds.
    """
    timing = timing_for(fps)
    rng = np.random.default_rng([seed, index])
    offset = float(rng.uniform(-timing.offset_ms, timing.offset_ms)) / 1000.0
    dropped = rng.random(instants) < drop_rate
    jitter = rng.uniform(-timing.jitter_ms, timing.jitter_ms, instants) / 1000.0
    return offset, dropped, jitter


def quorum_for(cameras: int) -> int:
    """All cameras but one, and at least one."""
    return max(1, cameras - 1)


@dataclass(frozen=True)
class Expected:
    """What the join must produce for a seed, from the cameras' schedules alone.

    Attributes:
        frames: frames the cameras capture.
        groups: instants with at least a quorum of frames (each one group).
        quorum_groups: of those, the ones missing a camera.
        evicted: frames of instants below the quorum (the join drops them).
    """

    frames: int
    groups: int
    quorum_groups: int
    evicted: int


def expected(cameras: int, instants: int, drop_rate: float, seed: int) -> Expected:
    """What the join must produce: each instant is one group when a quorum of the
    cameras captured it, and is dropped otherwise."""
    dropped = np.stack([camera_schedule(seed, i, instants, drop_rate)[1]
                        for i in range(cameras)])
    present = cameras - dropped.sum(axis=0)  # frames per instant
    grouped = present >= quorum_for(cameras)
    return Expected(frames=int(present.sum()), groups=int(grouped.sum()),
                    quorum_groups=int((grouped & (present < cameras)).sum()),
                    evicted=int(present[~grouped].sum()))


@dataclass(frozen=True)
class StartGate:
    """The first capture instant, the same for every process of the flow: each node
    marks itself up (arrive, in open) with a file in a shared directory, and the
    producers capture from delay seconds after the last mark's time (t0), which every
    process reads from the same files. Capture does not start while some cameras are
    still starting: they would begin behind real time, silent for the join's timeout.

    Arguments:
        directory: the shared directory (the flow's temporary one).
        names: every node of the flow.
        delay: seconds from the last node up to the first capture.
    """

    directory: str
    names: tuple[str, ...]
    delay: float

    def arrive(self, name: str) -> None:
        """Mark name up. A restarted process marks nothing new: the first mark stays."""
        try:
            with open(os.path.join(self.directory, f"{name}.up"), "x"):
                pass
        except FileExistsError:
            pass

    def t0(self, patience: float = GATE_PATIENCE_S) -> float:
        """Wait until every node is up, and return the first capture instant (epoch s).

        Raises:
            TimeoutError: some node was not up within patience seconds.
        """
        paths = [os.path.join(self.directory, f"{name}.up") for name in self.names]
        deadline = time.monotonic() + patience
        while True:
            missing = [name for name, path in zip(self.names, paths, strict=True)
                       if not os.path.exists(path)]
            if not missing:
                return max(os.stat(path).st_mtime for path in paths) + self.delay
            if time.monotonic() > deadline:
                raise TimeoutError(f"demo: {', '.join(missing)} not up after {patience:g} s")
            time.sleep(0.01)


def _sleep_until(instant: float) -> None:
    delay = instant - time.time()
    if delay > 0:
        time.sleep(delay)


# --------------------------------------------------------------------------------------
# Nodes (module level: every replica runs in a spawned process that imports them)
# --------------------------------------------------------------------------------------


class Camera(ProducerNode):
    """A camera capturing at fps from the gate's t0: one frame per instant k it does
    not drop, stamped with its own clock. The message carries the ground truth (k).
    With backlog it publishes as fast as it can, the stamps unchanged."""

    def __init__(self, index: int, gate: StartGate, fps: float, instants: int,
                 frame_size: tuple[int, int], drop_rate: float, seed: int,
                 backlog: bool = False) -> None:
        super().__init__(name=f"cam{index}")
        self.index, self.gate, self.fps, self.instants = index, gate, fps, instants
        self.frame_size, self.drop_rate, self.seed = frame_size, drop_rate, seed
        self.backlog = backlog

    def open(self) -> None:
        self.offset, self.dropped, self.jitter = camera_schedule(
            self.seed, self.index, self.instants, self.drop_rate, self.fps)
        self.k = 0
        self.gate.arrive(self.name)
        self.t0: float | None = None

    def next(self) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()
        while self.k < self.instants and self.dropped[self.k]:
            self.k += 1  # a dropped frame: the camera skips the instant
        if self.k >= self.instants:
            raise StopIteration
        k, self.k = self.k, self.k + 1
        capture = self.t0 + k / self.fps
        if not self.backlog:
            _sleep_until(capture)
        stamp = capture + self.offset + float(self.jitter[k])
        assert self.context is not None
        self.context.set_event_timestamp(stamp)
        width, height = self.frame_size
        frame = np.full((height, width), k % 256, dtype=np.uint8)
        # Behind real time: a busy CPU. A backlog runs ahead of it by design.
        lag_ms = None if self.backlog else (time.time() - capture) * 1000.0
        return {"camera": self.name, "k": k, "t": stamp, "lag_ms": lag_ms, "frame": frame}


class Imu(ProducerNode):
    """An IMU sampling at hz on the true clock, at t0 + j/hz for j in samples
    (imu_range). With backlog it publishes as fast as it can, the stamps unchanged."""

    def __init__(self, gate: StartGate, hz: float, samples: tuple[int, int],
                 backlog: bool = False) -> None:
        super().__init__(name="imu")
        self.gate, self.hz, self.backlog = gate, hz, backlog
        self.j, self.end = samples

    def open(self) -> None:
        self.gate.arrive(self.name)
        self.t0: float | None = None

    def next(self) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()
        if self.j >= self.end:
            raise StopIteration
        j, self.j = self.j, self.j + 1
        t = self.t0 + j / self.hz  # imu_tally counts the samples from the same sum
        if not self.backlog:
            _sleep_until(t)
        assert self.context is not None
        self.context.set_event_timestamp(t)
        return {"t": t, "gyro": (0.0, 0.0, 0.1 * math.sin(t))}


class Fusion(ProcessorNode):
    """The join: process(cam0, ..., camN, imu_samples) for each group. Its output is a
    summary of the group (the frames stay here), with its IMU window's tally against
    the samples that exist (imu_tally; hz, samples and window_ms as the IMU's)."""

    def __init__(self, gate: StartGate, hz: float, samples: tuple[int, int],
                 window_ms: float, delay: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.gate, self.hz, self.samples, self.window_ms = gate, hz, samples, window_ms
        self.delay = delay

    def open(self) -> None:
        self.gate.arrive(self.name)
        self.t0: float | None = None
        if self.delay:
            # A node that starts late: what its parents send meanwhile waits for it on
            # the broker, and it catches up on that backlog.
            self.t0 = self.gate.t0()
            _sleep_until(self.t0 + self.delay)

    def process(self, *inputs: Any) -> dict[str, Any]:
        if self.t0 is None:
            self.t0 = self.gate.t0()  # every node is up: a frame exists
        *frames, imu = inputs
        present = [f for f in frames if f is not None]
        group_t = sum(f["t"] for f in present) / len(present)
        offsets_ms = [(s["t"] - group_t) * 1000.0 for s in imu]
        in_window, exist = imu_tally([s["t"] for s in imu], [f["t"] for f in present],
                                     self.t0, self.hz, self.samples, self.window_ms)
        lags = [f["lag_ms"] for f in present if f["lag_ms"] is not None]
        return {
            "instants": [None if f is None else f["k"] for f in frames],
            # The pixels say which instant a frame is of: they arrived intact.
            "pixels_agree": all(int(f["frame"][0, 0]) == f["k"] % 256 for f in present),
            "imu": len(imu),
            "imu_in_window": in_window,
            "imu_expected": exist,
            "imu_span_ms": [min(offsets_ms), max(offsets_ms)] if imu else None,
            "lag_ms": max(lags) if lags else None,
        }


class Verify(ConsumerNode):
    """Checks every fused group against the ground truth; close() writes the counts
    as JSON to path."""

    def __init__(self, path: str, cameras: int, gate: StartGate) -> None:
        super().__init__(name="verify")
        self.path, self.cameras, self.gate = path, cameras, gate

    def open(self) -> None:
        self.gate.arrive(self.name)
        self.seen: set[str] = set()
        self.groups = self.quorum_groups = self.correct = self.frames = 0
        self.imu_in_window = self.imu_expected = 0
        self.lag_ms: float | None = None  # None: no frame said (a backlog)
        self.imu_counts: list[int] = []
        self.imu_span_ms: list[float] = []  # [earliest, latest], once a window held one

    def consume(self, summary: dict[str, Any]) -> None:
        assert self.context is not None
        key = self.context.last_input_key
        if key is not None:  # a redelivered group is counted once
            if key in self.seen:
                return
            self.seen.add(key)
        instants = [k for k in summary["instants"] if k is not None]
        self.groups += 1
        self.frames += len(instants)
        self.quorum_groups += len(instants) < self.cameras
        self.correct += len(set(instants)) == 1 and summary["pixels_agree"]
        self.imu_counts.append(summary["imu"])
        self.imu_in_window += summary["imu_in_window"]
        self.imu_expected += summary["imu_expected"]
        if summary["lag_ms"] is not None:
            self.lag_ms = max(self.lag_ms or 0.0, summary["lag_ms"])
        if summary["imu_span_ms"] is not None:
            low, high = summary["imu_span_ms"]
            span = self.imu_span_ms or [low, high]
            self.imu_span_ms = [min(span[0], low), max(span[1], high)]

    def close(self) -> None:
        if not hasattr(self, "seen"):  # open() never ran
            return
        counts = {"groups": self.groups, "quorum_groups": self.quorum_groups,
                  "correct": self.correct, "incorrect": self.groups - self.correct,
                  "frames": self.frames, "imu_counts": self.imu_counts,
                  "imu_in_window": self.imu_in_window, "imu_expected": self.imu_expected,
                  "imu_span_ms": self.imu_span_ms or None, "lag_ms": self.lag_ms}
        partial = Path(self.path).with_suffix(".partial")
        partial.write_text(json.dumps(counts))
        partial.replace(self.path)  # the reader never sees half a file


# --------------------------------------------------------------------------------------
# The flow and its run
# --------------------------------------------------------------------------------------


def check_options(cameras: int, fps: float, duration: float, frame_size: tuple[int, int],
                  imu_hz: float, drop_rate: float, seed: int = DEFAULT_SEED) -> None:
    """Check the demo's options (build_flow's and the command's).

    Raises:
        ValueError: naming the first option out of range, as its command-line flag.
    """
    if not 1 <= cameras <= MAX_CAMERAS:
        raise ValueError(f"--cameras must be 1 to {MAX_CAMERAS}, got {cameras}")
    if not 0 < fps <= MAX_FPS:
        raise ValueError(f"--fps must be above 0 and at most {MAX_FPS:g}, got {fps:g}")
    if not 0 < duration <= 3600:
        raise ValueError(f"--duration must be above 0 and at most 3600 s, got {duration:g}")
    if int(duration * fps) < 1:
        raise ValueError(f"--duration {duration:g} s at {fps:g} fps captures no frame")
    width, height = frame_size
    if not (1 <= width <= 4096 and 1 <= height <= 4096):
        raise ValueError(f"--frame-size must be 1x1 to 4096x4096, got {width}x{height}")
    if not 0 < imu_hz <= MAX_IMU_HZ:
        raise ValueError(f"--imu-hz must be above 0 and at most {MAX_IMU_HZ:g}, "
                         f"got {imu_hz:g}")
    if not 0 <= drop_rate < 1:
        raise ValueError(f"--drop-rate must be at least 0 and below 1, got {drop_rate:g}")
    if seed < 0:
        raise ValueError(f"--seed must be at least 0, got {seed}")


def build_flow(cameras: int = 4, fps: float = 30.0, duration: float = 10.0,
               frame_size: tuple[int, int] = (64, 48), imu_hz: float = 400.0,
               drop_rate: float = 0.02, seed: int = DEFAULT_SEED,
               summary_path: str | None = None,
               start_delay: float = START_DELAY_S, backlog: bool = False,
               fusion_delay: float = 0.0) -> Flow:
    """The demo flow: cameras and an IMU -> fusion -> verify.

    Arguments:
        cameras / fps / duration / frame_size (width, height) / imu_hz / drop_rate /
            seed: the simulation (see the module docstring).
        summary_path: where the verify sink writes its counts at its end; None picks a
            file in a fresh temporary directory (flow.consumers[0].path).
        start_delay: seconds from the last node's process up to the first capture
            (StartGate).
        backlog: the producers publish as fast as they can rather than in real time,
            with the same stamps (the replay case).
        fusion_delay: seconds from the first capture until the fusion node takes its
            first input (a node that starts late, then catches up).

    Returns:
        the Flow, named 'demo', of type BATCH (nothing published is lost).

    Raises:
        ValueError: an option out of range (check_options).
    """
    check_options(cameras, fps, duration, frame_size, imu_hz, drop_rate, seed)
    if summary_path is None:
        summary_path = os.path.join(tempfile.mkdtemp(prefix="videoflow-demo-"), "summary.json")
    instants = int(duration * fps)
    names = (*(f"cam{i}" for i in range(cameras)), "imu", "fusion", "verify")
    gate = StartGate(os.path.dirname(os.path.abspath(summary_path)), names, start_delay)
    cams = [Camera(i, gate, fps, instants, frame_size, drop_rate, seed, backlog)
            for i in range(cameras)]
    samples = imu_range(imu_hz, instants / fps, fps)
    window_ms = imu_window_ms(imu_hz)
    imu = Imu(gate, imu_hz, samples, backlog)
    fusion = Fusion(gate, imu_hz, samples, window_ms, fusion_delay, name="fusion", join_policy={
        "mode": "time", "tolerance_ms": timing_for(fps).tolerance_ms,
        "quorum": quorum_for(cameras), "timeout_ms": TIMEOUT_MS, "missing": "drop",
        "max_pending": 1024, "collect": {"imu": window_ms}})(*cams, imu)
    sink = Verify(summary_path, cameras, gate)(fusion)
    return Flow([*cams, imu], [sink], flow_type=BATCH, name="demo")


@dataclass
class DemoResult:
    """A demo run, checked.

    Attributes:
        report: the RunReport.
        cameras / quorum / fps / duration / imu_hz: what ran.
        groups / quorum_groups / correct / incorrect / frames: the verify sink's counts
            (frames: camera frames inside emitted groups).
        correctness: correct groups as a percentage of the groups; None for no group.
        imu_per_group: (min, mean, max) IMU samples per group; imu_span_ms: the earliest
            and latest sample relative to its group's frames' mean stamp. A window
            closes at the first sample beyond it or, as a backstop, once the IMU has
            been silent for the join's timeout.
        camera_lag_ms: the most a frame was published behind its capture instant (a
            replica that started after the first instant, a busy machine); None for a
            backlog, which runs ahead of real time by design. A camera or IMU that
            falls silent for the join's timeout (300 ms) is given up on, so a machine
            too busy to keep them sending can turn complete groups into quorum groups
            or close IMU windows short, and the figures then differ from the expected
            ones.
        expected: what the seed says the join must produce.
        drops: drops by reason per node that dropped anything (RunReport).
        imu_in_window / imu_expected: over every group, the IMU samples its window
            held, and the samples that exist within it (imu_tally).
        imu_completeness: imu_in_window as a percentage of imu_expected; None when no
            window could be counted.
        backlog: the producers ran ahead of real time.
        fusion_delay: seconds the fusion node started after the first capture.
    """

    report: RunReport
    cameras: int
    quorum: int
    fps: float
    duration: float
    imu_hz: float
    groups: int = 0
    quorum_groups: int = 0
    correct: int = 0
    incorrect: int = 0
    frames: int = 0
    correctness: float | None = None
    imu_per_group: tuple[int, float, int] | None = None
    imu_span_ms: tuple[float, float] | None = None
    camera_lag_ms: float | None = None
    expected: Expected | None = None
    drops: dict[str, dict[str, int]] = field(default_factory=dict)
    imu_in_window: int = 0
    imu_expected: int = 0
    imu_completeness: float | None = None
    backlog: bool = False
    fusion_delay: float = 0.0

    @property
    def join_latency_p50_ms(self) -> float | None:
        fusion = self.report.nodes.get("fusion")
        return None if fusion is None else fusion.join_latency_p50_ms

    @property
    def join_latency_p99_ms(self) -> float | None:
        fusion = self.report.nodes.get("fusion")
        return None if fusion is None else fusion.join_latency_p99_ms

    @property
    def failures(self) -> list[str]:
        """What failed, one line per check: the run completed, every group holds one
        capture instant, the groups and quorum groups are the ones the seed predicts
        (correct groups alone say nothing of the ones the join gave up on), and the
        windows hold at least MIN_IMU_COMPLETENESS % of the IMU samples that exist
        within them. Empty when every check holds."""
        failed = []
        e = self.expected
        if self.report.outcome != "completed":
            failed.append(f"the run did not complete: outcome {self.report.outcome}")
        if self.correctness is None:
            failed.append("correctness unknown: no group was fused")
        elif self.correctness != 100.0:
            failed.append(f"correctness {self.correctness:.1f} %: {self.incorrect} of "
                          f"{self.groups} groups merge capture instants or lost pixels")
        if e is None:
            failed.append("no expected figures to check the groups against")
        else:
            if self.groups != e.groups:
                failed.append(f"groups fused {self.groups}, expected {e.groups}")
            if self.quorum_groups != e.quorum_groups:
                failed.append(f"quorum groups {self.quorum_groups}, expected "
                              f"{e.quorum_groups}")
        if self.imu_completeness is None:
            failed.append("IMU completeness unknown: no group window could be counted")
        elif self.imu_completeness < MIN_IMU_COMPLETENESS:
            failed.append(f"IMU completeness {self.imu_completeness:.2f} % is below "
                          f"{MIN_IMU_COMPLETENESS:g} %: the windows held {self.imu_in_window}"
                          f" of the {self.imu_expected} samples within them")
        return failed

    @property
    def ok(self) -> bool:
        """Every check holds (failures is empty)."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        timing = timing_for(self.fps)
        return {
            "ok": self.ok, "failures": self.failures, "outcome": self.report.outcome,
            "cameras": self.cameras, "quorum": self.quorum, "fps": self.fps,
            "duration": self.duration, "imu_hz": self.imu_hz, "backlog": self.backlog,
            "fusion_delay": self.fusion_delay,
            "tolerance_ms": timing.tolerance_ms, "clock_offset_ms": timing.offset_ms,
            "jitter_ms": timing.jitter_ms, "imu_window_ms": imu_window_ms(self.imu_hz),
            "groups": self.groups,
            "quorum_groups": self.quorum_groups, "correct": self.correct,
            "incorrect": self.incorrect, "frames": self.frames,
            "correctness": self.correctness,
            "imu_completeness": self.imu_completeness,
            "imu_in_window": self.imu_in_window, "imu_expected": self.imu_expected,
            "join_latency_p50_ms": self.join_latency_p50_ms,
            "join_latency_p99_ms": self.join_latency_p99_ms,
            "imu_per_group": self.imu_per_group, "imu_span_ms": self.imu_span_ms,
            "camera_lag_ms": self.camera_lag_ms,
            "expected": None if self.expected is None else vars(self.expected),
            "drops": self.drops, "report": self.report.to_dict(),
        }

    def format(self) -> str:
        """The figures, then the RunReport table, then the verdict with each failed
        check."""
        e = self.expected
        p50, p99 = self.join_latency_p50_ms, self.join_latency_p99_ms
        imu = "-"
        if self.imu_per_group is not None:
            low, mean, high = self.imu_per_group
            imu = f"{mean:.1f} samples (min {low}, max {high})"
        if self.imu_span_ms is not None:
            imu += (f", {self.imu_span_ms[0]:+.1f} to {self.imu_span_ms[1]:+.1f} ms around "
                    "the frames' mean stamp")
        if self.backlog:
            lag, lag_note = "-", "a backlog: the producers ran ahead of real time"
        else:
            lag = "-" if self.camera_lag_ms is None else f"{self.camera_lag_ms:.1f} ms"
            lag_note = "most a frame was sent behind real time" + (
                f"; above {LAG_WARNING_MS:g} ms the machine is short of CPU for real "
                f"time, and a camera silent for the {TIMEOUT_MS:g} ms timeout is given up "
                "on: lighten the machine"
                if (self.camera_lag_ms or 0) > LAG_WARNING_MS else "")
        drops = "; ".join(f"{node}: " + ", ".join(f"{r} {n}" for r, n in by.items())
                          for node, by in self.drops.items()) or "none"
        rows = [
            ("groups fused", f"{self.groups}", "" if e is None else f"expected {e.groups}"),
            ("quorum groups", f"{self.quorum_groups}",
             f"{self.quorum} of {self.cameras} cameras"
             + ("" if e is None else f"; expected {e.quorum_groups}")),
            ("correctness", "-" if self.correctness is None else f"{self.correctness:.1f} %",
             f"{self.correct} of {self.groups} groups hold frames of one capture instant"),
            ("IMU complete", "-" if self.imu_completeness is None
             else f"{self.imu_completeness:.2f} %",
             f"{self.imu_in_window} of the {self.imu_expected} samples within the groups' "
             f"windows; at least {MIN_IMU_COMPLETENESS:g} % required"),
            ("join latency", "-" if p50 is None or p99 is None
             else f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
             "a quorum group waits until its missing camera's next frame"),
            ("IMU per group", imu, ""),
            ("camera lag", lag, lag_note),
            ("drops", drops, "" if e is None
             else f"expected: fusion join_evicted {e.evicted}, frames of instants below "
                  "the quorum"),
        ]
        cameras = f"{self.cameras} camera" + ("s" if self.cameras != 1 else "")
        head = (f"demo: {cameras} at {self.fps:g} fps and an IMU at "
                f"{self.imu_hz:g} Hz for {self.duration:g} s"
                + (" published as a backlog" if self.backlog else "")
                + (f", the fusion starting {self.fusion_delay:g} s late"
                   if self.fusion_delay else "")
                + f", fused by event time (tolerance {timing_for(self.fps).tolerance_ms:g} ms,"
                f" IMU window ±{imu_window_ms(self.imu_hz):g} ms)")
        lines = [head] + [f"  {label:<14} {value}" + (f"  ({note})" if note else "")
                          for label, value, note in rows]
        failures = self.failures
        verdict = ["demo OK"] if not failures else [
            "demo FAILED:", *(f"  {failure}" for failure in failures)]
        return "\n".join([*lines, "", self.report.format(), "", *verdict])


def run_demo(cameras: int = 4, fps: float = 30.0, duration: float = 10.0,
             frame_size: tuple[int, int] = (64, 48), imu_hz: float = 400.0,
             drop_rate: float = 0.02, seed: int = DEFAULT_SEED, nats_url: str | None = None,
             start_delay: float = START_DELAY_S,
             view: LiveView | bool | None = None, backlog: bool = False,
             fusion_delay: float = 0.0) -> DemoResult:
    """Build the demo flow, run it to its end and check it.

    Arguments:
        cameras ... seed / start_delay / backlog / fusion_delay: as build_flow.
        nats_url: the broker; None takes VIDEOFLOW_NATS_URL, else starts the embedded
            nats-server.
        view: as run_flow (None: a live view on a terminal).

    Returns:
        the DemoResult.

    Raises:
        ValueError: an option out of range.
        BrokerUnavailable / TimeoutError: as run_flow.
    """
    with tempfile.TemporaryDirectory(prefix="videoflow-demo-") as directory:
        summary_path = Path(directory) / "summary.json"
        flow = build_flow(cameras, fps, duration, frame_size, imu_hz, drop_rate, seed,
                          str(summary_path), start_delay, backlog, fusion_delay)
        report = flow.run(nats_url, view=view)
        counts = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    instants = int(duration * fps)
    result = DemoResult(report, cameras, quorum_for(cameras), fps, instants / fps, imu_hz,
                        expected=expected(cameras, instants, drop_rate, seed),
                        backlog=backlog, fusion_delay=fusion_delay)
    for name in ("groups", "quorum_groups", "correct", "incorrect", "frames",
                 "imu_in_window", "imu_expected"):
        setattr(result, name, int(counts.get(name, 0)))
    if result.groups:
        result.correctness = 100.0 * result.correct / result.groups
        imu = counts["imu_counts"]
        result.imu_per_group = (min(imu), sum(imu) / len(imu), max(imu))
        span = counts.get("imu_span_ms")
        result.imu_span_ms = None if span is None else (span[0], span[1])
        result.camera_lag_ms = counts.get("lag_ms")
    if result.imu_expected:
        result.imu_completeness = 100.0 * result.imu_in_window / result.imu_expected
    result.drops = {name: {reason: n for reason, n in node.dropped.items() if n}
                    for name, node in report.nodes.items() if node.dropped_total}
    return result


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------


def _frame_size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    if not sep or not width.strip().isdigit() or not height.strip().isdigit():
        raise ValueError(f"--frame-size is WIDTHxHEIGHT, e.g. 64x48, got {text!r}")
    return int(width), int(height)


def _command(args: argparse.Namespace) -> int:

    try:
        size = _frame_size(args.frame_size)
        check_options(args.cameras, args.fps, args.duration, size, args.imu_hz,
                      args.drop_rate, args.seed)
        if not 0 <= args.start_delay <= 60:
            raise ValueError(f"--start-delay must be 0 to 60 s, got {args.start_delay:g}")
        if not 0 <= args.fusion_delay <= 60:
            raise ValueError(f"--fusion-delay must be 0 to 60 s, got {args.fusion_delay:g}")
    except ValueError as error:
        raise CommandError(str(error)) from error
    result = run_demo(args.cameras, args.fps, args.duration, size, args.imu_hz,
                      args.drop_rate, args.seed, args.nats_url, args.start_delay,
                      view=False if args.json else LiveView(), backlog=args.backlog,
                      fusion_delay=args.fusion_delay)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.format())
    return 0 if result.ok else EXIT_FAILED


def register(subparsers: Any) -> None:
    """Add ``demo`` to the top-level parser's subparsers (func: a function(args) ->
    exit code)."""

    demo = subparsers.add_parser(
        "demo", help="fuse simulated cameras and an IMU by event time, and check it",
        description="Simulated cameras (clock offsets, jitter, dropped frames) and an IMU "
                    "fused by a time join on the embedded nats-server; every group is "
                    "checked against the ground truth. Exit code 0 when every group "
                    "holds one capture instant, the groups and quorum groups are the "
                    "ones the simulation predicts and the IMU windows hold at least "
                    f"{MIN_IMU_COMPLETENESS:g} % of their samples.")
    demo.add_argument("--cameras", type=int, default=4,
                      help=f"cameras, 1 to {MAX_CAMERAS}; the quorum is all but one "
                           "(default: 4)")
    demo.add_argument("--fps", type=float, default=30.0,
                      help=f"frames per second, at most {MAX_FPS:g}; above "
                           f"{REFERENCE_FPS:g} the clock skews and the join's tolerance "
                           "shrink with the frame period (default: 30)")
    demo.add_argument("--duration", type=float, default=10.0, metavar="SECONDS",
                      help="seconds of capture (default: 10)")
    demo.add_argument("--frame-size", default="64x48", metavar="WxH",
                      help="frame width x height in pixels (default: 64x48)")
    demo.add_argument("--imu-hz", type=float, default=400.0,
                      help=f"IMU samples per second, at most {MAX_IMU_HZ:g} "
                           "(default: 400)")
    demo.add_argument("--drop-rate", type=float, default=0.02,
                      help="share of frames each camera drops (default: 0.02)")
    demo.add_argument("--start-delay", type=float, default=START_DELAY_S, metavar="SECONDS",
                      help="seconds from the last node process up to the first capture "
                           f"(default: {START_DELAY_S:g})")
    demo.add_argument("--seed", type=int, default=DEFAULT_SEED,
                      help=f"seeds offsets, jitter and drops (default: {DEFAULT_SEED})")
    demo.add_argument("--backlog", action="store_true",
                      help="the cameras and the IMU publish as fast as they can rather "
                           "than in real time, with the same stamps: the replay case, "
                           "producers running ahead of the join")
    demo.add_argument("--fusion-delay", type=float, default=0.0, metavar="SECONDS",
                      help="the fusion node takes its first input this long after the "
                           "first capture, then catches up on what waited for it "
                           "(default: 0)")
    nats_url_option(demo, required_default=False)
    demo.add_argument("--json", action="store_true",
                      help="print the result as JSON (no live view)")
    demo.set_defaults(func=_command)


__all__ = ["DemoResult", "Expected", "Timing", "build_flow", "camera_schedule", "expected",
           "imu_range", "imu_tally", "imu_window_ms", "quorum_for", "register", "run_demo",
           "timing_for"]
