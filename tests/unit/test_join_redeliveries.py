"""A join's redeliveries of inputs it already acknowledged, on the memory adapter: an
ack the broker never got (a failover lost it, a lapse of the durable's leases) brings
the input back after its group went out. Acknowledged again and not grouped again:
grouped, with disorder_ms wide enough to take it, it made a second group of its
instant (in the three-host failover test, 9 instants fused twice)."""

from __future__ import annotations

from typing import Any

from messenger_flows import FLOW, RUN, flows, run_node

from videoflow.backends.memory import MemoryMessagingBackend
from videoflow.backends.messaging import Completed, SettleUnknown
from videoflow.core.report import NodeReport, RunReport
from videoflow.messaging.nats_messenger import NATSMessenger

__all__ = ["flows"]  # the fixture, imported for the tests below


class LosesAcks(MemoryMessagingBackend):
    """While armed, Completed settlements never reach the broker: their outcome is
    unknown, and the broker redelivers the input once its lease lapses."""

    armed = False

    def settle(self, token: Any, outcome: Any, settlement_id: str) -> Any:
        if self.armed and isinstance(outcome, Completed):
            return SettleUnknown("the ack was lost on its way (injected)")
        return super().settle(token, outcome, settlement_id)


def test_an_input_whose_ack_was_lost_comes_back_and_is_acknowledged_not_grouped_again(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    for side in ("left", "right"):
        messenger = flow.messenger(side)
        for t in (1.0, 2.0):
            messenger.set_output_event_timestamp(t)
            messenger.publish_message(t)
        messenger.publish_stop_signal()
    backend = LosesAcks(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    fuse = NATSMessenger(type("N", (), {"name": "fuse"})(), ["left", "right"],
                         "nats://unused", FLOW, flow.flow_type, RUN, backend=backend,
                         ack_wait=1, join_policy={"mode": "time", "tolerance_ms": 5.0,
                                                  "disorder_ms": 5000.0})
    flow.made.append(fuse)
    fused: list[Any] = []
    inputs = fuse.receive_message()
    fused.append(inputs["left"]["message"])
    backend.armed = True  # the first group's acks are lost
    fuse.publish_message(inputs["left"]["message"])
    fuse.ack_inputs()
    fuse.drain()
    backend.armed = False
    run_node(fuse, lambda inputs: fused.append(inputs["left"]["message"]))
    assert fused == [1.0, 2.0]  # the instant at 1.0 came back, and was not fused again
    assert fuse.redelivered_done == 2
    assert sum(fuse.take_drops().values()) == 0
    *groups, _ = run_node(flow.messenger("sink"), None)
    assert len(groups) == 2


def test_the_report_says_how_many_inputs_came_again_after_they_were_acknowledged() -> None:
    fuse = NodeReport.from_replicas("processor", {
        "fuse[0]": {"processed": 90, "redelivered_done": 7, "outcome": "ended"},
        "fuse[0]~1": {"processed": 3, "redelivered_done": 2, "outcome": "restarted"}})
    assert fuse.redelivered_done == 9
    text = RunReport("f", "r", "batch", "nats://x", nodes={"fuse": fuse}).format()
    assert ("  fuse: 9 inputs came again after it had acknowledged them (the acks lost on "
            "their way): acknowledged again, not grouped again") in text
