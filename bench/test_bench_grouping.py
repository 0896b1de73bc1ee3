"""Throughput of the input-group assemblers, through the public API only.

Every case runs on the compiled core and on the pure-Python reference in the same
run (the ``grouping_core`` fixture), one benchmark group per case: read the
compiled/reference ratio, never an absolute time. Each round feeds a pre-built
stream to a fresh assembler: ``add(parent, entry, handle)`` per entry, then
``pop_ready(now)`` until None, and a last drain at a time past every timeout and
window so the round ends with nothing pending. ``extra_info`` carries entries per
round and entries/s; the run ends with a summary table (bench/conftest.py).

Streams are deterministic (seeded) and checked against counts derived from the
stream itself, so a broken assembler fails the run even with --benchmark-disable.

Camera timing, as the issue sets it: each camera stamps a frame at the capture
instant plus uniform jitter of +-3 ms, tolerance 5 ms. A time group's time is its
first member's event time, so two cameras of one instant can be up to 6 ms apart
and some instants split into two groups that each wait out the timeout short of a
member; the expected counts come from a brute-force model of the matching rule
(``expected_time_counts``), not from "one group per instant".
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Any

import pytest

from videoflow.core.policies import JoinPolicy
from videoflow.messaging.clock_estimates import ClockEstimator
from videoflow.messaging.grouping import (
    CollectEntry,
    EnvelopeEntry,
    TimeGroupAssembler,
    TraceGroupAssembler,
)

FPS = 30.0
JITTER_S = 0.003
TOLERANCE_MS = 5.0
TIMEOUT_MS = 100.0
CAMERAS = [f"cam{i}" for i in range(8)]
IMU_HZ = 1000.0
IMU_WINDOW_MS = 20.0
DROP_RATE = 0.05
QUORUM = 6

# Rounds per core: the reference is ~6-10x slower, so it gets fewer.
ROUNDS = {"compiled": 40, "reference": 8}


class Handle:
    """An ack handle, held opaquely: the benchmark measures the assembler."""

    __slots__ = ()


# What an assembler let go of, queued by its resolver (released.extend, as the messenger's).
Released = list[tuple[Handle, str]]


# (parent, entry, handle, arrival time in seconds)
Stream = list[tuple[str, EnvelopeEntry, Handle, float]]


def _entry(trace_id: str, seq: int, event_ts: float | None) -> EnvelopeEntry:
    return EnvelopeEntry(trace_id, seq, event_ts, None, None, False)


def feed(
    assembler: Any, released: Released, stream: Stream, now_cell: list[float], end: float,
    on_group: Callable[[Any], None] | None = None,
    on_released: Callable[[Released], None] | None = None,
) -> tuple[int, Any]:
    """Feeds the stream, draining after each entry, then drains at ``end``; what the
    assembler queued in ``released`` (its resolver is released.extend, as the
    messenger's) is looked at once per entry, as the messenger looks once per receive
    batch (and dropped: the handles do nothing). on_group is called with each group
    popped, on_released with what was released, before it is dropped.

    Returns:
        (groups popped, the last group).
    """
    add = assembler.add
    pop = assembler.pop_ready
    groups = 0
    last = None
    for parent, entry, handle, now in stream:
        now_cell[0] = now
        add(parent, entry, handle)
        group = pop(now)
        while group is not None:
            groups += 1
            last = group
            if on_group is not None:
                on_group(group)
            group = pop(now)
        if released:
            if on_released is not None:
                on_released(released)
            released.clear()
    now_cell[0] = end
    group = pop(end)
    released.clear()
    while group is not None:
        groups += 1
        last = group
        if on_group is not None:
            on_group(group)
        group = pop(end)
    return groups, last


def run_case(
    benchmark: Any,
    make: Callable[[Callable[[], float], Released], Any],
    stream: Stream,
    kind: str,
    end: float,
) -> tuple[int, Any, Any]:
    """Times feed over fresh assemblers; returns (groups, last group, assembler) of the
    last round."""
    holder: list[Any] = []

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        cell = [0.0]
        released: Released = []
        assembler = make(lambda: cell[0], released)
        holder[:] = [assembler]
        return (assembler, released, stream, cell, end), {}

    groups, last = benchmark.pedantic(feed, setup=setup, rounds=ROUNDS[kind], warmup_rounds=1)
    return groups, last, holder[0]


# -- streams ---------------------------------------------------------------------


@cache
def trace_stream(n_parents: int, traces: int) -> Stream:
    """Diamond halves: parent p's half of trace i arrives at step i + p, so up to
    n_parents - 1 groups are assembling at once."""
    steps = []
    for i in range(traces):
        for p in range(n_parents):
            steps.append((i + p, p, i))
    steps.sort()
    return [(f"p{p}", _entry(f"t{i}", i, i / FPS), Handle(), step / FPS) for step, p, i in steps]


@cache
def camera_stream(frames: int, drop: float, imu: bool, t0: float = 0.0) -> tuple[Stream, list[int]]:
    """8 cameras at 30 fps (+-3 ms jitter, a frame dropped with probability ``drop``),
    optionally an IMU at 1 kHz, merged in event-time order; the clock follows event time.

    Returns:
        (stream, cameras present per capture instant).
    """
    rng = random.Random(20240611)
    timed: list[tuple[float, str, EnvelopeEntry]] = []
    present = []
    for k in range(frames):
        instant = t0 + k / FPS
        count = 0
        for name in CAMERAS:
            if drop and rng.random() < drop:
                continue
            ts = instant + rng.uniform(-JITTER_S, JITTER_S)
            timed.append((ts, name, _entry(f"{name}-{k}", k, ts)))
            count += 1
        present.append(count)
    if imu:
        for j in range(int(frames / FPS * IMU_HZ)):
            ts = t0 + j / IMU_HZ
            timed.append((ts, "imu", _entry(f"imu-{j}", j, ts)))
    timed.sort(key=lambda x: x[0])
    return [(name, e, Handle(), ts) for ts, name, e in timed], present


def expected_time_counts(stream: Stream, quorum: int | None, end: float) -> tuple[int, int]:
    """Brute-force model of the time join on a camera stream: (groups emitted, groups
    expired). A camera frame joins the nearest open group within tolerance that lacks
    its camera, else seeds one at its own time; a group is emitted when complete. An
    incomplete one is resolved, oldest first, once every camera it lacks has passed
    it in event time (watermark beyond its time + tolerance) or been silent for the
    timeout -- silence counting only once the IMU's window (when the stream has one)
    could close: its samples past the window, or the IMU silent for the timeout:
    emitted with at least ``quorum`` members, expired below it."""
    tol = TOLERANCE_MS / 1000.0
    timeout = TIMEOUT_MS / 1000.0
    need = len(CAMERAS) if quorum is None else quorum
    open_groups: list[tuple[float, float, set[str]]] = []  # (time, created, cameras)
    watermark = dict.fromkeys([*CAMERAS, "imu"], -math.inf)
    last: dict[str, float] = {}
    emitted = expired = 0
    window = IMU_WINDOW_MS / 1000.0 if any(p == "imu" for p, *_ in stream) else None

    def window_due(group: tuple[float, float, set[str]], now: float) -> bool:
        return window is None or watermark["imu"] > group[0] + window or (
            now >= last.get("imu", group[1]) + timeout)

    def given_up(group: tuple[float, float, set[str]], now: float) -> bool:
        missing = [c for c in CAMERAS if c not in group[2] and watermark[c] <= group[0] + tol]
        return all(now >= last.get(c, group[1]) + timeout for c in missing) and (
            not missing or window_due(group, now))

    def resolve(now: float) -> None:
        nonlocal emitted, expired
        for group in sorted(open_groups, key=lambda g: g[0]):
            if not given_up(group, now):
                return
            open_groups.remove(group)
            if len(group[2]) >= need:
                emitted += 1
            else:
                expired += 1

    for parent, entry, _, now in stream:
        if parent in CAMERAS:
            ts = entry.event_ts
            assert ts is not None
            last[parent] = now
            watermark[parent] = max(watermark[parent], ts)
            fits = [g for g in open_groups if parent not in g[2] and abs(g[0] - ts) <= tol]
            if fits:
                group = min(fits, key=lambda g: (abs(g[0] - ts), g[0]))
            else:
                group = (ts, now, set())
                open_groups.append(group)
            group[2].add(parent)
            if len(group[2]) == len(CAMERAS):
                open_groups.remove(group)
                emitted += 1
        else:
            assert entry.event_ts is not None
            last[parent] = now
            watermark[parent] = max(watermark[parent], entry.event_ts)
        resolve(now)
    resolve(end)
    return emitted, expired


def _time_policy(quorum: int | None, imu: bool, **kw: Any) -> JoinPolicy:
    return JoinPolicy(
        mode="time",
        tolerance_ms=TOLERANCE_MS,
        timeout_ms=TIMEOUT_MS,
        quorum=quorum,
        collect={"imu": IMU_WINDOW_MS} if imu else {},
        **kw,
    )


# -- cases -----------------------------------------------------------------------

# On top of each case, so the compiled and reference runs of one case are adjacent.
each_core = pytest.mark.parametrize("grouping_core", ["compiled", "reference"], indirect=True)


@each_core
@pytest.mark.parametrize("n_parents", [2, 8])
def test_trace_join(
    benchmark: Any, record_throughput: Callable[..., None], grouping_core: ModuleType,
    n_parents: int
) -> None:
    benchmark.group = f"trace-{n_parents}"
    traces = 20_000 // n_parents
    stream = trace_stream(n_parents, traces)
    parents = [f"p{p}" for p in range(n_parents)]
    policy = JoinPolicy(mode="trace", timeout_ms=TIMEOUT_MS * 10)

    def make(clock: Callable[[], float], released: Released) -> TraceGroupAssembler:
        return TraceGroupAssembler("join", parents, policy, clock=clock, core=grouping_core,
                                   resolver=released.extend)

    groups, last, assembler = run_case(benchmark, make, stream, grouping_core.CORE_KIND, 1e9)
    record_throughput(len(stream), grouping_core.CORE_KIND)
    # No drops: exactly one group per trace, the last trace last.
    assert groups == traces
    assert assembler.evictions == 0
    assert assembler.pending_count() == 0
    assert last.trace_id == f"t{traces - 1}" and set(last.entries) == set(parents)


@each_core
@pytest.mark.parametrize(
    "case",
    ["8cam", "8cam-drops", "8cam-drops-imu"],
)
def test_time_join(
    benchmark: Any, record_throughput: Callable[..., None], grouping_core: ModuleType, case: str
) -> None:
    benchmark.group = f"time-{case}"
    drop = DROP_RATE if "drops" in case else 0.0
    imu = case.endswith("imu")
    quorum = QUORUM if drop else None
    stream, present = camera_stream(1500 if imu else 2500, drop, imu)
    policy = _time_policy(quorum, imu)
    parents = CAMERAS + (["imu"] if imu else [])

    def make(clock: Callable[[], float], released: Released) -> TimeGroupAssembler:
        return TimeGroupAssembler("fuse", parents, policy, clock=clock, core=grouping_core,
                                  resolver=released.extend)

    end = stream[-1][3] + 10.0
    groups, last, assembler = run_case(benchmark, make, stream, grouping_core.CORE_KIND, end)
    record_throughput(len(stream), grouping_core.CORE_KIND)
    expected_groups, expected_expired = expected_time_counts(stream, quorum, end)
    assert groups == expected_groups
    assert assembler.evictions == expected_expired
    assert assembler.pending_count() == 0
    if imu:
        window = last.entries["imu"]
        assert isinstance(window, CollectEntry)
        # 1 kHz over a +-20 ms window around the group time.
        assert 39 <= len(window.event_ts) <= 41
        assert all(abs(s - last.event_ts) <= IMU_WINDOW_MS / 1000 for s in window.event_ts)


def feed_with_clocks(assembler: Any, released: Released, stream: Stream,
                     now_cell: list[float], end: float,
                     stamps: dict[int, tuple[str, float, float]],
                     spent: list[float]) -> tuple[int, Any]:
    """feed, with the clock estimator a time join runs beside its assembler
    (videoflow.messaging.clock_estimates) fed as Join feeds it: each group's time,
    its members when the estimator wants them, and each camera entry given up on (the
    stream's handles carry nothing: stamps gives each camera handle's parent, event
    time and arrival, as the messenger's handles carry them). The seconds spent in
    the estimator's calls are added to spent[0], and how many were timed to
    spent[1]."""
    clocks = ClockEstimator(CAMERAS, TOLERANCE_MS / 1000.0, collect_parents=["imu"])
    tick = time.perf_counter

    def fused(group: Any) -> None:
        started = tick()
        if clocks.fused(group.event_ts, time.monotonic()):
            handles = [seen for h in group.handles if (seen := stamps.get(id(h)))]
            clocks.members({p: (t, a, 0) for p, t, a in handles if p != "imu"})
            for p, t, a in handles:  # the window's samples, for its arrivals
                if p == "imu":
                    clocks.collected(p, t, a)
        spent[0] += tick() - started
        spent[1] += 1

    def missed(let_go: Released) -> None:
        for handle, _ in let_go:  # the messenger looks at each one anyway
            seen = stamps.get(id(handle))
            if seen is not None and seen[0] != "imu":  # a sample no group took: done
                started = tick()
                clocks.missed(*seen, time.monotonic())
                spent[0] += tick() - started
                spent[1] += 1

    return feed(assembler, released, stream, now_cell, end, fused, missed)


def timed_block_seconds(n: int = 200_000) -> float:
    """What timing an empty call as feed_with_clocks times the estimator's costs, per
    timed call (the least of three tries)."""
    tick, best = time.perf_counter, math.inf
    for _ in range(3):
        spent = [0.0, 0]
        begun = tick()
        for _ in range(n):
            started = tick()
            spent[0] += tick() - started
            spent[1] += 1
        best = min(best, (tick() - begun) / n)
    return best


@each_core
def test_time_join_with_its_clock_estimator(
    benchmark: Any, record_throughput: Callable[..., None], grouping_core: ModuleType
) -> None:
    """test_time_join's 8cam-drops-imu with the clock estimator fed as a time join
    feeds it, in the same benchmark group (its time per entry is the round's);
    extra_info has the estimator's own time per entry, its calls timed."""
    benchmark.group = "time-8cam-drops-imu"
    stream, _ = camera_stream(1500, DROP_RATE, True)
    policy = _time_policy(QUORUM, True)
    stamps = {id(handle): (parent, entry.event_ts, now)
              for parent, entry, handle, now in stream}
    spent = [0.0, 0]
    calls = [0]

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        calls[0] += 1
        cell = [0.0]
        released: Released = []
        assembler = TimeGroupAssembler("fuse", [*CAMERAS, "imu"], policy,
                                       clock=lambda: cell[0], core=grouping_core,
                                       resolver=released.extend)
        return (assembler, released, stream, cell, stream[-1][3] + 10.0, stamps, spent), {}

    groups, _ = benchmark.pedantic(feed_with_clocks, setup=setup,
                                   rounds=ROUNDS[grouping_core.CORE_KIND], warmup_rounds=1)
    record_throughput(len(stream), grouping_core.CORE_KIND)
    # Less the timing's own cost (two perf_counter calls and a sum per timed call,
    # measured here): about half of what was timed.
    timing = timed_block_seconds()
    benchmark.extra_info["estimator_us_per_entry"] = round(
        (spent[0] - spent[1] * timing) / calls[0] / len(stream) * 1e6, 4)
    benchmark.extra_info["timing_us_per_entry"] = round(
        spent[1] * timing / calls[0] / len(stream) * 1e6, 4)
    expected_groups, _ = expected_time_counts(stream, QUORUM, stream[-1][3] + 10.0)
    assert groups == expected_groups


PENDING = [100, 10_000, 100_000]
BATCH_INSTANTS = 1000


@each_core
@pytest.mark.parametrize("pending", PENDING)
def test_pending_scale_time(
    benchmark: Any, record_throughput: Callable[..., None], grouping_core: ModuleType, pending: int
) -> None:
    """Per-entry cost of complete 8-camera groups while ``pending`` incomplete groups
    (cam0 only, at old event times 10 ms apart) sit in the assembler: the other
    cameras' watermarks give them up in the warm-up round, and missing='wait' holds
    them, below quorum, for good.

    The assembler is filled once; each round feeds the same batch of complete groups
    at later times, which leaves it holding the same pending groups again.
    """
    benchmark.group = "pending-time"
    cell = [0.0]
    # This case measures cost against the pending count, so every instant of the batch
    # must group completely: the tolerance covers the whole +-3 ms jitter spread.
    policy = JoinPolicy(
        mode="time", tolerance_ms=2 * JITTER_S * 1000, timeout_ms=None, max_pending=1_000_000,
        missing="wait",
    )
    released: Released = []
    assembler = TimeGroupAssembler(
        "fuse", CAMERAS, policy, clock=lambda: cell[0], core=grouping_core,
        resolver=released.extend,
    )
    for i in range(pending):
        assembler.add("cam0", _entry(f"old-{i}", i, i * 0.01), Handle())
    base = pending * 0.01 + 1.0
    batch, _ = camera_stream(BATCH_INSTANTS, 0.0, False, base)
    assert assembler.pending_count() == pending

    groups, _ = benchmark.pedantic(
        feed,
        args=(assembler, released, batch, cell, batch[-1][3]),
        rounds=ROUNDS[grouping_core.CORE_KIND] * 2,
        warmup_rounds=1,
    )
    record_throughput(len(batch), grouping_core.CORE_KIND, pending)
    assert groups == BATCH_INSTANTS
    assert assembler.pending_count() == pending
    assert assembler.evictions == 0


@each_core
@pytest.mark.parametrize("pending", PENDING)
def test_pending_scale_trace(
    benchmark: Any, record_throughput: Callable[..., None], grouping_core: ModuleType, pending: int
) -> None:
    """The same with 2-parent trace groups: ``pending`` half-groups (parent p0 only)
    held while a batch of complete traces goes through."""
    benchmark.group = "pending-trace"
    cell = [0.0]
    policy = JoinPolicy(mode="trace", timeout_ms=None, max_pending=1_000_000)
    released: Released = []
    assembler = TraceGroupAssembler(
        "join", ["p0", "p1"], policy, clock=lambda: cell[0], core=grouping_core,
        resolver=released.extend,
    )
    for i in range(pending):
        assembler.add("p0", _entry(f"old-{i}", i, None), Handle())
    batch = trace_stream(2, 4 * BATCH_INSTANTS)

    groups, _ = benchmark.pedantic(
        feed,
        args=(assembler, released, batch, cell, batch[-1][3]),
        rounds=ROUNDS[grouping_core.CORE_KIND] * 2,
        warmup_rounds=1,
    )
    record_throughput(len(batch), grouping_core.CORE_KIND, pending)
    assert groups == 4 * BATCH_INSTANTS
    assert assembler.pending_count() == pending
    assert assembler.evictions == 0
