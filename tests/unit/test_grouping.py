"""Semantics of videoflow.messaging.grouping, run against both cores."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time

import pytest
from grouping_helpers import Clock, Handle, entry

from videoflow.core.policies import JoinPolicy
from videoflow.messaging import _grouping_ref
from videoflow.messaging.grouping import (
    ENTRY_KEYS,
    CollectEntry,
    EndEntry,
    EnvelopeEntry,
    ReadyGroup,
    TimeGroupAssembler,
    TraceGroupAssembler,
    make_assembler,
)

CORES = {
    "compiled": importlib.import_module("videoflow.messaging._grouping_core"),
    "reference": _grouping_ref,
}


@pytest.fixture(params=sorted(CORES))
def core(request: pytest.FixtureRequest):
    return CORES[request.param]


def drain(assembler, now=None) -> list[ReadyGroup]:
    out = []
    while (group := assembler.pop_ready(now)) is not None:
        out.append(group)
    return out


def members(group: ReadyGroup) -> dict:
    return {p: (None if e is None else (e.trace_id, e.seq)) for p, e in group.entries.items()}


# -- core selection ---------------------------------------------------------------


def test_compiled_core_is_a_compiled_extension():
    assert CORES["compiled"].CORE_KIND == "compiled"
    assert CORES["compiled"].__file__.endswith((".so", ".pyd"))


@pytest.mark.parametrize("flag, expected", [("1", "reference"), ("0", "compiled")])
def test_environment_switch_selects_the_core(flag, expected):
    env = dict(os.environ, VIDEOFLOW_PURE_PYTHON=flag)
    out = subprocess.run(
        [sys.executable, "-c", "from videoflow.messaging import grouping as g; print(g.CORE_KIND)"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    assert out.stdout.strip() == expected


# -- records ------------------------------------------------------------------------


def test_from_decoded_adapts_a_full_envelope_dict():
    decoded = {
        "trace_id": "t1", "seq": 7, "event_ts": 12.5, "message": {"x": 1}, "metadata": {"m": 2},
        "is_stop_signal": False, "type": "data", "producer_name": "cam0", "flow_id": "f",
        "run_id": "r", "span_id": 3, "parent_span_id": 2, "replica_id": 1, "blob_ref": None,
        "partition_key": "k", "is_abort": False, "abort_origin": None, "abort_error": None,
    }
    e = EnvelopeEntry.from_decoded(decoded)
    fields = set(EnvelopeEntry.__struct_fields__)
    assert {k: getattr(e, k) for k in fields} == {k: decoded[k] for k in fields}


def test_from_decoded_fills_defaults_for_a_partial_envelope():
    e = EnvelopeEntry.from_decoded({"trace_id": "t", "seq": 1})
    assert (e.event_ts, e.message, e.metadata, e.is_stop_signal) == (None, None, None, False)
    assert (e.type, e.producer_name, e.replica_id, e.blob_ref) == ("", "", 0, None)


@pytest.mark.parametrize("missing", ["trace_id", "seq"])
def test_from_decoded_without_identity_raises_key_error(missing):
    decoded = {"trace_id": "t", "seq": 1, "message": None}
    del decoded[missing]
    with pytest.raises(KeyError, match=missing):
        EnvelopeEntry.from_decoded(decoded)


def test_envelope_entry_is_never_mutated():
    e = entry("t", 1)
    for name in EnvelopeEntry.__struct_fields__:
        with pytest.raises(AttributeError):
            setattr(e, name, None)
    assert e == entry("t", 1)


def test_every_entry_record_is_read_by_the_keys_receive_message_documents():
    data = EnvelopeEntry("t", 1, 2.5, {"x": 1}, {"m": 1}, False)
    window = CollectEntry(["a", "b"], [None, None], [1.0, 2.0])
    died = EndEntry(False, True, "cam", {"type": "ValueError", "message": "bad"})
    assert {k: data[k] for k in ENTRY_KEYS} == {
        "message": {"x": 1}, "metadata": {"m": 1}, "event_ts": 2.5, "is_stop_signal": False,
        "is_abort": False, "abort_origin": None, "abort_error": None}
    assert (window["message"], window["event_ts"], window["is_abort"]) == (
        ["a", "b"], [1.0, 2.0], False)
    assert {k: died[k] for k in ENTRY_KEYS} == {
        "message": None, "metadata": None, "event_ts": None, "is_stop_signal": False,
        "is_abort": True, "abort_origin": "cam",
        "abort_error": {"type": "ValueError", "message": "bad"}}
    assert EndEntry(True)["is_stop_signal"] is True


@pytest.mark.parametrize("key", ["trace_id", "seq", "blob_ref", "nope"])
def test_an_entry_read_by_a_key_it_does_not_promise_raises_key_error(key):
    # Lineage and transport fields are attributes for the messaging layer, not keys
    # a node's task may come to depend on.
    with pytest.raises(KeyError, match=key):
        entry("t", 1)[key]


def test_collect_entry_defaults_to_empty_lists():
    c = CollectEntry()
    assert (c.message, c.metadata, c.event_ts, c.is_stop_signal) == ([], [], [], False)
    assert CollectEntry().message is not c.message


def test_make_assembler_follows_the_policy_mode(core):
    assert type(make_assembler("j", ["a", "b"], JoinPolicy())) is TraceGroupAssembler
    time_policy = JoinPolicy(mode="time", tolerance_ms=5)
    assert type(make_assembler("j", ["a", "b"], time_policy)) is TimeGroupAssembler


def test_make_assembler_hands_its_assembler_the_resolver():
    resolved: list[tuple[object, str]] = []
    a = make_assembler("j", ["a", "b"], JoinPolicy(max_pending=1), resolver=resolved.extend)
    a.add("a", entry("t1", 1), "first")
    a.add("a", entry("t2", 2), "second")
    assert resolved == [("first", "evicted")]


def test_assembler_refuses_a_policy_that_does_not_fit_its_parents(core):
    with pytest.raises(ValueError, match="quorum 3 exceeds"):
        TraceGroupAssembler("j", ["a", "b"], JoinPolicy(quorum=3), core=core)
    policy = JoinPolicy(mode="time", tolerance_ms=5)
    with pytest.raises(ValueError, match="65 sync parents exceed the maximum of 64"):
        TimeGroupAssembler("j", [f"p{i}" for i in range(65)], policy, core=core)


def test_sixty_four_sync_parents_use_every_presence_bit(core):
    parents = [f"p{i}" for i in range(64)]
    a = TimeGroupAssembler("j", parents, JoinPolicy(mode="time", tolerance_ms=1), core=core)
    for i, p in enumerate(parents):
        a.add(p, entry(f"{p}-0", i, 5.0), Handle(p))
        if i < 63:
            assert a.pop_ready(0.0) is None
    (group,) = drain(a, 0.0)
    assert set(group.entries) == set(parents) and len(group.handles) == 64


# -- resolving what the assembler lets go ---------------------------------------------


def test_a_standalone_assembler_resolves_what_it_discards_and_supersedes_before_returning(core):
    # The reference's promise, with no messenger and nothing to drain: each handle let go
    # is resolved through the handle's own methods (the default resolver) by the time
    # the call that let it go returns, with the real reason.
    log: list[tuple[str, str]] = []
    a = trace(core, max_pending=2, timeout_ms=100)
    a.add("a", entry("t1", 1), Handle("t1", log))
    a.add("a", entry("t1", 1), Handle("t1 again", log))
    assert log == [("t1", "superseded")]
    a.add("a", entry("t2", 2), Handle("t2", log))
    a.add("a", entry("t3", 3), Handle("t3", log))
    assert log[1:] == [("t1 again", "evicted")]
    a.sweep(0.1)
    assert log[2:] == [("t2", "expired"), ("t3", "expired")]
    a.add("a", entry("t4", 4), Handle("t4", log))
    assert a.flush(0.1) == [] and log[4:] == [("t4", "flushed")]
    late = Handle("late", log)
    b = timed(core, timeout_ms=None, quorum=2)
    b.add("a", entry("a5", 5, 5.0), Handle("a5"))
    b.add("b", entry("b5", 5, 5.0), Handle("b5"))
    b.add("a", entry("a1", 1, 1.0), late)  # behind both watermarks: no group can take it
    assert b.pop_ready(0.0) is not None and late.events == ["late"]


def test_a_resolver_is_given_what_a_call_let_go_once_the_call_is_done(core):
    # Any object is a handle to a custom resolver. It is called once per call that let
    # something go, with all of it in order, after the assembler's work, never in its
    # middle: the add that evicted has already joined its own entry.
    calls: list[tuple[list, int, bool]] = []
    a: TraceGroupAssembler

    def resolver(released: list) -> None:
        calls.append((list(released), a.pending_count(), a.has_pending_from("b")))

    a = TraceGroupAssembler("j", ["a", "b"], JoinPolicy(max_pending=1, timeout_ms=100),
                            clock=Clock(), core=core, resolver=resolver)
    a.add("a", entry("t1", 1), "first")
    a.add("b", entry("t2", 2), "second")
    assert calls == [([("first", "evicted")], 1, True)]
    a.add("b", entry("t2", 2), "second again")
    assert calls[1:] == [([("second", "superseded")], 1, True)]
    a.pop_ready(0.05)
    assert len(calls) == 2  # a call that lets nothing go makes none
    a.sweep(0.1)
    assert calls[2:] == [([("second again", "expired")], 0, False)]


def test_a_resolver_that_raises_has_been_handed_the_call_s_pairs(core):
    given: list[list] = []

    def resolver(released: list) -> None:
        given.append(list(released))  # the list is the core's, emptied after
        raise RuntimeError("resolver failed")

    a = TraceGroupAssembler("j", ["a", "b"], JoinPolicy(timeout_ms=None), core=core,
                            resolver=resolver)
    for i in (1, 2, 3):
        a.add("a", entry(f"t{i}", i), f"t{i}")
    with pytest.raises(RuntimeError, match="resolver failed"):
        a.flush(0.0)
    assert given == [[("t1", "flushed"), ("t2", "flushed"), ("t3", "flushed")]]
    a.sweep(0.0)  # the assembler is whole, and owes the resolver nothing more
    assert len(given) == 1 and a.pending_count() == 0 and not a.has_pending_from("a")


def test_the_default_resolver_resolves_every_handle_though_one_raises(core):
    class Failing(Handle):
        def discard(self, reason: str) -> None:
            super().discard(reason)
            raise RuntimeError(f"{self.name} failed")

    handles = [Failing("t1"), Handle("t2"), Failing("t3")]
    a = trace(core)
    for i, h in enumerate(handles):
        a.add("a", entry(f"t{i}", i), h)
    with pytest.raises(RuntimeError, match="t1 failed"):
        a.flush(0.0)
    assert [h.events for h in handles] == [["flushed"]] * 3


def test_a_core_built_without_an_owner_keeps_what_it_lets_go(core):
    kept = core.TraceCore(["a", "b"], -1.0, 2, 1, False, Clock(), ReadyGroup)
    kept.add("a", entry("t1", 1), "first")
    kept.add("a", entry("t2", 2), "second")
    assert kept.released == [("first", "evicted")]


# -- trace groups ----------------------------------------------------------------------


def trace(core, parents=("a", "b"), clock=None, **policy) -> TraceGroupAssembler:
    return TraceGroupAssembler(
        "join", list(parents), JoinPolicy(**policy), clock=clock or Clock(), core=core
    )


def test_trace_group_emits_when_every_half_arrived(core):
    a = trace(core)
    ha, hb = Handle("a"), Handle("b")
    a.add("a", entry("t1", 5, 1.5), ha)
    assert a.pop_ready() is None and a.pending_count() == 1
    a.add("b", entry("t1", 3, 1.25), hb)
    group = a.pop_ready()
    assert group.trace_id == "t1" and group.seq == 3 and group.event_ts == 1.25
    assert members(group) == {"a": ("t1", 5), "b": ("t1", 3)}
    assert set(group.handles) == {ha, hb} and ha.events == hb.events == []
    assert a.pending_count() == 0 and a.pop_ready() is None


def test_trace_groups_come_out_in_order_of_completion(core):
    a = trace(core)
    for t in ("t1", "t2", "t3"):
        a.add("a", entry(t, 1), Handle(t))
    for t in ("t2", "t3", "t1"):
        a.add("b", entry(t, 2), Handle(t))
    assert [g.trace_id for g in drain(a)] == ["t2", "t3", "t1"]


def test_trace_group_without_event_times_has_none(core):
    a = trace(core)
    a.add("a", entry("t", 1), Handle("a"))
    a.add("b", entry("t", 2), Handle("b"))
    assert a.pop_ready().event_ts is None


def test_trace_redelivery_supersedes_the_held_half(core):
    a = trace(core)
    old, new = Handle("old"), Handle("new")
    a.add("a", entry("t", 1, message="first"), old)
    a.add("a", entry("t", 1, message="again"), new)
    assert old.events == ["superseded"] and a.pending_count() == 1
    a.add("b", entry("t", 2), Handle("b"))
    group = a.pop_ready()
    assert group.entries["a"].message == "again" and new in group.handles
    assert old not in group.handles


def test_trace_second_message_with_the_same_trace_starts_a_second_group(core):
    a = trace(core)
    a.add("a", entry("t", 1), Handle("a1"))
    a.add("a", entry("t", 2), Handle("a2"))
    assert a.pending_count() == 2
    a.add("b", entry("t", 9), Handle("b1"))
    a.add("b", entry("t", 10), Handle("b2"))
    assert [members(g) for g in drain(a)] == [
        {"a": ("t", 1), "b": ("t", 9)},
        {"a": ("t", 2), "b": ("t", 10)},
    ]


def test_trace_timeout_below_quorum_expires_the_group(core):
    clock = Clock(100.0)
    a = trace(core, clock=clock, timeout_ms=500)
    h = Handle("a")
    a.add("a", entry("t", 1), h)
    a.sweep(100.49)
    assert h.events == [] and a.evictions == 0
    assert a.oldest_wait_seconds(100.25) == pytest.approx(0.25)
    a.sweep(100.5)
    assert h.events == ["expired"] and a.evictions == 1 and a.pending_count() == 0
    assert not a.has_pending_from("a") and a.oldest_wait_seconds(101.0) == 0.0


def test_trace_timeout_with_quorum_emits_missing_parents_as_none(core):
    clock = Clock(0.0)
    a = trace(core, parents=("a", "b", "c"), clock=clock, timeout_ms=100, quorum=2)
    a.add("a", entry("t", 1), Handle("a"))
    a.add("b", entry("t", 2), Handle("b"))
    assert a.pop_ready(0.05) is None
    group = a.pop_ready(0.1)
    assert members(group) == {"a": ("t", 1), "b": ("t", 2), "c": None}


def test_trace_missing_wait_never_gives_up_and_emits_at_quorum(core):
    clock = Clock(0.0)
    a = trace(core, parents=("a", "b", "c"), clock=clock, timeout_ms=100, quorum=2, missing="wait")
    h = Handle("a")
    a.add("a", entry("t", 1), h)
    a.sweep(1000.0)
    assert h.events == [] and a.pending_count() == 1 and a.evictions == 0
    a.add("b", entry("t", 2), Handle("b"))
    assert members(a.pop_ready(1000.0)) == {"a": ("t", 1), "b": ("t", 2), "c": None}


def test_trace_beyond_max_pending_evicts_the_oldest(core):
    a = trace(core, max_pending=2, timeout_ms=None)
    handles = [Handle(f"t{i}") for i in range(3)]
    for i, h in enumerate(handles):
        a.add("a", entry(f"t{i}", i), h)
    assert handles[0].events == ["evicted"] and a.evictions == 1
    assert handles[1].events == handles[2].events == [] and a.pending_count() == 2


def test_trace_unknown_parent_is_a_key_error(core):
    with pytest.raises(KeyError, match="zed"):
        trace(core).add("zed", entry("t", 1), Handle("z"))


def test_trace_flush_emits_quorum_groups_and_flushes_the_rest(core):
    a = trace(core, parents=("a", "b", "c"), quorum=2)
    a.add("a", entry("t1", 1), Handle("a1"))
    a.add("b", entry("t1", 2), Handle("b1"))
    lonely = Handle("a2")
    a.add("a", entry("t2", 3), lonely)
    (group,) = a.flush(0.0)
    assert members(group) == {"a": ("t1", 1), "b": ("t1", 2), "c": None}
    assert lonely.events == ["flushed"] and a.pending_count() == 0
    assert not any(a.has_pending_from(p) for p in "abc")


# -- time groups ------------------------------------------------------------------------


def timed(core, parents=("a", "b"), clock=None, epoch=None, **policy) -> TimeGroupAssembler:
    policy.setdefault("tolerance_ms", 5)
    return TimeGroupAssembler(
        "fuse", list(parents), JoinPolicy(mode="time", **policy), clock=clock or Clock(),
        epoch=epoch or Clock(), core=core
    )


def test_time_message_joins_the_nearest_group_within_tolerance(core):
    a = timed(core, parents=("a", "b"), timeout_ms=None)
    a.add("a", entry("a1", 1, 10.000), Handle("a1"))
    a.add("a", entry("a2", 2, 10.008), Handle("a2"))
    a.add("b", entry("b1", 1, 10.005), Handle("b1"))  # 5 ms from a1, 3 ms from a2
    assert members(a.pop_ready(0.0)) == {"a": ("a2", 2), "b": ("b1", 1)}
    assert a.pending_count() == 1


def test_time_message_beyond_tolerance_seeds_its_own_group(core):
    a = timed(core, timeout_ms=None)
    first = Handle("a1")
    a.add("a", entry("a1", 1, 10.0), first)
    a.add("b", entry("b1", 1, 10.0051), Handle("b1"))
    assert a.pop_ready(0.0) is None and a.pending_count() == 1
    # b is past a1's group (10.0051 > 10.0 + 5 ms): its member is not coming, and
    # below quorum the group is given up with no timeout at all.
    assert first.events == ["expired"]
    a.add("a", entry("a2", 2, 10.0052), Handle("a2"))
    assert members(a.pop_ready(0.0)) == {"a": ("a2", 2), "b": ("b1", 1)}


def test_time_message_skips_groups_already_holding_its_parent(core):
    a = timed(core, timeout_ms=None)
    a.add("a", entry("a1", 1, 10.0), Handle("a1"))
    a.add("a", entry("a2", 2, 10.001), Handle("a2"))
    assert a.pending_count() == 2


def test_time_group_identity_does_not_depend_on_arrival_order(core):
    def run(order):
        a = timed(core, parents=("a", "b", "c"), timeout_ms=None)
        for p in order:
            a.add(p, entry(f"{p}-7", 7 + ord(p), 20.0 + 0.001 * (ord(p) - 97)), Handle(p))
        return a.pop_ready(0.0)

    first, second = run("abc"), run("cab")
    identity = (first.trace_id, first.seq, first.event_ts)
    assert identity == (second.trace_id, second.seq, second.event_ts)
    assert first.trace_id.startswith("tg-") and first.seq == 7 + 97 and first.event_ts == 20.0
    other = timed(core, parents=("a", "b", "c"), timeout_ms=None)
    for p in "abc":
        other.add(p, entry(f"{p}-8", 7 + ord(p), 20.0), Handle(p))
    assert other.pop_ready(0.0).trace_id != first.trace_id


def test_time_quorum_emission_at_timeout_fills_missing_with_none(core):
    clock = Clock(50.0)
    a = timed(core, parents=("c1", "c2", "c3", "c4"), clock=clock, timeout_ms=100, quorum=3)
    for p in ("c1", "c2", "c4"):
        a.add(p, entry(p, 1, 7.0), Handle(p))
    assert a.pop_ready(50.099) is None
    group = a.pop_ready(50.1)
    assert members(group) == {"c1": ("c1", 1), "c2": ("c2", 1), "c3": None, "c4": ("c4", 1)}


def test_time_below_quorum_at_timeout_expires_per_missing_policy(core):
    clock = Clock(0.0)
    a = timed(core, parents=("c1", "c2", "c3"), clock=clock, timeout_ms=100, quorum=3)
    h = Handle("c1")
    a.add("c1", entry("c1", 1, 7.0), h)
    assert a.pop_ready(0.2) is None
    assert h.events == ["expired"] and a.evictions == 1


def test_time_a_dropped_frame_is_given_up_as_soon_as_its_camera_moves_on(core):
    # c3 dropped its frame at 7.0: its next one (7.1, beyond the 5 ms tolerance) says
    # so, and the group goes out with c3 None at once, not at the 10 s timeout.
    clock = Clock(0.0)
    a = timed(core, parents=("c1", "c2", "c3"), clock=clock, timeout_ms=10_000, quorum=2)
    for p in ("c1", "c2"):
        a.add(p, entry(p, 1, 7.0), Handle(p))
    assert a.pop_ready(0.0) is None
    a.add("c3", entry("c3", 2, 7.1), Handle("c3"))
    group = a.pop_ready(0.0)
    assert members(group) == {"c1": ("c1", 1), "c2": ("c2", 1), "c3": None}
    assert a.pending_count() == 1  # c3's own frame seeded the next group


def test_time_a_lagging_parent_is_waited_for_while_its_data_still_arrives(core):
    # b runs a second behind a in event time but keeps sending: a's group at 1.0 is
    # not given up on at the 100 ms timeout, however long b takes, and is whole.
    clock = Clock(0.0)
    a = timed(core, parents=("a", "b"), clock=clock, timeout_ms=100, quorum=1)
    a.add("a", entry("a1", 1, 1.0), Handle("a1"))
    for k in range(10):
        clock.now = 0.05 * (k + 1)
        a.add("b", entry(f"b{k}", k, 0.1 * k), Handle(f"b{k}"))  # 0.0 .. 0.9, late
        drain(a, clock.now)
    assert a.pending_count() == 1 and clock.now == 0.5  # five timeouts later
    a.add("b", entry("b10", 10, 1.0), Handle("b10"))
    (group,) = drain(a, clock.now)
    assert members(group) == {"a": ("a1", 1), "b": ("b10", 10)}


def test_time_a_silent_parent_is_given_up_once_silent_for_the_timeout(core):
    # b's last word came at clock 0.0; a's group begins at 0.05. b has been silent for
    # the 100 ms timeout at 0.1, so the group waits 50 ms, not a timeout of its own.
    # c was never heard from: for it, silence counts from the group's creation.
    clock = Clock(0.0)
    a = timed(core, parents=("a", "b"), clock=clock, timeout_ms=100, quorum=1)
    a.add("b", entry("b0", 0, 0.9), Handle("b0"))
    clock.now = 0.05
    a.add("a", entry("a1", 1, 1.0), Handle("a1"))
    (first,) = drain(a, 0.0999)  # b0's group: a's watermark passed it, a gave it up
    assert members(first) == {"a": None, "b": ("b0", 0)}
    assert a.pending_count() == 1
    assert members(a.pop_ready(0.1001)) == {"a": ("a1", 1), "b": None}
    never = timed(core, parents=("a", "c"), clock=Clock(5.0), timeout_ms=100, quorum=1)
    never.add("a", entry("a1", 1, 1.0), Handle("a1"))
    assert never.pop_ready(5.0999) is None
    assert members(never.pop_ready(5.1001)) == {"a": ("a1", 1), "c": None}


def test_time_a_parent_heard_from_is_not_silent_however_long_the_caller_was_away(core):
    # The node was away (its own code, a stall) for ten timeouts while b's data waited
    # for it: heard(b) at its return keeps b's member coming; b given up on only once
    # it has been silent for a timeout since it was last heard.
    clock = Clock(0.0)
    a = timed(core, parents=("a", "b"), clock=clock, timeout_ms=100, quorum=1)
    a.add("a", entry("a1", 1, 1.0), Handle("a1"))
    a.heard("b", 1.0)
    assert a.pop_ready(1.0) is None and a.pending_count() == 1
    a.add("b", entry("b1", 1, 1.001), Handle("b1"))
    (whole,) = drain(a, 1.0)
    assert members(whole) == {"a": ("a1", 1), "b": ("b1", 1)}
    a.add("a", entry("a2", 2, 2.0), Handle("a2"))
    a.heard("b", 1.5)
    assert a.pop_ready(1.5999) is None
    assert members(a.pop_ready(1.6001)) == {"a": ("a2", 2), "b": None}
    with pytest.raises(KeyError):
        a.heard("nobody", 2.0)


def test_time_a_sensor_heard_from_keeps_its_window_open(core):
    clock = Clock(500.0)
    a = fused(core, clock, timeout_ms=100)
    feed_imu(a, 9.99, 10.0)
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    a.heard("imu", 500.5)  # samples still queued for the node, not fed yet
    assert a.pop_ready(500.5999) is None
    group = a.pop_ready(500.6)
    assert len(group.entries["imu"].event_ts) == 11


def test_trace_deadline_runs_from_creation_whatever_is_heard(core):
    a = trace(core, clock=Clock(0.0), timeout_ms=100, quorum=1)
    a.add("a", entry("t1", 1, 1.0), Handle("a"))
    a.heard("b", 0.099)
    assert a.pop_ready(0.099) is None
    assert members(a.pop_ready(0.1001)) == {"a": ("t1", 1), "b": None}


def test_time_redelivery_supersedes_and_keeps_one_group(core):
    a = timed(core, timeout_ms=None)
    old, new = Handle("old"), Handle("new")
    a.add("a", entry("a1", 1, 3.0, "x"), old)
    a.add("a", entry("a1", 1, 3.0, "y"), new)
    assert old.events == ["superseded"] and a.pending_count() == 1
    a.add("b", entry("b1", 1, 3.001), Handle("b"))
    group = a.pop_ready(0.0)
    assert group.entries["a"].message == "y" and new in group.handles and old not in group.handles


def test_time_a_failed_group_redelivered_behind_the_watermarks_forms_again(core):
    # A group the node failed comes back (nak, redelivery) after both parents have
    # moved on: its members are behind their watermarks, and no watermark can say
    # they are not coming, so the first one waits for the others, not given up.
    clock = Clock(0.0)
    a = timed(core, clock=clock, timeout_ms=100, quorum=2)
    for ts in (1.0, 2.0):
        a.add("a", entry(f"a{ts}", int(ts), ts), Handle("a"))
        a.add("b", entry(f"b{ts}", int(ts), ts), Handle("b"))
    assert len(drain(a, 0.0)) == 2
    first = Handle("a-again")
    a.add("a", entry("a1.0", 1, 1.0), first)
    clock.now = 0.05
    assert a.pop_ready() is None and first.events == [] and a.waiting_for() == ["b"]
    a.add("b", entry("b1.0", 1, 1.0), Handle("b-again"))
    (group,) = drain(a)
    assert members(group) == {"a": ("a1.0", 1), "b": ("b1.0", 1)}


def test_time_a_late_message_no_group_takes_is_dropped_as_late_at_its_deadline(core):
    clock = Clock(0.0)
    a = timed(core, parents=("a", "b"), clock=clock, timeout_ms=100, quorum=2)
    a.add("a", entry("a5", 5, 5.0), Handle("a5"))
    a.add("b", entry("b5", 5, 5.0), Handle("b5"))
    late = Handle("a1")
    a.add("a", entry("a1", 1, 1.0), late)  # behind a's watermark; b has passed it too
    # It holds up no group behind it: b's data gives the newer group's a up at once.
    a.add("b", entry("b6", 6, 6.0), Handle("b6"))
    a.add("b", entry("b7", 7, 7.0), Handle("b7"))
    clock.now = 0.099
    assert len(drain(a)) == 1 and late.events == []
    clock.now = 0.1
    assert drain(a) == [] and late.events == ["late"]


def test_time_without_a_timeout_a_late_message_no_group_takes_is_dropped_at_once(core):
    a = timed(core, parents=("a", "b"), timeout_ms=None, quorum=2)
    a.add("a", entry("a5", 5, 5.0), Handle("a5"))
    a.add("b", entry("b5", 5, 5.0), Handle("b5"))
    late = Handle("a1")
    a.add("a", entry("a1", 1, 1.0), late)
    assert drain(a, 0.0)[0].trace_id and a.pending_count() == 0 and late.events == ["late"]


# -- disorder: a parent's messages out of event-time order ---------------------------------


def failover(a, log: list) -> None:
    """Two cameras at 30 fps, frames 0..7; camera a's frames 3 and 4 land behind its
    5 and 6, as outputs sent again after a broker failover do."""
    period = 1 / 30
    for k, j in enumerate((0, 1, 2, 5, 6, 3, 4, 7)):
        a.add("b", entry(f"b{k}", k, 10 + k * period), Handle(f"b{k}", log))
        a.add("a", entry(f"a{j}", j, 10 + j * period), Handle(f"a{j}", log))


def test_time_frames_out_of_order_within_disorder_all_fuse(core):
    # Two frames 67 ms out of order, disorder 100 ms.
    log: list = []
    a = timed(core, parents=("a", "b"), timeout_ms=None, disorder_ms=100)
    failover(a, log)
    groups = drain(a, 0.0) + a.flush(0.0)
    assert sorted(members(g)["a"][1] for g in groups if None not in members(g).values()) == [
        *range(8)]
    assert log == []  # nothing discarded


def test_time_frames_out_of_order_beyond_disorder_are_given_up_as_before(core):
    # Without disorder (the default) the same stream loses frames 3 and 4: a's
    # watermark passed them, so their groups gave a up, below quorum.
    log: list = []
    a = timed(core, parents=("a", "b"), timeout_ms=None)
    failover(a, log)
    drain(a, 0.0), a.flush(0.0)
    assert sorted(name for name, _ in log) == ["a3", "a4", "b3", "b4"]


def test_time_disorder_delays_only_a_group_that_lacks_a_parent(core):
    # A frame truly dropped: its group waits until the parent's watermark has passed it
    # by tolerance + disorder (here 5 + 100 ms), then goes with its quorum.
    a = timed(core, parents=("a", "b"), timeout_ms=None, quorum=1, disorder_ms=100)
    a.add("a", entry("a0", 0, 10.0), Handle("a0"))
    a.add("b", entry("b0", 0, 10.0), Handle("b0"))
    assert len(drain(a, 0.0)) == 1  # complete: not delayed
    a.add("b", entry("b1", 1, 10.1), Handle("b1"))  # a's frame 1 is never sent
    a.add("a", entry("a2", 2, 10.2), Handle("a2"))  # 100 ms past: within 105
    assert drain(a, 0.0) == []
    a.add("a", entry("a3", 3, 10.206), Handle("a3"))  # 106 ms past: given up
    (group,) = drain(a, 0.0)
    assert members(group) == {"a": None, "b": ("b1", 1)}


def test_time_a_message_within_disorder_seeds_a_group_the_watermarks_judge(core):
    # Not 'late': it holds its place in time order, and with a timeout it is given up
    # by the other parent's data, not held to its deadline.
    clock = Clock(0.0)
    log: list = []
    a = timed(core, parents=("a", "b"), clock=clock, timeout_ms=10_000, quorum=2,
              disorder_ms=100)
    a.add("a", entry("a2", 2, 10.08), Handle("a2", log))
    a.add("a", entry("a1", 1, 10.0), Handle("a1", log))  # 80 ms behind a's watermark
    a.add("b", entry("b2", 2, 10.08), Handle("b2", log))
    a.add("b", entry("b3", 3, 10.2), Handle("b3", log))  # b passes 10.0 by 200 ms
    assert len(drain(a, 0.0)) == 1
    assert log == [("a1", "expired")]  # at once, below quorum: not 'late', not at 10 s


def test_time_collect_window_closes_disorder_later_and_takes_a_sample_that_came_behind(core):
    clock = Clock(0.0)
    a = fused(core, clock, timeout_ms=None, disorder_ms=30)
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    feed_imu(a, 9.98, 10.02)
    a.add("imu", entry("i1", 1, 10.045), Handle("i1"))  # past the window, within disorder
    assert a.pop_ready(0.0) is None
    a.add("imu", entry("behind", 2, 10.019), Handle("behind"))  # came behind 10.045
    a.add("imu", entry("i3", 3, 10.051), Handle("i3"))  # past 10.02 + 30 ms: closes
    window = a.pop_ready(0.0).entries["imu"]
    assert len(window.event_ts) == 42 and 10.019 in window.event_ts


def test_time_entry_without_event_ts_falls_back_to_its_arrival_on_the_epoch_clock(core):
    # Event times are epoch seconds; the monotonic clock only times the backstop.
    a = timed(core, clock=Clock(5.0), epoch=Clock(1000.0), timeout_ms=None)
    a.add("a", entry("a1", 1, None), Handle("a"))
    a.add("b", entry("b1", 1, 1000.002), Handle("b"))
    group = a.pop_ready(5.0)
    assert group is not None and group.event_ts == 1000.0


def test_assemblers_time_their_backstop_on_the_monotonic_clock_by_default(core):
    for policy in (JoinPolicy(), JoinPolicy(mode="time", tolerance_ms=5)):
        a = make_assembler("j", ["a", "b"], policy)
        assert (a.clock, a.epoch) == (time.monotonic, time.time)


@pytest.mark.parametrize("step", [-3600.0, 3600.0])
def test_time_a_wall_clock_step_moves_no_timeout(core, step):
    # A step of the wall clock (epoch) leaves the backstop alone: the silent parent
    # is given up on one timeout after its group began on the monotonic clock, not an
    # hour early or late, and oldest_wait_seconds says how long the group waited.
    mono, wall = Clock(50.0), Clock(1_000_000.0)
    a = timed(core, parents=("a", "b"), clock=mono, epoch=wall, timeout_ms=100, quorum=1)
    a.add("a", entry("a1", 1, None), Handle("a1"))  # stamped on the wall clock
    wall.now += step
    mono.now += 0.05
    assert a.pop_ready() is None and a.oldest_wait_seconds() == pytest.approx(0.05)
    assert a.waiting_for() == ["b"]
    mono.now += 0.06
    group = a.pop_ready()
    assert group is not None and members(group) == {"a": ("a1", 1), "b": None}
    assert group.event_ts == 1_000_000.0 and a.oldest_wait_seconds() == 0.0


def test_time_waiting_for_names_the_parents_the_oldest_group_still_expects(core):
    a = timed(core, parents=("c1", "c2", "c3"), timeout_ms=1000, quorum=3)
    assert a.waiting_for() == []
    a.add("c1", entry("x1", 1, 1.0), Handle("x1"))
    assert a.waiting_for() == ["c2", "c3"]
    # c2's data passes the group without a member for it: not waited for any more,
    # though the group still waits for c3 (its data has not passed it).
    a.add("c2", entry("y2", 2, 1.5), Handle("y2"))
    assert a.waiting_for() == ["c3"]


def test_time_watermark_lags_say_how_far_each_parent_is_behind_the_most_advanced(core):
    a = timed(core, parents=("cam0", "cam1", "cam2", "imu"), collect={"imu": 20},
              timeout_ms=None)
    assert a.watermarks() == dict.fromkeys(("cam0", "cam1", "cam2", "imu"))
    assert a.watermark_lags() == dict.fromkeys(("cam0", "cam1", "cam2", "imu"))
    a.add("cam0", entry("a", 1, 10.0), Handle("a"))
    a.add("cam1", entry("b", 1, 10.25), Handle("b"))
    a.add("cam0", entry("a", 2, 9.0), Handle("a2"))  # behind its watermark: kept at 10.0
    a.add("imu", entry("i", 1, 10.5), Handle("i"))
    assert a.watermarks() == {"cam0": 10.0, "cam1": 10.25, "cam2": None, "imu": 10.5}
    assert a.watermark_lags() == {"cam0": 0.5, "cam1": 0.25, "cam2": None, "imu": 0.0}


def test_trace_waiting_for_names_the_missing_halves_and_there_are_no_watermarks(core):
    a = trace(core, parents=("a", "b", "c"))
    a.add("b", entry("t1", 1), Handle("b"))
    assert a.waiting_for() == ["a", "c"]
    assert a.watermarks() == {} and a.watermark_lags() == {}


def test_time_beyond_max_pending_evicts_the_oldest_group(core):
    a = timed(core, max_pending=3, timeout_ms=None)
    handles = [Handle(f"a{i}") for i in range(5)]
    for i, h in enumerate(handles):
        a.add("a", entry(f"a{i}", i, float(i)), h)
    assert [h.events for h in handles] == [["evicted"], ["evicted"], [], [], []]
    assert a.evictions == 2 and a.pending_count() == 3


# -- collect windows ----------------------------------------------------------------------


def fused(core, clock, window_ms=20, **policy) -> TimeGroupAssembler:
    return timed(
        core, parents=("cam", "imu"), clock=clock, collect={"imu": window_ms}, **policy
    )


def feed_imu(a, start, stop, step=0.001, log=None):
    handles = {}
    for k in range(round((stop - start) / step) + 1):
        ts = round(start + k * step, 6)
        h = Handle(f"imu@{ts}", log)
        handles[ts] = h
        a.add("imu", entry(f"imu{k}", k, ts), h)
    return handles


def test_collect_window_closes_on_the_event_time_watermark(core):
    clock = Clock(0.0)
    a = fused(core, clock, timeout_ms=None)
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    feed_imu(a, 9.98, 10.02)
    assert a.pop_ready(0.0) is None  # the window is open until a sample beyond 10.02
    a.add("imu", entry("late", 99, 10.0201), Handle("late"))
    group = a.pop_ready(0.0)
    window = group.entries["imu"]
    assert isinstance(window, CollectEntry)
    assert len(window.event_ts) == 41 and window.event_ts == sorted(window.event_ts)
    assert min(window.event_ts) == pytest.approx(9.98)
    assert max(window.event_ts) == pytest.approx(10.02)


def test_collect_window_waits_for_a_lagging_sensor_past_the_window_and_the_timeout(core):
    # The IMU is alive but behind: its samples for the frame's window arrive long after
    # the window's length and the timeout have passed in wall time; none is lost.
    clock = Clock(500.0)
    a = fused(core, clock, timeout_ms=100)
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    for k in range(71):  # 9.950 .. 10.020, one every 10 ms of wall time
        clock.now = 500.0 + 0.01 * k
        a.add("imu", entry(f"imu{k}", k, round(9.95 + 0.001 * k, 6)), Handle(f"imu{k}"))
        assert a.pop_ready(clock.now) is None  # open: no sample beyond 10.02 yet
    assert clock.now == pytest.approx(500.7)  # 0.7 s after the frame
    a.add("imu", entry("imu71", 71, 10.021), Handle("imu71"))
    group = a.pop_ready(clock.now)
    assert len(group.entries["imu"].event_ts) == 41  # 9.980 .. 10.020, every one


def test_collect_window_backstop_is_a_sensor_silent_for_the_timeout(core):
    clock = Clock(500.0)
    a = fused(core, clock, timeout_ms=100)
    feed_imu(a, 9.99, 10.0)  # the IMU's last samples, at clock 500.0
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    assert a.pop_ready(500.099) is None
    group = a.pop_ready(500.1)
    assert len(group.entries["imu"].event_ts) == 11


def test_collect_window_without_a_timeout_waits_for_the_watermark_alone(core):
    clock = Clock(500.0)
    a = fused(core, clock, timeout_ms=None)
    feed_imu(a, 9.99, 10.0)
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    assert a.pop_ready(10_000.0) is None
    a.add("imu", entry("next", 99, 10.03), Handle("next"))
    assert len(a.pop_ready(10_000.0).entries["imu"].event_ts) == 11


def test_collect_sample_in_two_windows_travels_once_in_the_last_group(core):
    clock = Clock(0.0)
    log: list = []
    a = fused(core, clock, timeout_ms=None)
    imu = feed_imu(a, 9.97, 10.09, log=log)
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    a.add("cam", entry("f1", 1, 10.03), Handle("f1"))
    groups = drain(a, 0.0)
    assert len(groups) == 2
    shared = imu[10.015]  # within 20 ms of both 10.00 and 10.03
    assert 10.015 in [round(t, 6) for t in groups[0].entries["imu"].event_ts]
    assert 10.015 in [round(t, 6) for t in groups[1].entries["imu"].event_ts]
    # Once both groups are out and the watermark rules out any later group near it,
    # the handle has travelled in exactly one ReadyGroup.
    a.add("cam", entry("f3", 3, 10.2), Handle("f3"))
    later = drain(a, 0.0) + a.flush(0.0)
    carriers = [g for g in groups + later if shared in g.handles]
    assert len(carriers) == 1 and shared.events == []
    for ts, h in imu.items():
        in_groups = sum(h in g.handles for g in groups + later)
        assert in_groups + len(h.events) == 1, ts


def test_collect_sample_no_group_takes_expires(core):
    clock = Clock(0.0)
    a = fused(core, clock, window_ms=5, timeout_ms=None)
    a.add("cam", entry("f0", 0, 10.0), Handle("f0"))
    early = Handle("early")
    a.add("imu", entry("s", 1, 10.05), early)
    assert early.events == []
    a.add("imu", entry("s2", 2, 10.2), Handle("s2"))
    a.add("cam", entry("f1", 1, 10.5), Handle("f1"))  # watermark moves past 10.05 + window
    drain(a, 0.0)
    assert early.events == ["expired"]


def test_collect_buffer_beyond_max_pending_evicts_the_oldest_sample(core):
    clock = Clock(0.0)
    a = fused(core, clock, timeout_ms=None, max_pending=4)
    handles = feed_imu(a, 1.0, 1.005)
    assert [h.events for h in handles.values()] == [["evicted"], ["evicted"], [], [], [], []]


def test_collect_parent_pending_until_its_samples_are_released(core):
    clock = Clock(0.0)
    a = fused(core, clock, timeout_ms=None)
    feed_imu(a, 1.0, 1.01)
    assert a.has_pending_from("imu") and not a.has_pending_from("cam")
    assert a.flush(0.0) == []
    assert not a.has_pending_from("imu")


@pytest.mark.parametrize("timeout_ms", [None, 100.0])
@pytest.mark.parametrize("mode", ["trace", "time"])
def test_steady_stream_keeps_bookkeeping_bounded(core, mode, timeout_ms):
    policy = {"timeout_ms": timeout_ms}
    if mode == "time":
        a = timed(core, **policy)
    else:
        a = trace(core, **policy)
    for i in range(5000):
        a.add("a", entry(f"t{i}", i, float(i)), Handle("a"))
        a.add("b", entry(f"t{i}", i, float(i)), Handle("b"))
        assert a.pop_ready(0.0) is not None
    fifo, ready = a._core.queue_lengths()
    assert fifo <= 100 and ready <= 100, (fifo, ready)


def test_integer_event_times_come_out_as_floats(core):
    a = timed(core, timeout_ms=None)
    a.add("a", entry("a1", 1, 100), Handle("a"))
    a.add("b", entry("b1", 1, 100), Handle("b"))
    group = a.pop_ready(0.0)
    assert type(group.event_ts) is float and group.event_ts == 100.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_time_join_refuses_a_non_finite_event_time(core, bad):
    a = timed(core, parents=("a", "imu"), collect={"imu": 5}, timeout_ms=None)
    for parent in ("a", "imu"):
        with pytest.raises(ValueError, match="is not a finite time"):
            a.add(parent, entry("x", 1, bad), Handle("x"))
    assert a.pending_count() == 0 and not a.has_pending_from("imu")


@pytest.mark.parametrize("mode", ["trace", "time"])
def test_seq_beyond_64_bits_is_an_overflow_error(core, mode):
    a = timed(core, timeout_ms=None) if mode == "time" else trace(core)
    with pytest.raises(OverflowError, match="outside the signed 64-bit range"):
        a.add("a", entry("big", 2**63, 1.0), Handle("big"))
    assert a.pending_count() == 0


def test_time_a_silent_camera_is_not_given_up_while_the_imu_window_holds_the_group(core):
    # cam1 falls silent past the timeout, but the group also waits for its IMU window
    # (the IMU is behind, still sending): giving cam1 up would gain nothing, and its
    # late frame still joins. Once the window could close, silence gives cam1 up.
    def cams(group):
        return {p: m for p, m in members_of(group).items() if p != "imu"}

    def members_of(group):
        return {p: None if e is None else (e.trace_id, e.seq)
                for p, e in group.entries.items() if p != "imu"}

    clock = Clock(500.0)
    a = timed(core, parents=("cam0", "cam1", "imu"), clock=clock, collect={"imu": 20},
              timeout_ms=100, quorum=1)
    feed_imu(a, 9.90, 9.95)
    a.add("cam0", entry("f0", 0, 10.0), Handle("f0"))
    a.heard("imu", 500.2)  # more samples wait for the node
    assert a.pop_ready(500.2) is None  # cam1 silent for 200 ms: held by the window
    a.add("cam1", entry("g0", 0, 10.001), Handle("g0"))
    feed_imu(a, 9.951, 10.03)
    whole = a.pop_ready(500.2)
    assert cams(whole) == {"cam0": ("f0", 0), "cam1": ("g0", 0)}
    assert len(whole.entries["imu"].event_ts) == 41
    a.add("cam0", entry("f1", 1, 10.1), Handle("f1"))  # cam1 silent from here
    feed_imu(a, 10.031, 10.13)
    assert a.pop_ready(500.2999) is None
    late = a.pop_ready(500.3001)
    assert cams(late) == {"cam0": ("f1", 1), "cam1": None}
    assert len(late.entries["imu"].event_ts) == 41
