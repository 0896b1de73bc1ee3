"""Event-time alignment of a time join (JoinPolicy.max_drift_ms): the join leaves a
parent that runs ahead on the broker until the slowest live parent catches up, so a
leader never fills the join's pending groups and a lagging parent is never starved.

The rules alone (Alignment), then whole joins on the memory adapter, where a lagging
camera publishes as the join waits for it (the join's on_wait hook): deterministic,
and the same join code that runs on JetStream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import messenger_flows
import pytest
from messenger_flows import Flow, run_node, run_sink

from videoflow.backends.messaging import Known
from videoflow.backends.shm_payload import SharedMemoryPayloadStore
from videoflow.messaging.join_alignment import DRIFT, PENDING, Alignment
from videoflow.messaging.nats_messenger import NATSMessenger

FPS = 30.0


class Waited(Exception):
    """Raised from a join's on_wait to stop it at its first wait."""


def aligned(**options: Any) -> Alignment:
    settings: dict[str, Any] = {"drift": 1.0, "timeout": 5.0, "max_pending": 100}
    settings.update(options)
    return Alignment(["a", "b", "imu"], ["a", "b"], settings["drift"], settings["timeout"],
                     settings["max_pending"])


# --------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------


def test_a_parent_more_than_the_drift_ahead_of_the_slowest_is_held_until_it_catches_up():
    rule = aligned()
    rule.update({"a": 12.5, "b": 10.0, "imu": 10.2}, pending=0, now=0.0)
    assert rule.held == {"a": DRIFT}
    rule.update({"a": 12.5, "b": 11.6, "imu": 11.7}, pending=0, now=2.0)
    assert rule.held == {}  # within a second of the slowest again
    assert rule.held_back_seconds(3.0) == {"a": 2.0, "b": 0.0, "imu": 0.0}


def test_a_collect_parent_running_ahead_is_held_by_the_drift_too():
    rule = aligned()
    rule.update({"a": 10.0, "b": 10.0, "imu": 11.5}, pending=0, now=0.0)
    assert rule.held == {"imu": DRIFT}


def test_with_half_of_max_pending_filled_only_the_slowest_sync_parents_are_taken():
    rule = aligned(max_pending=16)
    credit = rule.update({"a": 10.3, "b": 10.0, "imu": 10.4}, pending=8, now=0.0)
    # a seeds groups; the imu seeds none, and the oldest groups' windows need it.
    assert rule.held == {"a": PENDING} and credit == 8
    assert rule.update({"a": 10.3, "b": 10.0, "imu": 10.4}, pending=7, now=0.0) == 9
    assert rule.held == {}
    assert rule.update({"a": 10.3, "b": 10.0, "imu": 10.4}, pending=40, now=0.0) == 1


def test_a_parent_not_heard_from_is_the_slowest_until_it_speaks_or_falls_silent():
    rule = aligned(timeout=5.0)
    rule.update({"a": 10.0, "b": None, "imu": 10.0}, pending=1, now=100.0)
    assert rule.held == {"a": DRIFT, "imu": DRIFT}  # they wait for b, on the broker
    rule.update({"a": 10.0, "b": None, "imu": 10.0}, pending=1, now=104.9)
    assert set(rule.held) == {"a", "imu"}
    rule.update({"a": 10.0, "b": None, "imu": 10.0}, pending=1, now=105.0)
    assert rule.held == {}  # b silent for the timeout: no longer waited for


def test_a_parent_heard_waiting_is_not_silent_and_one_that_spoke_again_is_live_again():
    rule = aligned(timeout=5.0)
    rule.update({"a": 20.0, "b": 10.0, "imu": 20.0}, pending=1, now=0.0)
    rule.heard("b", 4.0)  # its input waits on the broker, or its producer for room
    rule.update({"a": 20.0, "b": 10.0, "imu": 20.0}, pending=1, now=8.9)
    assert set(rule.held) == {"a", "imu"}
    rule.update({"a": 20.0, "b": 10.0, "imu": 20.0}, pending=1, now=9.0)
    assert rule.held == {}  # silent since 4.0
    rule.heard("b", 9.5)
    rule.update({"a": 20.0, "b": 10.1, "imu": 20.0}, pending=1, now=9.5)
    assert set(rule.held) == {"a", "imu"}


def test_without_a_timeout_a_silent_parent_is_waited_for_forever():
    rule = aligned(timeout=None)
    rule.update({"a": 20.0, "b": 10.0, "imu": 20.0}, pending=1, now=0.0)
    rule.update({"a": 20.0, "b": 10.0, "imu": 20.0}, pending=1, now=1e6)
    assert set(rule.held) == {"a", "imu"}


def test_a_parent_that_ended_with_nothing_left_is_not_waited_for():
    rule = aligned()
    rule.update({"a": 20.0, "b": 10.0, "imu": 20.0}, pending=1, now=0.0,
                gone=frozenset({"b"}))
    assert rule.held == {}


def test_the_silence_clock_starts_at_the_first_update_not_at_construction():
    # A node whose open() took long (a model loading) has not waited for anyone.
    rule = aligned(timeout=5.0)
    rule.update({"a": 10.0, "b": None, "imu": 10.0}, pending=1, now=500.0)
    assert set(rule.held) == {"a", "imu"}


# --------------------------------------------------------------------------------------
# Whole joins on the memory adapter
# --------------------------------------------------------------------------------------


flows = messenger_flows.flows  # the in-memory flows fixture, taken by name


def laggard(camera: NATSMessenger, instants: int) -> Callable[[], None]:
    """A live camera that sends its next frame whenever the join waits for input, then
    its end of stream."""
    sent = iter(range(instants))

    def send() -> None:
        k = next(sent, None)
        if k is None:
            return
        camera.set_output_event_timestamp(k / FPS)
        camera.publish_message({"camera": "live", "instant": k})
        if k == instants - 1:
            camera.publish_stop_signal()

    return send


def fuse_all(fuse: NATSMessenger, live: NATSMessenger,
             instants: int) -> tuple[list[int], dict[str, int], list[dict[str, Any]]]:
    """Run the join until every parent ended; returns the instants fused (in order),
    its drops, and its status sampled at each wait."""
    statuses: list[dict[str, Any]] = []
    send = laggard(live, instants)

    def waiting() -> None:
        statuses.append(fuse.join_status())
        send()

    fuse.on_wait = waiting
    fused: list[int] = []

    def group(inputs: dict[str, Any]) -> int:
        present = {inputs[p]["message"]["instant"] for p in inputs if inputs[p] is not None}
        assert len(present) == 1, inputs  # never a merge of two instants
        (k,) = present
        fused.append(k)
        return k

    run_node(fuse, group)
    return fused, fuse.take_drops(), statuses


def leaders_publish_everything(flow: Flow, names: list[str], instants: int) -> None:
    for name in names:
        camera = flow.messenger(name)
        for k in range(instants):
            camera.set_output_event_timestamp(k / FPS)
            camera.publish_message({"camera": name, "instant": k})
        camera.publish_stop_signal()


def two_leaders_and_a_live_camera(flows: Callable[..., Flow], instants: int,
                                  ) -> tuple[Flow, NATSMessenger, NATSMessenger]:
    """Leaders a and b sent every instant already; live sends as the join waits
    (fuse_all). The join's wall clock stands still: nothing is silent, only event time
    moves. Returns the flow, live's messenger and the join's (max_pending 16)."""
    flow = flows({"a": [], "b": [], "live": [], "fuse": ["a", "b", "live"],
                  "sink": ["fuse"]})
    leaders_publish_everything(flow, ["a", "b"], instants)
    live = flow.messenger("live")
    fuse = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "timeout_ms": 5000.0, "max_pending": 16},
        clock=lambda: 1000.0)
    return flow, live, fuse


def test_a_leader_500_instants_ahead_with_max_pending_16_evicts_nothing_and_fuses_all(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    instants = 500
    flow, live, fuse = two_leaders_and_a_live_camera(flows, instants)
    fused, drops, statuses = fuse_all(fuse, live, instants)

    assert fused == list(range(instants))  # every instant, once, in order
    assert drops["join_evicted"] == 0 and drops["join_late"] == 0
    assert max(s["waiting_groups"] for s in statuses) <= 16
    # Input past the drift bound is set aside, never joined: the join's watermarks
    # never spread wider than the bound, whatever one receive took.
    spread = max(lag or 0.0 for s in statuses for lag in s["watermark_lag_seconds"].values())
    assert 0 < spread <= 1.0
    # The leaders were held back, and said so.
    assert any(s["held_back"].keys() == {"a", "b"} for s in statuses)
    assert all(s["waiting_why"].get("live") in (None, "behind") for s in statuses)
    *groups, _ = run_sink(flow.messenger("sink"), lambda inputs: None)
    assert [g["fuse"]["message"] for g in groups] == list(range(instants))


def test_without_alignment_the_same_lead_evicted_the_groups_the_laggard_completes(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    # The measurement, on the old behaviour: 0 of 300 groups, everything
    # join_evicted. Shown here so that the test above cannot pass by accident.
    instants = 100
    _, live, fuse = two_leaders_and_a_live_camera(flows, instants)
    assert fuse.join is not None
    fuse.join.alignment = None
    fused, drops, _ = fuse_all(fuse, live, instants)
    assert len(fused) < instants and drops["join_evicted"] > 0


def test_a_silent_parent_is_given_up_within_its_timeout_and_the_leaders_go_on(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    now = [1000.0]
    instants = 40
    flow = flows({"a": [], "b": [], "dead": [], "fuse": ["a", "b", "dead"],
                  "sink": ["fuse"]})
    leaders_publish_everything(flow, ["a", "b"], instants)
    dead = flow.messenger("dead")
    for k in range(5):  # it sends five frames, then nothing, ever
        dead.set_output_event_timestamp(k / FPS)
        dead.publish_message({"camera": "dead", "instant": k})
    fuse = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "timeout_ms": 2000.0, "quorum": 2,
        "max_pending": 16}, clock=lambda: now[0])
    statuses: list[dict[str, Any]] = []

    def waiting() -> None:
        statuses.append(fuse.join_status())
        now[0] += 0.1
        if round(now[0], 6) == 1003.0:
            dead.publish_stop_signal()  # so the run ends: after its timeout

    fuse.on_wait = waiting
    fused: list[tuple[int, bool]] = []
    run_node(fuse, lambda inputs: fused.append(
        (inputs["a"]["message"]["instant"], inputs["dead"] is not None)))
    assert [k for k, _ in fused] == list(range(instants))
    assert [k for k, full in fused if full] == list(range(5))
    # Before the backstop gave it up, the join said whom it waited for, and why.
    waits = [s for s in statuses if s["waiting_for"] == ["dead"]]
    assert waits and waits[-1]["waiting_why"] == {"dead": "silent"}
    # dead's frames arrived at the join's first receives (by 1000.1): the leaders were
    # held back until its timeout had passed, and no longer.
    # (With max_pending 16 they are held as half of it fills, before a second of lead.)
    last_held = max(i for i, s in enumerate(statuses) if s["held_back"])
    assert 2.0 <= last_held * 0.1 <= 2.3
    assert all(set(s["held_back"]) == {"a", "b"} for s in statuses[8:last_held + 1])
    assert fuse.alignment_state()[0]["dead"] == 0.0  # the slowest is never held back
    assert fuse.take_drops()["join_evicted"] == 0


def a_leader_and_a_camera_that_sent_one_frame(
    flows: Callable[..., Flow], now: list[float], **options: Any,
) -> tuple[NATSMessenger, NATSMessenger]:
    """Leader a sent its 10 instants, cam its first; the join (timeout 1 s, on the
    clock now[0]) is made with options. Returns cam's messenger and the join's."""
    flow = flows({"a": [], "cam": [], "fuse": ["a", "cam"], "sink": ["fuse"]})
    leaders_publish_everything(flow, ["a"], 10)
    cam = flow.messenger("cam")
    cam.set_output_event_timestamp(0.0)
    cam.publish_message({"camera": "cam", "instant": 0})
    fuse = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "timeout_ms": 1000.0, "missing": "drop"},
        clock=lambda: now[0], **options)
    return cam, fuse


def test_a_parent_whose_producer_waits_for_payload_room_is_held_back_not_silent(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    now = [1000.0]
    cam, fuse = a_leader_and_a_camera_that_sent_one_frame(flows, now)
    assert fuse.join is not None
    waiting_on_budget = {"cam"}
    fuse.join.budget_waiting = lambda: frozenset(waiting_on_budget)
    fused: list[int] = []
    statuses: list[dict[str, Any]] = []

    def waiting() -> None:
        statuses.append(fuse.join_status())
        now[0] += 0.25
        if now[0] >= 1010.0 and waiting_on_budget:  # ten timeouts later, room came
            waiting_on_budget.clear()
            for k in range(1, 10):
                cam.set_output_event_timestamp(k / FPS)
                cam.publish_message({"camera": "cam", "instant": k})
            cam.publish_stop_signal()

    fuse.on_wait = waiting
    run_node(fuse, lambda inputs: fused.append(inputs["cam"]["message"]["instant"]))
    assert fused == list(range(10))  # nothing given up while it waited for room
    assert any(s["waiting_why"] == {"cam": "budget"} for s in statuses)
    assert fuse.take_drops()["join_evicted"] == 0


def test_the_backlog_a_held_parent_leaves_on_the_broker_is_still_pending(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"a": [], "live": [], "fuse": ["a", "live"], "sink": ["fuse"]})
    leaders_publish_everything(flow, ["a"], 200)
    flow.messenger("live")
    fuse = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "timeout_ms": 5000.0, "max_pending": 16},
        clock=lambda: 1000.0)
    waits = iter(range(2))

    def stop() -> None:
        if next(waits, None) is None:  # the join took what it could, and waits again
            raise Waited

    fuse.on_wait = stop
    with pytest.raises(Waited):  # the join waits for live: held back, a stays queued
        fuse.receive_message()
    observed = fuse.pending_observation()  # held back is still waiting for the node
    assert isinstance(observed, Known) and observed.value >= 200
    status = fuse.join_status()
    assert status["held_back"] == {"a": DRIFT} and status["waiting_groups"] <= 16


def test_a_parents_bound_is_the_drift_over_the_slowest_other_live_parent():
    rule = aligned()
    rule.update({"a": 12.0, "b": 10.0, "imu": 10.5}, pending=0, now=0.0)
    assert rule.bounds == {"a": 11.0, "b": 11.5, "imu": 11.0}
    rule.update({"a": 12.0, "b": 10.0, "imu": 10.5}, pending=0, now=0.0,
                gone=frozenset({"b"}))
    assert rule.bounds == {"a": 11.5, "b": 11.5, "imu": 13.0}
    rule.update({"a": 12.0, "b": 10.0, "imu": 10.5}, pending=0, now=0.0,
                gone=frozenset({"b", "imu"}))
    assert rule.bounds["a"] == float("inf")  # alone: nothing to wait for
    rule.update({"a": 12.0, "b": 10.0, "imu": 10.5}, pending=0, now=0.0,
                deferring=frozenset({"b"}))
    assert rule.excluded == {"a", "b"} and rule.held == {"a": DRIFT}


def test_a_parent_waiting_for_room_in_its_shared_memory_share_is_not_given_up(
    flows,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # cam's producer is blocked in a put: its share of the shared-memory budget is full
    # of frames another reader holds (a slow recorder). The join reads the same store
    # and hears it waiting, for ten of its timeouts; nothing of cam is given up.
    now = [1000.0]
    folder = tmp_path / "shm"
    cam_store = SharedMemoryPayloadStore(folder, budget_bytes=400_000,
                                         budget_wait_seconds=30.0, writer=("cam", 0))
    SharedMemoryPayloadStore(folder).declare_writers([("cam", 0), ("other", 0)])
    # cam's share: the budget less the dormant writer's floor of one payload, 300,000.
    held = [cam_store.put(b"f" * 100_000, ["recorder"], f"cam:{i}") for i in range(3)]
    for i, ref in enumerate(held):
        cam_store.resolve_intent(ref, f"cam:{i}", accepted=True)
    cam, fuse = a_leader_and_a_camera_that_sent_one_frame(
        flows, now, payload_store=SharedMemoryPayloadStore(folder))
    blocked = threading.Thread(target=cam_store.put, args=(b"f" * 100_000, ["fuse"], "cam:3"))
    blocked.start()
    deadline = time.monotonic() + 10.0
    while cam_store.waiting_nodes() != {"cam"}:  # over its share: it waits, alone
        assert time.monotonic() < deadline, cam_store.writer_states()
        time.sleep(0.01)
    statuses: list[dict[str, Any]] = []

    def waiting() -> None:
        statuses.append(fuse.join_status())
        now[0] += 0.25
        if now[0] >= 1010.0 and held:  # ten timeouts later, the recorder lets go
            cam_store.release_many(held, "recorder")
            held.clear()
            blocked.join()
            for k in range(1, 10):
                cam.set_output_event_timestamp(k / FPS)
                cam.publish_message({"camera": "cam", "instant": k})
            cam.publish_stop_signal()

    fuse.on_wait = waiting
    fused: list[int] = []
    run_node(fuse, lambda inputs: fused.append(inputs["cam"]["message"]["instant"]))
    assert fused == list(range(10))  # nothing given up while it waited for room
    assert any(s["waiting_why"] == {"cam": "budget"} for s in statuses)
    assert any(s.get("payload_shares", {}).get("cam", {}).get("waiting_seconds")
               for s in statuses)
    assert fuse.take_drops()["join_evicted"] == 0


def test_a_leaders_input_past_the_drift_bound_is_set_aside_never_joined(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    # One receive takes a whole batch (up to 64 of a leader parked at once, two
    # seconds of a 30 fps camera); what lies past the bound waits, its payload unread.
    instants = 200
    flow = flows({"a": [], "live": [], "fuse": ["a", "live"], "sink": ["fuse"]})
    leaders_publish_everything(flow, ["a"], instants)
    live = flow.messenger("live")
    fuse = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "timeout_ms": 5000.0}, clock=lambda: 1000.0)
    fused, drops, statuses = fuse_all(fuse, live, instants)
    assert fused == list(range(instants)) and sum(drops.values()) == 0
    spread = max(lag or 0.0 for s in statuses for lag in s["watermark_lag_seconds"].values())
    assert 0.95 <= spread <= 1.0  # up to the bound, never past it
    assert any(s["held_back"] == {"a": DRIFT} for s in statuses)
