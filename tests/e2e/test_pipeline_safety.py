"""Crash safety of the pipelined node, end to end: whole flows on a real nats-server,
every replica a process of its own, and the faults real deployments see -- a processor
SIGKILLed with unconfirmed outputs in its publication window (and, separately, with
outputs a full stream refused waiting in it), a sink SIGKILLed with its settlements in
flight, a BATCH stream that fills mid-window, a broker frozen (SIGSTOP) mid-window, and
checkpointing nodes (a consumer, a processor) SIGKILLed and restarted mid-stream. The
fault-injecting nodes (tests/e2e/helpers/flow_nodes.py) strike from inside the replica,
at the moment its messenger holds what the test is about, and record what it held.

Every test asserts the exact outcome: nothing lost, nothing dropped or dead-lettered,
and every input group applied once. The Record sink keys its effects on
context.last_input_key and logs every group it is handed (applications.log: key, pid,
replica, value), so the log tells a legitimate redelivery (a group the dead process was
handed and never acknowledged, handed again to its replacement) from a double
application (a group handed twice to one process, a group handed twice without a
crash, or one value recorded under two keys). Each scenario runs once in the suite;
VIDEOFLOW_SAFETY_ATTEMPTS=N runs it N times, as the races it provokes land differently
each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from flow_nodes import (
    CheckpointedPassThrough,
    CheckpointedTally,
    DieMidWindow,
    DieMidWindowRecord,
    FreezeBrokerMidWindow,
    Numbers,
    Record,
    Scale,
    applied,
)

from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.credit import node_credit
from videoflow.core.naming import stream_name_for
from videoflow.core.report import RunReport
from videoflow.flow import Flow
from videoflow.messaging import topology
from videoflow.ops import dlq_list

ATTEMPTS = range(int(os.environ.get("VIDEOFLOW_SAFETY_ATTEMPTS", "1")))
"""Each kill-and-restart case runs once; VIDEOFLOW_SAFETY_ATTEMPTS=N runs it N times,
the kill landing at a different point of the window each time."""


# ------------------------------------------------------------------------ helpers


def sightings(out: Path) -> dict[str, list[tuple[int, int]]]:
    """Per group key, every (pid, value) the Record sink was handed it with, in order."""
    seen: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for line in (out / "applications.log").read_text().splitlines():
        key, pid, _replica, value = line.split()
        seen[key].append((int(pid), int(value)))
    return dict(seen)


def applied_keys(out: Path) -> set[str]:
    """The keys whose effect (a file) the Record sink wrote."""
    return {p.name for p in out.iterdir()
            if p.name != "applications.log" and not p.name.endswith(".partial")}


def assert_applied_exactly(out: Path, expected: list[int]) -> dict[str, list[tuple[int, int]]]:
    """Every expected value applied, each under exactly one key, and every key the sink
    was handed applied: a value recorded under two keys (an output published twice
    under two identities) or a group never applied fails here. Returns sightings."""
    values = sorted(v for (v,) in applied(out))
    assert values == sorted(expected), (
        f"missing {sorted(set(expected) - set(values))[:20]}, "
        f"twice {sorted(v for v, n in Counter(values).items() if n > 1)[:20]}")
    seen = sightings(out)
    assert applied_keys(out) == {key.replace("/", "_") for key in seen}
    # One key, one value: a redelivered group is the same group.
    assert {key: {v for _, v in hits} for key, hits in seen.items()
            if len({v for _, v in hits}) > 1} == {}
    return seen


def assert_each_group_handed_once(seen: dict[str, list[tuple[int, int]]]) -> None:
    """No sink died: the sink must have been handed each group once (its leases are
    kept alive while it lives, and a processor's re-publication of a group's output
    is deduplicated by the broker), so any second sighting is a double application."""
    twice = {key: hits for key, hits in seen.items() if len(hits) > 1}
    assert twice == {}, f"{len(twice)} groups handed to the sink more than once"


def assert_clean(report: RunReport) -> None:
    """Nothing dropped, nothing dead-lettered, anywhere in the run."""
    assert {name: (n.dropped_total, n.dead_lettered) for name, n in report.nodes.items()
            if n.dropped_total or n.dead_lettered} == {}, report.format()


def assert_restarted_once(report: RunReport, name: str) -> None:
    """The run completed clean, and the node's one replica was restarted once and then
    reached its end of stream."""
    assert report.outcome == "completed", report.format()
    node = report.nodes[name]
    assert (node.restarts, node.replicas) == (1, 1)
    assert node.outcomes[f"{name}[0]"] == "ended"
    assert_clean(report)


def marker(path: Path) -> dict[str, Any]:
    """What a fault-injecting node wrote at its fault point (a SIGKILL, a SIGSTOP)."""
    assert path.exists(), "the node never reached its fault point"
    facts: dict[str, Any] = json.loads(path.read_text())
    return facts


def read_log(path: Path) -> list[tuple[int, int]]:
    """(pid, value) per line of a _Tally node's seen.log."""
    return [(int(pid), int(value)) for pid, value in
            (line.split() for line in path.read_text().splitlines())]


SMALL_STREAM = 16
"""max_msgs of a processor's output stream in the full-stream tests: far below the
sink's credit and the processor's window, so the stream, not the sink, is the bound."""


async def _shrink_stream(url: str, name: str, max_msgs: int) -> int:
    """Set a provisioned stream's max_msgs by read-modify-write (update_stream is a
    full replace, NATS_FACTS S6); returns the limit read back."""
    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1,
                            reconnect_time_wait=0.1)
    try:
        js = nc.jetstream()
        config = (await js.stream_info(name)).config
        await js.update_stream(config.evolve(max_msgs=max_msgs))
        return int((await js.stream_info(name)).config.max_msgs)
    finally:
        await nc.close()


class StreamWatcher:
    """Polls one stream's message count on a thread of its own while the flow runs:
    the most messages it was seen to hold."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name: str | None = None  # set once provisioning names the stream
        self.most = 0
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch()),
                                        daemon=True)

    def __enter__(self) -> StreamWatcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    async def _watch(self) -> None:
        nc = await nats.connect(self.url, allow_reconnect=False, max_reconnect_attempts=1,
                                reconnect_time_wait=0.1)
        try:
            js = nc.jetstream()
            while not self._stop.is_set():
                if self.name is not None:
                    try:
                        state = (await js.stream_info(self.name)).state
                    except nats.js.errors.NotFoundError:  # torn down after the run
                        return
                    self.most = max(self.most, state.messages)
                    self.polls += 1
                await asyncio.sleep(0.005)
        finally:
            await nc.close()


def shrink_when_provisioned(monkeypatch: pytest.MonkeyPatch, node: str,
                            watcher: StreamWatcher | None = None) -> list[int]:
    """Make the next run's output stream of node hold SMALL_STREAM messages. No
    user-facing option sizes a BATCH stream, so the run's own provisioning is
    followed by a read-modify-write of that stream, before any replica starts.
    Returns the list the limit read back is appended to."""
    limits: list[int] = []
    provision = topology.provision_flow_sync

    def provision_then_shrink(nats_url: str, specs: Any, flow_id: str, run_id: str,
                              *args: Any, **kwargs: Any) -> None:
        provision(nats_url, specs, flow_id, run_id, *args, **kwargs)
        name = stream_name_for(flow_id, run_id, node)
        limits.append(asyncio.run(_shrink_stream(nats_url, name, SMALL_STREAM)))
        if watcher is not None:
            watcher.name = name

    # run_flow imports provision_flow_sync from topology when it is called.
    monkeypatch.setattr(topology, "provision_flow_sync", provision_then_shrink)
    return limits


# ------------------------------------------------------- 1. processor killed mid-window


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempt", ATTEMPTS)
@pytest.mark.parametrize("pack", [False, True], ids=["alone", "packs"])
def test_a_processor_killed_with_unconfirmed_outputs_in_its_window_loses_nothing(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path, attempt: int,
    pack: bool,
) -> None:
    count = 2000
    died = tmp_path / "died"
    # Unpaced: the processor's window is busy when it dies. With packs, the producer
    # packs its bursts and the processor writes each inbound pack's outputs as one.
    numbers = Numbers(count, pack=pack)
    sink = Record(str(out))(DieMidWindow(500, str(died), pack=pack)(numbers))
    # ack_wait bounds how long the dead replica's leased inputs take to come back.
    report = Flow([numbers], [sink], BATCH, name="killproc").run(
        nats_server.url, view=False, ack_wait=3)
    # It died holding groups whose outputs were sent but not yet confirmed, so their
    # inputs were never acknowledged: the replacement processes them again.
    facts = marker(died)
    assert facts["in_flight"] >= 1
    if pack:  # it died with packs of outputs in flight
        assert facts["packs"] >= 1, facts
    assert_restarted_once(report, "die_mid_window")
    seen = assert_applied_exactly(out, list(range(count)))
    # The replacement's outputs for those groups carry the dead process's msg ids (its
    # packs, the dead one's pack ids), so the broker keeps one copy: the sink, which
    # never died, is handed each group once.
    assert_each_group_handed_once(seen)
    assert report.nodes["record"].processed == count


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_processor_killed_while_its_outputs_wait_on_a_full_stream_loses_nothing(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, attempt: int,
) -> None:
    """The death that loses data if a group's inputs were settled before its outputs
    were stored: the processor's stream is full, so outputs in its window were
    refused and wait for the ladder to send them again when it dies."""
    count = 600
    died = tmp_path / "died"
    limits = shrink_when_provisioned(monkeypatch, "die_mid_window")
    numbers = Numbers(count)
    # The paced sink keeps the small stream full while the processor runs ahead.
    processor = DieMidWindow(300, str(died), refused=True)
    sink = Record(str(out), pace=0.003)(processor(numbers))
    report = Flow([numbers], [sink], BATCH, name="killfull").run(
        nats_server.url, view=False, ack_wait=3)
    assert limits == [SMALL_STREAM]
    death = marker(died)
    assert death["in_flight"] >= 1 and death["refused"] >= 1, death
    assert_restarted_once(report, "die_mid_window")
    seen = assert_applied_exactly(out, list(range(count)))
    assert_each_group_handed_once(seen)


# ------------------------------------------------------------ 2. sink killed mid-window


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_sink_killed_with_settlements_in_flight_applies_every_group_once(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path, attempt: int,
) -> None:
    count = 2000
    died = tmp_path / "died"
    numbers = Numbers(count)
    sink = DieMidWindowRecord(str(out), 500, str(died))(numbers)
    report = Flow([numbers], [sink], BATCH, name="killsink").run(
        nats_server.url, view=False, ack_wait=3)
    death = marker(died)
    assert death["settling"] >= 1  # it died with acknowledgements unanswered
    assert_restarted_once(report, "die_mid_window_record")
    seen = assert_applied_exactly(out, list(range(count)))
    dead = death["pid"]
    pids = {pid for hits in seen.values() for pid, _ in hits}
    assert dead in pids and len(pids) == 2  # the dead process and its one replacement
    # A group may be handed again only if the dead process was handed it (and died
    # before its acknowledgement was applied), and then only once, to the replacement.
    again = {key: hits for key, hits in seen.items() if len(hits) > 1}
    wrong = {key: hits for key, hits in again.items()
             if len(hits) != 2 or hits[0][0] != dead or hits[1][0] == dead}
    assert wrong == {}, f"groups applied twice: {wrong}"
    # The group it died on was applied and never acknowledged: it must come back.
    last = [key for key, hits in seen.items() if hits[0] == (dead, death["value"])]
    assert len(last) == 1 and last[0] in again
    # Only what the broker had leased to the dead process can come back.
    credit = node_credit(1, False, ["numbers"], None, BATCH)
    assert len(again) <= credit


# ----------------------------------------------------- 3. a BATCH stream fills mid-window


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_batch_stream_that_fills_mid_window_is_backpressure_not_loss(
    nats_server: embedded.EmbeddedServer, out: Path, monkeypatch: pytest.MonkeyPatch,
    attempt: int,
) -> None:
    count = 400
    url = nats_server.url
    with StreamWatcher(url) as watcher:
        limits = shrink_when_provisioned(monkeypatch, "scale", watcher)
        numbers = Numbers(count)
        # The sink is paced: the processor outruns it, so its stream fills and its
        # window meets refusals (a full DiscardPolicy.NEW stream) mid-flight.
        sink = Record(str(out), pace=0.004)(Scale(2)(numbers))
        report = Flow([numbers], [sink], BATCH, name="fullstream").run(
            url, view=False, ack_wait=30)
    assert limits == [SMALL_STREAM]
    assert watcher.polls > 0
    # The stream was seen full: the processor was ahead and had to wait for room.
    assert watcher.most == SMALL_STREAM
    assert report.outcome == "completed", report.format()
    assert_clean(report)
    scale = report.nodes["scale"]
    # Backpressure, not failure: no group failed its publication, every input was
    # processed and emitted once.
    assert (scale.processed, scale.emitted, scale.failed, scale.restarts) == (
        count, count, 0, 0)
    assert dlq_list(url, "fullstream") == []
    seen = assert_applied_exactly(out, [2 * i for i in range(count)])
    assert_each_group_handed_once(seen)


# ------------------------------------------------------------ 4. a frozen broker


@contextlib.contextmanager
def thaw_later(server: embedded.EmbeddedServer, frozen: Path,
               seconds: float) -> Iterator[list[float]]:
    """On a thread: once the node that freezes the broker wrote its marker, wait until
    the server is reported stopped, keep it stopped for `seconds`, then SIGCONT it.
    Yields a list the thread fills with the monotonic stop and thaw times."""
    assert server.process is not None
    pid = server.process.pid
    times: list[float] = []
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            if frozen.exists():
                # The node's SIGSTOP is asynchronous: wait until the server is
                # reported stopped (WNOHANG polls, so an exit is never waited on).
                _, status = os.waitpid(pid, os.WUNTRACED | os.WNOHANG)
                if status and os.WIFSTOPPED(status):
                    times.append(time.monotonic())
                    time.sleep(seconds)
                    os.kill(pid, signal.SIGCONT)
                    times.append(time.monotonic())
                    return
            time.sleep(0.002)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield times
    finally:
        done.set()
        thread.join(timeout=seconds + 10)
        os.kill(pid, signal.SIGCONT)  # never leave the test's server stopped


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_broker_frozen_mid_window_resolves_every_outcome_and_loses_nothing(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path, attempt: int,
) -> None:
    count = 2000
    frozen = tmp_path / "frozen"
    assert nats_server.process is not None
    numbers = Numbers(count)
    # The processor freezes the broker itself, at an input where its window holds
    # outputs sent but not confirmed: their receipts cannot come until the thaw.
    processor = FreezeBrokerMidWindow(500, str(frozen), nats_server.process.pid,
                                      reader_log=str(out / "applications.log"))
    sink = Record(str(out))(processor(numbers))
    with thaw_later(nats_server, frozen, 3.0) as times:
        # ack_wait above the freeze: the ladder (a receipt asked after again by
        # observe_publication) has room to resolve every outcome once it thaws.
        report = Flow([numbers], [sink], BATCH, name="frozen").run(
            nats_server.url, view=False, ack_wait=10)
    assert marker(frozen)["in_flight"] >= 1
    assert len(times) == 2 and times[1] - times[0] >= 3.0
    assert report.outcome == "completed", report.format()
    assert_clean(report)
    assert all(n.restarts == 0 for n in report.nodes.values()), report.format()
    node = report.nodes["freeze_broker_mid_window"]
    assert (node.processed, node.emitted, node.failed) == (count, count, 0)
    seen = assert_applied_exactly(out, list(range(count)))
    # No process died: each group reached the sink once (an output re-sent after
    # the thaw is deduplicated at the broker, and the sink's leases were kept alive).
    assert_each_group_handed_once(seen)


# ------------------------------------------------- 5. checkpointing nodes restarted


def _tally_files(directory: Path, dead: int) -> tuple[list[int], list[int], list[int], int]:
    """(values the dead process was handed, values its replacement's restored state
    held, values the replacement was handed, the replacement's pid), checking that
    exactly two processes ran, the first starting from nothing."""
    restored = [json.loads(line) for line in
                (directory / "restored.log").read_text().splitlines()]
    assert len(restored) == 2, restored
    assert restored[0] == {"pid": dead, "values": []}  # the first process began empty
    replacement = restored[1]["pid"]
    assert replacement != dead
    seen = read_log(directory / "seen.log")
    assert {pid for pid, _ in seen} <= {dead, replacement}
    return ([v for pid, v in seen if pid == dead], restored[1]["values"],
            [v for pid, v in seen if pid == replacement], replacement)


def _assert_one_prefix(restored: list[int], still_seen: list[int], count: int) -> None:
    """The restored state and the inputs the replacement still saw partition the
    inputs: none counted twice, none missed."""
    assert len(set(restored)) == len(restored)
    assert len(set(still_seen)) == len(still_seen), "the replacement saw an input twice"
    assert set(restored) & set(still_seen) == set(), "an input applied twice"
    assert set(restored) | set(still_seen) == set(range(count)), "an input missed"


def _assert_final_state(directory: Path, replacement: int, count: int) -> None:
    final = json.loads((directory / "final.json").read_text())
    assert final["pid"] == replacement
    # Every value applied exactly once to the state that survived.
    assert {v: n for v, n in enumerate(final["counts"]) if n != 1} == {}
    assert sum(v * n for v, n in enumerate(final["counts"])) == sum(range(count))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_checkpointing_consumer_restarted_mid_stream_resumes_one_committed_prefix(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path, attempt: int,
) -> None:
    count, at = 300, 120
    died = tmp_path / "died"
    numbers = Numbers(count)
    sink = CheckpointedTally(count, str(out), at, str(died))(numbers)
    report = Flow([numbers], [sink], BATCH, name="ckptsink").run(
        nats_server.url, view=False, ack_wait=3)  # the default ledger: kv
    death = marker(died)
    assert_restarted_once(report, "checkpointed_tally")
    handed_dead, restored, still_seen, replacement = _tally_files(out, death["pid"])
    assert handed_dead[-1] == at and len(set(handed_dead)) == len(handed_dead)
    # It checkpointed every input before the next, and died after its last input's
    # checkpoint committed: the restored state holds exactly what it was handed, the
    # input it died on included (that input, redelivered unacknowledged, is covered by
    # the checkpoint and must not reach the node again).
    assert sorted(restored) == sorted(handed_dead)
    assert at not in still_seen
    _assert_one_prefix(restored, still_seen, count)
    _assert_final_state(out, replacement, count)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_a_checkpointing_processor_restarted_mid_stream_resumes_one_committed_prefix(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path, attempt: int,
) -> None:
    count, at = 300, 120
    died = tmp_path / "died"
    state = tmp_path / "state"
    state.mkdir()
    numbers = Numbers(count)
    sink = Record(str(out))(CheckpointedPassThrough(count, str(state), at, str(died))(numbers))
    report = Flow([numbers], [sink], BATCH, name="ckptproc").run(
        nats_server.url, view=False, ack_wait=3)
    death = marker(died)
    assert_restarted_once(report, "checkpointed_pass_through")
    handed_dead, restored, still_seen, replacement = _tally_files(state, death["pid"])
    assert handed_dead[-1] == at and len(set(handed_dead)) == len(handed_dead)
    # Each input's checkpoint rode with its output and committed once that output was
    # accepted, before the next input; it died on `at` before applying it. So the
    # restored state is everything it was handed but `at`, and `at` comes back.
    assert sorted(restored) == sorted(set(handed_dead) - {at})
    assert at in still_seen
    _assert_one_prefix(restored, still_seen, count)
    _assert_final_state(state, replacement, count)
    # Downstream: every output once (a re-sent output deduplicated at the broker).
    seen = assert_applied_exactly(out, list(range(count)))
    assert_each_group_handed_once(seen)
