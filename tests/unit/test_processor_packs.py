"""A processor's packs (Node's pack) on the memory adapter: the outputs of one inbound
pack's members are held until the pack's last member is done, then go as one pack whose
PubAck settles every member; a member retried voids what was held, so the pack is
processed again whole and its outputs go once; a pack processed again after a crash
makes the same pack under the same id, which the broker's duplicate window drops."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from messenger_flows import FAST_RETRIES, FLOW, RUN, Flow, flows, run_node, run_sink
from test_publish_window import HeldReceipts, leased

from videoflow.backends.messaging import ChannelId, Envelope, Known
from videoflow.backends.messaging_types import pack_envelope
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.wire.serialization import encode_envelope

__all__ = ["flows"]  # the fixture, imported for the tests below

CAM = ChannelId(FLOW, RUN, "cam")


def envelope(value: int) -> Envelope:
    return Envelope(CAM, "data", encode_envelope(value, trace_id=f"t{value}", seq=value,
                                                 producer_name="cam"), f"cam:{value}")


def packed_inputs(flows: Callable[..., Flow]) -> Flow:
    """cam -> double -> sink, with cam's stream holding 10 alone, a pack of 1, 2 and 3,
    4 alone, and its end."""
    flow = flows({"cam": [], "double": ["cam"], "sink": ["double"]})
    deadline = time.monotonic() + 5
    flow.admin.publish(envelope(10), deadline)
    flow.admin.publish(pack_envelope([envelope(v) for v in (1, 2, 3)]), deadline)
    flow.admin.publish(envelope(4), deadline)
    flow.messenger("cam").publish_stop_signal()
    return flow


def stored(flow: Flow, node: str) -> int:
    """Broker messages the node's stream took (its last stream sequence)."""
    observed = flow.admin.observe_channel(ChannelId(FLOW, RUN, node))
    assert isinstance(observed, Known)
    return observed.value.last_seq


def packing(flow: Flow, node: str, held: bool = False,
            **options: Any) -> tuple[NATSMessenger, HeldReceipts]:
    """node's messenger, with pack=True, and its backend: held, its receipts wait for
    release()."""
    backend = HeldReceipts(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    if not held:
        backend.release()
    made = NATSMessenger(SimpleNamespace(name=node, pack=True), flow.edges[node],
                         "nats://unused", FLOW, flow.flow_type, RUN, backend=backend, **options)
    flow.made.append(made)
    return made, backend


def sink_messages(flow: Flow) -> list[Any]:
    *groups, _ = run_sink(flow.messenger("sink"), lambda inputs: None)
    return [g["double"]["message"] for g in groups]


def test_a_processor_sends_one_inbound_packs_outputs_as_one_pack_settled_with_its_members(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = packed_inputs(flows)
    double, backend = packing(flow, "double", held=True)

    def step() -> int:
        value = double.receive_message()["cam"]["message"]
        double.publish_message(value * 2)
        double.ack_inputs()
        return int(value)

    assert step() == 10 and stored(flow, "double") == 1  # an input alone: its output too
    assert [step() for _ in range(3)] == [1, 2, 3]
    assert stored(flow, "double") == 1  # the pack's outputs are held for its last member
    assert step() == 4  # the next input is no member: the held outputs went, as one pack
    assert stored(flow, "double") == 3
    assert leased(flow, "double", "cam") == 3  # nothing settled before its output's PubAck
    backend.release()
    double.drain()
    assert leased(flow, "double", "cam") == 0  # the pack's message settled with its members
    assert double.publication_stats["accepted"] == 5  # each output counted, packed or not
    double.publish_stop_signal()
    assert sink_messages(flow) == [20, 2, 4, 6, 8]


def test_a_member_retried_voids_what_its_pack_held_and_the_pack_goes_once_processed_again(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = packed_inputs(flows)
    processed: list[int] = []

    def once_flaky(inputs: dict[str, Any]) -> int:
        value = int(inputs["cam"]["message"])
        processed.append(value)
        if value == 2 and processed.count(2) == 1:
            raise ConnectionError("upstream service down")
        return value * 2

    double, _ = packing(flow, "double", delivery_policy=FAST_RETRIES)
    run_node(double, once_flaky)
    assert processed[:5] == [10, 1, 2, 3, 4]
    assert processed[5:] == [1, 2, 3]  # the pack came again whole, for 2
    # The first attempt sent nothing of the pack: 1's and 3's outputs were voided, so
    # the one pack stored is the second attempt's, with all three (ids fixed by it).
    assert stored(flow, "double") == 3 + 1  # 20, the pack, 8; the end marker
    assert double.publication_stats["duplicate"] == 0
    assert sink_messages(flow) == [20, 8, 2, 4, 6]


def test_a_member_given_up_on_leaves_the_others_outputs_to_go_in_the_pack(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = packed_inputs(flows)

    def poisoned(inputs: dict[str, Any]) -> int:
        value = int(inputs["cam"]["message"])
        if value == 2:
            raise ValueError("not a reading")  # retried to its budget, then dead-lettered
        return value * 2

    double, _ = packing(flow, "double", delivery_policy=FAST_RETRIES)
    run_node(double, poisoned)
    assert double.dead_lettered == 1
    assert sink_messages(flow) == [20, 2, 6, 8]


def test_a_pack_processed_again_after_a_crash_makes_the_same_pack_which_the_broker_drops(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = packed_inputs(flows)
    crashing, backend = packing(flow, "double", held=True, ack_wait=1)
    for _ in range(4):
        value = crashing.receive_message()["cam"]["message"]
        crashing.publish_message(value * 2)
        crashing.ack_inputs()
    crashing.window.pack_inputs(None)  # as its next receive would: the pack goes
    assert stored(flow, "double") == 2  # 20, and the pack: stored, its PubAck not back
    backend.shutdown(hand_back=False)  # the process dies before any input is settled
    replacement, _ = packing(flow, "double", ack_wait=1)
    run_node(replacement, lambda inputs: inputs["cam"]["message"] * 2)
    # Every input came again and was processed again: the same outputs, packed the same
    # way under the same ids, dropped as duplicates (20 and the pack's three).
    assert replacement.publication_stats["duplicate"] == 4
    assert stored(flow, "double") == 3 + 1  # 20, the pack, 8; the end marker
    assert sink_messages(flow) == [20, 2, 4, 6, 8]
