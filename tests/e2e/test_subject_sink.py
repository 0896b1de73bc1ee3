"""SubjectSink on a real nats-server: flows whose end is a plain NATS subject, read back
by plain nats-py (no videoflow code on the reading side), in each encoding, into a
JetStream stream (each group once, even sent twice) and on core NATS."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np
import pytest
from flow_nodes import AsFrame, FailOnceSink, Numbers, StallOnce

from videoflow.broker import server as embedded
from videoflow.broker.loop import registered
from videoflow.core.constants import BATCH
from videoflow.flow import Flow
from videoflow.io import (
    DTYPE_HEADER,
    EVENT_TIME_HEADER,
    SHAPE_HEADER,
    SubjectSink,
    SubjectSource,
)
from videoflow.messaging.tracing import parse_traceparent
from videoflow.wire.numpy_ext import ext_hook

pytestmark = pytest.mark.timeout(120)

COUNT = 20


async def stream_messages(url: str, stream: str) -> list[Any]:
    """Every message the stream holds, in order, read with plain nats-py."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        last = (await js.stream_info(stream)).state.last_seq
        return [await js.get_msg(stream, seq) for seq in range(1, last + 1)]
    finally:
        await nc.close()


async def add_stream(url: str, name: str, subjects: list[str], **config: Any) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=name, subjects=subjects, **config)
    finally:
        await nc.close()


def test_a_flow_writes_raw_frames_into_a_stream_a_plain_reader_decodes(
        nats_server: embedded.EmbeddedServer) -> None:
    url = nats_server.url
    asyncio.run(add_stream(url, "PLAIN", ["plain.>"]))
    numbers = Numbers(COUNT, name="numbers")
    frames = AsFrame(name="frames")(numbers)
    sink = SubjectSink("plain.frames", encoding="bytes", name="out")(frames)
    report = Flow([numbers], [sink], BATCH, name="sinkraw").run(url, view=False)
    assert report.outcome == "completed", report.format()
    held = asyncio.run(stream_messages(url, "PLAIN"))
    assert len(held) == COUNT  # every group once
    seen, ids, traces = [], set(), set()
    for msg in held:
        headers = msg.headers or {}
        shape = tuple(int(d) for d in headers[SHAPE_HEADER].split(","))
        frame = np.frombuffer(msg.data, dtype=np.dtype(headers[DTYPE_HEADER])).reshape(shape)
        assert frame.shape == (2, 3) and frame.dtype == np.uint8
        value = int(frame[0, 0])
        assert (frame == value).all()
        # The number's event time, as the producer set it.
        assert float(headers[EVENT_TIME_HEADER]) == 1000.0 + value
        parsed = parse_traceparent(headers["traceparent"])
        assert parsed is not None
        seen.append(value)
        ids.add(headers["Nats-Msg-Id"])
        traces.add(parsed[0])
    assert sorted(seen) == list(range(COUNT))
    assert len(ids) == COUNT and all(i.startswith("out:") for i in ids)
    assert len(traces) == COUNT  # each number its own trace, continued to the subject


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_a_flow_writes_a_core_subject_a_plain_subscriber_reads(
        encoding: str, nats_server: embedded.EmbeddedServer) -> None:
    url = nats_server.url
    got: list[Any] = []

    async def run() -> None:
        nc = await nats.connect(url)
        sub = await nc.subscribe("loose.numbers")
        await registered(nc, 5)
        numbers = Numbers(COUNT, name="numbers")
        sink = SubjectSink("loose.numbers", encoding=encoding, name="out")(numbers)
        flow = Flow([numbers], [sink], BATCH, name=f"sink{encoding}")
        report = await asyncio.to_thread(flow.run, url, view=False)
        assert report.outcome == "completed", report.format()
        while True:
            try:
                got.append(await sub.next_msg(timeout=1))
            except nats.errors.TimeoutError:
                break
        await nc.close()

    asyncio.run(run())
    decode = (lambda b: msgspec.msgpack.decode(b, ext_hook=ext_hook)) if encoding == "msgpack" \
        else json.loads
    values = [decode(m.data) for m in got]
    assert sorted(values) == list(range(COUNT))
    for msg, value in zip(got, values, strict=True):
        assert float(msg.headers[EVENT_TIME_HEADER]) == 1000.0 + value


FAST_RETRY = {"max_retries": 2, "backoff": {"base_ms": 50.0, "factor": 1.0, "max_ms": 50.0}}


def test_a_group_sent_again_is_held_once(nats_server: embedded.EmbeddedServer) -> None:
    # The sink fails each group after its message went out (as a crash between the
    # stream's accept and the input's ack would): the group comes again, is sent
    # again with the same Nats-Msg-Id, and the stream keeps one.
    url = nats_server.url
    asyncio.run(add_stream(url, "ONCE", ["once"]))
    numbers = Numbers(COUNT, name="numbers")
    sink = FailOnceSink("once", encoding="msgpack", name="out", delivery=FAST_RETRY)(numbers)
    report = Flow([numbers], [sink], BATCH, name="sinkonce").run(url, view=False)
    assert report.outcome == "completed", report.format()
    assert (report.nodes["out"].failed, report.nodes["out"].processed) == (COUNT, COUNT)
    held = asyncio.run(stream_messages(url, "ONCE"))
    assert sorted(msgspec.msgpack.decode(m.data) for m in held) == list(range(COUNT))
    assert len({m.headers["Nats-Msg-Id"] for m in held}) == COUNT


def test_a_refused_message_fails_the_input(nats_server: embedded.EmbeddedServer) -> None:
    # A stream whose messages may be 8 bytes, headers included: every message is
    # refused for good, each group fails, and is dead-lettered once its retries are
    # spent; the flow completes with its dead letters.
    url = nats_server.url
    asyncio.run(add_stream(url, "TINY", ["tiny"], max_msg_size=8))
    numbers = Numbers(3, name="numbers")
    sink = SubjectSink("tiny", encoding="json", name="out", delivery=FAST_RETRY)(numbers)
    report = Flow([numbers], [sink], BATCH, name="sinktiny").run(url, view=False)
    assert report.nodes["out"].dead_lettered == 3, report.format()
    assert report.nodes["out"].failed == 3 * (1 + FAST_RETRY["max_retries"])  # type: ignore[operator]
    assert asyncio.run(stream_messages(url, "TINY")) == []


async def publish_records(url: str, subject: str, n: int) -> None:
    """n records on subject, each with its Event-Time (1000 + i), by plain nats-py."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for i in range(n):
            await js.publish(subject, b"r%d" % i, headers={EVENT_TIME_HEADER: str(1000.0 + i)})
    finally:
        await nc.close()


def test_records_delivered_again_while_the_source_stalls_are_counted_once(
        nats_server: embedded.EmbeddedServer) -> None:
    # Plain stream -> SubjectSource(count=N) -> SubjectSink -> plain stream, as the io
    # benchmark runs it. The source stalls once for longer than its ack_wait: the
    # broker delivers the records it held unacknowledged again. Those are records the
    # source already took (their outputs deduplicated by the broker), so they do not
    # count towards its N: it ends after N distinct records, and every one is out.
    # It had counted each delivery, ended that many records early, and the run still
    # said completed.
    url, n = nats_server.url, 200
    asyncio.run(add_stream(url, "RECORDS", ["records"]))
    asyncio.run(add_stream(url, "RELAYED", ["relayed"]))
    asyncio.run(publish_records(url, "records", n))
    source = SubjectSource("RECORDS", decode=StallOnce(1000.0 + 60, 3.0), count=n,
                           ack_wait=1.0, batch=20, name="source")
    sink = SubjectSink("relayed", encoding="bytes", name="sink")(source)
    report = Flow([source], [sink], BATCH, name="relaystall").run(url, view=False)
    assert report.outcome == "completed", report.format()
    held = asyncio.run(stream_messages(url, "RELAYED"))
    assert len(held) == n, f"RELAYED holds {len(held)} of {n}: {report.format()}"
    assert sorted(m.data for m in held) == sorted(b"r%d" % i for i in range(n))
    assert sorted(float(m.headers[EVENT_TIME_HEADER]) for m in held) == [
        1000.0 + i for i in range(n)]
    assert report.nodes["sink"].processed == n, report.format()


@pytest.mark.parametrize("arguments, error", [
    ({"subject": "a.*"}, "wildcards"),
    ({"subject": ""}, "wildcards"),
    ({"subject": "a", "encoding": "xml"}, "encoding"),
    ({"subject": "a", "timeout": 0}, "timeout"),
    ({"subject": "a", "timeout": float("nan")}, "timeout"),
])
def test_a_sink_refuses_bad_arguments(arguments: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SubjectSink(**arguments)


def test_bytes_encoding_takes_bytes_or_arrays_only(tmp_path: Path) -> None:
    sink = SubjectSink("a", encoding="bytes", name="out")
    assert sink.encode(b"xy") == (b"xy", {})
    data, headers = sink.encode(np.arange(6, dtype="<f4").reshape(2, 3)[:, ::2])
    assert headers == {SHAPE_HEADER: "2,2", DTYPE_HEADER: "<f4"}
    assert np.frombuffer(data, "<f4").tolist() == [0.0, 2.0, 3.0, 5.0]
    with pytest.raises(TypeError, match="bytes or a numpy array"):
        sink.encode(3)
