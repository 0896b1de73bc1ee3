"""videoflow.ops and the operator CLI against a real nats-server: status, dlq list / show /
replay / purge, teardown."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from videoflow import ops
from videoflow.backends import shm_payload
from videoflow.backends.messaging import Known, Unknown
from videoflow.broker import server as embedded
from videoflow.broker.loop import registered
from videoflow.cli import ls
from videoflow.cli.ops import register
from videoflow.core.compiler import NodeSpec
from videoflow.core.constants import BATCH
from videoflow.core.naming import (
    dlq_stream_name,
    dlq_subject_for,
    sanitize,
    stream_name_for,
    subject_for,
)
from videoflow.core.policies import PoisonMessage
from videoflow.errors import BrokerUnavailable
from videoflow.messaging.dead_letters import dead_letter_for, encode_dead_letter
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.messaging.topology import provision_flow_sync
from videoflow.ops import run_records
from videoflow.ops.dead_letters import PAGE
from videoflow.ops.runs import list_flows
from videoflow.wire.serialization import decode_envelope, encode_envelope

pytestmark = pytest.mark.timeout(90)

FLOW, RUN = "flow", "run"
SPECS = [NodeSpec("cam", "producer"), NodeSpec("sink", "consumer", parents=("cam",))]
PUBLISHED = 5
POISONED = (0, 1)  # the messages the sink dead-letters


def messenger(url: str, node: str, parents: list[str], run: str = RUN) -> NATSMessenger:
    return NATSMessenger(SimpleNamespace(name=node), parents, url, FLOW, BATCH, run,
                         ack_wait=30, eos_quiescence_ms=200)


@dataclass(frozen=True)
class Scenario:
    url: str
    server: embedded.EmbeddedServer


@pytest.fixture
def scenario(nats_server: embedded.EmbeddedServer) -> Scenario:
    """Run `run` (cam -> sink): five messages published, the sink dead-letters the first
    two as poison and settles nothing else. A second run, `run-x`, exists beside it so
    that a name-prefix match would show."""
    provision_flow_sync(nats_server.url, SPECS, FLOW, RUN, BATCH, timeout=30)
    provision_flow_sync(nats_server.url, SPECS, FLOW, "run-x", BATCH, timeout=30)
    cam = messenger(nats_server.url, "cam", [])
    try:
        for n in range(PUBLISHED):
            cam.publish_message(n)
    finally:
        cam.close()
    sink = messenger(nats_server.url, "sink", ["cam"])
    try:
        for n in POISONED:
            message = sink.receive_message()["cam"]["message"]
            assert message == n
            sink.fail_inputs(PoisonMessage(f"frame {message} is corrupt"))
    finally:
        sink.close()
    return Scenario(nats_server.url, nats_server)


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="videoflow")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def eventually(read: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not read():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


# ------------------------------------------------------------------------------ status


def test_status_reports_the_run_s_own_streams_backlog_and_its_two_dead_letters(
    scenario: Scenario,
) -> None:
    remaining = PUBLISHED - len(POISONED)

    def settled() -> bool:  # the terminations reach the INTEREST stream asynchronously
        streams = ops.run_status(scenario.url, FLOW, RUN, timeout=5).streams
        return not isinstance(streams, Unknown) and streams[0].messages == Known(remaining)

    eventually(settled)
    status = ops.run_status(scenario.url, FLOW, RUN, timeout=5)
    assert status.exists == Known(True)
    assert not isinstance(status.streams, Unknown)
    # Only the producer publishes; run-x's vf-flow-run-x-cam is not this run's.
    (cam,) = status.streams
    assert (cam.name, cam.node, cam.retention) == (stream_name_for(FLOW, RUN, "cam"), "cam",
                                                   "interest")
    assert cam.messages == Known(remaining)
    assert isinstance(cam.bytes, Known) and cam.bytes.value > 0
    assert cam.last_seq == Known(PUBLISHED)
    assert not isinstance(cam.durables, Unknown)
    durables = {d.name: d for d in cam.durables}
    sink = durables["sink--from--cam"]
    assert sink.kind == "durable"
    assert isinstance(sink.pending, Known) and isinstance(sink.ack_pending, Known)
    assert sink.pending.value + sink.ack_pending.value == remaining
    assert isinstance(sink.unresolved, Unknown) and sink.unresolved.reason == "unread"
    assert "cam--eos--anchor" in durables
    assert status.dlq_count == Known(len(POISONED))
    assert ops.run_status(scenario.url, FLOW, "run-x", timeout=5).dlq_count == Known(0)


def test_status_of_a_run_with_no_streams_says_so_instead_of_raising(
    nats_server: embedded.EmbeddedServer,
) -> None:
    status = ops.run_status(nats_server.url, FLOW, "never", timeout=5)
    assert status.streams == ()
    assert status.exists == Known(False)
    assert status.dlq_count == Unknown("missing", status.dlq_count.detail)  # no DLQ yet


def test_status_of_an_unreachable_broker_raises_broker_unavailable_within_the_timeout(
    closed_port_url: str,
) -> None:
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="cannot connect"):
        ops.run_status(closed_port_url, FLOW, RUN, timeout=2)
    assert time.monotonic() - started < 3


def test_status_of_a_frozen_broker_is_unavailable_and_never_zero(
    scenario: Scenario,
    freeze: Callable[[embedded.EmbeddedServer], contextlib.AbstractContextManager[None]],
) -> None:
    async def frozen_status() -> ops.RunStatus:
        nc = await nats.connect(scenario.url, allow_reconnect=False,
                                max_reconnect_attempts=1, reconnect_time_wait=0.1)
        try:
            with freeze(scenario.server):
                return await ops.run_status_async(nc, FLOW, RUN, timeout=1)
        finally:
            await nc.close()

    status = asyncio.run(frozen_status())
    assert isinstance(status.streams, Unknown) and status.streams.reason == "timeout"
    assert isinstance(status.exists, Unknown)
    assert isinstance(status.dlq_count, Unknown) and status.dlq_count.reason == "timeout"
    started = time.monotonic()
    with freeze(scenario.server), pytest.raises(BrokerUnavailable, match="timeout"):
        ops.run_status(scenario.url, FLOW, RUN, timeout=1.5)
    assert time.monotonic() - started < 3


# --------------------------------------------------------------------------- dlq list


def test_dlq_list_and_show_decode_node_parent_reason_and_error(scenario: Scenario) -> None:
    entries = ops.dlq_list(scenario.url, FLOW, run_id=RUN, timeout=5)
    assert len(entries) == 2
    for entry, n in zip(entries, POISONED, strict=True):
        record = entry.record
        assert record is not None
        assert entry.subject == dlq_subject_for(FLOW, RUN, "sink")
        assert (record.run_id, record.node, record.parent, record.reason) == (
            RUN, "sink", "cam", "poison")
        assert record.error_type.endswith("PoisonMessage")
        assert record.error_message == f"frame {n} is corrupt"
        assert decode_envelope(record.envelope)["message"] == n
    assert ops.dlq_list(scenario.url, FLOW, node="cam", timeout=5) == []
    assert ops.dlq_list(scenario.url, FLOW, run_id="run-x", timeout=5) == []
    assert [e.seq for e in ops.dlq_list(scenario.url, FLOW, limit=1, timeout=5)] == [
        entries[0].seq]
    shown = ops.dlq_show(scenario.url, FLOW, entries[1].seq, timeout=5)
    assert shown == entries[1]


def test_dlq_list_lists_an_undecodable_record_with_its_seq_instead_of_skipping_it(
    scenario: Scenario,
) -> None:
    async def publish_junk() -> int:
        nc = await nats.connect(scenario.url)
        try:
            ack = await nc.jetstream().publish(dlq_subject_for(FLOW, RUN, "sink"), b"junk")
            return ack.seq
        finally:
            await nc.close()

    junk_seq = asyncio.run(publish_junk())
    entries = ops.dlq_list(scenario.url, FLOW, timeout=5)
    assert [e.decodable for e in entries] == [True, True, False]
    assert entries[-1].seq == junk_seq and "not a dead-letter record" in entries[-1].error
    report = ops.dlq_replay(scenario.url, FLOW, [junk_seq], timeout=5)
    assert report.failed == (junk_seq,)
    assert "undecodable" in report.results[0].reason


def test_dlq_list_reads_3000_records_a_page_per_round_trip_within_a_short_timeout(
        nats_server: embedded.EmbeddedServer, capsys: pytest.CaptureFixture[str]) -> None:
    count, flow = 3000, "many"
    provision_flow_sync(nats_server.url, SPECS, flow, RUN, BATCH, timeout=30)
    envelope = encode_envelope("frame", trace_id="t", seq=1)

    async def fill_and_watch() -> tuple[Any, list[str]]:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        subject = dlq_subject_for(flow, RUN, "sink")
        for start in range(0, count, 500):
            acks = [js.publish(subject, encode_dead_letter(dead_letter_for(
                flow, RUN, "sink", "cam", n + 1, 1, "poison", envelope, ValueError(str(n)),
                1000.0 + n))) for n in range(start, start + 500)]
            await asyncio.gather(*acks)
        # Every JetStream API request from here on, whoever makes it.
        requests: list[str] = []

        async def seen(msg: Any) -> None:
            requests.append(msg.subject)

        await nc.subscribe("$JS.API.>", cb=seen)
        await registered(nc, 5)
        return nc, requests

    loop = asyncio.new_event_loop()
    try:
        nc, requests = loop.run_until_complete(fill_and_watch())
        started = time.monotonic()
        entries = ops.dlq_list(nats_server.url, flow, timeout=2.0)
        took = time.monotonic() - started
        loop.run_until_complete(nc.flush())
        loop.run_until_complete(asyncio.sleep(0.2))  # the last requests' copies arrive
        loop.run_until_complete(nc.close())
    finally:
        loop.close()
    assert [e.seq for e in entries] == list(range(1, count + 1)), took
    assert [e.record.error_message for e in entries if e.record] == [
        str(n) for n in range(count)]
    fetches = [r for r in requests if r.startswith("$JS.API.CONSUMER.MSG.NEXT.")]
    gets = [r for r in requests if r.startswith("$JS.API.STREAM.MSG.GET.")]
    # A page per round trip (PAGE records), not one request per record.
    assert gets == [] and 1 <= len(fetches) <= count // PAGE + 3, requests[:20]
    # The reader it made is gone once it is done: nothing left behind on the stream.
    assert any(r.startswith("$JS.API.CONSUMER.DELETE.") for r in requests), requests[-5:]
    # Paging: --limit, then --after the last one shown.
    first = ops.dlq_list(nats_server.url, flow, limit=1000, timeout=2.0)
    second = ops.dlq_list(nats_server.url, flow, limit=1000, after=first[-1].seq,
                          timeout=2.0)
    assert [e.seq for e in first + second] == list(range(1, 2001))
    assert cli(["dlq", "list", "--nats-url", nats_server.url, "--flow", flow,
                "--limit", "2", "--after", "2996"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:]] == ["2997", "2998", "(the"]
    assert out[-1] == "(the first 2; the next page: --after 2998)"
    # The last page says there is no next one by naming none.
    assert cli(["dlq", "list", "--nats-url", nats_server.url, "--flow", flow,
                "--limit", "2", "--after", "2998"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:]] == ["2999", "3000"]


def test_dlq_show_prints_when_in_utc_and_the_decoded_input(
        scenario: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    before = time.time()
    entries = ops.dlq_list(scenario.url, FLOW, run_id=RUN, timeout=5)
    record = entries[1].record
    assert record is not None
    assert cli(["dlq", "show", "--nats-url", scenario.url, "--flow", FLOW,
                str(entries[1].seq)]) == 0
    shown = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    shown = {key: value.strip() for key, value in shown.items()}
    # dead_lettered_at in UTC to the millisecond, never raw epoch seconds.
    stamp = datetime.datetime.fromtimestamp(record.dead_lettered_at, datetime.timezone.utc)
    assert shown["dead-lettered"] == (stamp.strftime("%Y-%m-%d %H:%M:%S.")
                                      + f"{stamp.microsecond // 1000:03d} UTC")
    assert abs(record.dead_lettered_at - before) < 600
    kept = decode_envelope(record.envelope)
    assert shown["input"] == repr(POISONED[1]) == repr(kept["message"])
    assert shown["input trace"] == f"{kept['trace_id']} (seq {kept['seq']})"
    assert shown["input from"] == "cam (replica 0)"
    assert cli(["dlq", "show", "--nats-url", scenario.url, "--flow", FLOW,
                str(entries[1].seq), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["dead_lettered_at"] == record.dead_lettered_at
    assert document["dead_lettered_at_utc"] == shown["dead-lettered"]
    assert document["input"]["message"] == repr(POISONED[1])
    assert document["input"]["trace_id"] == kept["trace_id"]


def test_dlq_show_of_a_missing_seq_raises_dead_letter_not_found(scenario: Scenario) -> None:
    with pytest.raises(ops.DeadLetterNotFound, match="no dead letter at seq 99") as caught:
        ops.dlq_show(scenario.url, FLOW, 99, timeout=5)
    assert caught.value.seq == 99
    with pytest.raises(ops.DeadLetterNotFound, match="no dead-letter stream vf-other-dlq"):
        ops.dlq_list(scenario.url, "other", timeout=5)


# ------------------------------------------------------------------------- dlq replay


async def _read_at(url: str, stream: str, subject: str, seq: int) -> bytes:
    """A fresh ephemeral consumer's first message at or after seq."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            subject, stream=stream,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                  opt_start_seq=seq))
        (msg,) = await sub.fetch(1, timeout=5)
        await msg.ack()
        return bytes(msg.data)
    finally:
        await nc.close()


def test_replay_puts_the_envelope_back_on_the_parent_stream_once_within_the_window(
    scenario: Scenario,
) -> None:
    entries = ops.dlq_list(scenario.url, FLOW, run_id=RUN, timeout=5)
    first = ops.dlq_replay(scenario.url, FLOW, [entries[0].seq], timeout=5)
    (result,) = first.results
    assert first.replayed == (entries[0].seq,)
    assert result.subject == subject_for(FLOW, RUN, "cam")
    assert result.stream_seq is not None and result.stream_seq > PUBLISHED
    received = asyncio.run(_read_at(scenario.url, stream_name_for(FLOW, RUN, "cam"),
                                    result.subject, result.stream_seq))
    assert entries[0].record is not None and received == entries[0].record.envelope
    again = ops.dlq_replay(scenario.url, FLOW, run_id=RUN, timeout=5)
    assert again.duplicates == (entries[0].seq,)  # same msg id, inside the window
    assert again.replayed == (entries[1].seq,)
    assert {r.stream_seq for r in again.results if r.outcome == "duplicate"} == {
        result.stream_seq}
    # Replay never removes the record.
    assert len(ops.dlq_list(scenario.url, FLOW, run_id=RUN, timeout=5)) == 2
    missing = ops.dlq_replay(scenario.url, FLOW, [99], timeout=5)
    assert missing.failed == (99,) and "no dead letter at seq 99" in missing.results[0].reason


def test_teardown_removes_the_run_s_streams_keeps_the_dlq_and_replay_then_fails(
    scenario: Scenario, capsys: pytest.CaptureFixture[str],
) -> None:
    cleanup = ops.teardown(scenario.url, FLOW, RUN, timeout=5)
    assert cleanup.complete
    assert cleanup.removed == (stream_name_for(FLOW, RUN, "cam"),)
    assert ops.run_status(scenario.url, FLOW, RUN, timeout=5).streams == ()
    # run-x is untouched and the flow's dead letters survive.
    other = ops.run_status(scenario.url, FLOW, "run-x", timeout=5)
    assert not isinstance(other.streams, Unknown) and len(other.streams) == 1
    assert ops.run_status(scenario.url, FLOW, RUN, timeout=5).dlq_count == Known(2)
    report = ops.dlq_replay(scenario.url, FLOW, run_id=RUN, timeout=5)
    assert len(report.failed) == 2
    assert all(ops.TORN_DOWN in r.reason for r in report.results)
    assert cli(["teardown", "--nats-url", scenario.url, "--flow", FLOW, "--run", RUN,
                "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "flow": FLOW, "run": RUN, "removed": [], "remaining": [], "complete": True}


def test_teardown_reclaims_the_run_s_shared_memory_and_its_empty_folders(
    scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A kept run (stopped twice, its engine killed) leaves its folder in /dev/shm; a
    # teardown deleted its streams and left the folder, empty or not, for good.
    monkeypatch.setattr(shm_payload, "shm_root", lambda: tmp_path / "shm")
    folder = tmp_path / "shm" / sanitize(FLOW) / sanitize(RUN)
    store = shm_payload.SharedMemoryPayloadStore(folder)
    unread = store.put(b"x" * 100, ["sink"], "pub-1")
    assert store.refs() == (unread,)
    other = tmp_path / "shm" / sanitize(FLOW) / "run-x"
    shm_payload.SharedMemoryPayloadStore(other).put(b"y", ["sink"], "pub-2")
    assert ops.teardown(scenario.url, FLOW, RUN, timeout=5).complete
    assert not folder.exists()
    assert other.is_dir()  # another run's, and so its flow's folder, stay
    assert ops.teardown(scenario.url, FLOW, "run-x", timeout=5).complete
    assert not (tmp_path / "shm" / sanitize(FLOW)).exists()


def test_teardown_keeps_the_payloads_a_dead_letter_pins(
    scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shm_payload, "shm_root", lambda: tmp_path / "shm")
    folder = tmp_path / "shm" / sanitize(FLOW) / sanitize(RUN)
    store = shm_payload.SharedMemoryPayloadStore(folder)
    pinned = store.put(b"x" * 100, ["sink"], "pub-1")
    assert store.acquire(pinned, "dlq/sink", ttl_seconds=3600)
    store.put(b"z" * 100, ["sink"], "pub-2")
    assert ops.teardown(scenario.url, FLOW, RUN, timeout=5).complete
    assert shm_payload.SharedMemoryPayloadStore(folder).refs() == (pinned,)


def test_a_run_s_record_outlives_its_teardown_and_ls_lists_it_as_ended(
    scenario: Scenario,
) -> None:
    started = run_records.started_record(FLOW, RUN)
    run_records.record_run(scenario.url, started, timeout=5)
    (live,) = [r for f in list_flows(scenario.url, flow_id=FLOW, timeout=5) for r in f.runs
               if r.run_id == RUN]
    assert live.state == Known("idle") and live.record == started
    ended = msgspec.structs.replace(started, outcome="completed",
                                    ended_at=started.started_at + 2, torn_down=True)
    run_records.record_run(scenario.url, ended, timeout=5)
    assert ops.teardown(scenario.url, FLOW, RUN, timeout=5).complete
    runs = {r.run_id: r for f in list_flows(scenario.url, timeout=5) for r in f.runs}
    assert runs[RUN].state == Known("ended") and runs[RUN].record == ended
    assert (runs[RUN].streams, runs[RUN].messages) == (0, 0)
    assert runs["run-x"].state == Known("idle") and runs["run-x"].record is None
    assert run_records.run_record(scenario.url, FLOW, RUN, timeout=5) == ended
    assert run_records.run_record(scenario.url, FLOW, "run-x", timeout=5) is None
    assert run_records.run_record(scenario.url, "no-flow", RUN, timeout=5) is None
    assert run_records.run_records(scenario.url, FLOW, timeout=5) == [ended]


def test_ls_shows_a_flow_s_latest_ended_runs_and_with_flow_all_of_them(
    nats_server: embedded.EmbeddedServer, capsys: pytest.CaptureFixture[str],
) -> None:
    for n in range(7):
        record = run_records.RunRecord(flow_id="rec", run_id=f"r{n}", outcome="completed",
                                       started_at=1.0e9 + n, ended_at=1.0e9 + n + 1)
        run_records.record_run(nats_server.url, record, timeout=5)
    assert cli_ls(["--nats-url", nats_server.url]) == 0
    shown = capsys.readouterr().out
    assert [f"r{n}" in shown for n in range(7)] == [False, False] + [True] * 5
    assert "rec: 2 earlier ended runs (videoflow ls --flow rec)" in shown
    assert "2001-09-09 01:46:45Z" in shown  # r4's end, in UTC
    assert cli_ls(["--nats-url", nats_server.url, "--flow", "rec"]) == 0
    every = capsys.readouterr().out
    assert [line.split()[:3] for line in every.splitlines()[1:]] == [
        ["rec", f"r{n}", "completed"] for n in range(7)]
    assert "earlier" not in every


def cli_ls(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="videoflow")
    ls.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ls", *argv])
    code: int = args.func(args)
    return code


# -------------------------------------------------------------------------- dlq purge


def test_purge_refuses_without_yes_and_removes_the_run_s_records_with_it(
    scenario: Scenario, capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["dlq", "purge", "--nats-url", scenario.url, "--flow", FLOW, "--run", RUN]
    assert cli(base) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        "videoflow: error: dlq purge deletes dead letters for good; add --yes to confirm")
    assert captured.out == ""
    assert len(ops.dlq_list(scenario.url, FLOW, timeout=5)) == 2
    assert cli([*base, "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"purged": 2}
    assert ops.dlq_list(scenario.url, FLOW, timeout=5) == []
    assert ops.dlq_purge(scenario.url, FLOW, seqs=[1, 2], timeout=5) == 0  # already gone


def test_purge_by_seq_removes_exactly_that_record(scenario: Scenario) -> None:
    first, second = ops.dlq_list(scenario.url, FLOW, timeout=5)
    assert ops.dlq_purge(scenario.url, FLOW, seqs=[first.seq], timeout=5) == 1
    assert ops.dlq_list(scenario.url, FLOW, timeout=5) == [second]


# -------------------------------------------------------------------------------- CLI


def test_cli_status_prints_tables_and_json_with_the_dead_letter_count(
    scenario: Scenario, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(["status", "--nats-url", scenario.url, "--flow", FLOW, "--run", RUN]) == 0
    out = capsys.readouterr().out
    assert stream_name_for(FLOW, RUN, "cam") in out and "sink--from--cam" in out
    assert f"dead letters of this run ({dlq_stream_name(FLOW)}): 2" in out
    assert "unknown (unread)" in out
    assert cli(["status", "--nats-url", scenario.url, "--flow", FLOW, "--run", RUN,
                "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["dlq_count"] == 2 and document["exists"] is True
    (stream,) = document["streams"]
    sink = next(d for d in stream["durables"] if d["name"] == "sink--from--cam")
    assert sink["unresolved"]["unknown"] == "unread"
    assert cli(["dlq", "list", "--nats-url", scenario.url, "--flow", FLOW, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["node"], e["parent"], e["reason"]) for e in listed] == [
        ("sink", "cam", "poison")] * 2
    assert cli(["dlq", "show", "--nats-url", scenario.url, "--flow", FLOW, "99"]) == 1
    assert capsys.readouterr().err.startswith("videoflow: error: no dead letter at seq 99")


def test_cli_against_an_unreachable_broker_prints_one_error_line(
    closed_port_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli(["status", "--nats-url", closed_port_url, "--flow", FLOW, "--run", RUN,
                "--timeout", "2"])
    assert code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("videoflow: error: cannot connect to")
