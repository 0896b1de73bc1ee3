"""Packs (videoflow.wire.packs, videoflow.messaging.packs): several envelopes in one
broker message. On the wire: the layout, its prefix, what a reader rejects. Read by a
node, on the memory adapter: every member is an input of its own, in order; the
message is settled once, when its last member is; a member that asks for a retry brings
the whole pack again, and its completed members' outputs are not published twice; a
member given up on is given up on alone, against a record of its own."""

from __future__ import annotations

from typing import Any

import pytest
from messenger_flows import FAST_RETRIES, FLOW, RUN, flows, run_node, run_producer

from videoflow.backends.jetstream.publisher import PACK_BYTES, PACK_MEMBERS, pack_runs
from videoflow.backends.messaging import (
    Accepted,
    ChannelId,
    Envelope,
    Known,
    PublicationUnknown,
    Receipt,
    SubscriptionId,
)
from videoflow.core.policies import PoisonMessage
from videoflow.errors import WireError
from videoflow.messaging.dead_letters import decode_dead_letter
from videoflow.wire.packs import PACK_PREFIX, decode_pack, encode_pack, is_pack, pack_split
from videoflow.wire.serialization import decode_envelope, encode_envelope

__all__ = ["flows"]

CAM = ChannelId(FLOW, RUN, "cam")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def member(message: Any, seq: int) -> bytes:
    return encode_envelope(message, trace_id=f"foreign:{seq}", seq=seq,
                           producer_name="cam", event_ts=1000.0 + seq)


def test_a_pack_round_trips_and_starts_with_its_prefix() -> None:
    members = [member("b", 1), member("c", 2)]
    data = encode_pack("cam:pack:1", members, [TRACEPARENT, None])
    assert data.startswith(PACK_PREFIX) and is_pack(data)
    assert not is_pack(members[0])
    pack = decode_pack(data)
    assert (pack.pack_id, pack.members, pack.traceparents) == (
        "cam:pack:1", members, [TRACEPARENT, None])


def test_a_reader_that_knows_no_packs_rejects_one_as_an_envelope() -> None:
    with pytest.raises(WireError, match="version 4"):
        decode_envelope(encode_pack("p", [member("b", 1)], [None]))


@pytest.mark.parametrize("data", [
    b"\x94\x04",  # cut short
    b"\x94\x04\xa1p\x90\x90",  # no members
    b"\x94\x04\xa1p\x91\xc4\x01x\x92\xc0\xc0",  # two traceparents for one member
    b"\x94\x04\xa1p\x91\xa1x\x91\xc0",  # a member that is a str, not bin
    member("b", 1),  # an envelope
])
def test_what_is_not_a_whole_pack_is_refused(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_pack(data)


def test_a_pack_has_members_and_a_traceparent_for_each() -> None:
    with pytest.raises(ValueError, match="at least one member"):
        encode_pack("p", [], [])
    with pytest.raises(ValueError, match="one traceparent per member"):
        encode_pack("p", [member("b", 1)], [])


def publish_pack(flow: Any, members: list[bytes], pack_id: str = "cam:pack:1",
                 traceparents: list[str | None] | None = None) -> None:
    data = encode_pack(pack_id, members, traceparents or [None] * len(members))
    outcome = flow.admin.publish(Envelope(CAM, "data", data, pack_id), 10**9)
    assert type(outcome).__name__ == "Accepted"


def settled_everything(flow: Any, node: str) -> None:
    """Nothing of cam's stream is left for node: available or leased."""
    seen = flow.admin.observe_subscription(SubscriptionId(node, CAM))
    assert isinstance(seen, Known), seen
    assert (seen.value.available, seen.value.leased) == (0, 0)


def test_each_member_is_an_input_in_order_and_the_pack_is_settled_once(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam, work, sink = flow.messenger("cam"), flow.messenger("work"), flow.messenger("sink")
    cam.publish_message("a")
    publish_pack(flow, [member("b", 1), member("c", 2), member("d", 3)],
                 traceparents=[None, TRACEPARENT, None])
    run_producer(cam, ["e"])
    *inputs, _ = run_node(work, lambda got: got["cam"]["message"].upper())
    assert [got["cam"]["message"] for got in inputs] == ["a", "b", "c", "d", "e"]
    assert [got["cam"]["event_ts"] for got in inputs[1:4]] == [1001.0, 1002.0, 1003.0]
    assert work.received["cam"] == 5
    settled_everything(flow, "work")
    *groups, _ = run_node(sink, None)
    assert [g["work"]["message"] for g in groups] == ["A", "B", "C", "D", "E"]


@pytest.mark.timeout(60)
def test_a_member_that_asks_for_a_retry_brings_its_whole_pack_again(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam = flow.messenger("cam")
    # Its lease outlasts the test: the pack comes again because it was handed back.
    work = flow.messenger("work", delivery_policy=FAST_RETRIES, ack_wait=600)
    sink = flow.messenger("sink")
    publish_pack(flow, [member("b", 1), member("c", 2), member("d", 3)])
    run_producer(cam, ["e"])
    processed: list[str] = []

    def once_flaky(got: dict[str, Any]) -> str:
        message = got["cam"]["message"]
        processed.append(message)
        if message == "c" and processed.count("c") == 1:
            raise ConnectionError("upstream service down")
        return str(message).upper()

    run_node(work, once_flaky)
    # b was done when c failed: it comes again with its pack, and so does d (after e,
    # which was delivered meanwhile).
    assert processed == ["b", "c", "d", "e", "b", "c", "d"]
    assert flow.broker.dead_letters(FLOW) == []
    settled_everything(flow, "work")
    # b's and d's outputs carry the ids they had: the broker kept one of each.
    *groups, _ = run_node(sink, None)
    assert sorted(g["work"]["message"] for g in groups) == ["B", "C", "D", "E"]


def test_members_given_up_on_are_given_up_on_alone_each_against_its_own_record(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam = flow.messenger("cam")
    work = flow.messenger("work", delivery_policy=FAST_RETRIES)
    flow.messenger("sink")
    publish_pack(flow, [member("b", 1), member("poison", 2), b"\xc1garbage",
                        member("poison", 4), member("e", 5)])
    run_producer(cam, [])

    def picky(got: dict[str, Any]) -> str:
        if got["cam"]["message"] == "poison":
            raise PoisonMessage("not this one")
        return str(got["cam"]["message"])

    *inputs, _ = run_node(work, picky)
    assert [got["cam"]["message"] for got in inputs] == ["b", "e"]
    # Two dead letters, one per member (their ids name the member), and one
    # termination against the log for the bytes that are no envelope.
    letters = [decode_dead_letter(record) for _, record in flow.broker.dead_letters(FLOW)]
    assert [decode_envelope(letter.envelope)["seq"] for letter in letters] == [2, 4]
    assert {letter.reason for letter in letters} == {"poison"}
    assert work.take_drops()["undecodable"] == 1
    (entry,) = work.terminal_entries()
    assert entry["reason"].startswith("undecodable") and entry["record_ref"].endswith(".3")
    settled_everything(flow, "work")


def queued(name: str, n: int, *, subject: str = "vf.flow.run.cam", packable: bool = True,
           size: int = 8) -> list[Any]:
    return [(subject, Envelope(CAM, "data", bytes(size), f"{name}{i}", packable=packable),
             100.0 + i, Receipt()) for i in range(n)]


def test_packable_publications_queued_together_go_in_packs_by_subject_and_bound() -> None:
    items = (queued("a", 3) + queued("x", 1, packable=False) + queued("b", 2)
             + queued("c", 2, subject="vf.flow.run.other") + queued("d", PACK_MEMBERS + 1)
             + queued("y", 1, packable=False) + queued("e", 3, size=PACK_BYTES // 2))
    sent = pack_runs(items, lambda *_: None)
    # a0-a2 | x0 alone | b0-b1 | c0-c1 (another subject) | d: 64, then the next one
    # alone | y0 | e: two fill the bytes, the third alone
    assert [envelope.msg_id for _, envelope, _, _ in sent] == [
        "a0+3", "x0", "b0+2", "c0+2", f"d0+{PACK_MEMBERS}", f"d{PACK_MEMBERS}", "y0",
        "e0+2", "e2"]
    first = sent[0]
    assert first[2] == 100.0  # the earliest deadline of its members
    pack = decode_pack(first[1].data)
    assert pack.members == [bytes(8)] * 3 and pack.pack_id == "a0+3"


def test_a_packs_outcome_answers_each_member_and_an_unknown_one_is_remembered() -> None:
    remembered: list[Any] = []
    items = queued("a", 2) + queued("n", 1, packable=False) + queued("b", 3)
    first, alone, second = pack_runs(
        items, lambda pack, members: remembered.append((pack.msg_id, len(members))))
    assert alone is items[2]  # sent as it is, its own receipt
    first[3].set_result(Accepted(7))
    second[3].set_result(PublicationUnknown("lost"))
    assert [r.result(0) for *_, r in items[:2]] == [Accepted(7)] * 2
    assert all(isinstance(r.result(0), PublicationUnknown) for *_, r in items[3:])
    assert remembered == [("b0+3", 3)]  # the pack whose members observe re-publishes


def test_a_writers_split_into_packs_depends_on_the_sizes_alone() -> None:
    # A processor's outputs made again split the same way: the same packs, the same ids.
    assert pack_split([]) == []
    assert pack_split([8] * (2 * PACK_MEMBERS + 1)) == [PACK_MEMBERS, PACK_MEMBERS, 1]
    half = PACK_BYTES // 2
    assert pack_split([half, half, 1, PACK_BYTES + 1, 3]) == [2, 1, 1, 1]
    sizes = [(i * 7919) % 20_000 for i in range(500)]
    start = 0
    for count in pack_split(sizes):  # every run within both bounds, and as long as they allow
        run = sizes[start:start + count]
        start += count
        assert count <= PACK_MEMBERS and (sum(run) <= PACK_BYTES or count == 1)
        if start < len(sizes):
            assert count == PACK_MEMBERS or sum(run) + sizes[start] > PACK_BYTES
    assert start == len(sizes)


def test_no_pack_without_two_packable_neighbours() -> None:
    alone = queued("a", 1) + queued("x", 1, packable=False) + queued("b", 1)
    assert pack_runs(alone, lambda *_: None) == alone


def test_a_time_join_takes_an_imu_far_ahead_in_packs_beside_a_late_camera(flows) -> None:  # type: ignore[no-untyped-def]
    # Inputs out of step: the IMU's 400 Hz samples come first, all of them, in packs of
    # 20; camera 0 is on time and camera 1 comes after everything else. Each group
    # still gets both frames of its instant and exactly the samples of its window, and
    # every pack is settled once its samples were taken or let go.
    flow = flows({"cam0": [], "cam1": [], "imu": [], "fuse": ["cam0", "cam1", "imu"],
                  "sink": ["fuse"]})
    policy = {"mode": "time", "tolerance_ms": 5.0, "timeout_ms": 60_000.0,
              "missing": "drop", "collect": {"imu": 10.0}}
    cams = {c: flow.messenger(c) for c in ("cam0", "cam1")}
    fuse = flow.messenger("fuse", join_policy=policy, clock=lambda: 1000.0)
    instants, rate = 30, 400

    def frames(cam: str) -> None:
        for k in range(instants):
            cams[cam].set_output_event_timestamp(k / 30)
            cams[cam].publish_message(k)
        cams[cam].publish_stop_signal()

    frames("cam0")
    samples = [encode_envelope(i, trace_id=f"imu:{i}", seq=i + 1, event_ts=i / rate)
               for i in range(instants * rate // 30)]
    imu = ChannelId(FLOW, RUN, "imu")
    for start in range(0, len(samples), 20):
        pack = encode_pack(f"imu:{start}", samples[start:start + 20], [None] * 20)
        assert type(flow.admin.publish(Envelope(imu, "data", pack, f"imu:{start}"),
                                       10**9)).__name__ == "Accepted"
    flow.admin.publish(Envelope(imu, "eos", encode_envelope(
        None, trace_id="imu:end", seq=0, metadata={"replicas": 1}, is_stop_signal=True,
        producer_name="imu"), "imu:eos:0"), 10**9)
    frames("cam1")

    def fused(got: dict[str, Any]) -> int:
        k = got["cam0"]["message"]
        assert got["cam1"]["message"] == k
        window = got["imu"]["message"]
        assert window and all(abs(i / rate - k / 30) <= 0.010 + 1e-9 for i in window), k
        return k

    *groups, _ = run_node(fuse, fused)
    assert len(groups) == instants
    assert fuse.take_drops()["join_evicted"] == 0
    seen = flow.admin.observe_subscription(SubscriptionId("fuse", imu))
    assert isinstance(seen, Known) and (seen.value.available, seen.value.leased) == (0, 0)
