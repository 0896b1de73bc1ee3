"""ended_replicas on a real nats-server: which replicas' clean end markers are on a
kept run's stream, read without leaving a reader behind (a lingering one counted the
resumed replicas' new end markers as unprocessed, and the resumed run was kept)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import StreamConfig

from videoflow.broker import server as embedded
from videoflow.core.naming import eos_subject_for, stream_name_for, subject_for
from videoflow.messaging.messenger_deliveries import end_marker
from videoflow.ops.resume import ended_replicas

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
