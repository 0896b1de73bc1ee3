"""A slow node settles promptly and leases only what it can soon process (issue 40),
end to end: a real nats-server, every replica a process of its own.

A sink taking 0.5 s a message once kept every settlement for 24 s (they went in
batches of 64) and leased the whole stream at its first fetch, so a crash redid it
all and a second replica found nothing to take. The broker's ack floor must now
trail what the node finished by a message or two at every look, and competing
replicas must split the work.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from broker_reads import durable_state, wait_for_pullers
from flow_nodes import Numbers
from slow_nodes import SlowPass, SlowSink, done

from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.report import RunReport
from videoflow.flow import Flow
from videoflow.messaging.nats_messenger import FIRST_DEPTH

pytestmark = pytest.mark.timeout(120)

MESSAGES = 24
SECONDS = 0.2  # per message: a detector doing 5 a second


def run_sampling(flow: Flow, url: str, log_dir: Path, node: str, durable: str,
                 ) -> tuple[RunReport, list[tuple[int, dict[str, int]]]]:
    """Run flow, and meanwhile sample, every 0.2 s, what node finished (first) and the
    broker's view of its durable (then)."""
    result: list[RunReport] = []
    runner = threading.Thread(target=lambda: result.append(flow.run(url, view=False)))
    runner.start()
    samples = []
    try:
        while runner.is_alive():
            finished = sum(done(log_dir, node).values())
            state = asyncio.run(durable_state(url, durable))
            if state is not None and state["delivered"]:
                samples.append((finished, state))
            runner.join(0.2)
    finally:
        runner.join()
    return result[0], samples


@pytest.mark.parametrize("kind", ["consumer", "processor"])
def test_a_slow_nodes_settlements_reach_the_broker_as_it_finishes_each_input(
    nats_server: embedded.EmbeddedServer, tmp_path: Path, kind: str,
) -> None:
    numbers = Numbers(MESSAGES, name="numbers")
    if kind == "consumer":
        slow = SlowSink(str(tmp_path), SECONDS, name="slow")(numbers)
        sinks = [slow]
    else:  # settled only once its output is confirmed
        slow = SlowPass(str(tmp_path), SECONDS, name="slow")(numbers)
        sinks = [SlowSink(str(tmp_path), 0.0, name="sink")(slow)]
    flow = Flow([numbers], sinks, BATCH, name=f"slow-{kind}")
    report, samples = run_sampling(flow, nats_server.url, tmp_path, "slow",
                                   "slow--from--numbers")
    assert report.outcome == "completed", report.format()
    assert sum(done(tmp_path, "slow").values()) == MESSAGES
    working = [(finished, s) for finished, s in samples if 0 < finished < MESSAGES]
    assert len(working) >= 10, samples  # the node's 5 s of work, looked at throughout
    for finished, state in working:
        # The ack floor is the stream sequence of the last input settled in order
        # (message n is sequence n): at most two finished ones not yet settled.
        assert state["ack_floor"] >= finished - 2, (finished, state, samples)
    # What it leased is what it will soon process, never the stream. Once it has
    # timed a few groups: the one in hand, the next parked, one more a pull request
    # may bring that the receiver saw expire before the server did (a loaded host),
    # and the two finished ones the floor may trail by. Before, what its first
    # fetches of FIRST_DEPTH brought: never half the stream (the old code leased it
    # all at its first fetch). A receive once took, besides what was parked, what the
    # keeper thread parked while it took: 15 delivered at the 9th finished, under load.
    steady = [(f, s) for f, s in working if f > 2 * FIRST_DEPTH]
    assert steady, samples
    assert max(s["ack_pending"] for _, s in steady) <= 5, steady
    assert max(s["ack_pending"] for _, s in samples) <= MESSAGES // 2, samples


def test_two_replicas_of_a_slow_node_each_process_a_share(
    nats_server: embedded.EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The producer waits until both replicas ask for input: one started seconds after
    # the other (a loaded machine) would find less to take whatever they lease.
    gate = tmp_path / "go"
    monkeypatch.setenv("VF_TEST_GATE", str(gate))
    numbers = Numbers(MESSAGES, name="numbers")
    slow = SlowSink(str(tmp_path), SECONDS, name="slow", nb_tasks=2)(numbers)
    flow = Flow([numbers], [slow], BATCH, name="slow-shared")
    result: list[RunReport] = []
    runner = threading.Thread(target=lambda: result.append(
        flow.run(nats_server.url, view=False)))
    runner.start()
    try:
        asyncio.run(wait_for_pullers(nats_server.url, "slow--from--numbers", 2, 60))
    finally:
        gate.touch()
        runner.join()
    report = result[0]
    assert report.outcome == "completed", report.format()
    shares = done(tmp_path, "slow")
    assert sum(shares.values()) == MESSAGES
    # Competing replicas split the stream; once it leased everything, one took all.
    assert min(shares.get(0, 0), shares.get(1, 0)) >= MESSAGES // 4, shares
