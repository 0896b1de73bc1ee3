"""What the messenger tests on the memory adapter share: a flow of messengers on one
in-process broker, and the task loops that drive them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    ChannelId,
    ChannelSpec,
    SubscriptionId,
)
from videoflow.core.constants import BATCH, REALTIME
from videoflow.messaging.nats_messenger import NATSMessenger

FLOW, RUN = "flow", "run"
FAST_RETRIES = {"max_retries": 2, "backoff": {"base_ms": 1.0, "factor": 1.0, "max_ms": 1.0}}


class Flow:
    """A broker, one channel per publishing node, and a messenger per node."""

    def __init__(self, edges: dict[str, list[str]], flow_type: str = BATCH,
                 realtime_buffer: int = 1) -> None:
        self.broker = MemoryBroker(duplicate_window=120.0)
        self.edges = edges  # node -> parents
        self.flow_type = flow_type
        self.made: list[NATSMessenger] = []
        children: dict[str, list[str]] = {}
        for node, parents in edges.items():
            for parent in parents:
                children.setdefault(parent, []).append(node)
        admin = self.backend()
        admin.ensure_dead_letters("dlq")
        for node in edges:
            if node in children:  # it publishes: its channel, read by every child
                channel = ChannelId(FLOW, RUN, node)
                # The children's data durables, and the end-marker interest anchor that
                # provisioning creates, so a marker outlives the per-process EOS durable
                # of a replica that read it and died.
                required = (*(SubscriptionId(c, channel) for c in children[node]),
                            SubscriptionId("eos-anchor", channel, "eos"))
                # REALTIME keeps only the freshest realtime_buffer messages (live_latest);
                # BATCH keeps everything until every reader acknowledged it.
                profile = LIVE_LATEST if flow_type == REALTIME else RELIABLE_WORK
                admin.ensure_channel(ChannelSpec(ChannelId(FLOW, RUN, node), profile,
                                                 required=required,
                                                 realtime_buffer=realtime_buffer),
                                     "provision")
        self.admin = admin

    def backend(self) -> MemoryMessagingBackend:
        made = MemoryMessagingBackend(self.broker, flow_id=FLOW, run_id=RUN)
        made.start()
        return made

    def messenger(self, node: str, pack: bool = False, **options: Any) -> NATSMessenger:
        """node's messenger (pack: Node's pack) on a backend of its own."""
        made = NATSMessenger(SimpleNamespace(name=node, pack=pack), self.edges[node],
                             "nats://unused", FLOW, self.flow_type, RUN,
                             backend=self.backend(), **options)
        self.made.append(made)
        return made


def run_sink(messenger: NATSMessenger, consume: Callable[[dict[str, Any]], None]) -> list[Any]:
    """A consumer's loop: like run_node, but it publishes nothing."""
    seen: list[Any] = []
    while True:
        inputs = messenger.receive_message()
        if all(e is not None and (e["is_stop_signal"] or e["is_abort"])
               for e in inputs.values()):
            return [*seen, inputs]
        consume(inputs)
        messenger.ack_inputs()
        seen.append(inputs)


def run_producer(messenger: NATSMessenger, messages: list[Any]) -> None:
    for i, message in enumerate(messages):
        messenger.set_output_event_timestamp(1000.0 + i)
        messenger.publish_message(message)
    messenger.publish_stop_signal()


def run_node(messenger: NATSMessenger, work: Callable[[dict[str, Any]], Any] | None) -> list[Any]:
    """The task loop: receive, process, publish, ack (fail on an exception), until every
    parent ended; then this node's own end of stream. Returns the inputs processed and
    the final stop entries, last."""
    seen: list[Any] = []
    for _ in range(1000):
        inputs = messenger.receive_message()
        if all(e is not None and (e["is_stop_signal"] or e["is_abort"])
               for e in inputs.values()):
            if work is not None:
                messenger.publish_stop_signal()
            seen.append(inputs)
            return seen
        try:
            output = None if work is None else work(inputs)
        except Exception as error:  # the task hands every failure to the policy
            messenger.fail_inputs(error)
            continue
        if work is not None:
            messenger.publish_message(output)
        messenger.ack_inputs()
        seen.append(inputs)
    raise AssertionError("the flow never ended")


@pytest.fixture
def flows() -> Iterator[Callable[..., Flow]]:
    """Make flows (edges, flow_type=BATCH); every messenger made is closed after."""
    made: list[Flow] = []

    def make(edges: dict[str, list[str]], flow_type: str = BATCH,
             realtime_buffer: int = 1) -> Flow:
        flow = Flow(edges, flow_type, realtime_buffer)
        made.append(flow)
        return flow

    yield make
    for flow in made:
        for messenger in flow.made:
            messenger.close()
