"""Per-parent clock offsets a time join finds by itself (JoinPolicy's clock_offsets
correct them; this says what to set, and with clock_correction='running' follows them:
RunningCorrection).

A camera without PTP, a driver that stamps at readout, a USB camera's constant pipeline
delay: each shifts every event time of one parent by about a constant, and beyond the
join's tolerance that parent's inputs meet no group at all. ClockEstimator watches a time
join's sync parents (collect parents are not estimated: their samples spread over a
window by design) and keeps, per parent, the last WINDOW of:

- residuals: for each group it is a member of, its event time less the median of the
  other members' (with three or more members, one parent off does not move the others'
  median; with two, each reads off against the other);
- near misses: each of its inputs the join gave up on, placed, when estimated, between
  the fused groups nearest it before and after. Frames are periodic, so a miss alone
  cannot say whether a camera is 20 ms ahead or 13 ms behind at 30 fps: the candidate
  nearest the parent's arrival offset is taken (its event time less the time it
  arrived, against the other parents' median), which tells the two apart by a whole
  frame period. Arrivals say that only of live sources, whose event times keep pace
  with the wall clock (their latest arrivals span their stamps' span): in a live
  flow, a parent's near misses wait until its arrivals and another parent's are
  live. In a
  backlog (a replay) the nearer candidate is taken. Either way a miss counts only
  when the candidate taken is within a quarter of the parent's frame period of what
  was expected (a backlog's offsets must then be under a quarter period): an input
  whose own instant was not fused at all (below quorum) is a period from the groups
  around it and says nothing of its clock;
- whether each input joined a group (matched).

A parent whose inputs mostly join groups is judged by its residuals, small by
construction (within the tolerance), whatever its arrival: a parent that lags, whose
frames arrive late but are stamped right, is not offset. One whose inputs mostly miss is
judged by its near misses.

A collect parent (an IMU joined by window) has neither: its samples fill each group's
window wherever its clock puts them, so no grouping can tell its offset. What can is
its arrivals, live: its samples' event times less their arrival, against the sync
parents' (basis 'arrivals'). That also holds each source's own delay to the join, so
it is reported, in words only beyond the tolerance and its noise and with that
caveat, and never followed by a running correction.

Medians throughout, so dropped frames, quorum groups and a few outliers do not move the
estimate; the spread (median absolute deviation) and the sample count say how far to
trust it. The times seen are the corrected ones: with clock_offsets applied, what is
left is the residual offset.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median
from typing import Final

WINDOW: Final = 64
"""Samples kept per parent, of each kind: about two seconds of a 30 fps camera."""

MIN_SAMPLES: Final = 8
"""Samples a parent needs before its offset is estimated."""

RECENT_GROUPS: Final = 512
"""Fused groups' times kept to place near misses against."""

LIVE_SAMPLES: Final = 16
"""The latest arrivals a parent is judged live by."""

LIVE_PACE: Final = 0.35
"""A parent keeps pace with the wall clock -- its arrivals can tell a near miss's two
candidates apart -- when its latest inputs' arrivals span their event times' span
within this fraction. A backlog being caught up on arrives in bursts, its inputs in a
small part of the time they cover: the latest sixteen pass only once a burst is at
most about a third of them, so that their median is the live ones'. (Judged by their
spread alone, within 100 ms, a burst once put a camera 20 ms ahead on the instant
after.) A loaded host's delays move single arrivals, not the span of sixteen; what a
parent was last judged live at is kept while a stall makes its latest look
otherwise (_live)."""

LIVE_SPREAD_S: Final = 0.1
"""And their event times less their arrival times spread (median absolute deviation)
within this."""

SAMPLE_HZ: Final = 100.0
"""Groups a second whose members are measured, and given-up inputs a second per parent
(ClockEstimator: its cost is per second, not per message)."""

DEADBAND_FRACTION: Final = 0.05
"""The least offset, as a fraction of the tolerance, a running correction moves for."""

SHOWN_FRACTION: Final = 0.25
"""An offset beyond this fraction of the tolerance is reported in words (advice)."""


@dataclass(frozen=True, slots=True)
class OffsetEstimate:
    """One parent's estimated clock offset.

    Attributes:
        offset_s: how far its event times read ahead of the other parents' (behind
            when negative), seconds, after any correction already applied; the
            correction to add is -offset_s.
        spread_s: the median absolute deviation of the samples, seconds.
        samples: how many samples it rests on.
        basis: 'groups' (its distance from its groups' other members) or 'near
            misses' (its dropped inputs' distance from the nearest groups).
        matched: the share of its recent inputs that joined a group, 0 to 1.
    """

    offset_s: float
    spread_s: float
    samples: int
    basis: str
    matched: float

    def to_dict(self) -> dict[str, float | int | str]:
        return {"offset_s": self.offset_s, "spread_s": self.spread_s,
                "samples": self.samples, "basis": self.basis, "matched": self.matched}


class ClockEstimator:
    """A time join's per-parent clock offsets (see the module).

    Its cost is bounded per second, not per message: every fused group's time is kept
    (an append to a ring), but the members of at most sample_hz groups
    a second are measured, and at most sample_hz given-up inputs a second per parent
    (a rig at 30-60 fps has every one measured; a backlog replayed at thousands of
    groups a second, a sample).

    Arguments:
        sync_parents: the parents estimated (a collect parent is not).
        tolerance_s: the join's tolerance, seconds (what counts as far off).
        sample_hz: see above.
    """

    def __init__(self, sync_parents: Iterable[str], tolerance_s: float,
                 sample_hz: float = SAMPLE_HZ, collect_parents: Iterable[str] = ()) -> None:
        self.parents = list(sync_parents)
        self.collect = list(collect_parents)
        self._collected = {p: deque[tuple[float, float]](maxlen=WINDOW)
                           for p in self.collect}
        self.tolerance_s = tolerance_s
        self._every = 1.0 / sample_hz
        # Per parent, (event time, arrival) of its latest measured inputs.
        self._arrival = {p: deque[tuple[float, float]](maxlen=WINDOW) for p in self.parents}
        self._residuals = {p: deque[float](maxlen=WINDOW) for p in self.parents}
        self._misses = {p: deque[float](maxlen=WINDOW) for p in self.parents}
        self._matched = {p: deque[bool](maxlen=WINDOW) for p in self.parents}
        self._missed_at = dict.fromkeys(self.parents, -math.inf)
        self._sampled_at = -math.inf
        self._groups = deque[float](maxlen=RECENT_GROUPS)  # recent fused groups' times
        # A group's time is its earliest member's; near misses are placed against its
        # members' median, this much later (measured on the sampled groups).
        self._lift = deque[float](maxlen=WINDOW)
        # Per parent, how many times its correction changed (forget): an input decoded
        # under an earlier correction is not measured against the new one.
        self._epochs = dict.fromkeys(self.parents, 0)
        # Per parent (sync or collect), its event times less arrival when it was last
        # judged live: a prior is a property of the source, not of its latest stall.
        self._live: dict[str, float] = {}

    def epoch(self, parent: str) -> int:
        """The parent's correction epoch, as its inputs are decoded now (members and
        missed take it back, and measure only the current epoch's)."""
        return self._epochs.get(parent, 0)

    def fused(self, group_time: float, now: float) -> bool:
        """A group was fused, its time group_time (its earliest sync member's event
        time), at now (monotonic seconds).

        Returns:
            whether its members are wanted (members): at most sample_hz a second.
        """
        self._groups.append(group_time)  # sorted when estimated: nothing more per group
        if now - self._sampled_at < self._every:
            return False
        self._sampled_at = now
        return True

    def collected(self, parent: str, event_ts: float, arrived: float) -> None:
        """A sample of collect parent parent, at event_ts, arrived at arrived (the
        members' clock): taken for a group's members were wanted (fused), so at most
        sample_hz groups' worth a second."""
        samples = self._collected.get(parent)
        if samples is not None:
            samples.append((event_ts, arrived))

    def members(self, times: Mapping[str, tuple[float, float, int]]) -> None:
        """The sync members of a group fused wanted: per parent, (its event time, when
        it arrived, on a clock the same for every parent, and the correction epoch it
        was decoded in); a member decoded under an earlier correction is left out."""
        epochs = self._epochs
        current = {p: (t, a) for p, (t, a, e) in times.items() if epochs.get(p, 0) == e}
        if not current:
            return
        ordered = sorted(t for t, _ in current.values())
        n = len(ordered)
        for parent, (t, arrived) in current.items():
            if parent not in self._matched:
                continue
            if n > 1:
                self._residuals[parent].append(t - _median_without(ordered, t))
            self._arrival[parent].append((t, arrived))
            self._matched[parent].append(True)
        half = n // 2
        middle = ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2.0
        self._lift.append(middle - ordered[0])

    def missed(self, parent: str, event_ts: float, arrived: float, now: float,
               epoch: int = 0) -> None:
        """The join gave up on an input of parent at event_ts (no group took it), which
        arrived at arrived (members' clock), decoded in the correction epoch epoch, at
        now (monotonic seconds)."""
        misses = self._misses.get(parent)
        if misses is None or epoch != self._epochs[parent] or (
                now - self._missed_at[parent] < self._every):
            return
        self._missed_at[parent] = now
        # Placed when estimated: the groups around it may be fused after it is given
        # up on (a receive's adds let it go before its groups are handed out).
        misses.append(event_ts)
        self._arrival[parent].append((event_ts, arrived))
        self._matched[parent].append(False)

    def forget(self, parent: str) -> None:
        """Drop what was measured of parent (its correction just changed: what comes
        next is measured against the new one)."""
        for kept in (self._arrival, self._residuals, self._misses, self._matched):
            kept[parent].clear()
        self._live.pop(parent, None)  # its event times moved with the correction
        self._epochs[parent] += 1

    def restart(self) -> None:
        """Drop every sample and fused group's time, and the rate gates, keeping the
        correction epochs: a learning join (ClockLearning) is about to group what it
        holds again, and measures it afresh."""
        for kept in (self._arrival, self._residuals, self._misses, self._matched,
                     self._collected):
            for samples in kept.values():
                samples.clear()
        self._groups.clear()
        self._lift.clear()
        self._live.clear()
        self._missed_at = dict.fromkeys(self.parents, -math.inf)
        self._sampled_at = -math.inf

    def estimates(self) -> dict[str, OffsetEstimate]:
        """Each parent's offset, for the parents with enough samples."""
        out: dict[str, OffsetEstimate] = {}
        groups = sorted(self._groups)
        live = self._live_now()
        for parent in self.parents:
            matched = self._matched[parent]
            if len(matched) < MIN_SAMPLES:
                continue
            # The share counts the near misses only: an input given up with no group
            # near it (an instant below quorum, whose members all went) says nothing
            # of its clock.
            picked = self._near_misses(parent, groups, live)
            matches = sum(matched)
            if matches + len(picked) < MIN_SAMPLES:
                continue
            share = matches / (matches + len(picked))
            residuals = self._residuals[parent]
            if share >= 0.5 and len(residuals) >= MIN_SAMPLES:
                out[parent] = _estimate(list(residuals), "groups", share)
            elif len(picked) >= MIN_SAMPLES:
                out[parent] = _estimate(picked, "near misses", share)
        sync = [m for p, m in live.items() if p not in self._collected]
        for parent, samples in self._collected.items():
            if parent in live and sync:
                out[parent] = _estimate([e - a - median(sync) for e, a in samples],
                                        "arrivals", 1.0)
        return out

    def _live_now(self) -> dict[str, float]:
        """Each parent's event times less arrival as last judged live (_live_median),
        taken afresh where its latest are."""
        for parent, samples in (*self._arrival.items(), *self._collected.items()):
            middle = _live_median(samples)
            if middle is not None:
                self._live[parent] = middle
        return dict(self._live)

    def _near_misses(self, parent: str, groups: list[float],
                     live: Mapping[str, float]) -> list[float]:
        """Each near miss's offset from the fused group (groups: their times, sorted)
        it missed: of the groups just before and after it, the one whose offset is
        nearest the parent's arrival offset against the others' (nearest zero when
        arrivals say nothing). A miss is taken only when that offset is within a
        quarter of the parent's frame period of what was expected: an input whose own
        instant was not fused (below quorum) is a period or more from the groups
        around it, and says nothing of its clock."""
        others = [m for p, m in live.items() if p != parent and p in self._arrival]
        prior = live[parent] - median(others) if parent in live and others else None
        if prior is None and any(p in self._arrival for p in live):
            return []  # a live flow: wait until this parent's arrivals tell them apart
        misses = self._misses[parent]
        # The frame period: the least gap between fused groups, or between its own
        # misses, further apart than the tolerance (sampled misses, instants not
        # fused and dropped frames only make gaps of several periods).
        own = sorted(misses)
        tolerance = self.tolerance_s
        period = min((b - a for ordered in (groups, own)
                      for a, b in zip(ordered, ordered[1:], strict=False) if b - a > tolerance),
                     default=None)
        if period is None:
            return []
        reach = period / 4.0
        expected = 0.0 if prior is None else prior
        lift = median(self._lift) if self._lift else 0.0
        picked = []
        for event_ts in misses:
            at = bisect.bisect_left(groups, event_ts - lift)
            candidates = [event_ts - groups[i] - lift for i in (at - 1, at)
                          if 0 <= i < len(groups)]
            if candidates:
                best = min(candidates, key=lambda c: abs(c - expected))
                if abs(best - expected) <= reach:
                    picked.append(best)
        return picked

    def advice(self, estimates: Mapping[str, OffsetEstimate] | None = None
               ) -> dict[str, str]:
        """In words, per parent whose offset is beyond SHOWN_FRACTION of the
        tolerance, with the clock_offsets setting that corrects it."""
        if estimates is None:
            estimates = self.estimates()
        tolerance_ms = self.tolerance_s * 1000.0
        lines = {}
        for parent, e in estimates.items():
            if abs(e.offset_s) <= SHOWN_FRACTION * self.tolerance_s:
                continue
            way = "ahead of" if e.offset_s > 0 else "behind"
            if e.basis == "arrivals":
                # Said only past the tolerance and its own noise: sources' delays to the
                # join differ by a few ms (a 2 kHz IMU's batches, say) with no clock off.
                if abs(e.offset_s) <= max(self.tolerance_s, 3.0 * e.spread_s):
                    continue
                lines[parent] = (
                    f"{parent}'s samples arrive as if its clock read "
                    f"{abs(e.offset_s) * 1000.0:.1f} ms {way} the others' (its window is "
                    f"{'late' if e.offset_s > 0 else 'early'} by as much if so); its "
                    f"arrivals also hold its own delay to the join: if its clock is the "
                    f"one off, set clock_offsets={{'{parent}': {-e.offset_s:.4f}}} (from "
                    f"{e.samples} arrivals, spread {e.spread_s * 1000.0:.1f} ms)")
                continue
            lines[parent] = (
                f"{parent}'s clock reads {abs(e.offset_s) * 1000.0:.1f} ms {way} the others "
                f"(tolerance {tolerance_ms:g} ms): {100.0 * (1.0 - e.matched):.0f} % of its "
                f"recent inputs unmatched; set clock_offsets={{'{parent}': "
                f"{-e.offset_s:.4f}}} (from {e.samples} {e.basis}, spread "
                f"{e.spread_s * 1000.0:.1f} ms)")
        return lines


class RunningCorrection:
    """JoinPolicy's clock_correction='running': each parent's correction follows the
    estimator, a bounded step at a time.

    A parent whose estimate is off by more than its deadband (three spreads, and at
    least DEADBAND_FRACTION of the tolerance) has its correction moved against it by at
    most step_s, never past limit_s either way from its static offset; its samples are
    then dropped (ClockEstimator.forget), so the next step goes by what the new
    correction leaves. A camera 20 ms ahead with a 5 ms step is corrected in four.

    Arguments:
        static: the policy's clock_offsets, seconds per parent.
        step_s / limit_s: the bounds.

    Attributes:
        applied: per parent, the correction decode adds (static plus running).
        changes: how many times the correction moved, per parent.
    """

    def __init__(self, static: Mapping[str, float], step_s: float, limit_s: float) -> None:
        self.static = dict(static)
        self.step_s, self.limit_s = step_s, limit_s
        self.applied: dict[str, float] = dict(static)
        self.changes: dict[str, int] = {}

    def update(self, clocks: ClockEstimator,
               estimates: Mapping[str, OffsetEstimate] | None = None) -> list[str]:
        """Move the corrections the estimates call for (see the class).

        Arguments:
            estimates: clocks.estimates(), when the caller has them already.

        Returns:
            each change, in words, for the log.
        """
        said = []
        deadband_floor = DEADBAND_FRACTION * clocks.tolerance_s
        if estimates is None:
            estimates = clocks.estimates()
        for parent, e in estimates.items():
            if e.basis == "arrivals" or abs(e.offset_s) <= max(3.0 * e.spread_s,
                                                                 deadband_floor):
                continue  # arrivals hold the source's own delay too: not followed
            base = self.static.get(parent, 0.0)
            was = self.applied.get(parent, base)
            step = max(-self.step_s, min(self.step_s, -e.offset_s))
            now = max(base - self.limit_s, min(base + self.limit_s, was + step))
            if now == was:
                continue  # at its limit
            self.applied[parent] = now
            self.changes[parent] = self.changes.get(parent, 0) + 1
            clocks.forget(parent)
            said.append(f"{parent}'s clock correction moved from {was * 1000.0:+.1f} ms to "
                        f"{now * 1000.0:+.1f} ms: it read {e.offset_s * 1000.0:.1f} ms "
                        f"{'ahead' if e.offset_s > 0 else 'behind'} (from {e.samples} "
                        f"{e.basis})")
        return said


def _median_without(ordered: list[float], value: float) -> float:
    """The median of ordered (sorted, two or more) with one occurrence of value taken
    out: the other members' median, without building their list."""
    at = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1  # what is left

    def left(i: int) -> float:  # the i-th of what is left
        return ordered[i] if i < at else ordered[i + 1]

    half = n // 2
    return left(half) if n % 2 else (left(half - 1) + left(half)) / 2.0


def _live_median(offsets: deque[tuple[float, float]]) -> float | None:
    """The median of a parent's latest LIVE_SAMPLES event times less arrival, if they
    keep pace with the wall clock (LIVE_PACE, LIVE_SPREAD_S); None otherwise, or with
    too few. The latest only: a live source's first inputs may come in a burst (its
    reader started after it), which must not make it look like a backlog for long."""
    if len(offsets) < MIN_SAMPLES:
        return None
    latest = list(offsets)[-LIVE_SAMPLES:]
    stamps = [e for e, _ in latest]
    arrivals = [a for _, a in latest]
    covered = max(stamps) - min(stamps)
    if not covered > 0 or abs(max(arrivals) - min(arrivals) - covered) > LIVE_PACE * covered:
        return None
    offsets_now = [e - a for e, a in latest]
    middle = median(offsets_now)
    return middle if median(abs(d - middle) for d in offsets_now) <= LIVE_SPREAD_S else None


def _estimate(samples: list[float], basis: str, share: float) -> OffsetEstimate:
    middle = median(samples)
    spread = median(abs(s - middle) for s in samples)
    return OffsetEstimate(middle, spread, len(samples), basis, share)


__all__ = ["DEADBAND_FRACTION", "MIN_SAMPLES", "SAMPLE_HZ", "SHOWN_FRACTION", "WINDOW",
           "ClockEstimator", "OffsetEstimate", "RunningCorrection"]
