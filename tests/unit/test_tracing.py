"""videoflow.messaging.tracing without a broker: trace ids from lineage ids, the
traceparent header's format and parsing, and the fast path (no tracer) of a flow of
messengers on the memory adapter, whose deliveries carry the header as JetStream's do."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    ChannelId,
    ChannelSpec,
    Delivery,
    DeliveryToken,
    SubscriptionId,
    SubscriptionSpec,
)
from videoflow.core.constants import BATCH
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.messaging.tracing import (
    TRACING_ENV,
    NodeTracing,
    format_traceparent,
    new_span_id,
    parse_traceparent,
    w3c_trace_id,
)

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_32_hex_lineage_is_its_own_trace_id_and_any_other_maps_to_its_digest() -> None:
    live = "0123456789abcdef0123456789abcdef"
    assert w3c_trace_id(live) == live
    replayable = w3c_trace_id("cam:src:17")
    assert len(replayable) == 32 and int(replayable, 16)
    assert w3c_trace_id("cam:src:17") == replayable  # deterministic
    assert w3c_trace_id("cam:src:18") != replayable
    for odd in ("0" * 32, live.upper(), live[:31], "tg-0123456789abcdef"):
        mapped = w3c_trace_id(odd)
        assert mapped != odd and len(mapped) == 32


@pytest.mark.parametrize("value, parsed", [
    (VALID, ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01")),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future",
     ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "00")),
    (VALID + "-more", None),  # version 00 has exactly four fields
    ("ff" + VALID[2:], None),
    (VALID.upper(), None),
    ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", None),
    (VALID[:-1], None),
    ("", None),
    (None, None),
])
def test_parse_traceparent_accepts_only_valid_w3c_trace_context(
    value: str | None, parsed: tuple[str, str, str] | None,
) -> None:
    assert parse_traceparent(value) == parsed


def test_a_formatted_traceparent_parses_back() -> None:
    span_id = new_span_id()
    assert len(span_id) == 16 and int(span_id, 16)
    value = format_traceparent("4bf92f3577b34da6a3ce929d0e0e4736", span_id)
    assert parse_traceparent(value) == ("4bf92f3577b34da6a3ce929d0e0e4736", span_id, "01")


def member(parent: str, traceparent: str | None) -> SimpleNamespace:
    token = DeliveryToken(SubscriptionId("fuse", ChannelId("f", "r", parent)), 1, 1, 0)
    return SimpleNamespace(parent=parent, arrived=0.0, delivery=Delivery(
        token, b"", 1, 1, traceparent=traceparent))


def test_without_a_tracer_an_output_continues_its_first_parent_s_member_and_flags() -> None:
    tracing = NodeTracing("fuse", 0, "f", "r", "vf.f.r.fuse",
                          {"left": "vf.f.r.left", "right": "vf.f.r.right"}, tracer=False)
    assert not tracing.enabled
    left = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    right = "00-" + "3" * 32 + "-" + "4" * 16 + "-01"
    group = tracing.begin_group("lineage", [member("right", right), member("left", left)])
    traceparent, span = tracing.output("lineage", group, "fuse:x:1")
    assert span is None
    parsed = parse_traceparent(traceparent)
    assert parsed is not None
    assert (parsed[0], parsed[2]) == ("1" * 32, "00") and parsed[1] != "2" * 16
    # An input without a header: the lineage's trace id.
    group = tracing.begin_group("cam:src:3", [member("left", None)])
    parsed = parse_traceparent(tracing.output("cam:src:3", group, "m")[0])
    assert parsed is not None and parsed[0] == w3c_trace_id("cam:src:3")
    # A producer's output starts a trace from its lineage.
    parsed = parse_traceparent(tracing.output("cam:src:4", None, "m")[0])
    assert parsed is not None and (parsed[0], parsed[2]) == (w3c_trace_id("cam:src:4"), "01")


@pytest.mark.parametrize("value", ["off", "0", "false", "NO"])
def test_tracing_off_writes_no_header_and_makes_no_span_even_with_a_provider(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACING_ENV, value)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = NodeTracing("scale", 0, "f", "r", "vf.f.r.scale", {"cam": "vf.f.r.cam"},
                          tracer=provider.get_tracer("test"))
    assert not tracing.enabled
    group = tracing.begin_group("cam:src:1", [member("cam", VALID)])
    assert tracing.output("cam:src:1", group, "scale:k:1") == (None, None)
    assert tracing.output("cam:src:2", None, "m") == (None, None)
    assert tracing.end_group(group, "ack") is None
    assert exporter.get_finished_spans() == ()


def test_with_a_tracer_a_member_without_a_header_is_continued_from_its_lineage() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = NodeTracing("scale", 1, "f", "r", "vf.f.r.scale", {"cam": "vf.f.r.cam"},
                          tracer=provider.get_tracer("test"))
    group = tracing.begin_group("cam:src:9", [member("cam", None)])
    traceparent, span = tracing.output("cam:src:9", group, "scale:k:1")
    NodeTracing.published(span, 10)
    settle = tracing.end_group(group, "ack")
    assert settle is not None
    settle.end()
    parsed = parse_traceparent(traceparent)
    assert parsed is not None and parsed[0] == w3c_trace_id("cam:src:9")
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["process scale", "publish scale", "receive scale", "settle scale"]
    publish = next(s for s in exporter.get_finished_spans() if s.name == "publish scale")
    assert publish.attributes is not None
    assert publish.attributes["messaging.message.body.size"] == 10
    assert publish.attributes["videoflow.replica"] == 1


def test_on_the_memory_adapter_every_output_carries_a_traceparent_continuing_its_input(
) -> None:
    broker = MemoryBroker(duplicate_window=120.0)

    def backend() -> MemoryMessagingBackend:
        made = MemoryMessagingBackend(broker, flow_id="f", run_id="r")
        made.start()
        return made

    cam, scale = ChannelId("f", "r", "cam"), ChannelId("f", "r", "scale")
    # probe reads what scale reads, and what scale publishes.
    cam_probe, scale_probe = SubscriptionId("probe", cam), SubscriptionId("probe", scale)
    admin = backend()
    for channel, readers in ((cam, ("scale", "probe")), (scale, ("probe",))):
        admin.ensure_channel(ChannelSpec(channel, RELIABLE_WORK, required=(
            *(SubscriptionId(r, channel) for r in readers),
            SubscriptionId("eos-anchor", channel, "eos"))), "provision")
    producer = NATSMessenger(SimpleNamespace(name="cam"), [], "nats://unused", "f", BATCH,
                             "r", backend=backend())
    processor = NATSMessenger(SimpleNamespace(name="scale"), ["cam"], "nats://unused", "f",
                              BATCH, "r", backend=backend(), eos_quiescence_ms=50)
    try:
        for n in range(3):
            producer.publish_message(n)
        producer.publish_stop_signal()
        for _ in range(3):
            inputs = processor.receive_message()
            processor.publish_message(inputs["cam"]["message"] * 2)
            processor.ack_inputs()
        processor.drain()
    finally:
        producer.close()
        processor.close()
    probe = backend()
    for sub in (cam_probe, scale_probe):
        probe.ensure_subscription(SubscriptionSpec(sub, 30, -1, 16), "bind")

    def headers(sub: SubscriptionId) -> list[tuple[str, str, str]]:
        got = probe.receive_any([sub], 16, 0, time.monotonic() + 5)
        parsed = [parse_traceparent(delivery.traceparent) for _, delivery in got]
        assert len(parsed) == 3 and None not in parsed, got
        return [p for p in parsed if p is not None]

    inputs, outputs = headers(cam_probe), headers(scale_probe)
    assert len({trace_id for trace_id, _, _ in inputs}) == 3  # a trace per output
    for (in_trace, in_span, _), (out_trace, out_span, _) in zip(inputs, outputs, strict=True):
        assert out_trace == in_trace and out_span != in_span
