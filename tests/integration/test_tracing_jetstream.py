"""Tracing on a real nats-server: a flow of messengers run in this process with the
OpenTelemetry SDK's in-memory exporter installed as the global tracer provider, the
traceparent headers read back from the broker and the spans from the exporter.

Two producers (a, b); scale processes a; fuse joins scale and b by event time; sink
consumes fuse. Each node runs its task loop in turn (every node before it has ended)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import nats
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from videoflow.broker import server as embedded
from videoflow.core.compiler import NodeSpec
from videoflow.core.constants import BATCH
from videoflow.core.naming import stream_name_for
from videoflow.messaging import tracing
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.messaging.topology import provision_flow_sync
from videoflow.messaging.tracing import parse_traceparent
from videoflow.wire.serialization import decode_envelope

pytestmark = pytest.mark.timeout(90)

FLOW, RUN = "traced", "run1"
POLICY = {"mode": "time", "tolerance_ms": 100.0, "timeout_ms": 60_000.0, "missing": "drop"}
COUNT = 5


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The SDK's provider, with an in-memory exporter, for this test's messengers only
    (use_tracer_provider): OpenTelemetry's global provider is left alone, so later
    tests in this process run without spans, as a process without an SDK does."""
    provider = TracerProvider()
    made = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(made))
    tracing.use_tracer_provider(provider)
    try:
        yield made
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()


def messenger(url: str, node: str, parents: list[str], **options: Any) -> NATSMessenger:
    return NATSMessenger(SimpleNamespace(name=node), parents, url, FLOW, BATCH, RUN,
                         ack_wait=30, eos_quiescence_ms=200, **options)


def produce(url: str, node: str) -> None:
    producer = messenger(url, node, [])
    try:
        for k in range(COUNT):
            producer.set_output_event_timestamp(1000.0 + k)
            producer.publish_message({"from": node, "k": k})
        producer.publish_stop_signal()
    finally:
        producer.close()


def run_node(m: NATSMessenger, work: Any) -> None:
    """The task loop (core.task): receive, process, publish, ack, until every parent
    ended; then this node's end of stream."""
    try:
        while True:
            inputs = m.receive_message()
            if all(e is not None and e["is_stop_signal"] for e in inputs.values()):
                if work is not None:
                    m.publish_stop_signal()
                return
            if work is not None:
                m.publish_message(work(inputs))
            m.ack_inputs()
    finally:
        m.close()


async def stored(url: str, node: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """(envelope, headers) of every data message on node's stream, oldest first (read
    before its readers acknowledge it: the stream keeps a message until they do)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        stream = stream_name_for(FLOW, RUN, node)
        info = await js.stream_info(stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            assert msg.data is not None
            envelope = decode_envelope(msg.data)
            if not envelope["is_stop_signal"]:  # data, not an end marker
                found.append((envelope, dict(msg.headers or {})))
        return found
    finally:
        await nc.close()


def ids(span: ReadableSpan) -> tuple[int, int]:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


def header_ids(headers: dict[str, str]) -> tuple[int, int]:
    parsed = parse_traceparent(headers.get("traceparent"))
    assert parsed is not None, headers
    return int(parsed[0], 16), int(parsed[1], 16)


def test_a_flow_s_headers_and_spans_continue_every_input_s_trace_and_link_a_join_s_members(
    nats_server: embedded.EmbeddedServer, exporter: InMemorySpanExporter,
) -> None:
    specs = [NodeSpec("a", "producer"), NodeSpec("b", "producer"),
             NodeSpec("scale", "processor", parents=("a",)),
             NodeSpec("fuse", "processor", parents=("scale", "b"), join_policy=POLICY),
             NodeSpec("sink", "consumer", parents=("fuse",))]
    provision_flow_sync(nats_server.url, specs, FLOW, RUN, BATCH, timeout=30)
    on: dict[str, list[tuple[dict[str, Any], dict[str, str]]]] = {}

    def read(node: str) -> None:
        on[node] = asyncio.run(stored(nats_server.url, node))

    produce(nats_server.url, "a")
    produce(nats_server.url, "b")
    read("a")
    read("b")
    run_node(messenger(nats_server.url, "scale", ["a"]),
             lambda i: {"k": i["a"]["message"]["k"], "scaled": True})
    read("scale")
    run_node(messenger(nats_server.url, "fuse", ["scale", "b"], join_policy=POLICY),
             lambda i: [i["scale"]["message"]["k"], i["b"]["message"]["k"]])
    read("fuse")
    run_node(messenger(nats_server.url, "sink", ["fuse"]), None)

    # Every output read from the broker carries a valid traceparent.
    assert {node: len(messages) for node, messages in on.items()} == dict.fromkeys(on, COUNT)
    header = {node: [header_ids(headers) for _, headers in messages]
              for node, messages in on.items()}
    # A processor's output shares its input's trace id (outputs in input order here).
    assert [t for t, _ in header["scale"]] == [t for t, _ in header["a"]]
    # A join's output continues its first parent's member: scale's, not b's.
    assert [t for t, _ in header["fuse"]] == [t for t, _ in header["scale"]]
    assert {t for t, _ in header["a"]}.isdisjoint({t for t, _ in header["b"]})
    assert len({t for t, _ in header["a"]}) == COUNT  # a producer starts a trace per output

    spans = [s for s in exporter.get_finished_spans()
             if s.attributes is not None and s.attributes.get("videoflow.run") == RUN]
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    by_id = {ids(span)[1]: span for span in spans}
    kinds = {name: {s.kind for s in found} for name, found in by_name.items()}
    assert kinds == {
        "publish a": {SpanKind.PRODUCER}, "publish b": {SpanKind.PRODUCER},
        "publish scale": {SpanKind.PRODUCER}, "publish fuse": {SpanKind.PRODUCER},
        **{f"{op} {node}": {kind} for node in ("scale", "fuse", "sink")
           for op, kind in (("receive", SpanKind.CLIENT), ("process", SpanKind.CONSUMER),
                            ("settle", SpanKind.CLIENT))}}
    assert {name: len(found) for name, found in by_name.items()} == dict.fromkeys(by_name, COUNT)
    for span in spans:
        assert span.attributes is not None
        assert span.attributes["messaging.system"] == "nats"
        assert span.attributes["videoflow.flow"] == FLOW
        assert span.attributes["videoflow.replica"] == 0

    # Each header is its publish span's context; a producer's publish span is a root.
    for node in ("a", "b", "scale", "fuse"):
        assert sorted(header[node]) == sorted(ids(s) for s in by_name[f"publish {node}"])
    assert all(s.parent is None for s in by_name["publish a"] + by_name["publish b"])

    # receive and process are children of the input's publish span; publish and settle
    # of process.
    for node, parent in (("scale", "a"), ("fuse", "scale"), ("sink", "fuse")):
        publishes = {ids(s)[1] for s in by_name[f"publish {parent}"]}
        for op in ("receive", "process"):
            for span in by_name[f"{op} {node}"]:
                assert span.parent is not None and span.parent.is_remote
                assert span.parent.span_id in publishes
        for span in by_name[f"settle {node}"]:
            assert span.parent is not None
            assert by_id[span.parent.span_id].name == f"process {node}"
            assert span.attributes is not None
            assert span.attributes["videoflow.settle.result"] == "confirmed"
            assert span.attributes["messaging.operation.name"] == "ack"
    for node in ("scale", "fuse"):
        for span in by_name[f"publish {node}"]:
            assert span.parent is not None
            assert by_id[span.parent.span_id].name == f"process {node}"

    # A join's spans link every member's span context: one of scale's publish spans and
    # one of b's.
    publish_of = {ids(s)[1]: name for name in ("publish scale", "publish b")
                  for s in by_name[name]}
    for op in ("receive", "process"):
        for span in by_name[f"{op} fuse"]:
            linked = [publish_of[link.context.span_id] for link in span.links]
            assert sorted(linked) == ["publish b", "publish scale"]
            assert span.parent is not None
            assert publish_of[span.parent.span_id] == "publish scale"
