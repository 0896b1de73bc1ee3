"""Differential tests: the compiled grouping core against the pure-Python reference.

Every scenario (a policy plus a sequence of add / pop_ready / sweep / flush calls at
explicit clock readings) is fed to two assemblers, one over each core, each with its
own recording handles, resolved by the assembler's default resolver. After every call
both must return the same groups, have resolved (within that call) the same handles
with the same reasons in the same order, and report the same pending_count, evictions,
has_pending_from and oldest_wait_seconds. Alongside, an oracle checks each side on its
own against the rules of ``_grouping_ref``'s docstring: handle conservation (every
handle resolved exactly once: superseded, discarded, or handed out in exactly one
ReadyGroup), tolerance and quorum of emitted time groups, collect windows against a
brute-force scan of the buffered samples, trace groups sharing one trace id.
"""

from __future__ import annotations

import importlib
import math
import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from videoflow.core.policies import JoinPolicy
from videoflow.messaging import _grouping_ref
from videoflow.messaging.grouping import (
    SUPERSEDED,
    CollectEntry,
    EnvelopeEntry,
    ReadyGroup,
    Resolver,
    TimeGroupAssembler,
    TraceGroupAssembler,
)

COMPILED = importlib.import_module("videoflow.messaging._grouping_core")
REFERENCE = _grouping_ref
CORES = (("compiled", COMPILED), ("reference", REFERENCE))


def _compiled_sorted_times() -> type:
    """The compiled SortedTimes: in its own module (_timeline) since the split, or
    beside the cores in a build from before it."""
    try:
        return importlib.import_module("videoflow.messaging._timeline").SortedTimes
    except ImportError:
        return COMPILED.SortedTimes


BASE = 1_700_000_000.0  # wall-clock seconds, the scale producers stamp event_ts in
MISSING = ("drop", "dead_letter", "wait")
DISCARD_REASONS = {"evicted", "expired", "flushed", "late"}
TG_ID = re.compile(r"tg-[0-9a-f]{16}")

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------------------
# scenarios
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A policy and the calls to make. Ops (clock readings in seconds):

    ("add", parent, trace_id, seq, event_ts | None, now)  the clock reads now during add
    ("pop", now | None)    pop_ready(now); None: pop_ready() reading the clock as it stands
    ("drain", now)         pop_ready(now) until it returns None
    ("sweep", now)
    ("heard", now, parent)  heard(parent, now): input of parent's waits, not fed yet
    ("flush", now)         a final flush is always appended when the ops do not end in one
    """

    mode: str
    sync: tuple[str, ...]
    collect: tuple[tuple[str, float], ...]  # (parent, window_ms)
    tolerance_ms: float | None
    timeout_ms: float | None
    quorum: int | None
    missing: str
    max_pending: int
    ops: tuple[tuple, ...]
    start: float = BASE
    disorder_ms: float = 0.0

    def policy(self) -> JoinPolicy:
        return JoinPolicy(
            mode=self.mode,
            tolerance_ms=self.tolerance_ms,
            timeout_ms=self.timeout_ms,
            missing=self.missing,
            quorum=self.quorum,
            max_pending=self.max_pending,
            collect=dict(self.collect),
            disorder_ms=self.disorder_ms,
        )

    def parents(self) -> list[str]:
        return list(self.sync) + [c for c, _ in self.collect]


def _weighted(*pairs):
    """sampled_from over values repeated by weight (shrinks toward the first)."""
    out = []
    for value, weight in pairs:
        out.extend([value] * weight)
    return st.sampled_from(out)


_MAX_PENDING = _weighted((1024, 4), (1, 1), (2, 1), (3, 1), (5, 1))  # small: evictions
_EAGER = _weighted(("", 5), ("pop", 2), ("drain", 2), ("sweep", 1), ("popnow", 1),
                   ("heard", 1))
_LAZY = _weighted(("", 20), ("sweep", 1), ("pop", 1), ("heard", 1))  # groups pile up for the flush


def _interleave(draw, msgs, span_ms, timeout_ms, start=BASE):
    """Turns (arrival_ms, parent, trace_id, seq, ts_ms|None) deliveries into ops: local
    shuffles, a clock that follows arrival and sometimes jumps, pops/sweeps between adds."""
    msgs = sorted(msgs, key=lambda m: m[0])
    # local shuffles: adjacent swaps
    if len(msgs) > 1:
        for i in draw(st.lists(st.integers(0, len(msgs) - 2), max_size=len(msgs) // 2)):
            msgs[i], msgs[i + 1] = msgs[i + 1], msgs[i]
    jump_sizes = [span_ms, 5 * span_ms] + ([timeout_ms, 2 * timeout_ms] if timeout_ms else [])
    jumps = dict(
        draw(
            st.lists(
                st.tuples(st.integers(0, max(len(msgs) - 1, 0)), st.sampled_from(jump_sizes)),
                max_size=2,
            )
        )
    )
    actions = _LAZY if draw(st.booleans()) else _EAGER
    parents = sorted({m[1] for m in msgs})
    ops: list[tuple] = []
    clock_ms = -math.inf
    shift = 0.0
    for i, (arrival, parent, trace_id, seq, ts_ms) in enumerate(msgs):
        shift += jumps.get(i, 0)
        clock_ms = max(clock_ms, arrival + shift)
        now = start + clock_ms / 1000.0
        event_ts = None if ts_ms is None else start + ts_ms / 1000.0
        ops.append(("add", parent, trace_id, seq, event_ts, now))
        action = draw(actions)
        if action == "popnow":
            ops.append(("pop", None))
        elif action == "heard":
            ops.append(("heard", now, draw(st.sampled_from(parents))))
        elif action:
            ops.append((action, now))
    end = 0 if clock_ms == -math.inf else clock_ms
    end += draw(st.sampled_from([0, span_ms, 10 * span_ms]))
    ops.append(("flush", start + end / 1000.0))
    return tuple(ops)


def _join_knobs(draw, n_sync: int, period: int, stragglers: bool, latencies: list[int]):
    """(timeout_ms, quorum, missing, latency_ms). With stragglers: halves arrive long
    after the timeout and a partial quorum applies, so groups expire below quorum,
    wait ('wait') and reach it later, or emit with parents missing."""
    if stragglers:
        timeout = draw(st.sampled_from([period, 2 * period]))
        quorum = draw(st.integers(2, n_sync - 1)) if n_sync >= 3 else 1
        missing = draw(_weighted(("wait", 2), ("drop", 1)))
        latency = draw(st.sampled_from([3 * period, 6 * period]))
    else:
        timeout = draw(st.one_of(st.none(), st.sampled_from([period, 3 * period, 10 * period])))
        quorum = draw(st.one_of(st.none(), st.integers(1, n_sync)))
        missing = draw(st.sampled_from(MISSING))
        latency = draw(st.sampled_from(latencies))
    return timeout, quorum, missing, latency


@st.composite
def time_streams(draw, stragglers: bool = False) -> Scenario:
    """Camera-like sync parents at a base period with jitter, drops, redeliveries,
    missing event_ts; sometimes high-rate collect parents with windows."""
    n_sync = draw(st.integers(3 if stragglers else 1, 8))
    n_col = draw(_weighted((0, 3), (1, 2), (2, 1)))
    period = draw(st.sampled_from([10, 40, 100]))
    tol = draw(st.sampled_from([0, 1, period // 4, period // 2, period]))
    jitter = draw(st.sampled_from([0, 1, period // 4, period // 2]))
    frames = draw(st.integers(1, 10))
    timeout, quorum, missing, latency = _join_knobs(
        draw, n_sync, period, stragglers, [0, period // 2, 2 * period]
    )
    max_pending = draw(_MAX_PENDING)
    window_ms = st.sampled_from([0, period // 4, period // 2, period, 2 * period])
    windows = [draw(window_ms) for _ in range(n_col)]
    rate = draw(st.sampled_from([1, 2, 4]))
    sync = tuple(f"cam{i}" for i in range(n_sync))
    col = tuple(f"imu{i}" for i in range(n_col))
    msgs = []

    def emit(parent, trace_id, seq, ts_ms):
        # fate: 0 dropped, 1 redelivered later (same trace_id, seq, event_ts), 2 no event_ts
        fate = draw(st.integers(0, 11))
        if fate == 0:
            return
        if fate == 2:
            ts_ms = None
        base = ts_ms if ts_ms is not None else seq * period
        arrival = base + draw(st.integers(0, latency))
        msgs.append((arrival, parent, trace_id, seq, ts_ms))
        if fate == 1:
            again = arrival + draw(st.integers(0, 5 * period))
            msgs.append((again, parent, trace_id, seq, ts_ms))

    for p in sync:
        offset = draw(st.integers(-jitter, jitter))
        for k in range(frames):
            j = draw(st.integers(-jitter, jitter)) if jitter else 0
            emit(p, f"{p}-{k}", k, k * period + offset + j)
    for c in col:
        # a sensor may stop early: its last samples settle while the cameras go on
        for i in range(draw(st.integers(0, frames)) * rate * 2):
            emit(c, f"{c}-{i}", i, i * period / (2 * rate))
    ops = _interleave(draw, msgs, period, timeout)
    collect = tuple(zip(col, windows, strict=True))
    disorder = draw(_weighted((0, 2), (period // 2, 1), (2 * period, 1)))
    return Scenario("time", sync, collect, tol, timeout, quorum, missing, max_pending, ops,
                    disorder_ms=disorder)


@st.composite
def trace_streams(draw, stragglers: bool = False) -> Scenario:
    """Diamond-like fan-in: each trace's halves from 2..8 parents, with missing halves,
    redeliveries, second messages of a trace under another seq, missing event_ts."""
    n = draw(st.integers(3 if stragglers else 2, 8))
    traces = draw(st.integers(1, 10))
    period = draw(st.sampled_from([20, 100]))
    timeout, quorum, missing, latency = _join_knobs(
        draw, n, period, stragglers, [0, period, 5 * period]
    )
    max_pending = draw(_MAX_PENDING)
    parents = tuple(f"branch{i}" for i in range(n))
    seqs = dict.fromkeys(parents, 0)
    msgs = []
    for k in range(traces):
        trace_id = f"t{k}"
        origin = k * period
        for p in parents:
            # fate: 0 missing half, 1 redelivered, 2 a second message of the trace, 3 no ts
            fate = draw(st.integers(0, 9))
            if fate == 0:
                continue
            seqs[p] += 1
            ts = None if fate == 3 else origin
            arrival = origin + draw(st.integers(0, latency))
            msgs.append((arrival, p, trace_id, seqs[p], ts))
            if fate == 1:
                again = arrival + draw(st.integers(0, 5 * period))
                msgs.append((again, p, trace_id, seqs[p], ts))
            elif fate == 2:
                seqs[p] += 1
                again = arrival + draw(st.integers(0, 3 * period))
                msgs.append((again, p, trace_id, seqs[p], ts))
    ops = _interleave(draw, msgs, period, timeout)
    return Scenario("trace", parents, (), None, timeout, quorum, missing, max_pending, ops)


_DT_MS = _weighted((0, 4), (1, 1), (5, 1), (10, 2), (30, 1), (200, 1))


@st.composite
def chaotic_streams(draw) -> Scenario:
    """A small alphabet of parents, trace ids, seqs and event times on a coarse grid, so
    ties, tolerance boundaries, redeliveries with other event times, flushes in the
    middle and adds after a flush all come up."""
    mode = draw(st.sampled_from(["time", "trace"]))
    n_sync = draw(st.integers(1, 4))
    n_col = draw(st.integers(0, 2)) if mode == "time" else 0
    tol = draw(st.sampled_from([0, 10, 25, 50])) if mode == "time" else None
    windows = [draw(st.sampled_from([0, 10, 20, 50])) for _ in range(n_col)]
    timeout = draw(st.one_of(st.none(), st.sampled_from([10, 30, 100])))
    quorum = draw(st.one_of(st.none(), st.integers(1, n_sync)))
    missing = draw(st.sampled_from(MISSING))
    max_pending = draw(_MAX_PENDING)
    start = draw(st.sampled_from([BASE, 0.0]))
    sync = tuple(f"s{i}" for i in range(n_sync))
    col = tuple(f"c{i}" for i in range(n_col))
    add = st.tuples(
        st.just("add"),
        st.sampled_from(sync + col + col),  # samples twice as often
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 2),
        st.one_of(st.none(), st.integers(0, 15)),
        _DT_MS,
    )
    control = _weighted(("pop", 3), ("drain", 3), ("sweep", 2), ("popnow", 1), ("flush", 1),
                        ("heard", 2))
    ctl = st.tuples(control, st.sampled_from(sync + col), _DT_MS)
    raw = draw(st.lists(st.one_of(add, add, add, ctl), min_size=8, max_size=80))
    ops: list[tuple] = []
    clock_ms = 0
    for op in raw:
        clock_ms += op[-1]
        now = start + clock_ms / 1000.0
        if op[0] == "add":
            _, parent, trace_id, seq, ts, _ = op
            event_ts = None if ts is None else start + ts * 10 / 1000.0
            ops.append(("add", parent, trace_id, seq, event_ts, now))
        elif op[0] == "popnow":
            ops.append(("pop", None))
        elif op[0] == "heard":
            ops.append(("heard", now, op[1]))
        else:
            ops.append((op[0], now))
    collect = tuple(zip(col, windows, strict=True))
    disorder = draw(st.sampled_from([0, 0, 10, 50])) if mode == "time" else 0
    return Scenario(
        mode, sync, collect, tol, timeout, quorum, missing, max_pending, tuple(ops), start,
        disorder,
    )


# --------------------------------------------------------------------------------------
# harness
# --------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class RecordingHandle:
    """Logs (id, 'discard', reason) / (id, 'supersede') into its assembler's log."""

    __slots__ = ("hid", "log", "resolutions")

    def __init__(self, hid: int, log: list) -> None:
        self.hid = hid
        self.log = log
        self.resolutions = 0

    def discard(self, reason: str) -> None:
        self.resolutions += 1
        self.log.append((self.hid, "discard", reason))

    def supersede(self) -> None:
        self.resolutions += 1
        self.log.append((self.hid, "supersede"))

    def __repr__(self) -> str:
        return f"H{self.hid}"


def log_resolution(released: list[tuple[RecordingHandle, str]]) -> None:
    """A custom resolver: logs what the handles' own methods would, without calling them."""
    for handle, reason in released:
        handle.resolutions += 1
        handle.log.append(
            (handle.hid, "supersede") if reason == SUPERSEDED else (handle.hid, "discard", reason))


@dataclass
class Delivery:
    hid: int
    parent: str
    trace_id: str
    seq: int
    event_ts: float | None
    now: float  # clock reading during add
    entry: EnvelopeEntry
    is_sample: bool


def entry_view(e: Any) -> Any:
    if e is None:
        return None
    if type(e) is EnvelopeEntry:
        return ("entry", e.trace_id, e.seq, e.message)
    if type(e) is CollectEntry:
        return ("window", tuple(e.event_ts), tuple(e.message), tuple(m["d"] for m in e.metadata))
    return ("unexpected", type(e).__name__, repr(e))


def group_view(g: Any) -> Any:
    """What two cores must agree on for one emitted group."""
    if type(g) is not ReadyGroup:
        return ("not a ReadyGroup", repr(g))
    return (
        g.trace_id,
        g.seq,
        g.event_ts,
        {p: entry_view(e) for p, e in g.entries.items()},
        sorted(h.hid for h in g.handles),
    )


class Side:
    """One assembler over one core, with its own handles, log and oracle state."""

    def __init__(
        self, label: str, module: Any, scn: Scenario, clock: FakeClock, deliveries: list[Delivery],
        resolver: Resolver | None = None,
    ) -> None:
        self.label = label
        self.scn = scn
        self.clock = clock
        self.deliveries = deliveries
        self.log: list[tuple] = []
        self.handles: list[RecordingHandle] = []
        cls = TimeGroupAssembler if scn.mode == "time" else TraceGroupAssembler
        # One fake clock for both: the oracle stamps an entry without event_ts with the
        # clock's reading at its add (eff_ts).
        self.asm = cls("join", scn.parents(), scn.policy(), clock=clock, epoch=clock,
                       core=module, resolver=resolver)
        assert type(self.asm._core).__module__ == module.__name__, "assembler ignored core="
        self.quorum = len(scn.sync) if scn.quorum is None else scn.quorum
        self.tol = None if scn.tolerance_ms is None else scn.tolerance_ms / 1000.0
        self.windows = {c: w / 1000.0 for c, w in scn.collect}
        # oracle state, by handle id
        self.status: dict[int, str | None] = {}
        self.held_ts: dict[int, float] = {}
        self.taken: set[int] = set()
        self.emitted_in: dict[int, int] = {}
        self.identities: dict[str, tuple] = {}
        self.n_groups = 0
        self.groups: list[ReadyGroup] = []

    # -- calls ---------------------------------------------------------------------

    def call(self, op: tuple) -> tuple[list, list]:
        """Runs one op; returns (groups, new log events)."""
        start = len(self.log)
        kind = op[0]
        groups: list = []
        if kind == "add":
            d = self.deliveries[-1]
            h = RecordingHandle(d.hid, self.log)
            self.handles.append(h)
            self.asm.add(d.parent, d.entry, h)
        elif kind == "pop":
            g = self.asm.pop_ready(op[1])
            if g is not None:
                groups.append(g)
        elif kind == "sweep":
            self.asm.sweep(op[1])
        elif kind == "heard":
            self.asm.heard(op[2], op[1])
        elif kind == "flush":
            groups = self.asm.flush(op[1])
            assert isinstance(groups, list), f"flush returned {groups!r}"
        else:  # pragma: no cover
            raise AssertionError(op)
        # Each handle let go is resolved (default resolver: the handle's own methods)
        # before the call returns; none waits for a later one.
        left = self.asm._core.released
        assert not left, f"[{self.label}] {op!r} left {left} unresolved"
        return groups, self.log[start:]

    def observe(self) -> tuple:
        now = self.clock.now
        return (
            self.asm.pending_count(),
            self.asm.evictions,
            {p: self.asm.has_pending_from(p) for p in self.scn.parents()},
            self.asm.oldest_wait_seconds(now),
            self.asm.waiting_for(),
            self.asm.watermarks(),
        )

    # -- oracle --------------------------------------------------------------------

    def eff_ts(self, d: Delivery) -> float:
        if d.event_ts is not None:
            return d.event_ts
        return d.now if self.scn.mode == "time" else math.nan

    def check(self, op: tuple, groups: list, events: list, before: tuple, after: tuple) -> None:
        where = f"[{self.label}] after {op!r}"
        kind = op[0]
        new = self.deliveries[-1] if kind == "add" else None
        if new is not None:
            self.status[new.hid] = None
            self.held_ts[new.hid] = self.eff_ts(new)
        superseded = 0
        sync_discards = 0
        for ev in events:
            hid = ev[0]
            d = self.deliveries[hid]
            assert self.status.get(hid, "unknown") is None, (
                f"{where}: handle {hid} resolved again ({ev}) after {self.status.get(hid)}"
            )
            if ev[1] == "supersede":
                assert new is not None, f"{where}: supersede outside add: {ev}"
                assert (d.parent, d.trace_id, d.seq) == (new.parent, new.trace_id, new.seq), (
                    f"{where}: handle {hid} {d} superseded by a different message {new}"
                )
                superseded += 1
                self.status[hid] = "superseded"
                self.held_ts[new.hid] = self.held_ts[hid]
                if hid in self.taken:
                    self.taken.add(new.hid)
                continue
            assert ev[1] == "discard" and ev[2] in DISCARD_REASONS, f"{where}: bad event {ev}"
            reason = ev[2]
            if kind == "add":
                if hid == new.hid:
                    # A sync message behind every other parent's watermark seeds a
                    # group they have all passed: given up at once -- 'late' when it
                    # was behind its own parent's too, which only a core without a
                    # timeout judges by watermarks.
                    assert new.is_sample or self.scn.mode == "time", (
                        f"{where}: a sync add discarded its own handle: {ev}")
                    assert reason in ("expired", "evicted", "late"), f"{where}: {ev}"
                    assert reason != "late" or self.scn.timeout_ms is None, (
                        f"{where}: a late seed with a timeout waits for its deadline: {ev}")
                elif self.scn.mode == "time":
                    # A watermark the add moved can give up on earlier groups below
                    # quorum (event-time resolution), besides evicting over capacity.
                    assert reason in ("evicted", "expired", "late"), f"{where}: {ev}"
                else:
                    assert reason == "evicted", f"{where}: add discarded another handle: {ev}"
            elif kind in ("pop", "sweep"):
                assert reason in ("expired", "late"), f"{where}: {ev}"
            elif kind == "heard":
                raise AssertionError(f"{where}: heard resolved a handle: {ev}")
            else:
                assert reason == "flushed", f"{where}: {ev}"
            if not d.is_sample:
                sync_discards += 1
            self.status[hid] = "discard:" + reason
        assert superseded <= 1, f"{where}: one add superseded {superseded} handles"
        for g in groups:
            self.check_group(where, g)
        # counters
        pending, evictions, has_pending, wait, waiting_for, marks = after
        assert 0 <= pending <= self.scn.max_pending, f"{where}: pending_count {pending}"
        assert set(waiting_for) <= set(self.scn.sync) and (pending > 0 or not waiting_for), (
            f"{where}: waiting_for {waiting_for} with {pending} pending")
        if self.scn.mode == "time":  # a watermark is the greatest event time seen
            seen: dict[str, float] = {}
            for d in self.deliveries:
                seen[d.parent] = max(seen.get(d.parent, -math.inf), self.eff_ts(d))
            assert marks == {p: seen.get(p) for p in marks} and set(marks) == set(
                self.scn.parents()), f"{where}: watermarks {marks}, adds say {seen}"
        else:
            assert marks == {}, f"{where}: a trace join has no watermarks: {marks}"
        delta = evictions - before[1]
        assert 0 <= delta <= sync_discards and (delta > 0) == (sync_discards > 0), (
            f"{where}: evictions went {before[1]} -> {evictions} with {sync_discards} sync discards"
        )
        assert wait >= 0.0 and (pending > 0 or wait == 0.0), f"{where}: oldest_wait {wait}"
        for p, flag in has_pending.items():
            expected = any(self.status[d.hid] is None for d in self.deliveries if d.parent == p)
            assert flag == expected, (
                f"{where}: has_pending_from({p!r}) is {flag}, unresolved handles say {expected}"
            )

    def check_group(self, where: str, g: ReadyGroup) -> None:
        assert type(g) is ReadyGroup, f"{where}: emitted {g!r}"
        self.n_groups += 1
        self.groups.append(g)
        where = f"{where} group #{self.n_groups} {group_view(g)}"
        scn = self.scn
        hids = [h.hid for h in g.handles]
        assert len(hids) == len(set(hids)), f"{where}: a handle twice in one group"
        hid_set = set(hids)
        assert set(g.entries) == set(scn.parents()), f"{where}: entries keyed {list(g.entries)}"
        members: list[tuple[str, Delivery]] = []
        for p in scn.sync:
            e = g.entries[p]
            from_p = [h for h in hids if self.deliveries[h].parent == p]
            if e is None:
                assert not from_p, f"{where}: {p} missing yet its handles {from_p} are in the group"
                continue
            assert type(e) is EnvelopeEntry, f"{where}: {p} -> {e!r}"
            k = int(e.message[1:])
            d = self.deliveries[k]
            assert e is d.entry and d.parent == p, f"{where}: {p} holds {d}"
            assert from_p == [k], (
                f"{where}: {p}'s handles in the group are {from_p}, its entry is delivery {k}"
            )
            members.append((p, d))
        assert len(members) >= self.quorum, (
            f"{where}: {len(members)} sync members, quorum {self.quorum}"
        )
        assert g.seq == min(d.seq for _, d in members), f"{where}: seq"
        held = [self.held_ts[d.hid] for _, d in members]
        if scn.mode == "trace":
            assert all(d.trace_id == g.trace_id for _, d in members), f"{where}: trace ids"
            known = [t for t in held if t == t]
            assert g.event_ts == (min(known) if known else None), f"{where}: event_ts"
            assert hid_set == {d.hid for _, d in members}, f"{where}: handles are not the members"
        else:
            self.check_time_group(where, g, members, held, hids)
        for hid in hids:
            assert self.status.get(hid, "unknown") is None, (
                f"{where}: handle {hid} emitted after {self.status.get(hid)}"
            )
            self.status[hid] = "emitted"
            self.emitted_in[hid] = self.n_groups

    def check_time_group(self, where, g, members, held, hids) -> None:
        assert g.event_ts == min(held), f"{where}: event_ts {g.event_ts} != min {min(held)}"
        keys = [f"{p}\x00{d.trace_id}\x00{d.seq}\x00" for p, d in members]
        assert TG_ID.fullmatch(g.trace_id) and g.trace_id == REFERENCE.group_identity(keys), (
            f"{where}: minted id"
        )
        member_set = tuple(sorted(keys))
        assert self.identities.setdefault(g.trace_id, member_set) == member_set, (
            f"{where}: one id for two member sets"
        )
        # the group's time is its seed's event time: some member all others are within
        # tolerance of
        tol = self.tol
        candidates = [t0 for t0 in held if all(abs(t - t0) <= tol for t in held)]
        assert candidates, f"{where}: sync members {held} not within {tol} of one of them"
        windows: dict[str, list[int]] = {}
        for c in self.windows:
            ce = g.entries[c]
            assert type(ce) is CollectEntry, f"{where}: {c} -> {ce!r}"
            assert len(ce.message) == len(ce.event_ts) == len(ce.metadata), f"{where}: {c}"
            assert ce.event_ts == sorted(ce.event_ts), f"{where}: {c} window not oldest first"
            ks = []
            for msg, ts, md in zip(ce.message, ce.event_ts, ce.metadata, strict=True):
                k = int(msg[1:])
                d = self.deliveries[k]
                assert d.parent == c and md == {"d": k}, f"{where}: {c} window holds {d}"
                assert ts == self.held_ts[k], f"{where}: {c} sample {k} at {ts}"
                assert self.status[k] is None, (
                    f"{where}: {c} window holds sample {k}, already {self.status[k]}"
                )
                ks.append(k)
            assert len(ks) == len(set(ks)), f"{where}: {c} sample twice in a window"
            windows[c] = ks

        # brute force: some candidate group time has every window sample within the
        # window and every untaken sample still buffered within the window in it
        def fits(t0: float) -> bool:
            for c, w in self.windows.items():
                inside = set(windows[c])
                if any(abs(self.held_ts[k] - t0) > w for k in inside):
                    return False
                for d in self.deliveries:
                    if (
                        d.parent == c
                        and self.status[d.hid] is None
                        and d.hid not in self.taken
                        and abs(self.held_ts[d.hid] - t0) <= w
                        and d.hid not in inside
                    ):
                        return False
            return True

        if self.windows:
            buffered = [d for d in self.deliveries if d.is_sample and self.status[d.hid] is None]
            assert any(fits(t0) for t0 in candidates), (
                f"{where}: collect windows {windows} do not match the buffered samples "
                f"{[(d.hid, self.held_ts[d.hid]) for d in buffered]} "
                f"for any group time in {candidates}"
            )
        for ks in windows.values():
            self.taken.update(ks)
        for hid in hids:
            d = self.deliveries[hid]
            if d.is_sample:
                assert hid in self.taken, f"{where}: untaken sample {hid} handed out"

    def check_conservation(self) -> None:
        where = f"[{self.label}] after the final flush"
        for h in self.handles:
            total = h.resolutions + (1 if h.hid in self.emitted_in else 0)
            assert total == 1, (
                f"{where}: handle {h.hid} ({self.deliveries[h.hid]}) resolved {total} times: "
                f"{[ev for ev in self.log if ev[0] == h.hid]}, group {self.emitted_in.get(h.hid)}"
            )
            assert self.status[h.hid] is not None
        assert self.asm.pending_count() == 0, where
        assert self.asm.oldest_wait_seconds(self.clock.now) == 0.0, where
        for p in self.scn.parents():
            assert not self.asm.has_pending_from(p), f"{where}: still pending from {p}"


def run_differential(scn: Scenario, resolver: Resolver | None = None) -> tuple[Side, Side]:
    """Runs scn on both cores, their handles resolved by resolver (None: the default,
    the handles' own methods)."""
    clock = FakeClock(scn.start)
    deliveries: list[Delivery] = []
    sides = [Side(label, module, scn, clock, deliveries, resolver) for label, module in CORES]
    ops = list(scn.ops)
    if not ops or ops[-1][0] != "flush":
        ops.append(("flush", None))
    collect = {c for c, _ in scn.collect}
    obs = [s.observe() for s in sides]
    for i, op in enumerate(ops):
        steps = [op]
        if op[0] == "add":
            _, parent, trace_id, seq, event_ts, now = op
            clock.now = now
            k = len(deliveries)
            e = EnvelopeEntry(trace_id, seq, event_ts, f"m{k}", {"d": k}, False)
            is_sample = parent in collect
            deliveries.append(Delivery(k, parent, trace_id, seq, event_ts, now, e, is_sample))
        elif op[1] is not None:
            clock.now = op[1]
        if op[0] == "drain":
            steps = [("pop", op[1])] * 10_000
        for step in steps:
            outcomes = []
            for s in sides:
                try:
                    outcomes.append(s.call(step))
                except Exception as exc:  # report both sides before failing
                    outcomes.append(exc)
            if any(isinstance(o, Exception) for o in outcomes):
                raise AssertionError(
                    f"op #{i} {step!r} raised: compiled={outcomes[0]!r} reference={outcomes[1]!r}"
                ) from next(o for o in outcomes if isinstance(o, Exception))
            views = [[group_view(g) for g in o[0]] for o in outcomes]
            assert views[0] == views[1], (
                f"op #{i} {step!r}: groups differ\n compiled:  {views[0]}\n reference: {views[1]}"
            )
            assert outcomes[0][1] == outcomes[1][1], (
                f"op #{i} {step!r}: handle events differ\n compiled:  {outcomes[0][1]}\n"
                f" reference: {outcomes[1][1]}"
            )
            new_obs = [s.observe() for s in sides]
            assert new_obs[0] == new_obs[1], (
                f"op #{i} {step!r}: (pending_count, evictions, has_pending_from, oldest_wait, "
                "waiting_for, watermarks) "
                f"differ\n compiled:  {new_obs[0]}\n reference: {new_obs[1]}"
            )
            for s, o, b, a in zip(sides, outcomes, obs, new_obs, strict=True):
                s.check(step, o[0], o[1], b, a)
            obs = new_obs
            if step[0] == "pop" and not outcomes[0][0] and op[0] == "drain":
                break
    for s in sides:
        assert not any(h.resolutions > 1 for h in s.handles), f"[{s.label}] resolved twice"
        s.check_conservation()
    return sides[0], sides[1]


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------


@SETTINGS
@given(scn=time_streams())
def test_time_mode_streams_with_jitter_drops_redelivery_and_collect_agree_across_cores(scn):
    run_differential(scn)


@SETTINGS
@given(scn=trace_streams())
def test_trace_mode_streams_with_missing_halves_redelivery_and_second_seqs_agree_across_cores(scn):
    run_differential(scn)


@SETTINGS
@given(scn=st.one_of(time_streams(stragglers=True), trace_streams(stragglers=True)))
def test_straggling_parents_under_partial_quorum_and_missing_wait_agree_across_cores(scn):
    run_differential(scn)


@settings(SETTINGS, max_examples=300)
@given(scn=chaotic_streams())
def test_small_alphabet_op_sequences_agree_across_cores_and_conserve_handles(scn):
    run_differential(scn)


@settings(SETTINGS, max_examples=100)
@given(scn=st.one_of(chaotic_streams(), time_streams(stragglers=True)))
def test_a_custom_resolver_is_given_the_same_handles_and_reasons_in_the_same_order(scn):
    run_differential(scn, resolver=log_resolution)


def test_harness_flags_a_handle_emitted_and_then_discarded():
    """The oracle is not vacuous: a hand-made double resolution is caught."""
    scn = Scenario(
        "trace",
        ("a", "b"),
        (),
        None,
        None,
        None,
        "drop",
        8,
        (("add", "a", "t", 1, None, BASE), ("add", "b", "t", 1, None, BASE)),
    )
    compiled, reference = run_differential(scn)
    assert reference.n_groups == compiled.n_groups == 1
    reference.handles[0].discard("expired")
    with pytest.raises(AssertionError, match="resolved 2 times"):
        reference.check_conservation()


def test_time_scenario_with_collect_window_and_quorum_timeout_emits_as_specified():
    """A fixed scenario through the whole harness, with its outcome pinned."""
    t = BASE
    scn = Scenario(
        "time",
        ("cam0", "cam1", "cam2"),
        (("imu", 20.0),),
        5.0,
        100.0,
        2,
        "drop",
        8,
        (
            ("add", "imu", "i0", 0, t - 0.030, t),
            ("add", "imu", "i1", 1, t - 0.010, t),
            ("add", "cam0", "c0", 0, t, t),
            ("add", "cam1", "c1", 0, t + 0.004, t),
            ("add", "imu", "i2", 2, t + 0.015, t),
            ("pop", t + 0.050),
            ("drain", t + 0.101),
        ),
    )
    compiled, reference = run_differential(scn)
    assert [group_view(g) for g in compiled.groups] == [group_view(g) for g in reference.groups]
    (group,) = reference.groups
    # cam0 and cam1 (5 ms apart at most) make quorum 2 of 3 at the 100 ms timeout; the
    # imu window holds the two samples within 20 ms of t, oldest first
    assert group.entries["cam2"] is None
    assert group.entries["imu"].event_ts == [t - 0.010, t + 0.015]
    assert sorted(h.hid for h in group.handles) == [2, 3]
    # i0 (30 ms before t) settles unused at the first pop; the two used samples are
    # still buffered at the flush, which returns no group to carry them: 'flushed'
    assert (
        reference.log
        == compiled.log
        == [
            (0, "discard", "expired"),
            (1, "discard", "flushed"),
            (4, "discard", "flushed"),
        ]
    )


# -- SortedTimes ------------------------------------------------------------------------

_runs = st.integers(1, 60)  # bulk operations reach the compaction thresholds (32)
sorted_times_ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 40), _runs),
        st.tuples(st.just("remove"), st.integers(0, 1000), _runs),
        st.tuples(st.just("remove_oldest"), st.just(0), _runs),
        st.tuples(st.just("remove_inner"), st.just(0), _runs),
        st.tuples(st.just("bounds"), st.integers(-2, 42), st.integers(0, 12)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=sorted_times_ops)
def test_reference_sorted_times_matches_a_sorted_list_and_the_compiled_twin_layout(ops):
    ref = REFERENCE.SortedTimes()
    comp = _compiled_sorted_times()()
    model: list[tuple[float, int]] = []  # ties keep insertion order (bisect_right)
    slot = 0
    for op in ops:
        if op[0] == "insert":
            for r in range(op[2]):
                t = (op[1] + 7 * r) % 41 * 0.25
                model.insert(bisect_right([x for x, _ in model], t), (t, slot))
                ref.insert(t, slot)
                comp.py_insert(t, slot)
                slot += 1
        elif op[0].startswith("remove"):
            for _ in range(min(op[2], len(model))):
                if op[0] == "remove":
                    idx = op[1] % len(model)
                elif op[0] == "remove_oldest":
                    idx = 0
                else:  # an inner one, so tombstones pile up between live ends
                    idx = len(model) // 2
                t, s = model.pop(idx)
                ref.remove(t, s)
                comp.py_remove(t, s)
        else:
            a = op[1] * 0.25
            b = a + op[2] * 0.25
            i, j = ref.bounds(a, b)
            assert (i, j) == ref.py_bounds(a, b) == comp.py_bounds(a, b)
            assert ref.lo <= i <= j <= len(ref.t)
            inside = [(ref.t[k], ref.s[k]) for k in range(i, j) if ref.s[k] >= 0]
            assert inside == [(t, s) for t, s in model if a <= t <= b]
        # the reference's raw layout: sorted from the head, no tombstone at either
        # end, dead counting the tombstones, compacted once tombstones outnumber the
        # live entries by the slack
        raw_t, raw_s = ref.t[ref.lo :], ref.s[ref.lo :]
        assert raw_t == sorted(raw_t) and len(ref.t) == len(ref.s)
        assert ref.dead == raw_s.count(-1) <= len(model) + 32
        assert not raw_s or (raw_s[0] != -1 and raw_s[-1] != -1)
        assert [(t, s) for t, s in zip(raw_t, raw_s, strict=True) if s != -1] == model
        for impl in (ref, comp):
            live_t, live_s = impl.live()
            assert list(zip(live_t.tolist(), live_s.tolist(), strict=True)) == model
        # same layout in the compiled twin: every window maps to the same raw indices
        assert comp.py_bounds(-1.0, 11.0) == ref.bounds(-1.0, 11.0)


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.text(max_size=12), max_size=6))
def test_group_identity_is_the_same_in_both_cores(keys):
    minted = REFERENCE.group_identity(keys)
    assert TG_ID.fullmatch(minted)
    assert COMPILED.group_identity(list(keys)) == minted
