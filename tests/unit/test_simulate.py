"""videoflow.testing.simulate: a flow run in one process on simulated time, from
scripted inputs, with the real messenger, join and task (no broker)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from videoflow import ConsumerNode, Flow, PoisonMessage, ProcessorNode, ProducerNode
from videoflow.testing import Crash, Input, Silent, simulate, simulate_node

T0 = 1_000.0
FPS = 30.0


class Camera(ProducerNode):
    """Stands in for a camera the script plays; run unscripted, it sends `count`
    frames of its own."""

    def __init__(self, name: str, count: int = 0) -> None:
        super().__init__(name=name)
        self.count = count

    def open(self) -> None:
        self.k = 0

    def next(self) -> dict[str, Any]:
        if self.k >= self.count:
            raise StopIteration
        self.context.set_event_timestamp(T0 + self.k / FPS)
        self.k += 1
        return {"k": self.k - 1}


class Fuse(ProcessorNode):
    """Each camera's frame number (None when missing); the IMU window's length when
    an IMU is joined; raises PoisonMessage on frame 13 of the first camera."""

    def process(self, *inputs: Any) -> Any:
        if inputs[0] is not None and inputs[0]["k"] == 13:
            raise PoisonMessage("frame 13 is corrupt")
        return [len(i) if isinstance(i, list) else (None if i is None else i["k"])
                for i in inputs]


class Sink(ConsumerNode):
    """Writes what it consumed when it closes: open() and close() run in a simulation."""

    def __init__(self, path: str) -> None:
        super().__init__(name="sink")
        self.path = path

    def open(self) -> None:
        self.seen: list[Any] = []

    def consume(self, fused: Any) -> None:
        self.seen.append(fused)

    def close(self) -> None:
        Path(self.path).write_text(repr(self.seen))


def fusion(tmp_path: Path, cameras: int = 3, imu: bool = False, **policy: Any) -> Flow:
    producers = [Camera(f"cam{i}") for i in range(cameras)]
    parents = [*producers]
    join = {"mode": "time", "tolerance_ms": 8.0, "quorum": cameras - 1, "timeout_ms": 300.0,
            "missing": "drop", **policy}
    if imu:
        parents.append(Camera("imu"))
        join["collect"] = {"imu": 20.0}
    fuse = Fuse(name="fuse", join_policy=join)(*parents)
    sink = Sink(str(tmp_path / "seen.txt"))(fuse)
    return Flow(parents, [sink], name="fusion")


def frames(count: int, skip: tuple[int, ...] = (), **marks: Any) -> list[Input]:
    return [Input({"k": k}, event_ts=T0 + k / FPS, **marks.get(str(k), {}))
            for k in range(count) if k not in skip]


def test_a_dropped_frame_makes_a_quorum_group_and_every_run_gives_the_same_groups(
        tmp_path: Path) -> None:
    inputs = {"cam0": frames(10), "cam1": frames(10, skip=(4,)), "cam2": frames(10)}
    first = simulate(fusion(tmp_path), inputs)
    again = simulate(fusion(tmp_path), inputs)

    assert first.messages("fuse") == [[k, None if k == 4 else k, k] for k in range(10)]
    quorum = first.groups["fuse"][4]
    assert quorum.event_times() == {"cam0": T0 + 4 / FPS, "cam1": None, "cam2": T0 + 4 / FPS}
    assert [o.event_ts for o in quorum.outputs] == [T0 + 4 / FPS]  # the group's time
    assert ([(g.event_times(), g.at) for g in again.groups["fuse"]]
            == [(g.event_times(), g.at) for g in first.groups["fuse"]])
    assert first.report is not None and first.report.outcome == "completed"
    assert first.report.nodes["fuse"].processed == 10
    # The consumer's open() and close() ran: it wrote what it consumed.
    assert (tmp_path / "seen.txt").read_text() == repr(first.messages("fuse"))


def test_a_join_timeout_runs_on_simulated_time_not_the_wall_clock(tmp_path: Path) -> None:
    # cam2 goes silent after frame 4 without ending: the groups after it wait the
    # whole timeout (30 simulated seconds) before going out with cam0 and cam1.
    inputs = {"cam0": frames(8), "cam1": frames(8), "cam2": [*frames(5), Silent()]}
    started = time.perf_counter()
    result = simulate(fusion(tmp_path, timeout_ms=30_000.0), inputs, until=120.0)
    wall = time.perf_counter() - started

    assert result.messages("fuse") == [[k, k, k if k < 5 else None] for k in range(8)]
    waited = result.groups["fuse"][5].at - (T0 + 5 / FPS - T0)
    assert waited == pytest.approx(30.0, abs=0.1)  # RUN-006: its timeout, simulated
    # Not waited on the wall clock: well under the 30 s it would take. A speed figure
    # (it takes 2.4 s alone) is no promise of the simulation, and CI's load took it
    # past 5 s twice.
    assert wall < 15.0, f"{wall:.1f} s of wall time for a 30 s simulated timeout"
    assert result.report is not None and result.report.outcome == "stopped"
    assert result.join_status["fuse"]["waiting_groups"] == 0


def test_a_collect_parent_gives_each_group_its_window(tmp_path: Path) -> None:
    imu = [Input({"t": j}, event_ts=T0 + j / 400.0) for j in range(-8, 160)]
    inputs = {"cam0": frames(10), "cam1": frames(10), "cam2": frames(10), "imu": imu}
    result = simulate(fusion(tmp_path, imu=True), inputs)

    groups = result.groups["fuse"]
    assert len(groups) == 10
    for k, group in enumerate(groups):
        window = group.event_times()["imu"]
        assert isinstance(window, list) and window
        assert all(abs(t - (T0 + k / FPS)) <= 0.020 + 1e-9 for t in window if t is not None)


def test_below_quorum_a_group_is_dropped_with_its_reason(tmp_path: Path) -> None:
    # Frame 6 reaches cam0 alone: below the quorum of 2, given up and counted.
    inputs = {"cam0": frames(10), "cam1": frames(10, skip=(6,)), "cam2": frames(10, skip=(6,))}
    result = simulate(fusion(tmp_path), inputs)

    assert [k for k, *_ in result.messages("fuse")] == [k for k in range(10) if k != 6]
    assert [(d.node, d.parent, d.reason) for d in result.drops] == [
        ("fuse", "cam0", "join_evicted")]
    dropped = result.drops[0].input
    assert dropped is not None and dropped.message == {"k": 6}
    assert result.report is not None
    dropped = {r: n for r, n in result.report.nodes["fuse"].dropped.items() if n}
    assert dropped == {"join_evicted": 1}


def test_a_frame_sent_after_its_group_went_out_is_dropped(tmp_path: Path) -> None:
    # cam1's frame 3 is sent after its frame 5: its group went out without it once
    # cam1's frame 4 passed it, and no later group takes it.
    late = [i for i in frames(10) if i.message["k"] != 3]
    late.insert(5, Input({"k": 3}, event_ts=T0 + 3 / FPS, at=5 / FPS))
    inputs = {"cam0": frames(10), "cam1": late, "cam2": frames(10)}
    result = simulate(fusion(tmp_path), inputs)

    assert [(d.parent, d.reason) for d in result.drops] == [("cam1", "join_evicted")]
    assert result.messages("fuse") == [[k, None if k == 3 else k, k] for k in range(10)]


def test_poison_is_dead_lettered_and_the_run_goes_on(tmp_path: Path) -> None:
    inputs = {f"cam{i}": frames(16) for i in range(3)}
    result = simulate(fusion(tmp_path), inputs)

    assert [k for k, *_ in result.messages("fuse")] == [k for k in range(16) if k != 13]
    assert {(d.node, d.reason, d.error_message) for d in result.dead_letters} == {
        ("fuse", "poison", "frame 13 is corrupt")}
    assert sorted(d.parent for d in result.dead_letters) == ["cam0", "cam1", "cam2"]
    assert "frame 13 is corrupt" in result.dead_letters[0].traceback


def test_a_redelivery_and_a_duplicate(tmp_path: Path) -> None:
    # cam0's frame 2 is delivered twice (its first lease lapses at once): processed
    # once. cam2's frame 5 is sent twice: the second copy finds its group gone and
    # is dropped below the quorum.
    inputs = {"cam0": frames(8, **{"2": {"redeliver": True}}), "cam1": frames(8),
              "cam2": frames(8, **{"5": {"duplicate": True}})}
    result = simulate(fusion(tmp_path), inputs)

    assert result.messages("fuse") == [[k, k, k] for k in range(8)]
    assert len(result.outputs["cam2"]) == 9
    assert [(d.parent, d.reason) for d in result.drops] == [("cam2", "join_evicted")]


def test_a_crashed_replica_s_group_is_delivered_again_after_ack_wait(tmp_path: Path) -> None:
    inputs = {f"cam{i}": frames(12) for i in range(3)}
    result = simulate(fusion(tmp_path), inputs, crashes=[Crash("fuse", after=5)], ack_wait=10.0)

    fused = result.messages("fuse")
    assert sorted(fused) == [[k, k, k] for k in range(12)]  # nothing lost
    assert fused[-1] == [5, 5, 5]  # the one it died holding, once its lease lapsed
    assert result.groups["fuse"][-1].at >= 10.0
    report = result.report
    assert report is not None and report.outcome == "completed"
    node = report.nodes["fuse"]
    assert node.restarts == 1 and len(node.deaths) == 1
    assert sorted(node.deaths[0].in_hand) == ["cam0:6", "cam1:6", "cam2:6"]


def test_a_producer_without_a_script_runs_its_own_next(tmp_path: Path) -> None:
    flow = fusion(tmp_path)
    for producer in flow.producers:
        producer.count = 5  # type: ignore[attr-defined]
    result = simulate(flow, {"cam1": frames(5, skip=(2,))})

    # cam0 and cam2 send all theirs at once; group 2 waits for cam1's next frame,
    # which completes group 3 first.
    assert sorted(result.messages("fuse")) == [[k, None if k == 2 else k, k]
                                               for k in range(5)]


def test_inputs_that_cannot_be_played_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'fuse': not a producer"):
        simulate(fusion(tmp_path), {"fuse": frames(1)})
    with pytest.raises(ValueError, match="needs|give simulate an until"):
        simulate(fusion(tmp_path), {"cam0": [*frames(2), Silent()]})
    with pytest.raises(ValueError, match="Silent must be the last"):
        simulate(fusion(tmp_path), {"cam0": [Silent(), *frames(2)]}, until=1.0)
    with pytest.raises(KeyError, match="no node 'nope'"):
        simulate(fusion(tmp_path), {}, crashes=[Crash("nope", after=1)])


class Double(ProcessorNode):
    def process(self, value: Any) -> Any:
        return value * 2


def test_one_node_runs_on_given_inputs() -> None:
    result = simulate_node(Double(name="double"), {"numbers": [Input(n) for n in range(5)]})

    assert result.messages("double") == [0, 2, 4, 6, 8]
    assert [g.inputs["numbers"].message for g in result.groups["double"]  # type: ignore[union-attr]
            ] == [0, 1, 2, 3, 4]


def test_one_join_runs_on_given_inputs() -> None:
    fuse = Fuse(name="fuse", join_policy={"mode": "time", "tolerance_ms": 8.0, "quorum": 1,
                                          "timeout_ms": 100.0, "missing": "drop"})
    result = simulate_node(fuse, {"a": frames(3), "b": frames(3, skip=(1,))})

    # Group 1 waits for b's next frame, which completes group 2 first.
    assert result.messages("fuse") == [[0, 0], [2, 2], [1, None]]


def test_simulate_node_refuses_a_producer_and_a_wired_node(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="processor or a consumer"):
        simulate_node(Camera("cam"), {})
    wired = fusion(tmp_path).consumers[0]
    with pytest.raises(ValueError, match="already wired"):
        simulate_node(wired, {"x": frames(1)})


class Flaky(ProcessorNode):
    def process(self, value: Any) -> Any:
        raise RuntimeError("the model server is down")


def test_a_run_that_would_go_on_for_ever_is_stopped_at_the_limit_and_says_so() -> None:
    # Every attempt fails, and the policy retries a million times, a second apart.
    flaky = Flaky(name="flaky", delivery={
        "max_retries": 1_000_000, "backoff": {"base_ms": 1000.0, "factor": 1.0,
                                             "max_ms": 1000.0}})
    result = simulate_node(flaky, {"numbers": [Input(1)]}, ack_wait=5.0)

    report = result.report
    assert report is not None and report.outcome == "stopped"
    assert report.stopped_by is not None and "limit" in report.stopped_by
    assert 50.0 <= result.seconds <= 50.0 + 60.0  # the limit, then its wind-down
    assert result.messages("flaky") == [] and result.dead_letters == []
