"""What the JetStream adapter's integration tests share (test_broker_loop.py and the
test_jetstream_*.py beside it): a connected client on a LoopRunner (Wired), the
streams and durables they read, and small publish / take / receive helpers. The
fixtures over them (wired, backends) are conftest's."""

from __future__ import annotations

import time

from nats.aio.client import Client
from nats.js import JetStreamContext

from videoflow.backends.jetstream.backend import (
    JetStreamMessagingBackend,
    channel_spec_for,
    subscription_spec_for,
)
from videoflow.backends.jetstream.configs import consumer_config_for, stream_config_for
from videoflow.backends.jetstream.outcomes import (
    publish_once,
)
from videoflow.backends.jetstream.streams import ensure_consumer, ensure_stream
from videoflow.backends.jetstream.subscription_receiver import (
    SubscriptionReceiver,
    bind_receiver,
)
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    Delivery,
    Envelope,
    SubscriptionId,
)
from videoflow.broker.loop import (
    ErrorLog,
    LoopRunner,
    close_client,
    connect_fail_fast,
)
from videoflow.core.constants import BATCH
from videoflow.core.credit import consumer_credit
from videoflow.core.naming import (
    stream_name_for,
    subject_for,
)

FLOW, RUN = "flow", "run"



class Wired:
    """A runner with a connected client and its JetStream context, all on the
    runner's loop — how the backend holds them."""

    def __init__(self, url: str) -> None:
        self.runner = LoopRunner()
        self.runner.start()
        self.errors = ErrorLog()
        self.client: Client = self.runner.run(connect_fail_fast(url, 5.0, self.errors), 10)
        self.js: JetStreamContext = self.client.jetstream()

    def run(self, coro, timeout: float = 20.0):  # type: ignore[no-untyped-def]
        return self.runner.run(coro, timeout)

    def close(self) -> None:
        self.runner.run(close_client(self.client), 10)
        self.runner.stop()



def batch_channel(
    wired: Wired, node: str, max_msgs: int = 10_000, ack_wait: int = 30, max_deliver: int = 5,
    max_ack_pending: int | None = None,
) -> tuple[str, str]:
    """A BATCH (INTEREST, DiscardPolicy.NEW) stream for node with one data durable
    reading it, so published messages are retained. Returns (stream, subject)."""
    stream = stream_name_for(FLOW, RUN, node)
    config = stream_config_for(FLOW, RUN, node, BATCH, batch_max_msgs=max_msgs)
    verified = wired.run(ensure_stream(wired.js, config))
    assert verified.mismatches == ()
    durable = consumer_config_for(FLOW, RUN, "child", node, ack_wait=ack_wait,
                                  max_deliver=max_deliver)
    if max_ack_pending is not None:
        durable.max_ack_pending = max_ack_pending
    wired.run(ensure_consumer(wired.js, stream, durable))
    return stream, subject_for(FLOW, RUN, node)



def envelope(node: str, data: bytes = b"payload", msg_id: str | None = None) -> Envelope:
    return Envelope(ChannelId(FLOW, RUN, node), "data", data, msg_id)



def bound(wired: Wired, node: str, generation: int = 0, prefetch: int = 4,
          ack_confirm: float = 2.0) -> SubscriptionReceiver:
    sub = SubscriptionId("child", ChannelId(FLOW, RUN, node))

    async def bind() -> SubscriptionReceiver:
        return await bind_receiver(wired.client, sub, stream_name_for(FLOW, RUN, node),
                                   "child--from--" + node, generation, prefetch=prefetch,
                                   fetch_timeout=0.5, ack_confirm_seconds=ack_confirm)

    return wired.run(bind())



def publish(wired: Wired, node: str, count: int) -> None:
    subject = subject_for(FLOW, RUN, node)
    for i in range(count):
        outcome = wired.run(publish_once(wired.js, subject, envelope(node, b"m%d" % i), 5))
        assert isinstance(outcome, Accepted)



def take(wired: Wired, receiver: SubscriptionReceiver, credit: int = 1, wait: float = 5.0):  # type: ignore[no-untyped-def]
    """Up to credit deliveries, gathered until that many arrived or wait passed: the
    pull loop parks each message as it arrives, so one take may see only part of what
    the server is sending. Taken from this thread, as receive_any takes them."""
    deadline = time.monotonic() + wait
    got = receiver.take_ready(credit)
    while len(got) < credit and time.monotonic() < deadline:
        time.sleep(0.005)
        got += receiver.take_ready(credit - len(got))
    return got



def ack_floor(wired: Wired, node: str) -> int:
    info = wired.run(wired.js.consumer_info(stream_name_for(FLOW, RUN, node),
                                            "child--from--" + node))
    return info.ack_floor.stream_seq



def data_sub(node: str, consumer: str = "child") -> SubscriptionId:
    return SubscriptionId(consumer, ChannelId(FLOW, RUN, node))



def provisioned(backend: JetStreamMessagingBackend, node: str, ack_wait: float = 30.0,
                max_deliver: int = 5, op: str = "op-1", consumer: str = "child",
                byte_credit: int = 0, credit: int | None = None) -> SubscriptionId:
    sub = data_sub(node, consumer)
    backend.ensure_channel(channel_spec_for(FLOW, RUN, node, BATCH, RELIABLE_WORK,
                                            required=[sub]), "chan")
    backend.ensure_subscription(
        subscription_spec_for(sub, ack_wait, max_deliver,
                              consumer_credit(1, False) if credit is None else credit,
                              byte_credit), op)
    return sub



def send(backend: JetStreamMessagingBackend, node: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        outcome = backend.publish(envelope(node, b"m%d" % i, msg_id=f"{node}-{i}"),
                                  time.monotonic() + 5)
        assert isinstance(outcome, Accepted), outcome



def receive_n(backend: JetStreamMessagingBackend, sub: SubscriptionId, n: int,
              wait: float = 5.0) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        got += backend.receive(sub, n - len(got), 0, min(deadline, time.monotonic() + 1))
    return got



def consumer_state(wired: Wired, node: str) -> tuple[int, int, int]:
    """(ack floor stream seq, num_ack_pending, num_pending) of node's durable."""
    info = wired.run(wired.js.consumer_info(stream_name_for(FLOW, RUN, node),
                                            "child--from--" + node))
    return info.ack_floor.stream_seq, info.num_ack_pending, info.num_pending

