"""A REALTIME reader on JetStream: a burst reaches a reader that keeps up whole, and a
slow one works on the newest input (videoflow.messaging.freshness, issue 43)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import nats

from videoflow.broker import server as embedded
from videoflow.core.compiler import NodeSpec
from videoflow.core.constants import REALTIME
from videoflow.core.credit import REALTIME_BURST
from videoflow.core.naming import durable_name_for, stream_name_for
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.messaging.topology import provision_flow_sync

FLOW, RUN = "flow", "run"


def reader(url: str, seen: list[Any], work_seconds: float = 0.0,
           sent: list[int] | None = None, lags: list[int] | None = None) -> NATSMessenger:
    """Provision cam -> sink (REALTIME) and start the sink's task loop on a thread,
    appending each message it works on to seen; with sent (the count of messages the
    test has published, kept up to date by it), how far behind the last one sent each
    message was when the sink was handed it, to lags."""
    specs = [NodeSpec("cam", "producer"), NodeSpec("sink", "consumer", parents=("cam",))]
    provision_flow_sync(url, specs, FLOW, RUN, REALTIME, timeout=30)
    sink = NATSMessenger(SimpleNamespace(name="sink"), ["cam"], url, FLOW, REALTIME, RUN,
                         eos_quiescence_ms=200)

    def loop() -> None:
        try:
            while True:
                inputs = sink.receive_message()
                if inputs["cam"]["is_stop_signal"]:
                    return
                if sent is not None and lags is not None:
                    lags.append(sent[0] - 1 - inputs["cam"]["message"])
                time.sleep(work_seconds)
                sink.ack_inputs()
                seen.append(inputs["cam"]["message"])
        finally:
            sink.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    sink.thread = thread  # type: ignore[attr-defined]
    return sink


def ack_pending(url: str) -> tuple[int, int]:
    """The sink's durable: (num_ack_pending, num_pending)."""
    async def ask() -> tuple[int, int]:
        client = await nats.connect(url)
        try:
            info = await client.jetstream().consumer_info(
                stream_name_for(FLOW, RUN, "cam"), durable_name_for("sink", "cam"))
            return info.num_ack_pending, info.num_pending
        finally:
            await client.close()
    return asyncio.run(ask())


def test_a_realtime_reader_that_keeps_up_gets_a_burst_its_parent_sent_at_once(
    nats_server: embedded.EmbeddedServer,
) -> None:
    """A stream that kept one message per subject had each message of a burst evict the
    one before it on the broker before the reader was handed it: a camera catching up
    after a stall lost all but its last. It keeps REALTIME_BURST now, and a reader that
    keeps up works through them all, in order."""
    seen: list[Any] = []
    sink = reader(nats_server.url, seen)
    cam = NATSMessenger(SimpleNamespace(name="cam"), [], nats_server.url, FLOW, REALTIME, RUN)
    try:
        for n in range(5):  # paced: the reader works on each, so its load is known
            cam.publish_message(n)
            deadline = time.monotonic() + 10
            while len(seen) <= n and time.monotonic() < deadline:
                time.sleep(0.005)
        assert seen == list(range(5))
        burst = list(range(5, 5 + REALTIME_BURST - 1))
        for n in burst:  # at once, as the window sends a burst
            cam.publish_message(n)
        cam.publish_stop_signal()
    finally:
        cam.close()
    sink.thread.join(20)  # type: ignore[attr-defined]
    assert not sink.thread.is_alive(), "the reader never saw its parent end"  # type: ignore[attr-defined]
    assert seen == list(range(5)) + burst
    assert sink.received["cam"] == len(seen)
    assert sink.freshness is not None and sink.freshness.superseded == 0
    assert sink.take_drops()["superseded"] == 0


def test_a_realtime_reader_that_falls_behind_works_on_the_newest_input(
    nats_server: embedded.EmbeddedServer,
) -> None:
    """A reader taking 80 ms an input (more than CATCH_UP_SECONDS) on a parent sending
    every 10 ms: each input it works on is the newest there was when it took it, the
    older ones are superseded and acknowledged (none is left pending on the durable),
    and it ends on the last."""
    seen: list[Any] = []
    published, lags = [0], []
    sink = reader(nats_server.url, seen, work_seconds=0.08, sent=published, lags=lags)
    cam = NATSMessenger(SimpleNamespace(name="cam"), [], nats_server.url, FLOW, REALTIME, RUN)
    sent = 150
    try:
        for n in range(sent):
            cam.publish_message(n)
            published[0] = n + 1
            time.sleep(0.01)
        cam.publish_stop_signal()
    finally:
        cam.close()
    sink.thread.join(30)  # type: ignore[attr-defined]
    assert not sink.thread.is_alive(), "the reader never saw its parent end"  # type: ignore[attr-defined]
    assert seen == sorted(seen) and seen[-1] == sent - 1
    # About 1.5 s of input at 80 ms each, after the first few it took untimed.
    assert len(seen) < sent // 3, seen
    assert sink.freshness is not None and sink.freshness.superseded > sent // 2
    # Each skipped input is received, and counted as the node's superseded drop.
    assert sink.take_drops()["superseded"] == sink.freshness.superseded
    assert sink.received["cam"] == len(seen) + sink.freshness.superseded
    # Past its first inputs, each one it was handed was the newest there was, or one
    # of the few still on their way: working through what the stream keeps, it would
    # be handed each about REALTIME_BURST sends behind the last one sent. (How many
    # sends one input's work spans depends on how fast this loaded host lets the test
    # publish, so it is not what is checked.)
    late = [lag for message, lag in zip(seen, lags, strict=False) if message >= 50]
    assert late and max(late) < REALTIME_BURST // 2, list(zip(seen, lags, strict=False))
    assert ack_pending(nats_server.url) == (0, 0)
