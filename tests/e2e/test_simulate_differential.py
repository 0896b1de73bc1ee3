"""A flow simulated in one process (videoflow.testing.simulate) and the same flow run
on a real nats-server, each replica a process, give the same groups, outputs and
drops: a differential test over generated camera scripts (dropped frames, jitter
within the tolerance, cameras of different lengths).

The join resolves by its parents' data (watermarks and ends of stream), with a
timeout no run reaches, so what it fuses depends on the frames alone, not on when
each process got to send them: any difference is the simulation's."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from differential_nodes import NameFrames, ScriptedCamera, WriteConsumed
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from videoflow.broker import server as embedded
from videoflow.core.report import RunReport
from videoflow.flow import Flow
from videoflow.testing import Input, simulate

T0 = 1_000.0
FPS = 30.0
TOLERANCE_MS = 8.0

Script = list[list[tuple[int, float]]]  # per camera: (frame number, event time)


@st.composite
def scripts(draw: st.DrawFn) -> Script:
    """2-3 cameras, up to 12 instants; each camera drops some frames and stamps the
    rest within ±3 ms of the instant (two cameras' stamps of one instant stay inside
    the tolerance, and far from the next instant's)."""
    cameras = draw(st.integers(2, 3))
    instants = draw(st.integers(3, 12))
    script: Script = []
    for _ in range(cameras):
        kept = draw(st.lists(st.booleans(), min_size=instants, max_size=instants))
        jitter = draw(st.lists(st.integers(-3, 3), min_size=instants, max_size=instants))
        script.append([(k, T0 + k / FPS + jitter[k] / 1000.0)
                       for k in range(instants) if kept[k]])
    return script


def flow_of(script: Script, path: Path) -> Flow:
    cameras = [ScriptedCamera(f"cam{i}", frames) for i, frames in enumerate(script)]
    fuse = NameFrames(name="fuse", join_policy={
        "mode": "time", "tolerance_ms": TOLERANCE_MS, "quorum": len(cameras) - 1,
        "timeout_ms": 600_000.0, "missing": "drop"})(*cameras)
    return Flow(cameras, [WriteConsumed(str(path))(fuse)], name="differential")


def drops(report: RunReport) -> dict[str, dict[str, int]]:
    return {name: {r: n for r, n in node.dropped.items() if n}
            for name, node in report.nodes.items()}


def sorted_groups(groups: list[Any]) -> list[Any]:
    return sorted(groups, key=lambda g: [(-1 if k is None else k) for k in g])


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(script=scripts())
@example(script=[[(k, T0 + k / FPS) for k in range(8) if k != 3],
                 [(k, T0 + k / FPS + 0.002) for k in range(8) if k not in (3, 5)],
                 [(k, T0 + k / FPS - 0.002) for k in range(7)]])
def test_a_simulated_flow_and_the_same_flow_on_nats_give_the_same_results(
        nats_server: embedded.EmbeddedServer, tmp_path: Path, script: Script) -> None:
    simulated_path = tmp_path / f"simulated-{uuid.uuid4().hex}.json"
    real_path = tmp_path / f"real-{uuid.uuid4().hex}.json"
    inputs = {f"cam{i}": [Input({"k": k}, event_ts=t) for k, t in frames]
              for i, frames in enumerate(script)}

    simulated = simulate(flow_of(script, simulated_path), inputs)
    real = flow_of(script, real_path).run(nats_server.url, view=False)

    assert simulated.report is not None
    assert (simulated.report.outcome, real.outcome) == ("completed", "completed")
    real_groups = json.loads(real_path.read_text())
    simulated_groups = json.loads(simulated_path.read_text())
    assert sorted_groups(simulated.messages("fuse")) == sorted_groups(simulated_groups)
    assert sorted_groups(simulated_groups) == sorted_groups(real_groups)
    assert drops(simulated.report) == drops(real)
    for name in ("fuse", "sink"):
        assert simulated.report.nodes[name].processed == real.nodes[name].processed
    assert simulated.report.nodes["fuse"].emitted == real.nodes["fuse"].emitted
    assert simulated.dead_letters == [] and real.dead_lettered == 0
