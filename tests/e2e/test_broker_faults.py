"""A BATCH flow rides out its broker's faults: a 20k-message flow with a keyed sink, the
broker SIGKILLed and restarted, or frozen, mid-run; every run must end completed with
nothing lost and every group applied once (issue 12)."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_faults import freeze, kill_and_restart, strike_when
from flow_nodes import Numbers, Record, Scale
from test_pipeline_safety import assert_applied_exactly, assert_clean

from videoflow import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.flow import Flow
from videoflow.core.report import RunReport

COUNT = 20_000
STRIKE_AT = 3_000
"""The fault strikes once the sink has applied this many groups: mid-stream."""


def run_linear(url: str, out: Path, name: str, **options: object) -> RunReport:
    numbers = Numbers(COUNT)
    sink = Record(str(out))(Scale(2, nb_tasks=2)(numbers))
    return Flow([numbers], [sink], BATCH, name=name).run(url, view=False, **options)


def assert_whole(report: RunReport, out: Path) -> None:
    assert report.outcome == "completed", report.format()
    assert_clean(report)
    assert_applied_exactly(out, [2 * i for i in range(COUNT)])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("down", [3.0])
def test_a_batch_flow_rides_out_a_broker_killed_and_restarted(
    nats_server: embedded.EmbeddedServer, out: Path, down: float,
) -> None:
    with strike_when(out, STRIKE_AT, kill_and_restart(nats_server, down)) as fault:
        report = run_linear(nats_server.url, out, "restarted")
    assert fault.error is None and fault.struck_at is not None
    assert fault.recovered_at is not None
    assert_whole(report, out)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seconds", [5.0])
def test_a_batch_flow_rides_out_a_broker_frozen(
    nats_server: embedded.EmbeddedServer, out: Path, seconds: float,
) -> None:
    with strike_when(out, STRIKE_AT, freeze(nats_server, seconds)) as fault:
        report = run_linear(nats_server.url, out, "frozen")
    assert fault.error is None and fault.recovered_at is not None
    assert_whole(report, out)
