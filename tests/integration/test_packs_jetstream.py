"""Packs read by a node on a real nats-server: a pack a foreign writer published with
nats-py is read member by member, in order with the messages around it; a member that
asks for a retry brings the whole pack again, handed back at once (not after its
lease), and the broker keeps one copy of each output; once every member is settled,
nothing of the pack is left on the durable. And `videoflow tap` shows each member. A
live producer's burst goes in packs (pack=True), every message arriving once and in
order, and a pack whose receipt was lost is resolved for each member by re-publishing
it whole. A packing processor after it sends each inbound pack's outputs as one pack:
as many broker messages as it read, every message once and in order."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import nats
import pytest
from test_nats_messenger_jetstream import node_loop

from videoflow.backends.messaging import Accepted, ChannelId, Envelope, PublicationUnknown
from videoflow.broker import server as embedded
from videoflow.core.compiler import NodeSpec
from videoflow.core.constants import BATCH
from videoflow.core.naming import durable_name_for, stream_name_for, subject_for
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.messaging.topology import provision_flow_sync
from videoflow.ops.tap import Tapped, tap
from videoflow.wire.packs import encode_pack
from videoflow.wire.serialization import encode_envelope

pytestmark = pytest.mark.timeout(90)

FLOW, RUN = "flow", "run"
ACK_WAIT = 600  # longer than the test may take: a pack comes again only if handed back
FAST_RETRIES = {"max_retries": 2, "backoff": {"base_ms": 20.0, "factor": 1.0, "max_ms": 20.0}}


def messenger(url: str, node: str, parents: list[str], pack: bool = False,
              **options: Any) -> NATSMessenger:
    return NATSMessenger(SimpleNamespace(name=node, pack=pack), parents, url, FLOW, BATCH,
                         RUN, ack_wait=ACK_WAIT, eos_quiescence_ms=200, **options)


async def publish_pack(url: str, subject: str, pack_id: str, members: list[bytes]) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(subject, encode_pack(pack_id, members, [None] * len(members)),
                                     headers={"Nats-Msg-Id": pack_id})
    finally:
        await nc.close()


def provision_linear(url: str) -> None:
    """cam -> work -> sink."""
    specs = [NodeSpec("cam", "producer"), NodeSpec("work", "processor", parents=("cam",)),
             NodeSpec("sink", "consumer", parents=("work",))]
    provision_flow_sync(url, specs, FLOW, RUN, BATCH, ack_wait=ACK_WAIT, timeout=30)


async def left_on(url: str, stream: str, durable: str) -> tuple[int, int]:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
        return info.num_pending, info.num_ack_pending
    finally:
        await nc.close()


def test_a_foreign_pack_is_read_member_by_member_and_a_retry_brings_it_whole_again(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    provision_linear(url)
    cam = messenger(url, "cam", [])
    try:
        cam.publish_message("a")
        cam.drain()  # stored before the pack, which another connection publishes
        members = [encode_envelope(m, trace_id=f"foreign:{i}", seq=i, producer_name="cam")
                   for i, m in enumerate(["b", "c", "d"], 1)]
        asyncio.run(publish_pack(url, subject_for(FLOW, RUN, "cam"), "foreign:pack:1",
                                 members))
        cam.publish_message("e")
        cam.publish_stop_signal()
    finally:
        cam.close()
    processed: list[str] = []

    def once_flaky(inputs: dict[str, Any]) -> str:
        message = inputs["cam"]["message"]
        processed.append(message)
        if message == "c" and processed.count("c") == 1:
            raise ConnectionError("upstream service down")
        return str(message).upper()

    outputs: list[Any] = []
    got: list[Any] = []
    threads = [threading.Thread(target=node_loop, args=(
                   messenger(url, "work", ["cam"], delivery_policy=FAST_RETRIES),
                   once_flaky, outputs, (Exception,))),
               threading.Thread(target=node_loop,
                                args=(messenger(url, "sink", ["work"]), None, got))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    # Every member once, then b, c and d again: the pack came back whole for c.
    assert processed[:5] == ["a", "b", "c", "d", "e"]
    assert sorted(processed[5:]) == ["b", "c", "d"]
    # b's and d's outputs were published twice under the same ids: kept once.
    assert sorted(inputs["work"]["message"] for inputs in got) == ["A", "B", "C", "D", "E"]
    assert asyncio.run(left_on(url, stream_name_for(FLOW, RUN, "cam"),
                               durable_name_for("work", "cam"))) == (0, 0)


def test_tap_shows_each_member_of_a_pack_and_a_broken_pack_as_one_undecodable(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    subject = subject_for(FLOW, RUN, "cam")

    async def publish() -> None:
        nc = await nats.connect(url)
        try:
            members = [encode_envelope(m, trace_id=f"t{m}", seq=1) for m in "bcd"]
            await nc.publish(subject, encode_pack("p", members, [None] * 3))
            await nc.publish(subject, b"\x94\x04 not a pack")
            await nc.publish(subject, encode_envelope("e", trace_id="te", seq=1))
            await nc.flush()
        finally:
            await nc.close()

    seen: list[Tapped] = []

    def ready(_subject: str) -> None:  # subscribed: publish from another loop
        threading.Thread(target=lambda: asyncio.run(publish())).start()

    n = tap(url, FLOW, "cam", seen.append, run_id=RUN, count=5, seconds=30, ready=ready)
    assert n == 5
    assert [t.envelope["message"] if t.envelope else None for t in seen] == [
        "b", "c", "d", None, "e"]
    assert "malformed pack" in seen[3].error


async def stored(url: str, node: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(stream_name_for(FLOW, RUN, node))).state.messages
    finally:
        await nc.close()


def test_a_packing_producers_burst_goes_in_packs_and_every_message_arrives_once_in_order(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    specs = [NodeSpec("cam", "producer"), NodeSpec("sink", "consumer", parents=("cam",))]
    provision_flow_sync(url, specs, FLOW, RUN, BATCH, ack_wait=ACK_WAIT, timeout=30)
    n = 3000
    cam = messenger(url, "cam", [], pack=True)
    try:
        for i in range(n):  # as fast as it can: what queues while the loop is busy packs
            cam.publish_message(i.to_bytes(8, "little"))
        cam.publish_stop_signal()
    finally:
        cam.close()
    got: list[Any] = []
    node_loop(messenger(url, "sink", ["cam"]), None, got)
    assert [int.from_bytes(g["cam"]["message"], "little") for g in got] == list(range(n))
    # Fewer broker messages than outputs: packs carried them (and the end marker has
    # its own subject and stream sequence in it).
    assert asyncio.run(stored(url, "cam")) < n


def test_a_packs_unknown_outcome_is_resolved_for_each_member_by_re_publishing_the_pack(
    nats_server: embedded.EmbeddedServer, freeze: Any,
) -> None:
    url = nats_server.url
    specs = [NodeSpec("cam", "producer"), NodeSpec("sink", "consumer", parents=("cam",))]
    provision_flow_sync(url, specs, FLOW, RUN, BATCH, ack_wait=ACK_WAIT, timeout=30)
    cam = messenger(url, "cam", [])
    try:
        sent = [Envelope(ChannelId(FLOW, RUN, "cam"), "data",
                         encode_envelope(i, trace_id=f"t{i}", seq=i + 1), f"cam-{i}",
                         packable=True) for i in range(20)]
        backend = cam.backend
        with freeze(nats_server):  # the receipts are lost; the server stores it all later
            deadline = time.monotonic() + 0.5
            outcomes = [r.result(timeout=5) for r in
                        [backend.publish_async(e, deadline) for e in sent]]
        assert all(isinstance(o, PublicationUnknown) for o in outcomes), outcomes
        observed = [backend.observe_publication(e) for e in sent]
        # Each member's pack was already stored: re-published whole, a duplicate.
        assert all(isinstance(o, Accepted) and o.duplicate for o in observed), observed
        packs = asyncio.run(stored(url, "cam"))
        assert packs == len({o.stream_seq for o in observed if isinstance(o, Accepted)})
        cam.publish_stop_signal()
    finally:
        cam.close()
    got: list[Any] = []
    node_loop(messenger(url, "sink", ["cam"]), None, got)
    assert [g["cam"]["message"] for g in got] == list(range(20))  # each once


def test_a_packing_processor_mirrors_its_inputs_packs_and_every_message_arrives_once(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    provision_linear(url)
    n = 3000
    cam = messenger(url, "cam", [], pack=True)
    try:
        for i in range(n):
            cam.publish_message(i.to_bytes(8, "little"))
        cam.publish_stop_signal()
    finally:
        cam.close()
    outputs: list[Any] = []
    node_loop(messenger(url, "work", ["cam"], pack=True),
              lambda inputs: inputs["cam"]["message"][::-1], outputs)
    got: list[Any] = []
    node_loop(messenger(url, "sink", ["work"]), None, got)
    assert [int.from_bytes(g["work"]["message"], "big") for g in got] == list(range(n))
    # The processor read cam's packs and wrote one pack for each: as many messages.
    packs = asyncio.run(stored(url, "cam"))
    assert packs < n and asyncio.run(stored(url, "work")) == packs
