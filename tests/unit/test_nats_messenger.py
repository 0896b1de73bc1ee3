"""NATSMessenger on the memory adapter: flows run node by node in one thread, every
scenario deterministic. Each node gets its own backend on one shared broker, as each
worker process holds its own connection to one server."""

from __future__ import annotations

import concurrent.futures
import inspect
import mmap
import os
import random
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import messenger_flows
import numpy as np
import pytest
from messenger_flows import FAST_RETRIES, FLOW, RUN, run_node, run_producer, run_sink
from shm_helpers import base_of

from videoflow.backends.memory import MemoryMessagingBackend
from videoflow.backends.messaging import (
    LIVE_LATEST,
    ChannelId,
    ChannelSpec,
    Completed,
    Envelope,
    Known,
    Receipt,
    SettleResult,
    SettleUnknown,
    SubscriptionId,
    Unknown,
)
from videoflow.backends.payload import MemoryPayloadStore
from videoflow.backends.shm_payload import SharedMemoryPayloadStore
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.engine import CHECKPOINT_METADATA_KEY
from videoflow.core.policies import PoisonMessage, WorkerFatal
from videoflow.core.runtime import FlowRuntime, MemoryRuntimeStore
from videoflow.errors import DurabilityUnavailable
from videoflow.messaging.dead_letters import decode_dead_letter
from videoflow.messaging.grouping import ENTRY_KEYS, EnvelopeEntry
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.messaging.partitions import partition_of
from videoflow.wire.offload import MemoryBlobStore
from videoflow.wire.serialization import decode_envelope, encode_envelope

flows = messenger_flows.flows  # the in-memory flows fixture, taken by name


def test_a_chain_carries_every_message_its_trace_and_its_event_time_to_the_end(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "double": ["cam"], "sink": ["double"]})
    cam, double, sink = flow.messenger("cam"), flow.messenger("double"), flow.messenger("sink")
    run_producer(cam, [1, 2, 3, 4, 5])
    producer_traces: list[str] = []

    def doubled(inputs: dict[str, Any]) -> Any:
        info = double.last_input_info()
        assert info is not None and info["cam"] is not None
        producer_traces.append(info["cam"]["trace_id"])
        return inputs["cam"]["message"] * 2

    run_node(double, doubled)
    sink_traces: list[str] = []

    def seen(inputs: dict[str, Any]) -> None:
        info = sink.last_input_info()
        assert info is not None and info["double"] is not None
        sink_traces.append(info["double"]["trace_id"])

    received = run_sink(sink, seen)
    *groups, stop = received
    # One form per delivery: the task gets the entry the assembler kept, not a copy.
    assert all(type(g["double"]) is EnvelopeEntry for g in groups)
    assert [g["double"]["message"] for g in groups] == [2, 4, 6, 8, 10]
    # The event time a producer set travels with the event, and so does its trace id.
    assert [g["double"]["event_ts"] for g in groups] == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert sink_traces == producer_traces and len(set(producer_traces)) == 5
    # An entry is read by key (Messenger.receive_message): every key, compared whole.
    assert list(stop) == ["double"]
    assert {key: stop["double"][key] for key in ENTRY_KEYS} == {
        "message": None, "metadata": None, "event_ts": None, "is_stop_signal": True,
        "is_abort": False, "abort_origin": None, "abort_error": None}
    assert sink.last_input_info() is None  # after the end, nothing is the last input
    assert cam.publication_stats["accepted"] == 6  # five messages and the end marker
    for messenger in (cam, double, sink):
        assert messenger.take_drops() == dict.fromkeys(
            ("exhausted", "undecodable", "join_evicted", "join_late", "publish_discarded",
             "superseded"), 0)


def test_a_diamond_joins_the_two_branches_of_each_event_by_trace(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "left": ["cam"], "right": ["cam"], "fuse": ["left", "right"],
                  "sink": ["fuse"]})
    cam, left, right = flow.messenger("cam"), flow.messenger("left"), flow.messenger("right")
    fuse, sink = flow.messenger("fuse"), flow.messenger("sink")
    run_producer(cam, list(range(6)))
    run_node(left, lambda inputs: ("L", inputs["cam"]["message"]))
    run_node(right, lambda inputs: ("R", inputs["cam"]["message"]))
    keys = []

    def fused(inputs: dict[str, Any]) -> Any:
        keys.append(fuse.last_input_key())
        info = fuse.last_input_info()
        assert info is not None and info["left"]["trace_id"] == info["right"]["trace_id"]
        return (inputs["left"]["message"], inputs["right"]["message"])

    run_node(fuse, fused)
    *groups, _ = run_node(sink, None)
    assert [g["fuse"]["message"] for g in groups] == [[["L", n], ["R", n]] for n in range(6)]
    assert len(set(keys)) == 6  # one group per originating event


def test_a_poison_input_is_dead_lettered_at_once_and_the_flow_goes_on(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam = flow.messenger("cam")
    work = flow.messenger("work", delivery_policy=FAST_RETRIES)
    sink = flow.messenger("sink")
    run_producer(cam, [1, 2, 3])

    def fragile(inputs: dict[str, Any]) -> Any:
        if inputs["cam"]["message"] == 2:
            raise PoisonMessage("frame 2 is corrupt")
        return inputs["cam"]["message"]

    run_node(work, fragile)
    *groups, _ = run_node(sink, None)
    assert [g["work"]["message"] for g in groups] == [1, 3]
    (only,) = flow.broker.dead_letters(FLOW)
    record = decode_dead_letter(only[1])
    assert (record.node, record.parent, record.reason, record.attempts) == (
        "work", "cam", "poison", 1)  # first failure: no attempts burned
    assert "frame 2 is corrupt" in record.error_message
    assert decode_envelope(record.envelope)["message"] == 2  # the input, as it arrived


def test_a_transient_failure_is_retried_then_dead_lettered_after_max_retries(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam, work = flow.messenger("cam"), flow.messenger("work", delivery_policy=FAST_RETRIES)
    flow.messenger("sink")
    run_producer(cam, ["x"])
    attempts = []

    def flaky(inputs: dict[str, Any]) -> Any:
        attempts.append(inputs["cam"]["message"])
        raise ConnectionError("upstream service down")

    run_node(work, flaky)
    assert len(attempts) == 3  # the first delivery and max_retries=2 redeliveries
    (only,) = flow.broker.dead_letters(FLOW)
    assert decode_dead_letter(only[1]).reason == "retries_exhausted"


def test_a_worker_fatal_error_hands_the_input_back_without_a_dead_letter(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam, work = flow.messenger("cam"), flow.messenger("work", delivery_policy=FAST_RETRIES)
    flow.messenger("sink")
    run_producer(cam, ["x"])
    calls = []

    def broken_then_fixed(inputs: dict[str, Any]) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise WorkerFatal("GPU lost")
        return "ok"

    run_node(work, broken_then_fixed)
    assert len(calls) == 2
    assert flow.broker.dead_letters(FLOW) == []


def test_bytes_that_are_not_an_envelope_are_counted_and_terminated_against_the_log(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, sink = flow.messenger("cam"), flow.messenger("sink")
    cam.publish_message("before")
    outcome = flow.admin.publish(Envelope(ChannelId(FLOW, RUN, "cam"), "data", b"\xc1garbage"),
                                 10**9)
    assert outcome.__class__.__name__ == "Accepted"
    run_producer(cam, ["after"])
    *groups, _ = run_node(sink, None)
    assert [g["cam"]["message"] for g in groups] == ["before", "after"]
    assert sink.take_drops()["undecodable"] == 1
    (entry,) = sink.terminal_entries()
    assert entry["reason"].startswith("undecodable") and entry["record_ref"].startswith(
        "terminal:sink:")


def test_an_end_marker_on_the_data_subject_is_undecodable_and_the_node_goes_on(flows) -> None:  # type: ignore[no-untyped-def]
    # End markers travel on the end-marker subject. A foreign writer's envelope flagged
    # as one on the data subject must not end a one-parent node while data still comes.
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, sink = flow.messenger("cam"), flow.messenger("sink")
    cam.publish_message("before")
    data = ChannelId(FLOW, RUN, "cam")
    for flags in ({"is_stop_signal": True}, {"is_abort": True, "abort_origin": "cam"}):
        forged = encode_envelope("x", trace_id="forged", seq=0, **flags)
        assert flow.admin.publish(Envelope(data, "data", forged), 10**9).__class__.__name__ \
            == "Accepted"
    run_producer(cam, ["after"])
    *groups, stop = run_node(sink, None)
    assert [g["cam"]["message"] for g in groups] == ["before", "after"]
    assert stop["cam"]["is_stop_signal"]  # the real end, after the data
    assert sink.take_drops()["undecodable"] == 2
    assert all(entry["reason"].startswith("undecodable") for entry in sink.terminal_entries())


@pytest.mark.parametrize("error", ["boom", ["a", 1], {"type": 7, "message": "x"}])
def test_an_abort_whose_error_is_not_an_error_record_reaches_the_child_as_malformed(
        flows, error: Any) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    sink = flow.messenger("sink")
    marker = encode_envelope(None, trace_id="cam:end", seq=0, metadata={"replicas": 1},
                             is_abort=True, abort_origin="cam", abort_error=error)
    flow.admin.publish(Envelope(ChannelId(FLOW, RUN, "cam"), "eos", marker, "cam:abort:0"),
                       10**9)
    (stop,) = run_node(sink, None)
    assert stop["cam"]["is_abort"] and stop["cam"]["abort_origin"] == "cam"
    assert stop["cam"]["abort_error"] == {"type": "malformed", "message": repr(error)}


def test_an_abort_reaches_the_child_as_an_aborted_end_carrying_the_error(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, sink = flow.messenger("cam"), flow.messenger("sink")
    cam.publish_message("frame")
    cam.publish_abort(RuntimeError("camera unplugged"))
    *groups, stop = run_node(sink, None)
    assert [g["cam"]["message"] for g in groups] == ["frame"]
    assert stop["cam"]["is_abort"] and not stop["cam"]["is_stop_signal"]
    assert stop["cam"]["abort_origin"] == "cam"
    assert stop["cam"]["abort_error"] == {"type": "RuntimeError", "message": "camera unplugged"}


def test_every_replica_of_a_parent_must_end_before_the_child_does(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    first = flow.messenger("cam", nb_tasks=2, replica_id=0)
    second = flow.messenger("cam", nb_tasks=2, replica_id=1)
    sink = flow.messenger("sink")
    run_producer(first, ["a"])  # replica 0 ends; replica 1 is still going
    assert sink.receive_message()["cam"]["message"] == "a"
    sink.ack_inputs()
    answers: list[dict[str, Any]] = []
    waiting = threading.Thread(target=lambda: answers.append(sink.receive_message()))
    waiting.start()
    waiting.join(0.5)
    assert answers == []  # one end marker of two: the parent has not ended
    second.publish_message("b")  # the same first output number as replica 0's "a"
    second.publish_stop_signal()
    waiting.join(5)
    assert [a["cam"]["message"] for a in answers] == ["b"]
    sink.ack_inputs()
    assert sink.receive_message()["cam"]["is_stop_signal"]


def test_four_cameras_and_an_imu_fuse_by_capture_instant_never_merging_two(flows) -> None:  # type: ignore[no-untyped-def]
    # The generator's ground truth: camera c captures instant k at k/30 s plus its own
    # clock offset and up to +-3 ms of jitter, and drops 2% of its frames; the IMU
    # samples at 400 Hz. Fused groups must hold frames of exactly one instant each, a
    # dropped frame must give a quorum group with None for that camera, and each group
    # must carry the IMU samples within its window.
    rng = random.Random(7)
    cams = [f"cam{c}" for c in range(4)]
    flow = flows({**{c: [] for c in cams}, "imu": [], "fuse": [*cams, "imu"], "sink": ["fuse"]})
    policy = {"mode": "time", "tolerance_ms": 12.0, "quorum": 3, "timeout_ms": 60_000.0,
              "missing": "drop", "collect": {"imu": 20.0}}
    producers = {c: flow.messenger(c) for c in [*cams, "imu"]}
    # Everything is published before the fusion starts (a replay), so wall time says
    # nothing about event time: the fusion's clock stands still, and windows close on
    # the IMU's event-time watermark alone, never on the wall-time backstop.
    fuse = flow.messenger("fuse", join_policy=policy, clock=lambda: 1000.0)
    sink = flow.messenger("sink")
    instants = 60
    dropped: set[tuple[str, int]] = set()
    for c, cam in enumerate(cams):
        offset = (c - 1.5) * 0.001
        for k in range(instants):
            if rng.random() < 0.02:
                dropped.add((cam, k))
                continue
            producers[cam].set_output_event_timestamp(k / 30 + offset + rng.uniform(-0.003, 0.003))
            producers[cam].publish_message({"camera": cam, "instant": k})
        producers[cam].publish_stop_signal()
    for i in range(int(instants / 30 * 400)):
        producers["imu"].set_output_event_timestamp(i / 400)
        producers["imu"].publish_message(i)
    producers["imu"].publish_stop_signal()

    def fused(inputs: dict[str, Any]) -> Any:
        frames = [inputs[c]["message"] for c in cams if inputs[c] is not None]
        instant = {f["instant"] for f in frames}
        assert len(instant) == 1, frames  # never a merge of two capture instants
        (k,) = instant
        missing = {c for c in cams if inputs[c] is None}
        assert missing == {c for c in cams if (c, k) in dropped}, (k, missing)
        samples = inputs["imu"]["message"]
        # window 20 ms around a group time within 1.5 ms offset + 3 ms jitter of k/30
        assert samples and all(abs(s / 400 - k / 30) <= 0.0245 + 1e-9 for s in samples)
        return {"instant": k, "frames": len(frames), "imu": len(samples)}

    run_node(fuse, fused)
    *groups, _ = run_sink(sink, lambda inputs: None)
    emitted = [g["fuse"]["message"] for g in groups]
    full = [k for k in range(instants)
            if sum((c, k) in dropped for c in cams) <= 1]  # at least a quorum of 3 captured
    assert sorted(g["instant"] for g in emitted) == full
    assert any(g["frames"] == 3 for g in emitted) == any(
        sum((c, k) in dropped for c in cams) == 1 for k in range(instants))
    assert fuse.take_drops()["join_evicted"] == 0
    assert flow.broker.dead_letters(FLOW) == []  # no group failed the checks above


class LosesAckReplies(MemoryMessagingBackend):
    """Fault injection: while armed, Completed settlements are applied by the broker but
    their confirmation is lost -- what a timed-out ack_sync looks like (PAY-004)."""

    armed = False

    def settle_many(self, settlements):  # type: ignore[no-untyped-def]
        results = super().settle_many(settlements)
        if not self.armed:
            return results
        return [SettleUnknown("confirmation lost (injected)")
                if isinstance(outcome, Completed) else result
                for (_, outcome, _), result in zip(settlements, results, strict=True)]

    def settle_async(self, token, outcome, settlement_id):  # type: ignore[no-untyped-def]
        # The pipelined path: the settlement is applied, its answer is lost.
        (result,) = self.settle_many([(token, outcome, settlement_id)])
        future: concurrent.futures.Future[SettleResult] = concurrent.futures.Future()
        future.set_result(result)
        return future


def test_big_frames_travel_by_ref_through_a_join_and_are_reclaimed_only_after_confirmed_acks(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"cam_a": [], "cam_b": [], "fuse": ["cam_a", "cam_b"], "sink": ["fuse"]})
    store = MemoryPayloadStore()
    cams = {c: flow.messenger(c, payload_store=store, blob_reader_ids=["fuse"])
            for c in ("cam_a", "cam_b")}
    lossy = LosesAckReplies(flow.broker, flow_id=FLOW, run_id=RUN)
    lossy.start()
    fuse = NATSMessenger(SimpleNamespace(name="fuse"), ["cam_a", "cam_b"], "nats://unused",
                         FLOW, BATCH, RUN, backend=lossy, payload_store=store,
                         join_policy={"mode": "time", "tolerance_ms": 5.0},
                         clock=lambda: 1000.0)
    flow.made.append(fuse)
    frames = {c: np.full((2500, 2500, 4), i + 1, dtype=np.uint8)  # 25 MB each
              for i, c in enumerate(cams)}
    assert frames["cam_a"].nbytes == 25_000_000 > flow.broker.max_payload
    for c, messenger in cams.items():
        messenger.set_output_event_timestamp(5.0)
        messenger.publish_message(frames[c])
        messenger.publish_stop_signal()
    refs = store.refs()
    assert len(refs) == 2  # by ref: the broker never saw the pixels
    assert all(store.obligations(r) == ("fuse",) for r in refs)  # intents resolved

    inputs = fuse.receive_message()
    assert np.array_equal(inputs["cam_a"]["message"], frames["cam_a"])
    assert np.array_equal(inputs["cam_b"]["message"], frames["cam_b"])
    assert all(store.obligations(r) == ("fuse",) for r in refs)  # processing: still owed
    lossy.armed = True
    fuse.ack_inputs()
    # The acks reached the broker but were not confirmed: nothing may be released.
    assert fuse.unconfirmed_acks == 2
    assert all(store.obligations(r) == ("fuse",) for r in refs)
    lossy.armed = False
    # (Reconciliation releases such obligations once the broker's ack floor shows the
    # settlement happened -- RuntimeObligationLedger; here the test just ends the run.)


def test_a_confirmed_ack_releases_the_payload_and_it_is_reclaimed(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    store = MemoryPayloadStore()
    cam = flow.messenger("cam", payload_store=store, blob_reader_ids=["sink"])
    sink = flow.messenger("sink", payload_store=store)
    frame = np.arange(2_000_000, dtype=np.uint8)  # over the 1 MiB broker limit
    cam.publish_message(frame)
    cam.publish_stop_signal()
    (ref,) = store.refs()
    inputs = sink.receive_message()
    assert np.array_equal(inputs["cam"]["message"], frame)
    assert store.obligations(ref) == ("sink",)
    sink.ack_inputs()
    assert store.refs() == ()  # released after the confirmed ack, and so reclaimed
    assert sink.receive_message()["cam"]["is_stop_signal"]


def shared_memory_pair(flows, directory: Path):  # type: ignore[no-untyped-def]
    """A camera and its sink over one shared-memory payload store in directory."""
    flow = flows({"cam": [], "sink": ["cam"]})
    store = SharedMemoryPayloadStore(directory)
    cam = flow.messenger("cam", payload_store=store, blob_reader_ids=["sink"])
    return flow, store, cam, flow.messenger("sink", payload_store=store)


def test_through_shared_memory_a_frame_goes_by_ref_past_64_kib_and_arrives_as_a_mapping(
    flows, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    _, store, cam, sink = shared_memory_pair(flows, tmp_path)
    frame = np.arange(480 * 640, dtype=np.uint32).astype(np.uint8).reshape(480, 640)
    small = np.zeros(1000, np.uint8)  # far below the store's threshold: inline
    cam.publish_message({"frame": frame})
    cam.publish_message({"frame": small})
    cam.publish_stop_signal()
    (ref,) = store.refs()  # only the 300 KB frame, though the broker would take it
    assert store.records()[ref].channel == "cam"
    assert store.records()[ref].stream_seq is not None  # the accepted sequence, kept
    assert cam.runtime.outbox() == []  # the store's record is the outbox entry
    got = sink.receive_message()["cam"]["message"]["frame"]
    assert np.array_equal(got, frame) and not got.flags.writeable
    assert isinstance(base_of(got), mmap.mmap)  # a view of the mapping, no copy
    sink.ack_inputs()
    assert store.refs() == () and store.used_bytes() == 0
    assert np.array_equal(got, frame)  # still readable: the mapping outlives the payload
    assert np.array_equal(sink.receive_message()["cam"]["message"]["frame"], small)


def test_a_payload_gone_from_shared_memory_is_dead_lettered_and_the_next_input_follows(
    flows, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    flow, _, cam, sink = shared_memory_pair(flows, tmp_path)
    cam.publish_message(np.zeros(100_000, np.uint8))
    for blob in (tmp_path / "blobs").iterdir():
        blob.unlink()  # a host's cleanup, or a manual delete
    run_producer(cam, ["after"])
    *groups, _ = run_node(sink, None)
    assert [g["cam"]["message"] for g in groups] == ["after"]
    assert sink.take_drops()["undecodable"] == 1
    (only,) = flow.broker.dead_letters(FLOW)
    record = decode_dead_letter(only[1])
    assert (record.node, record.parent, record.reason) == ("sink", "cam", "undecodable")
    assert record.error_type.endswith("PayloadMissing") and "no bytes" in record.error_message
    assert sink.dead_lettered == 1


@pytest.mark.timeout(30)
def test_a_crash_between_processing_and_ack_redelivers_and_a_keyed_sink_applies_once(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"cam": [], "sink": ["cam"]})
    cam = flow.messenger("cam")
    crashing = flow.messenger("sink", ack_wait=1)
    run_producer(cam, ["a", "b"])
    applied: dict[str, Any] = {}
    calls: list[Any] = []

    def apply(messenger: NATSMessenger, inputs: dict[str, Any]) -> None:
        calls.append(inputs["cam"]["message"])
        key = messenger.last_input_key()
        assert key is not None
        applied.setdefault(key, inputs["cam"]["message"])  # idempotent on the group key

    apply(crashing, crashing.receive_message())  # applied ...
    crashing.backend.shutdown(hand_back=False)  # ... and the process dies before the ack
    replacement = flow.messenger("sink", ack_wait=1)
    run_sink(replacement, lambda inputs: apply(replacement, inputs))
    assert sorted(calls) == ["a", "a", "b"]  # "a" came back to the replacement
    assert sorted(applied.values()) == ["a", "b"]  # and was applied once


def test_a_join_half_that_times_out_is_dead_lettered_and_the_flow_still_ends(flows) -> None:  # type: ignore[no-untyped-def]
    # missing='dead_letter' (BATCH's default): a group that times out incomplete gives its
    # halves to the dead-letter stream; they no longer count as held, so the join still
    # drains and ends.
    now = [1000.0]
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    left, right = flow.messenger("left"), flow.messenger("right")
    fuse = flow.messenger("fuse", join_policy={"mode": "time", "tolerance_ms": 5.0,
                                               "timeout_ms": 1000.0},
                          clock=lambda: now[0])
    left.set_output_event_timestamp(1.0)
    left.publish_message("alone")  # its partner never comes
    left.set_output_event_timestamp(2.0)
    left.publish_message("paired")
    right.set_output_event_timestamp(2.0)
    right.publish_message("paired")
    fuse_inputs = fuse.receive_message()
    assert fuse_inputs["left"]["message"] == fuse_inputs["right"]["message"] == "paired"
    fuse.ack_inputs()
    now[0] += 2.0  # the lone half's group times out
    left.publish_stop_signal()
    right.publish_stop_signal()
    assert fuse.receive_message()["left"]["is_stop_signal"]
    (only,) = flow.broker.dead_letters(FLOW)
    record = decode_dead_letter(only[1])
    assert (record.node, record.parent, record.reason) == ("fuse", "left", "join_incomplete")
    # It says why (`dlq show` printed 'error: -').
    assert record.error_type == "videoflow.errors.JoinIncomplete"
    assert record.error_message.startswith("its group was given up below quorum")
    assert fuse.take_drops()["join_evicted"] == 1


def test_a_late_input_no_group_can_take_is_dropped_as_join_late_at_its_deadline(flows) -> None:  # type: ignore[no-untyped-def]
    # left sends 1.0 after 5.0: behind its own watermark, with no group left to take
    # it. It waits a timeout (a redelivery's partners would come by then), then goes,
    # counted as join_late, not as an evicted half.
    now = [1000.0]
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    left, right = flow.messenger("left"), flow.messenger("right")
    fuse = flow.messenger("fuse", join_policy={"mode": "time", "tolerance_ms": 5.0,
                                               "timeout_ms": 1000.0, "missing": "drop"},
                          clock=lambda: now[0])
    for ts in (5.0, 1.0, 6.0):
        left.set_output_event_timestamp(ts)
        left.publish_message(ts)
    for ts in (5.0, 6.0):
        right.set_output_event_timestamp(ts)
        right.publish_message(ts)
    for ts in (5.0, 6.0):
        inputs = fuse.receive_message()
        assert inputs["left"]["message"] == inputs["right"]["message"] == ts
        fuse.ack_inputs()
    assert fuse.join_status()["waiting_for"] == ["right"]  # the late one, until its deadline
    now[0] += 1.5
    left.publish_stop_signal()
    right.publish_stop_signal()
    assert fuse.receive_message()["left"]["is_stop_signal"]
    drops = fuse.take_drops()
    assert (drops["join_late"], drops["join_evicted"]) == (1, 0)
    assert [e["reason"] for e in fuse.terminal_entries()] == ["join late"]


def test_a_burst_of_evicted_join_halves_is_logged_as_one_batch(flows) -> None:  # type: ignore[no-untyped-def]
    # missing='drop': each timed-out half is terminated against the terminal log
    # (DELIV-15), and the halves a receive gives up on together are logged together.
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    left, right = flow.messenger("left"), flow.messenger("right")
    fuse = flow.messenger("fuse", join_policy={"mode": "time", "tolerance_ms": 5.0,
                                               "timeout_ms": 1000.0, "missing": "drop"})
    batches: list[int] = []
    log_terminals = fuse.runtime.log_terminals

    def counted(entries):  # type: ignore[no-untyped-def]
        batches.append(len(entries))
        return log_terminals(entries)

    fuse.runtime.log_terminals = counted
    for t in range(1, 6):
        left.set_output_event_timestamp(float(t))
        left.publish_message(f"alone-{t}")  # their partners never come
    left.publish_stop_signal()
    right.publish_stop_signal()
    assert fuse.receive_message()["left"]["is_stop_signal"]  # the end flushes them all
    assert batches == [5]
    assert len(fuse.terminal_entries()) == 5
    assert fuse.take_drops()["join_evicted"] == 5
    assert flow.broker.dead_letters(FLOW) == []


def test_what_a_join_lets_go_is_queued_inside_add_and_settled_after_the_batch(flows) -> None:  # type: ignore[no-untyped-def]
    # The messenger's resolver only queues: no broker call is made from inside the
    # assembler's add, and what the batch's adds let go of is settled after them.
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    left, right = flow.messenger("left"), flow.messenger("right")
    fuse = flow.messenger("fuse", join_policy={"mode": "trace", "max_pending": 1,
                                               "missing": "drop"})
    join = fuse.join
    assert join is not None
    inside_add = [False]
    queued: list[int] = []  # the join's queue after each add
    calls: list[tuple[str, bool]] = []  # (backend or ledger call, made inside an add)
    add = join.assembler.add

    def watched_add(parent, entry, handle):  # type: ignore[no-untyped-def]
        inside_add[0] = True
        try:
            add(parent, entry, handle)
        finally:
            inside_add[0] = False
        queued.append(len(join._released))

    join.assembler.add = watched_add
    for target in (fuse.backend, fuse.runtime):
        for name in dir(target):
            method = getattr(target, name)
            if name.startswith("_") or not inspect.ismethod(method):
                continue

            def watched(*args, __name=name, __method=method, **kwargs):  # type: ignore[no-untyped-def]
                calls.append((__name, inside_add[0]))
                return __method(*args, **kwargs)

            setattr(target, name, watched)
    for t in range(3):  # every half alone (two producers never share a trace id)
        left.publish_message(f"left-{t}")
        right.publish_message(f"right-{t}")
    left.publish_stop_signal()
    right.publish_stop_signal()
    assert fuse.receive_message()["left"]["is_stop_signal"]
    assert not [name for name, inside in calls if inside]  # nothing from inside an add
    assert queued == [0, 1, 2, 3, 4, 5]  # each add's eviction queued, none settled yet
    reasons = [e["reason"] for e in fuse.terminal_entries()]
    assert reasons == ["join evicted"] * 5 + ["join flushed"]
    assert fuse.take_drops()["join_evicted"] == 6
    assert any(name.startswith("settle") for name, _ in calls)


def test_pending_counts_what_waits_here_and_on_the_broker_and_status_reads_the_join(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    now = [1000.0]
    flow = flows({"left": [], "right": [], "fuse": ["left", "right"], "sink": ["fuse"]})
    left, right = flow.messenger("left"), flow.messenger("right")
    fuse = flow.messenger("fuse", join_policy={"mode": "time", "tolerance_ms": 5.0,
                                               "missing": "wait"}, clock=lambda: now[0])
    assert fuse.pending_observation() == Known(0) and fuse.pending_count() == 0
    for ts in (1.0, 2.0, 3.0):
        left.set_output_event_timestamp(ts)
        left.publish_message(ts)
    right.set_output_event_timestamp(3.0)
    right.publish_message(3.0)
    assert fuse.pending_observation() == Known(4)  # all still on the broker
    inputs = fuse.receive_message()
    assert inputs["left"]["message"] == inputs["right"]["message"] == 3.0
    now[0] += 7.5
    status = fuse.join_status()
    # Two left halves wait for partners, and missing='wait' never gives up on them.
    assert status["waiting_groups"] == 2 and status["gives_up"] is False
    assert status["oldest_wait_seconds"] == pytest.approx(7.5)
    # right's data has passed them, but missing='wait' still takes its member.
    assert status["waiting_for"] == ["right"]
    assert status["watermark_lag_seconds"] == {"left": 0.0, "right": 0.0}
    observed = fuse.pending_observation()
    assert observed == Known(fuse.pending_count()) and observed.value >= 2
    assert set(fuse.subscription_status()) == {"left", "right"}
    assert all(isinstance(o, Known) for o in fuse.subscription_status().values())


def test_a_parent_whose_count_is_unknown_makes_pending_unknown_never_zero(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    flow.messenger("cam")
    sink = flow.messenger("sink")
    flow.admin.close([ChannelId(FLOW, RUN, "cam")], "0")  # the parent's channel is gone
    observed = sink.pending_observation()
    assert isinstance(observed, Unknown) and observed.reason == "missing"
    assert sink.pending_count() == 0  # the documented lossy form; the observation says why


def test_quiesce_stops_input_and_says_so_instead_of_a_flow_stop(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    cam, sink = flow.messenger("cam"), flow.messenger("sink")
    assert (sink.check_for_termination(), sink.stop_reason()) == (False, None)
    sink.quiesce()
    sink.quiesce()  # idempotent
    assert (sink.check_for_termination(), sink.stop_reason()) == (True, "quiesce")
    cam.publish_message("after")  # goes to a survivor, not to the quiesced sink
    # The task's receive returns at once: nothing more comes to this process.
    assert sink.receive_message()["cam"]["is_stop_signal"] is True
    survivor = flow.messenger("sink")
    assert survivor.receive_message()["cam"]["message"] == "after"


def test_a_checkpoint_on_a_ledger_that_dies_with_the_process_is_refused_not_faked(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam, work = flow.messenger("cam"), flow.messenger("work")
    flow.messenger("sink")
    cam.publish_message(1)
    with pytest.raises(ValueError, match="input group"):
        work.checkpoint(b"state")  # nothing received yet: nothing to cover
    work.receive_message()
    with pytest.raises(DurabilityUnavailable, match="RUN-022"):
        work.checkpoint(b"state")
    with pytest.raises(DurabilityUnavailable):
        work.publish_message(2, {CHECKPOINT_METADATA_KEY: b"state"})
    assert work.publication_stats["accepted"] == 0  # refused before anything was sent
    assert work.restore_checkpoint() is None


def test_a_replayable_producer_resumes_from_its_last_accepted_offset_and_a_replay_dedups(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    flow = flows({"file": [], "sink": ["file"]})
    ledger = MemoryRuntimeStore()  # shared by the producer and its replacement

    def producer() -> NATSMessenger:
        return flow.messenger("file", replayable=True,
                              runtime=FlowRuntime(ledger, FLOW, RUN, "file"))

    sink = flow.messenger("sink")
    first = producer()
    assert first.resume_offset() == 0
    for line in ("l1", "l2", "l3"):
        first.publish_message(line)
    # Recorded up to the last confirmed output: at most every OFFSET_COMMIT_SECONDS
    # while outputs stream, and all of it once the window drains.
    assert 1 <= first.resume_offset() <= 3
    first.drain()
    assert first.resume_offset() == 3
    replacement = producer()  # after a restart: the source resumes after offset 3 ...
    assert replacement.resume_offset() == 3
    replacement.outputs.source_offset = 2  # ... or, had the ledger lagged, replays line 3
    replacement.publish_message("l3")
    replacement.publish_message("l4")
    replacement.publish_stop_signal()
    assert replacement.publication_stats["duplicate"] == 1  # MSGID-6: the same id again
    *groups, _ = run_sink(sink, lambda inputs: None)
    assert [g["file"]["message"] for g in groups] == ["l1", "l2", "l3", "l4"]


def test_a_replayable_producer_counts_outputs_answered_while_it_publishes_nothing(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    """accepted_outputs counts every output the broker answered so far, not only those
    the window resolved as later outputs went out: a source waiting for records acks
    the records of outputs accepted meanwhile (else, holding as many as its durable
    lets it, it waited out the broker's ack_wait and was handed them all again)."""
    flow = flows({"file": [], "sink": ["file"]})
    file = flow.messenger("file", replayable=True)
    held: list[tuple[Receipt[Any], Any]] = []
    publish_now = file.backend.publish_async

    def answered_later(envelope: Any, deadline: float) -> Receipt[Any]:
        receipt: Receipt[Any] = Receipt()
        held.append((receipt, publish_now(envelope, deadline).result()))
        return receipt

    file.backend.publish_async = answered_later  # type: ignore[method-assign]
    for line in ("l1", "l2", "l3"):
        file.publish_message(line)
    assert file.accepted_outputs() == 0  # sent, none answered yet
    for receipt, answer in held:
        receipt.set_result(answer)
    assert file.accepted_outputs() == 3  # answered: counted with nothing more published
    file.publish_stop_signal()


def test_live_producers_mint_ids_no_other_replica_or_restart_repeats(flows) -> None:  # type: ignore[no-untyped-def]
    """MSGID-5: two replicas of a live producer, and one of them restarted, each mint
    ids of their own; nothing they publish is dropped as a duplicate."""
    flow = flows({"cam": [], "sink": ["cam"]})
    sink = flow.messenger("sink")
    ids: list[str] = []
    for replica, frames in ((0, ["a1", "a2"]), (1, ["b1", "b2"]), (0, ["c1", "c2"])):
        cam = flow.messenger("cam", nb_tasks=2, replica_id=replica)
        for frame in frames:
            cam.publish_message(frame)
        # the ids the broker keeps, less the end markers'
        ids = [i for i in flow.broker._streams[cam.channel].dedup if ":eos:" not in i]
        assert cam.publication_stats["duplicate"] == 0
        if frames[0] != "c1":
            cam.publish_stop_signal()
    assert len(set(ids)) == 6
    assert all(re.fullmatch(r"cam#[01]~[0-9a-f]{12}:1:[12]", i) for i in ids)
    received = []
    while len(received) < 6:
        received.append(sink.receive_message()["cam"]["message"])
        sink.ack_inputs()
    assert sorted(received) == ["a1", "a2", "b1", "b2", "c1", "c2"]


def test_a_late_reader_of_a_realtime_parent_still_sees_every_replica_end(flows) -> None:  # type: ignore[no-untyped-def]
    """REALTIME keeps the freshest data per subject, so a replica's data never evicts
    another replica's end marker: a reader that starts after both replicas ended gets
    the freshest data, then the parent's end, instead of waiting forever."""
    flow = flows({"cam": [], "sink": ["cam"]}, REALTIME)
    channel = ChannelId(FLOW, RUN, "cam")
    # As provisioning sizes it: room for each of the two replicas' markers.
    flow.admin.ensure_channel(ChannelSpec(channel, LIVE_LATEST, realtime_buffer=2, required=(
        SubscriptionId("sink", channel), SubscriptionId("eos-anchor", channel, "eos"))),
        "provision")
    first, second = (flow.messenger("cam", nb_tasks=2, replica_id=r) for r in (0, 1))
    first.publish_message("a")
    first.publish_stop_signal()
    for frame in ("b", "c", "d"):
        second.publish_message(frame)
    second.publish_stop_signal()
    sink = flow.messenger("sink", eos_quiescence_ms=10)
    *groups, end = run_sink(sink, lambda inputs: None)
    assert [g["cam"]["message"] for g in groups] == ["c", "d"]
    assert end["cam"]["is_stop_signal"] is True


REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "spec" / "messaging-api-reference.txt"


@pytest.mark.skipif(not REFERENCE.exists(), reason="the shared API reference is not present")
def test_the_constructor_is_the_reference_s_parameter_for_parameter() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    head = "class videoflow.messaging.nats_messenger.NATSMessenger("
    line = text[text.index(head) + len(head):].splitlines()[0]
    signature = line[: line.rindex(")")]
    expected = []
    for param in re.split(r",\s*(?![^\[]*\])", signature):
        name, _, default = param.partition(" = ")
        expected.append((name.split(":")[0].strip(), default or None))
    declared = [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
                for p in inspect.signature(NATSMessenger).parameters.values()
                if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert declared == expected


def test_what_is_not_supported_is_refused_clearly(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    with pytest.raises(ValueError, match="envelope_version"):
        flow.messenger("sink", envelope_version=2)
    with pytest.raises(ValueError, match="blob_readers"):
        flow.messenger("sink", blob_readers=0)


def test_partitioned_replicas_each_take_their_own_keys_and_together_all_of_them(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cams": [], "track": ["cams"]})
    producer = flow.messenger("cams")
    replicas = [flow.messenger("track", nb_tasks=2, replica_id=i, partition_by="camera")
                for i in range(2)]
    for n in range(24):
        if n % 2:  # a business key set by the producer ...
            producer.set_output_partition_key(f"cam-{n % 6}")
            producer.publish_message({"n": n})
        else:  # ... or the partition_by field of the message
            producer.publish_message({"n": n, "camera": f"cam-{n % 6}"})
    producer.publish_stop_signal()
    seen: list[list[dict[str, Any]]] = []
    for replica in replicas:
        *groups, stop = run_sink(replica, lambda inputs: None)
        assert stop["cams"]["is_stop_signal"]
        seen.append([g["cams"]["message"] for g in groups])
    assert sorted(m["n"] for part in seen for m in part) == list(range(24))  # all, once
    for index, part in enumerate(seen):
        assert part  # both replicas got work
        for message in part:
            assert partition_of(f"cam-{message['n'] % 6}", 2) == index
    sub = SubscriptionId("track", ChannelId(FLOW, RUN, "cams"), replica=0)
    assert replicas[0].backend.skipped(sub) == len(seen[1])  # the others' keys, acked at once


class _Recording(MemoryMessagingBackend):
    """Records when a subscription's filter is set and when it is bound."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, Any]] = []

    def set_admission(self, subscription: Any, admit: Any, on_skip: Any = None) -> bool:
        self.calls.append(("filter", subscription))
        return super().set_admission(subscription, admit, on_skip)

    def ensure_subscription(self, spec: Any, operation_id: str) -> Any:
        self.calls.append(("bind", spec.id))
        return super().ensure_subscription(spec, operation_id)


def test_a_partitioned_replica_filters_before_it_binds(flows) -> None:  # type: ignore[no-untyped-def]
    """A bound JetStream subscription starts fetching at once: a filter set after the
    bind let the first deliveries through to every replica."""
    flow = flows({"cams": [], "track": ["cams"]})
    backend = _Recording(flow.broker, flow_id=FLOW, run_id=RUN)
    backend.start()
    replica = NATSMessenger(SimpleNamespace(name="track"), ["cams"], "nats://unused", FLOW,
                            BATCH, RUN, backend=backend, nb_tasks=2, replica_id=1,
                            partition_by="camera")
    flow.made.append(replica)
    data = SubscriptionId("track", ChannelId(FLOW, RUN, "cams"), replica=1)
    assert backend.calls.index(("filter", data)) < backend.calls.index(("bind", data))


def test_a_release_lost_with_an_unconfirmed_ack_is_reconciled_by_the_replacement(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    # PAY-004 then PAY-006: the ack reached the broker but its confirmation was lost, so
    # the reader kept its obligation; its replacement reconciles at start, sees the ack
    # floor past the publication and cancels the lost release -- and the payload goes.
    flow = flows({"cam": [], "sink": ["cam"]})
    store, ledger = MemoryPayloadStore(), MemoryRuntimeStore()
    cam = flow.messenger("cam", payload_store=store, blob_reader_ids=["sink"],
                         runtime=FlowRuntime(ledger, FLOW, RUN, "cam"))
    lossy = LosesAckReplies(flow.broker, flow_id=FLOW, run_id=RUN)
    lossy.start()
    first = NATSMessenger(SimpleNamespace(name="sink"), ["cam"], "nats://unused", FLOW, BATCH,
                          RUN, backend=lossy, payload_store=store,
                          runtime=FlowRuntime(ledger, FLOW, RUN, "sink"))
    flow.made.append(first)
    cam.publish_message(np.zeros(2_000_000, dtype=np.uint8))  # by ref
    cam.publish_stop_signal()
    (ref,) = store.refs()
    assert first.receive_message()["cam"]["message"].nbytes == 2_000_000
    lossy.armed = True
    first.ack_inputs()
    assert first.unconfirmed_acks == 1 and store.obligations(ref) == ("sink",)
    lossy.shutdown(hand_back=False)  # the reader dies with its release owed

    replacement = flow.messenger("sink", payload_store=store,
                                 runtime=FlowRuntime(ledger, FLOW, RUN, "sink"))
    assert replacement.receive_message()["cam"]["is_stop_signal"]  # nothing redelivered
    assert replacement.reconciled == 1
    assert store.refs() == ()  # the lost release was cancelled and the payload reclaimed


def test_a_dead_lettered_input_that_came_by_ref_keeps_its_payload_for_the_dead_letter(
    flows,  # type: ignore[no-untyped-def]
) -> None:
    # BLOB-14 step 3: the dead letter carries the envelope and so the ref; the payload is
    # pinned (dlq/...) for the dead letters' retention before the delivery is
    # terminated, and the reader's own obligation goes once that is confirmed.
    flow = flows({"cam": [], "work": ["cam"], "sink": ["work"]})
    store = MemoryPayloadStore()
    cam = flow.messenger("cam", payload_store=store, blob_reader_ids=["work"])
    work = flow.messenger("work", payload_store=store)
    flow.messenger("sink")
    cam.publish_message(np.ones(2_000_000, dtype=np.uint8))
    (ref,) = store.refs()
    work.receive_message()
    work.fail_inputs(PoisonMessage("corrupt frame"))
    assert store.obligations(ref) == ("dlq/dlq:work:cam:1",)  # only the pin is left
    (only,) = flow.broker.dead_letters(FLOW)
    assert decode_envelope(decode_dead_letter(only[1]).envelope)["blob_ref"] == ref


def test_the_counter_blob_store_deletes_a_payload_after_its_last_confirmed_read(flows) -> None:  # type: ignore[no-untyped-def]
    # RFC 0002 / BLOB-5: the publisher records how many reads a payload is owed; each
    # reader counts one down once its settlement is confirmed; the last deletes it. The
    # count lives in the run ledger the nodes share.
    flow = flows({"cam": [], "left": ["cam"], "right": ["cam"]})
    blobs, ledger = MemoryBlobStore(), MemoryRuntimeStore()

    def node(name: str, **options: Any) -> NATSMessenger:
        return flow.messenger(name, blob_store=blobs,
                              runtime=FlowRuntime(ledger, FLOW, RUN, name), **options)

    cam = node("cam", blob_readers=2)
    left, right = node("left"), node("right")
    frame = np.arange(2_000_000, dtype=np.uint8)
    cam.publish_message(frame)
    cam.publish_stop_signal()
    assert len(blobs) == 1
    for reader in (left, right):
        assert np.array_equal(reader.receive_message()["cam"]["message"], frame)
    left.ack_inputs()
    assert len(blobs) == 1  # one read still owed
    right.ack_inputs()
    assert len(blobs) == 0  # the last confirmed read deleted it
    for reader in (left, right):
        assert reader.receive_message()["cam"]["is_stop_signal"]


def test_a_counter_store_payload_without_a_count_is_left_to_its_ttl(flows) -> None:  # type: ignore[no-untyped-def]
    flow = flows({"cam": [], "sink": ["cam"]})
    blobs, ledger = MemoryBlobStore(), MemoryRuntimeStore()
    cam = flow.messenger("cam", blob_store=blobs, runtime=FlowRuntime(ledger, FLOW, RUN, "cam"))
    sink = flow.messenger("sink", blob_store=blobs,
                          runtime=FlowRuntime(ledger, FLOW, RUN, "sink"))
    cam.publish_message(np.zeros(2_000_000, dtype=np.uint8))
    sink.receive_message()
    sink.ack_inputs()
    assert len(blobs) == 1  # blob_readers None: nobody counts, the store's TTL decides


def test_realtime_keeps_the_freshest_input_and_drops_a_failure_instead_of_retrying(flows) -> None:  # type: ignore[no-untyped-def]
    # REALTIME: the channel keeps only the latest message (a slow reader sees the
    # freshest, never a backlog), and a failed input is dropped and counted (best
    # effort), not retried late or dead-lettered.
    flow = flows({"cam": [], "view": ["cam"]}, REALTIME)
    cam, view = flow.messenger("cam"), flow.messenger("view")
    cam.publish_message("frame-1")
    assert view.receive_message()["cam"]["message"] == "frame-1"
    view.ack_inputs()
    for n in (2, 3, 4):  # the viewer is busy: only the last survives
        cam.publish_message(f"frame-{n}")
    assert view.receive_message()["cam"]["message"] == "frame-4"
    view.fail_inputs(ConnectionError("display lost"))
    assert view.take_drops()["exhausted"] == 1
    assert flow.broker.dead_letters(FLOW) == []
    assert len(view.terminal_entries()) == 1  # terminated against the log (DELIV-15)
    cam.publish_message("frame-5")
    assert view.receive_message()["cam"]["message"] == "frame-5"  # not frame-4 again


def test_a_realtime_frame_superseded_for_a_newer_one_lets_its_payload_go(flows) -> None:  # type: ignore[no-untyped-def]
    # A slow viewer (60 ms a frame, over CATCH_UP_SECONDS) finds three frames waiting:
    # it works on the newest, and the two it skips are acknowledged and their payloads
    # released once the acks are confirmed (PAY-004), not left to reconciliation.
    flow = flows({"cam": [], "view": ["cam"]}, REALTIME, realtime_buffer=16)
    store = MemoryPayloadStore()
    cam = flow.messenger("cam", payload_store=store, blob_reader_ids=["view"])
    view = flow.messenger("view", payload_store=store)

    def frame(n: int) -> np.ndarray:
        return np.full(2_000_000, n, dtype=np.uint8)  # over the 1 MiB broker limit

    cam.publish_message(frame(0))
    assert view.receive_message()["cam"]["message"][0] == 0
    time.sleep(0.06)
    view.ack_inputs()
    for n in (1, 2, 3):
        cam.publish_message(frame(n))
    assert view.receive_message()["cam"]["message"][0] == 3
    assert view.take_drops()["superseded"] == 2
    view.ack_inputs()
    cam.publish_stop_signal()
    assert view.receive_message()["cam"]["is_stop_signal"]
    assert store.refs() == ()  # every frame released, and so reclaimed


def test_a_frame_passed_through_unchanged_is_stored_again_without_a_copy(
    flows, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # Issue 14, point 3: a processor that returns its input (the dict whose frame is a
    # read-only view of shared memory) publishes a payload of its own -- its own ref,
    # obligations and intent -- over the same bytes (a second link to the file).
    flow = flows({"cam": [], "pass": ["cam"], "sink": ["pass"]})
    store = SharedMemoryPayloadStore(tmp_path)
    cam = flow.messenger("cam", payload_store=store, blob_reader_ids=["pass"])
    passer = flow.messenger("pass", payload_store=store, blob_reader_ids=["sink"])
    sink = flow.messenger("sink", payload_store=store)
    frame = np.arange(480 * 640, dtype=np.uint32).astype(np.uint8).reshape(480, 640)
    cam.publish_message({"i": 0, "frame": frame})
    cam.publish_message({"i": 1, "frame": frame})
    cam.publish_stop_signal()

    def passed(change: bool) -> os.stat_result:
        message = passer.receive_message()["cam"]["message"]
        if change:
            message["seen"] = True  # its bytes no longer say what it holds
        before = set(store.refs())
        passer.publish_message(message)
        passer.drain()
        (ref,) = set(store.refs()) - before
        assert store.records()[ref].channel == "pass"
        assert store.obligations(ref) == ("sink",)  # its own, for its own reader
        linked = os.stat(tmp_path / "blobs" / ref)
        passer.ack_inputs()
        return linked

    assert passed(change=False).st_nlink == 2  # the camera's file, a second name
    assert passed(change=True).st_nlink == 1  # written anew
    got = []
    for _ in range(2):
        got.append(sink.receive_message()["pass"]["message"])
        sink.ack_inputs()
    assert [g["i"] for g in got] == [0, 1] and got[1]["seen"] is True
    assert all(np.array_equal(g["frame"], frame) and not g["frame"].flags.writeable
               for g in got)
    assert store.refs() == () and store.used_bytes() == 0
