"""An event time that is not a finite number: refused by the setter that was given it,
and, arriving from a writer that is not videoflow, dead-lettered as poison by the
node that receives it -- never handed to a time join, whose core refuses it."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import messenger_flows
import msgspec
import numpy as np
import pytest
from messenger_flows import FLOW, RUN, Flow, run_node, run_producer

from videoflow.backends.messaging import ChannelId, Envelope
from videoflow.backends.payload import MemoryPayloadStore
from videoflow.core.context import RuntimeContext, event_time
from videoflow.messaging.dead_letters import decode_dead_letter
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.wire.serialization import decode_envelope, encode_envelope

flows = messenger_flows.flows  # the in-memory flows fixture, taken by name

BAD_TIMES = [
    pytest.param(math.nan, "must be finite, got nan", id="nan"),
    pytest.param(math.inf, "must be finite, got inf", id="inf"),
    pytest.param(-math.inf, "must be finite, got -inf", id="-inf"),
    pytest.param(np.float32("nan"), "must be finite, got", id="numpy-nan"),
    pytest.param(10**400, "must be finite, got 1000", id="int-beyond-float"),
    pytest.param("x", "must be a number of epoch seconds, got 'x' \\(str\\)", id="str"),
    pytest.param("1.5", "must be a number of epoch seconds, got '1.5'", id="numeric-str"),
    pytest.param(None, "must be a number of epoch seconds, got None", id="None"),
    pytest.param(True, "must be a number of epoch seconds, got True", id="bool"),
]


def _fuse(flow: Flow, **policy: Any) -> NATSMessenger:
    return flow.messenger("fuse", join_policy={"mode": "time", "tolerance_ms": 5.0,
                                               "timeout_ms": 1000.0, **policy})


def _publish_raw(flow: Flow, node: str, envelope: bytes) -> None:
    """Publish bytes on a node's data subject as a writer that is not videoflow would."""
    outcome = flow.admin.publish(Envelope(ChannelId(FLOW, RUN, node), "data", envelope),
                                 10**9)
    assert outcome.__class__.__name__ == "Accepted"


# ------------------------------------------------------------------ the setters


@pytest.mark.parametrize(("value", "match"), BAD_TIMES)
def test_the_messengers_setter_refuses_a_time_that_is_not_a_finite_number(
        flows, value: Any, match: str) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam = flow.messenger("cam")
    with pytest.raises(ValueError, match=f"^set_output_event_timestamp: an event time {match}"):
        cam.set_output_event_timestamp(value)
    cam.publish_message("unstamped")  # nothing of the refused value stuck to the output
    sink = flow.messenger("sink")
    assert sink.receive_message()["cam"]["event_ts"] is None


@pytest.mark.parametrize(("value", "match"), BAD_TIMES)
def test_the_contexts_setter_refuses_it_by_its_own_name_before_the_messenger_sees_it(
        flows, value: Any, match: str) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam = flow.messenger("cam")
    context = RuntimeContext(cam, "cam")
    with pytest.raises(ValueError, match=f"^set_event_timestamp: an event time {match}"):
        context.set_event_timestamp(value)
    assert cam.outputs.event_ts is None


class _Stamps:
    """A messenger's setter alone, recording what it was given (the base Messenger's
    is a no-op: the context's check must not rely on the messenger's)."""

    def __init__(self) -> None:
        self.given: list[Any] = []

    def set_output_event_timestamp(self, value: float) -> None:
        self.given.append(value)


def test_the_contexts_setter_checks_whatever_messenger_is_under_it() -> None:
    stamps = _Stamps()
    context = RuntimeContext(stamps, "cam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^set_event_timestamp: .* got nan"):
        context.set_event_timestamp(math.nan)
    context.set_event_timestamp(np.int64(7))
    assert stamps.given == [7.0] and type(stamps.given[0]) is float


@pytest.mark.parametrize("value", [1.5, 2, np.float64(3.25), np.int64(4), Fraction(1, 4),
                                   -1.0, 0.0, 1e18])
def test_any_finite_real_number_is_a_time_and_travels_as_a_float(
        flows, value: Any) -> None:  # type: ignore[no-untyped-def]
    assert event_time(value, "setter") == float(value)
    assert type(event_time(value, "setter")) is float
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, sink = flow.messenger("cam"), flow.messenger("sink")
    RuntimeContext(cam, "cam").set_event_timestamp(value)
    cam.publish_message("stamped")
    assert sink.receive_message()["cam"]["event_ts"] == float(value)


# ------------------------------------------------------------------ the receiving side


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_foreign_envelope_whose_event_time_is_not_finite_is_dead_lettered_not_joined(
        flows, bad: float) -> None:  # type: ignore[no-untyped-def]
    # Before, the time join's core raised "event_ts nan is not a finite time" from
    # assembler.add, and the whole replica failed with no dead letter.
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    left, right, fuse = flow.messenger("left"), flow.messenger("right"), _fuse(flow)
    run_producer(left, ["a", "b"])  # event times 1000.0 and 1001.0
    forged = encode_envelope("forged", trace_id="foreign", seq=7, event_ts=bad,
                             producer_name="right")
    _publish_raw(flow, "right", forged)
    run_producer(right, ["A", "B"])
    *groups, stop = run_node(fuse, lambda inputs: inputs["left"]["message"]
                             + inputs["right"]["message"])
    # The rest of the flow went on: both real pairs joined, then both parents ended.
    assert [(g["left"]["message"], g["right"]["message"]) for g in groups] == [
        ("a", "A"), ("b", "B")]
    assert stop["left"]["is_stop_signal"] and stop["right"]["is_stop_signal"]
    (only,) = flow.broker.dead_letters(FLOW)
    record = decode_dead_letter(only[1])
    assert (record.node, record.parent, record.reason, record.attempts) == (
        "fuse", "right", "poison", 1)  # at once: no attempts burned on it
    assert record.error_type.endswith("WireError")
    assert f"'event_ts' is {bad!r}, not a finite time" in record.error_message
    assert decode_envelope(record.envelope)["trace_id"] == "foreign"  # the input, kept
    assert fuse.dead_lettered == 1
    assert fuse.take_drops()["undecodable"] == 1
    assert fuse.terminal_entries() == []  # given up on against the dead letter alone


def test_a_non_finite_event_time_is_poison_at_a_one_parent_node_too(flows) -> None:  # type: ignore[no-untyped-def]
    # A single-parent node would pass the time on as its output's (inherited), and the
    # join below it would fail: it is stopped at the first node that receives it.
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam, work = flow.messenger("cam"), flow.messenger("work")
    _publish_raw(flow, "cam", encode_envelope("forged", trace_id="foreign", seq=0,
                                              event_ts=math.nan))
    run_producer(cam, ["after"])
    *groups, _ = run_node(work, lambda inputs: inputs["cam"]["message"])
    assert [g["cam"]["message"] for g in groups] == ["after"]
    assert [decode_dead_letter(d[1]).reason for d in flow.broker.dead_letters(FLOW)] == [
        "poison"]


def test_an_event_time_that_is_not_a_number_on_the_wire_is_undecodable_and_the_join_goes_on(
        flows) -> None:  # type: ignore[no-untyped-def]
    # A str where the wire types a float never decodes: terminated as undecodable, as
    # every mistyped envelope is, before any join sees it.
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    left, right, fuse = flow.messenger("left"), flow.messenger("right"), _fuse(flow)
    run_producer(left, ["a"])
    good = encode_envelope("forged", trace_id="foreign", seq=0, event_ts=1000.0)
    fields = msgspec.msgpack.decode(good)
    fields[14] = "x"  # event_ts, as a foreign writer might send it
    _publish_raw(flow, "right", msgspec.msgpack.encode(fields))
    run_producer(right, ["A"])
    *groups, _ = run_node(fuse, lambda inputs: inputs["left"]["message"]
                          + inputs["right"]["message"])
    assert [(g["left"]["message"], g["right"]["message"]) for g in groups] == [("a", "A")]
    assert fuse.take_drops()["undecodable"] == 1
    (entry,) = fuse.terminal_entries()
    assert entry["reason"].startswith("undecodable") and "event_ts" in entry["reason"]


def test_a_poison_event_time_on_an_input_by_ref_keeps_its_payload_for_the_dead_letter(
        flows) -> None:  # type: ignore[no-untyped-def]
    # The payload is never read (the input goes before its payload is restored), but
    # the dead letter carries the ref: pinned for the dead letters' retention (BLOB-14),
    # and the reader's own obligation released once the dead letter is confirmed.
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    store = MemoryPayloadStore()
    cam = flow.messenger("cam", payload_store=store, blob_reader_ids=["work"])
    work = flow.messenger("work", payload_store=store)
    flow.messenger("sink")
    cam.outputs.event_ts = math.nan  # an older writer, whose setter let it through
    cam.publish_message(np.ones(2_000_000, dtype=np.uint8))
    (ref,) = store.refs()
    run_producer(cam, ["after"])
    *groups, _ = run_node(work, lambda inputs: inputs["cam"]["message"])
    assert [g["cam"]["message"] for g in groups] == ["after"]
    assert store.obligations(ref) == ("dlq/dlq:work:cam:1",)  # only the pin is left
    (only,) = flow.broker.dead_letters(FLOW)
    record = decode_dead_letter(only[1])
    assert record.reason == "poison"
    assert decode_envelope(record.envelope)["blob_ref"] == ref
