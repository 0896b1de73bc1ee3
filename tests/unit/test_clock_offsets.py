"""Clock offsets on the memory adapter. Corrected (JoinPolicy.clock_offsets): a camera
whose clock reads 20 ms ahead never meets the others within an 8 ms tolerance, and
every one of its frames is dropped; with its offset given, every instant is one group
again, its frames' event times corrected before the join reads them (matching,
watermarks, the group's time). Found (ClockEstimator): the join estimates that camera's
offset within a millisecond, live, under 5 % drops, 1 ms jitter, quorum groups and a
camera lagging half a second, reports none for the others, and says what to set; corrected, it
reports none left. Both cores, the compiled and the reference, give the same. The
policy checks the offsets it is given."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from messenger_flows import FLOW, RUN, Flow, flows, run_node

from videoflow.backends.memory import MemoryMessagingBackend
from videoflow.core.engine import CLOCK_OFFSETS_METADATA_KEY
from videoflow.core.policies import JoinPolicy
from videoflow.messaging import _grouping_ref, grouping
from videoflow.messaging.clock_estimates import (
    RECENT_GROUPS,
    SAMPLE_HZ,
    ClockEstimator,
    RunningCorrection,
)
from videoflow.messaging.clock_learning import LEARN_SECONDS, ClockLearning
from videoflow.messaging.nats_messenger import NATSMessenger

__all__ = ["flows"]  # the fixture, imported for the tests below

FPS, FRAMES, AHEAD = 30.0, 12, 0.020


def capture(flow: Flow) -> None:
    """cam_a and cam_b capture the same FRAMES instants; cam_b's clock reads AHEAD."""
    for camera, skew in (("cam_a", 0.0), ("cam_b", AHEAD)):
        messenger = flow.messenger(camera)
        for k in range(FRAMES):
            messenger.set_output_event_timestamp(100.0 + k / FPS + skew)
            messenger.publish_message(k)
        messenger.publish_stop_signal()


@pytest.fixture(params=["compiled", "reference"])
def core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The join core the messengers made in the test assemble with."""
    if request.param == "reference":
        monkeypatch.setattr(grouping, "_core", _grouping_ref)
    return str(request.param)


def fuse(flows: Any, offsets: dict[str, float]) -> tuple[list[Any], Any]:
    flow = flows({"cam_a": [], "cam_b": [], "fuse": ["cam_a", "cam_b"], "sink": ["fuse"]})
    capture(flow)
    fusion = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "missing": "drop", "timeout_ms": 60_000.0,
        "clock_offsets": offsets})
    assert fusion.join is not None
    made_by = type(fusion.join.assembler._core).__module__  # the core the fixture chose
    assert made_by == grouping._core.__name__, made_by
    groups = run_node(fusion, lambda inputs: [inputs["cam_a"]["message"],
                                              inputs["cam_b"]["message"]])[:-1]
    return groups, fusion


def test_a_camera_whose_clock_reads_ahead_is_never_fused_without_its_offset(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    groups, fusion = fuse(flows, {})
    assert groups == []  # 20 ms apart against 8 ms: no instant is whole
    assert sum(fusion.take_drops().values()) == 2 * FRAMES  # each frame dropped, counted


def test_with_its_offset_every_instant_is_one_group_at_the_corrected_time(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    groups, fusion = fuse(flows, {"cam_b": -AHEAD})
    assert [(g["cam_a"]["message"], g["cam_b"]["message"]) for g in groups] == [
        (k, k) for k in range(FRAMES)]
    for k, group in enumerate(groups):  # cam_b's entries carry its corrected time
        assert group["cam_b"]["event_ts"] == pytest.approx(100.0 + k / FPS, abs=1e-9)
        assert group["cam_a"]["event_ts"] == 100.0 + k / FPS
    assert sum(fusion.take_drops().values()) == 0


@pytest.mark.parametrize(("offsets", "said"), [
    ({"cam_b": float("nan")}, "must be a finite number of seconds"),
    ({"cam_b": 61.0}, "within ±60"),
    ({"cam_b": "20ms"}, "must be a finite number of seconds"),
    ({7: 0.02}, "keys must be parent names"),
])
def test_the_policy_refuses_offsets_it_cannot_apply(offsets: dict[Any, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        JoinPolicy(mode="time", tolerance_ms=8.0, clock_offsets=offsets)


def test_offsets_are_a_time_joins_and_name_its_parents() -> None:
    with pytest.raises(ValueError, match="clock_offsets need mode='time'"):
        JoinPolicy(clock_offsets={"cam_b": 0.01})
    policy = JoinPolicy(mode="time", tolerance_ms=8.0, clock_offsets={"cam_c": 0.01})
    with pytest.raises(ValueError, match="names 'cam_c', not a parent.*did you mean 'cam_b'"):
        policy.validate_for(["cam_a", "cam_b"])
    assert JoinPolicy.from_dict(JoinPolicy(mode="time", tolerance_ms=8.0,
                                           clock_offsets={"cam_b": -0.02}).to_dict()
                                ).clock_offsets == {"cam_b": -0.02}


def rig(flows: Any, offsets: dict[str, float], instants: int = 60,
        **policy: Any) -> tuple[list[Any], dict[str, Any]]:
    """Four live cameras at 30 fps for 60 instants, each capturing in real time on a
    thread of its own: each drops 5 % of its frames and stamps with 1 ms of jitter;
    cam2's clock reads 20 ms ahead; cam1's frames each reach the flow half a second
    after capture (a lagging camera, its stamps right). A time join, tolerance 8 ms,
    quorum 3 of 4, fuses them as they come (policy: more of its policy). Returns the
    groups and the join's status at the end, with its corrections (clock_corrections,
    clock_changes)."""
    cams = [f"cam{i}" for i in range(4)]
    flow = flows({**{c: [] for c in cams}, "fuse": cams, "sink": ["fuse"]})
    messengers = {c: flow.messenger(c) for c in cams}
    lag = 0.5
    t0 = time.time() + 0.2

    def capture(camera: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        messenger = messengers[camera]
        skew = AHEAD if camera == "cam2" else 0.0
        delay = lag if camera == "cam1" else 0.0
        for k in range(instants):
            dropped, jitter = rng.random() < 0.05, rng.uniform(-0.001, 0.001)
            time.sleep(max(0.0, t0 + k / FPS + delay - time.time()))
            if not dropped:
                messenger.set_output_event_timestamp(t0 + k / FPS + skew + jitter)
                messenger.publish_message(k)
        messenger.publish_stop_signal()

    threads = [threading.Thread(target=capture, args=(c, i)) for i, c in enumerate(cams)]
    fusion = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "quorum": 3, "missing": "drop",
        "timeout_ms": 60_000.0, "clock_offsets": offsets, **policy})
    for thread in threads:
        thread.start()
    groups = run_node(fusion, lambda inputs: inputs)[:-1]
    for thread in threads:
        thread.join()
    status = fusion.join_status()
    status["clock_corrections"], status["clock_changes"] = fusion.clock_corrections()
    status["clock_learning"] = fusion.clock_learned
    return groups, status


def test_the_join_finds_a_camera_20_ms_ahead_and_no_offset_for_the_others(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    _, status = rig(flows, {})
    found = status["clock_offsets"]
    assert set(found) == {"cam0", "cam1", "cam2", "cam3"}
    assert found["cam2"]["offset_s"] == pytest.approx(AHEAD, abs=0.001)
    assert found["cam2"]["basis"] == "near misses" and found["cam2"]["matched"] < 0.1
    for camera in ("cam0", "cam1", "cam3"):  # cam1's second of lag is no offset
        assert abs(found[camera]["offset_s"]) < 0.001, (camera, found[camera])
        assert found[camera]["basis"] == "groups"
    assert list(status["clock_advice"]) == ["cam2"]
    advice = status["clock_advice"]["cam2"]
    assert re.match(r"cam2's clock reads (19\.[5-9]|20\.[0-5]) ms ahead of the others "
                    r"\(tolerance 8 ms\): 100 % of its recent inputs unmatched; set "
                    r"clock_offsets=\{'cam2': -0\.0(19[5-9]|20[0-5])\}", advice), advice


def test_once_corrected_the_join_finds_no_offset_left(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    groups, status = rig(flows, {"cam2": -AHEAD})
    assert len(groups) > 50  # the instants with a quorum: cam2 is fused again
    found = status["clock_offsets"]
    assert all(abs(e["offset_s"]) < 0.001 and e["basis"] == "groups" for e in found.values())
    assert status["clock_advice"] == {}


def test_a_near_miss_is_told_from_the_next_instants_by_its_arrival() -> None:
    # 20 ms ahead at 30 fps is 13.3 ms before the next instant: closer. The arrival
    # offset (its stamps against when they arrived, beside the others') picks the
    # right one.
    # In a backlog, arrivals say nothing: the nearer instant is taken, and only
    # within a quarter of a period -- 20 ms ahead is not guessed at, 6 ms is found.
    def estimator(arrivals: bool, ahead: float = AHEAD) -> ClockEstimator:
        clocks = ClockEstimator(["a", "b", "c"], 0.008)
        for k in range(40):
            t = 100.0 + k / FPS
            arrived = t + 0.005 if arrivals else 0.0  # a backlog: all at once
            if clocks.fused(t, now=k / FPS):
                clocks.members({"a": (t, arrived, 0), "b": (t, arrived, 0)})
            clocks.missed("c", t + ahead, arrived, now=k / FPS)
        return clocks

    assert estimator(True).estimates()["c"].offset_s == pytest.approx(AHEAD)
    assert "c" not in estimator(False).estimates()
    assert estimator(False, 0.006).estimates()["c"].offset_s == pytest.approx(0.006)
    assert estimator(True).estimates()["a"].offset_s == pytest.approx(0.0)


def test_an_input_whose_instant_was_not_fused_is_no_near_miss() -> None:
    # Instants below quorum: every member is given up, the groups around them a period
    # away either side. They say nothing of a clock, and are not counted against it.
    clocks = ClockEstimator(["a", "b", "c"], 0.008)
    for k in range(60):
        t = 100.0 + k / FPS
        if k % 3 == 0:  # fused: a, b and c within a millisecond
            if clocks.fused(t, now=k / FPS):
                clocks.members({"a": (t, t, 0), "b": (t + 0.0005, t, 0), "c": (t, t, 0)})
        else:  # below quorum: a, b and c all given up, stamped right
            for parent in ("a", "b", "c"):
                clocks.missed(parent, t, t, now=k / FPS)
    found = clocks.estimates()
    assert all(abs(e.offset_s) < 0.001 and e.basis == "groups" and e.matched == 1.0
               for e in found.values()), found


def test_the_estimators_cost_is_per_second_not_per_group() -> None:
    # A backlog fused at thousands of groups a second: every group's time is kept,
    # the members of SAMPLE_HZ of them a second measured.
    clocks = ClockEstimator(["a", "b"], 0.008)
    wanted = sum(clocks.fused(100.0 + k / 1000.0, now=k / 10_000.0) for k in range(10_000))
    assert wanted == pytest.approx(SAMPLE_HZ * 1.0, abs=1)
    assert list(clocks._groups) == [100.0 + k / 1000.0 for k in range(10_000)][-RECENT_GROUPS:]


def test_a_running_correction_follows_the_estimate_a_bounded_step_at_a_time(
    flows, core: str, caplog: pytest.LogCaptureFixture,  # type: ignore[no-untyped-def]
) -> None:
    caplog.set_level("INFO", logger="videoflow.messaging.nats_messenger")
    groups, status = rig(flows, {}, instants=150, clock_correction="running",
                         clock_step_ms=5.0, clock_limit_ms=50.0)
    assert status["clock_corrections"]["cam2"] == pytest.approx(-AHEAD, abs=0.001)
    assert status["clock_changes"]["cam2"] >= 4  # 20 ms in steps of at most 5
    moves = [re.search(r"moved from ([-+][\d.]+) ms to ([-+][\d.]+) ms", r.getMessage())
             for r in caplog.records if "cam2's clock correction" in r.getMessage()]
    assert len(moves) == status["clock_changes"]["cam2"]  # each change logged
    assert all(m is not None and abs(float(m[2]) - float(m[1])) <= 5.0 + 1e-9 for m in moves)
    # Once it caught up, cam2 is fused again: the last instants' groups have it (but
    # for its own 5 % drops).
    late = [g for g in groups if g["cam0"] is not None and g["cam0"]["message"] >= 120]
    assert sum(g["cam2"] is not None for g in late) >= 0.85 * len(late) > 0
    assert not any(abs(e["offset_s"]) > 0.002 for e in status["clock_offsets"].values())


def test_a_running_correction_never_goes_past_its_limit(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    groups, status = rig(flows, {}, instants=120, clock_correction="running",
                         clock_step_ms=3.0, clock_limit_ms=6.0)
    assert status["clock_corrections"]["cam2"] == pytest.approx(-0.006)
    # 14 ms short of its offset, 6 ms beyond the tolerance (more than the cameras'
    # +-1 ms jitter can close): still never fused, and the estimate says what is left.
    assert all(g["cam2"] is None for g in groups)
    assert status["clock_offsets"]["cam2"]["offset_s"] == pytest.approx(0.014, abs=0.001)


def test_running_correction_bounds_are_checked() -> None:
    for bad, said in [({"clock_correction": "learned"}, "clock_correction must be one of"),
                      ({"clock_step_ms": 0.0}, "clock_step_ms must be finite and > 0"),
                      ({"clock_limit_ms": 61_000.0}, "clock_limit_ms must be at most 60000")]:
        with pytest.raises(ValueError, match=said):
            JoinPolicy(mode="time", tolerance_ms=8.0, **bad)
    with pytest.raises(ValueError, match="clock_correction='running' needs mode='time'"):
        JoinPolicy(clock_correction="running")


# ------------------------------------------------------------------ corrections said


def test_outputs_say_the_corrections_their_group_was_fused_with(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"cam_a": [], "cam_b": [], "fuse": ["cam_a", "cam_b"], "sink": ["fuse"]})
    capture(flow)
    fusion = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "missing": "drop", "timeout_ms": 60_000.0,
        "clock_offsets": {"cam_a": 0.0, "cam_b": -AHEAD}})
    infos: list[Any] = []

    def work(inputs: dict[str, Any]) -> int:
        infos.append(fusion.last_input_info())
        return int(inputs["cam_a"]["message"])

    run_node(fusion, work)
    # The node sees what was added to each member's time: cam_a's zero is not said on
    # the wire, cam_b's is.
    assert [(i["cam_a"]["clock_offset"], i["cam_b"]["clock_offset"]) for i in infos] == [
        (0.0, -AHEAD)] * FRAMES
    outputs = run_node(flow.messenger("sink"), None)[:-1]
    assert [o["fuse"]["metadata"] for o in outputs] == [
        {CLOCK_OFFSETS_METADATA_KEY: {"cam_b": -AHEAD}}] * FRAMES


def test_a_join_that_corrects_nothing_says_nothing(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"cam_a": [], "cam_b": [], "fuse": ["cam_a", "cam_b"], "sink": ["fuse"]})
    for camera in ("cam_a", "cam_b"):
        messenger = flow.messenger(camera)
        for k in range(FRAMES):
            messenger.set_output_event_timestamp(100.0 + k / FPS)
            messenger.publish_message(k)
        messenger.publish_stop_signal()
    fusion = flow.messenger("fuse", join_policy={"mode": "time", "tolerance_ms": 8.0})
    run_node(fusion, lambda inputs: inputs["cam_a"]["message"])
    outputs = run_node(flow.messenger("sink"), None)[:-1]
    assert len(outputs) == FRAMES and all(o["fuse"]["metadata"] is None for o in outputs)


def test_a_running_correction_learns_before_its_first_group_and_its_outputs_say_so(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    seen: list[Any] = []
    cams = [f"cam{i}" for i in range(4)]
    flow = flows({**{c: [] for c in cams}, "fuse": cams, "sink": ["fuse"]})
    messengers = {c: flow.messenger(c) for c in cams}
    t0 = time.time() + 0.2

    def camera(name: str) -> None:
        messenger = messengers[name]
        for k in range(120):
            time.sleep(max(0.0, t0 + k / FPS - time.time()))
            messenger.set_output_event_timestamp(t0 + k / FPS + (AHEAD if name == "cam2" else 0.0))
            messenger.publish_message(k)
        messenger.publish_stop_signal()

    threads = [threading.Thread(target=camera, args=(c,)) for c in cams]
    fusion = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "quorum": 3, "missing": "drop",
        "timeout_ms": 60_000.0, "clock_correction": "running", "clock_step_ms": 5.0})
    for thread in threads:
        thread.start()

    def work(inputs: dict[str, Any]) -> int:
        seen.append((inputs, fusion.last_input_info()))
        return len(seen) - 1

    run_node(fusion, work)
    for thread in threads:
        thread.join()
    said = [o["fuse"]["metadata"] for o in run_node(flow.messenger("sink"), None)[:-1]]
    assert len(said) == len(seen) > 0
    steps = []
    for (inputs, info), metadata in zip(seen, said, strict=True):
        applied = (metadata or {}).get(CLOCK_OFFSETS_METADATA_KEY, {})
        assert set(applied) <= {"cam2"}  # only the camera that is off was moved
        steps.append(applied.get("cam2", 0.0))
        # Each member's own stamp with the offset said added is the time the join
        # fused it at: replayed with these offsets, the same inputs group alike.
        replayed = {p: t0 + e["message"] / FPS + (AHEAD if p == "cam2" else 0.0)
                    + applied.get(p, 0.0) for p, e in inputs.items() if e is not None}
        assert replayed == pytest.approx(
            {p: i["event_ts"] for p, i in info.items() if i is not None}, abs=1e-9)
        assert max(replayed.values()) - min(replayed.values()) <= 0.008
    # It learned cam2's clock before its first group went out: every instant is one
    # group of all four cameras, each saying the same correction.
    assert len(seen) == 120
    assert all(all(e is not None for e in inputs.values()) for inputs, _ in seen)
    assert len(set(steps)) == 1 and steps[0] == pytest.approx(-AHEAD, abs=0.001)


def test_a_running_correction_makes_the_groups_a_static_offset_makes(
    flows, core: str, caplog: pytest.LogCaptureFixture,  # type: ignore[no-untyped-def]
) -> None:
    # Under 5 % drops, jitter, quorum groups and a camera half a second behind: the
    # join learns cam2's clock, 2 ms a step, before its first group goes out, and every
    # instant's group has the members it has with cam2's offset given.
    caplog.set_level("INFO", logger="videoflow.messaging.nats_messenger")

    def members(groups: list[Any]) -> list[tuple[int, frozenset[str]]]:
        return sorted((min(e["message"] for e in g.values() if e is not None),
                       frozenset(p for p, e in g.items() if e is not None)) for g in groups)

    running, status = rig(flows, {}, clock_correction="running")
    static, _ = rig(flows, {"cam2": -AHEAD})
    assert members(running) == members(static)
    assert status["clock_corrections"]["cam2"] == pytest.approx(-AHEAD, abs=0.001)
    assert status["clock_changes"]["cam2"] >= 10  # 20 ms, 2 ms a step
    learned = [r.getMessage() for r in caplog.records if "learned its parents'" in r.getMessage()]
    assert len(learned) == 1
    assert re.search(r"learned its parents' clocks for \d\.\d\d s, until every parent's "
                     r"clock was estimated: \d+ correction steps \(cam2 -(19|20)\.\d ms\); "
                     r"its first \d+ groups held meanwhile", learned[0]), learned
    assert status["clock_learning"] == learned[0][len("fuse: "):]


def test_a_learning_join_whose_inputs_end_lets_what_it_holds_go(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    # Too few frames to estimate anything (MIN_SAMPLES): learning ends with the inputs,
    # and what it held goes out as it stands -- nothing hangs, nothing is lost.
    flow = flows({"cam_a": [], "cam_b": [], "fuse": ["cam_a", "cam_b"], "sink": ["fuse"]})
    for camera in ("cam_a", "cam_b"):
        messenger = flow.messenger(camera)
        for k in range(3):
            messenger.set_output_event_timestamp(100.0 + k / FPS)
            messenger.publish_message(k)
        messenger.publish_stop_signal()
    fusion = flow.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "timeout_ms": 60_000.0,
        "clock_correction": "running"})
    groups = run_node(fusion, lambda inputs: inputs["cam_a"]["message"])[:-1]
    assert [(g["cam_a"]["message"], g["cam_b"]["message"]) for g in groups] == [
        (k, k) for k in range(3)]
    assert fusion.join is not None and fusion.join.learning is None
    empty = flows({"cam_a": [], "cam_b": [], "fuse": ["cam_a", "cam_b"], "sink": ["fuse"]})
    for camera in ("cam_a", "cam_b"):
        empty.messenger(camera).publish_stop_signal()
    idle = empty.messenger("fuse", join_policy={
        "mode": "time", "tolerance_ms": 8.0, "clock_correction": "running"})
    (ends,) = run_node(idle, None)  # only the end entries: no input, no hang
    assert all(e["is_stop_signal"] for e in ends.values())


def test_a_collect_parents_clock_is_told_by_its_arrivals_and_never_followed() -> None:
    # An IMU joined by window: no grouping can tell its offset (its samples fill the
    # window wherever they fall); its arrivals, beside the cameras', can.
    def estimator(ahead: float) -> ClockEstimator:
        clocks = ClockEstimator(["a", "b"], 0.008, collect_parents=["imu"])
        for k in range(40):
            t = 100.0 + k / FPS
            if clocks.fused(t, now=k / FPS):
                clocks.members({"a": (t, t + 0.004, 0), "b": (t, t + 0.005, 0)})
                for j in range(8):  # its samples, stamped `ahead` of the true time
                    s = t - 0.02 + j * 0.005
                    clocks.collected("imu", s + ahead, s + 0.0045)
        return clocks

    off = estimator(0.02)
    found = off.estimates()["imu"]
    assert found.basis == "arrivals" and found.offset_s == pytest.approx(0.02, abs=0.001)
    assert off.advice()["imu"].startswith(
        "imu's samples arrive as if its clock read 20.0 ms ahead of the others'")
    running = RunningCorrection({}, 0.002, 0.1)
    assert running.update(off) == [] and running.applied == {}  # reported, not followed
    aligned = estimator(0.0)
    assert abs(aligned.estimates()["imu"].offset_s) < 0.001 and aligned.advice() == {}


def test_learning_is_bounded_by_time_once_caught_up_and_by_what_it_holds() -> None:
    learning = ClockLearning(max_groups=10)
    assert learning.bound_reached(now=100.0, pending=0) is None  # no input yet
    learning.first = learning.started = 100.0
    assert learning.bound_reached(now=100.0 + LEARN_SECONDS - 0.01, pending=9) is None
    learning.started = 101.0  # a full receive came back then: still catching up
    assert learning.bound_reached(now=100.0 + LEARN_SECONDS, pending=0) is None
    assert learning.bound_reached(now=101.0 + LEARN_SECONDS, pending=0) == (
        f"{LEARN_SECONDS:g} s had passed")
    assert learning.bound_reached(now=101.0, pending=10) == "it held 10 groups"


def test_a_learning_join_that_dies_loses_nothing(
    flows, core: str,  # type: ignore[no-untyped-def]
) -> None:
    # Learning holds inputs unacknowledged: a process that dies mid-way leaves them to
    # the broker, and its replacement, learning afresh, has every one of them: each
    # instant is a group of cam_a and cam_c, and each of cam_b's frames (6 ms off, a
    # backlog read faster than the estimator samples: not learned here) is fused or
    # counted as dropped.
    cams = ["cam_a", "cam_b", "cam_c"]
    flow = flows({**{c: [] for c in cams}, "fuse": cams, "sink": ["fuse"]})
    for camera in cams:
        messenger = flow.messenger(camera)
        for k in range(40):
            messenger.set_output_event_timestamp(
                100.0 + k / FPS + (0.006 if camera == "cam_b" else 0.0))
            messenger.publish_message(k)
        messenger.publish_stop_signal()
    policy = {"mode": "time", "tolerance_ms": 3.0, "quorum": 2, "missing": "drop",
              "timeout_ms": 60_000.0, "clock_correction": "running", "clock_step_ms": 2.0}
    backend = MemoryMessagingBackend(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    dying = NATSMessenger(SimpleNamespace(name="fuse", pack=False), flow.edges["fuse"],
                          "nats://unused", FLOW, flow.flow_type, RUN, backend=backend,
                          ack_wait=1, join_policy=policy)
    flow.made.append(dying)
    assert dying.join is not None and dying.join.learning is not None
    for _ in range(20):  # the first inputs in: learning holds them
        dying._receive_once()
        if dying.join.learning.first is not None:
            break
    assert dying.join.learning.first is not None
    backend.shutdown(hand_back=False)  # the process dies holding them, settling none
    time.sleep(1.1)  # their leases lapse (ack_wait): they come again, in order
    fusion = flow.messenger("fuse", ack_wait=1, join_policy=policy)
    groups = run_node(fusion, lambda inputs: inputs["cam_a"]["message"])[:-1]
    assert [(g["cam_a"]["message"], g["cam_c"]["message"]) for g in groups] == [
        (k, k) for k in range(40)]
    fused_b = sum(g["cam_b"] is not None for g in groups)
    assert fused_b + sum(fusion.take_drops().values()) == 40, fused_b
    assert fusion.join is not None and fusion.join.learning is None
