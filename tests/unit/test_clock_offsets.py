"""JoinPolicy.clock_offsets on the memory adapter: a camera whose clock reads 20 ms
ahead never meets the others within an 8 ms tolerance, and every one of its frames is
dropped; with its offset given, every instant is one group again, its frames' event
times corrected before the join reads them (matching, watermarks, the group's time).
Both cores, the compiled and the reference, give the same groups. The policy checks the
offsets it is given."""

from __future__ import annotations

from typing import Any

import pytest
from messenger_flows import Flow, flows, run_node

from videoflow.core.policies import JoinPolicy
from videoflow.messaging import _grouping_ref, grouping

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
