"""The demo's timing and ground truth: the cameras' clock skews and the join's
tolerance at a frame rate, the IMU's samples and windows, each camera's seeded
schedule of offsets, jitter and drops, and what the join must produce for a seed.

Every process of the demo computes the same figures from the same seed; why the
tolerance separates capture instants is in videoflow.cli.demo's docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REFERENCE_FPS = 60.0
"""Up to this frame rate the three figures below hold; above it they scale with the
frame period (Timing)."""

CLOCK_OFFSET_MS = 1.5  # each camera's clock is off by a constant within this
JITTER_MS = 1.0  # and each stamp by a random amount within this
TOLERANCE_MS = 8.0
IMU_WINDOW_MS = 20.0  # the aim; imu_window_ms rounds it to whole sample periods


@dataclass(frozen=True)
class Timing:
    """The cameras' clock skews and the join's tolerance at one frame rate.

    Up to REFERENCE_FPS they are CLOCK_OFFSET_MS, JITTER_MS and TOLERANCE_MS; above
    it all three shrink with the frame period, keeping their proportions to it at
    REFERENCE_FPS, so spread_ms <= tolerance_ms < period_ms - spread_ms holds at every
    frame rate (videoflow.cli.demo's docstring says why that separates instants).

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
