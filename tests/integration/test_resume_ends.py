"""ended_replicas on a real nats-server: which replicas' clean end markers are on a
kept run's stream, read without leaving a reader behind (a lingering one counted the
resumed replicas' new end markers as unprocessed, and the resumed run was kept)."""

from __future__ import annotations

import asyncio
import contextlib

import nats
import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from videoflow.broker import server as embedded
from videoflow.core.naming import durable_name_for, eos_subject_for, stream_name_for, subject_for
from videoflow.messaging.messenger_deliveries import end_marker
from videoflow.ops.resume import drop_abort_markers, ended_replicas, release_leases

pytestmark = pytest.mark.timeout(60)

FLOW, RUN, NODE = "f", "r", "cam"


async def publish_ends(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=stream_name_for(FLOW, RUN, NODE),
                                         subjects=[f"{subject_for(FLOW, RUN, NODE)}.>",
                                                   subject_for(FLOW, RUN, NODE)]))
        subject = eos_subject_for(FLOW, RUN, NODE)
        await js.publish(subject, end_marker(NODE, FLOW, RUN, 0, 3, False, None))
        await js.publish(subject, end_marker(NODE, FLOW, RUN, 1, 3, True,
                                             {"type": "E", "message": "x"}))
        await js.publish(subject_for(FLOW, RUN, NODE), b"data is not an end")
    finally:
        await nc.close()


async def consumers(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return [c.name for c in await nc.jsm().consumers_info(stream_name_for(FLOW, RUN, NODE))]
    finally:
        await nc.close()


def test_clean_ends_are_read_and_no_reader_is_left_on_the_stream(
        nats_server: embedded.EmbeddedServer) -> None:
    asyncio.run(publish_ends(nats_server.url))
    # Replica 0 ended cleanly; replica 1 aborted (started again); replica 2 said nothing.
    assert ended_replicas(nats_server.url, FLOW, RUN, [NODE]) == {NODE: {0}}
    assert asyncio.run(consumers(nats_server.url)) == []


DURABLE = durable_name_for("sink", NODE)


async def leave_leases(url: str, took: int = 6, max_deliver: int = -1) -> None:
    """Ten messages on the run's stream, a data durable (ack_wait 30 s) and a reader
    that took the first `took` of them, acked the even ones out of order, and vanished
    holding the odd ones."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        stream = stream_name_for(FLOW, RUN, NODE)
        await js.add_stream(StreamConfig(name=stream, subjects=[subject_for(FLOW, RUN, NODE)]))
        for n in range(10):
            await js.publish(subject_for(FLOW, RUN, NODE), str(n).encode())
        await js.add_consumer(stream, ConsumerConfig(
            durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
            max_deliver=max_deliver))
    finally:
        await nc.close()
    dead = await nats.connect(url)
    try:
        reader = await dead.jetstream().pull_subscribe_bind(DURABLE, stream)
        for msg in await reader.fetch(took, timeout=5) if took else []:
            if int(msg.data) % 2 == 0:
                await msg.ack_sync()
    finally:
        await dead.close()


async def read_after_the_release(url: str) -> tuple[list[tuple[int, int]], float]:
    """What a new reader of the durable is handed within 5 s, as (message, delivery
    count), and the durable's ack_wait."""
    nc = await nats.connect(url)
    got: list[tuple[int, int]] = []
    try:
        js = nc.jetstream()
        stream = stream_name_for(FLOW, RUN, NODE)
        reader = await js.pull_subscribe_bind(DURABLE, stream)
        deadline = asyncio.get_running_loop().time() + 5
        while len(got) < 7 and asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(nats.errors.TimeoutError, asyncio.TimeoutError):
                for msg in await reader.fetch(10, timeout=0.5):
                    got.append((int(msg.data), msg.metadata.num_delivered))
                    await msg.ack_sync()
        info = await js.consumer_info(stream, DURABLE)
        return got, float(info.config.ack_wait or 0)
    finally:
        await nc.close()


def test_a_dead_replicas_leases_are_handed_out_again_at_once_and_nothing_acked_twice(
        nats_server: embedded.EmbeddedServer) -> None:
    asyncio.run(leave_leases(nats_server.url))
    assert release_leases(nats_server.url, FLOW, RUN, [NODE]) == 3
    got, ack_wait = asyncio.run(read_after_the_release(nats_server.url))
    # The three leased first, each on its second delivery (counted as a lapse would
    # be), well within the 30 s ack_wait; then the six never delivered; 0, 2 and 4,
    # acked, never again.
    assert got == [(1, 2), (3, 2), (5, 2), (6, 1), (7, 1), (8, 1), (9, 1)]
    assert ack_wait == 30.0  # the durable's own, given back


def test_a_run_whose_replicas_held_no_lease_releases_none(
        nats_server: embedded.EmbeddedServer) -> None:
    asyncio.run(leave_leases(nats_server.url, took=0))
    assert release_leases(nats_server.url, FLOW, RUN, [NODE]) == 0
    got, ack_wait = asyncio.run(read_after_the_release(nats_server.url))
    assert got[:2] == [(0, 1), (1, 1)] and ack_wait == 30.0


def test_a_resume_deletes_the_abort_markers_and_keeps_the_clean_ends(
        nats_server: embedded.EmbeddedServer) -> None:
    asyncio.run(publish_ends(nats_server.url))
    assert drop_abort_markers(nats_server.url, FLOW, RUN, [NODE]) == 1
    assert ended_replicas(nats_server.url, FLOW, RUN, [NODE]) == {NODE: {0}}

    async def markers_left() -> int:
        nc = await nats.connect(nats_server.url)
        try:
            info = await nc.jetstream().stream_info(
                stream_name_for(FLOW, RUN, NODE), subjects_filter=eos_subject_for(FLOW, RUN, NODE))
            return sum((info.state.subjects or {}).values())
        finally:
            await nc.close()

    assert asyncio.run(markers_left()) == 1  # replica 0's clean end
    assert asyncio.run(consumers(nats_server.url)) == []  # no reader left behind


def test_a_durable_with_a_delivery_cap_keeps_its_leases_until_ack_wait(
        nats_server: embedded.EmbeddedServer) -> None:
    # A lease on its last delivery would lapse into a max-deliveries advisory that no
    # replica is there to hear yet: its message neither processed nor dead-lettered.
    asyncio.run(leave_leases(nats_server.url, max_deliver=2))
    assert release_leases(nats_server.url, FLOW, RUN, [NODE]) == 0
    got, ack_wait = asyncio.run(read_after_the_release(nats_server.url))
    assert got[:4] == [(6, 1), (7, 1), (8, 1), (9, 1)] and ack_wait == 30.0
