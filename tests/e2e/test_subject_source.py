"""SubjectSource on a real nats-server: four cameras and an IMU published by plain
nats-py (no videoflow code on the publishing side) -- frames as raw bytes with shape
headers, or as native envelopes packed by hand from docs/WIRE.md -- fused by a time
join, every group checked against the stamps published. Two replicas of one source
share its durable, and every record comes out once. Garbage on a subject is
counted, kept in the dead-letter stream, and the flow goes on."""

from __future__ import annotations

import asyncio
import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import msgspec
import nats
import numpy as np
import pytest
from ros_nodes import JsonLines, StampFusion, json_with_pid, read_lines

from videoflow.broker import server as embedded
from videoflow.cli.demo_truth import imu_window_ms, in_window
from videoflow.core.constants import BATCH
from videoflow.flow import Flow
from videoflow.io import DTYPE_HEADER, EVENT_TIME_HEADER, SHAPE_HEADER, SubjectSource
from videoflow.ops.dead_letters import dlq_list

pytestmark = pytest.mark.timeout(180)

T0 = 1_700_000_000.0
FPS, IMU_HZ, INSTANTS, CAMERAS = 30, 400, 45, 4
WINDOW_MS = imu_window_ms(IMU_HZ)


def rig(seed: int = 5) -> dict[str, Any]:
    """Per camera, instant -> stamp (5% dropped, +-2 ms jitter); the IMU's stamps."""
    rng = random.Random(seed)
    truth: dict[str, Any] = {f"cam{c}": {} for c in range(CAMERAS)}
    for k in range(INSTANTS):
        for c in range(CAMERAS):
            if rng.random() >= 0.05:
                truth[f"cam{c}"][k] = T0 + k / FPS + rng.uniform(-0.002, 0.002)
    lead = int(np.ceil((WINDOW_MS + 10) / 1000 * IMU_HZ))
    # As a reader computes them from integer nanoseconds (the JSON IMU's header).
    truth["imu"] = [round((T0 + i / IMU_HZ) * 1e9) / 1e9
                    for i in range(-lead, INSTANTS * IMU_HZ // FPS + lead)]
    return truth


def frame(k: int) -> np.ndarray:
    return np.full((6, 8, 3), k % 256, np.uint8)


def ext_array(array: np.ndarray) -> msgspec.msgpack.Ext:
    """docs/WIRE.md's ext 1: u32 LE header length, msgpack [descr, shape], C-order data."""
    header = msgspec.msgpack.encode([array.dtype.str, list(array.shape)])
    return msgspec.msgpack.Ext(1, struct.pack("<I", len(header)) + header + array.tobytes())


def envelope(message: Any, event_ts: float, seq: int) -> bytes:
    """A v3 envelope as a plain list (docs/WIRE.md), packed by a plain msgpack writer."""
    return msgspec.msgpack.encode([
        3, f"ext:{seq}", seq, message, None, False,  # version, trace_id .. is_stop_signal
        "", "", "", "", None, None, 0, None,  # type .. span ids, replica_id, blob_ref
        event_ts, None, False, None, None])  # event_ts, partition_key, abort fields


async def publish_rig(url: str, truth: dict[str, Any], native: bool) -> None:
    """Everything published before the flow starts (the publishers ran ahead)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="RIG", subjects=["rig.>"])
    seq = 0
    for c in range(CAMERAS):
        for k, stamp in truth[f"cam{c}"].items():
            seq += 1
            if native:
                await js.publish(f"rig.cam{c}", envelope(ext_array(frame(k)), stamp, seq))
            else:
                await js.publish(f"rig.cam{c}", frame(k).tobytes(), headers={
                    SHAPE_HEADER: "6,8,3", DTYPE_HEADER: "|u1", EVENT_TIME_HEADER: repr(stamp)})
    for i, stamp in enumerate(truth["imu"]):
        seq += 1
        sample = {"t": stamp, "angular_velocity": [float(i), 0.0, 0.0]}
        if native:
            await js.publish("rig.imu", envelope(
                {"angular_velocity": ext_array(np.array([float(i), 0.0, 0.0]))}, stamp, seq))
        else:  # JSON, its event time in nanoseconds in the header
            await js.publish("rig.imu", msgspec.json.encode(sample),
                             headers={EVENT_TIME_HEADER: str(round(stamp * 1e9))})
    await nc.close()


@pytest.mark.parametrize("native", [False, True], ids=["raw-and-json", "native-envelopes"])
def test_plain_publishers_are_fused_group_for_group(native: bool, tmp_path: Path,
                                                    nats_server: embedded.EmbeddedServer
                                                    ) -> None:
    truth = rig()
    asyncio.run(publish_rig(nats_server.url, truth, native))
    decode = "envelope" if native else "bytes"
    cams = [SubjectSource("RIG", subject=f"rig.cam{c}", decode=decode,
                          count=len(truth[f"cam{c}"]), name=f"cam{c}") for c in range(CAMERAS)]
    imu = SubjectSource("RIG", subject="rig.imu", decode="envelope" if native else "json",
                        count=len(truth["imu"]), name="imu")
    fusion = StampFusion(name="fusion", join_policy={
        "mode": "time", "tolerance_ms": 10.0, "quorum": 1, "timeout_ms": 10_000.0,
        "missing": "drop", "max_pending": 1024, "collect": {"imu": WINDOW_MS}})(*cams, imu)
    out = tmp_path / "groups.jsonl"
    sink = JsonLines(str(out), name="sink")(fusion)
    report = Flow([*cams, imu], [sink], BATCH, name=f"plain{int(native)}").run(
        nats_server.url, view=False)
    assert report.outcome == "completed", report.format()

    by_instant: dict[int, dict[str, Any]] = {}
    for group in read_lines(out):
        present = [s for s in group["stamps"] if s is not None]
        k = round((present[0] - T0) * FPS)
        assert k not in by_instant, f"instant {k} fused twice"
        by_instant[k] = group
    names = [f"cam{c}" for c in range(CAMERAS)]
    assert set(by_instant) == {k for cam in names for k in truth[cam]}
    w = WINDOW_MS / 1000.0
    for k, group in by_instant.items():
        assert group["stamps"] == [truth[cam].get(k) for cam in names], k
        assert group["pixels"] == [k % 256 if k in truth[cam] else None for cam in names]
        windows = [[s for s in truth["imu"] if in_window(s, t, w)]
                   for t in group["stamps"] if t is not None]
        assert sorted(group["imu"]) in windows, (k, group["imu"])
    # Every record was acknowledged once its output was accepted: nothing is left
    # for the durables to deliver.
    assert asyncio.run(unacked(nats_server.url, [f"vf-{'plain' + str(int(native))}-{n}"
                                                 for n in (*names, "imu")])) == 0


async def unacked(url: str, durables: list[str], stream: str = "RIG") -> int:
    """What the durables still hold for a reader: delivered and not acknowledged, or
    not delivered yet."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        total = 0
        for durable in durables:
            info = await js.consumer_info(stream, durable)
            total += info.num_ack_pending + info.num_pending
        return total
    finally:
        await nc.close()


RECORDS = 300


def test_two_replicas_share_the_durable_and_every_record_comes_out_once(
        tmp_path: Path, nats_server: embedded.EmbeddedServer) -> None:
    # Each replica ends once its fetches got nothing for idle_end: long enough for
    # both to be up before the records come (count is refused with two replicas).
    items = SubjectSource("WORK", subject="work.items", decode=json_with_pid, idle_end=5.0,
                          batch=4, nb_tasks=2, name="items")
    out = tmp_path / "got.jsonl"
    sink = JsonLines(str(out), name="sink")(items)
    flow = Flow([items], [sink], BATCH, name="replicas")

    async def run() -> Any:
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        await js.add_stream(name="WORK", subjects=["work.>"])
        running = asyncio.ensure_future(asyncio.to_thread(flow.run, nats_server.url,
                                                          view=False))
        # Published once both replicas wait on the durable, so that both take a share
        # (a batch of 4 at a time), not one of them everything before the other is up.
        for _ in range(1200):
            try:
                if (await js.consumer_info("WORK", "vf-replicas-items")).num_waiting >= 2:
                    break
            except nats.js.errors.NotFoundError:
                pass  # no replica has bound the durable yet
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the two replicas never both waited on the durable")
        for i in range(RECORDS):  # a plain nats-py publisher
            await js.publish("work.items", json.dumps({"id": i, "value": i * i}).encode())
        await nc.close()
        return await running

    report = asyncio.run(run())
    assert report.outcome == "completed", report.format()
    assert report.nodes["items"].emitted == RECORDS
    assert not report.nodes["items"].dropped_total
    got = read_lines(out)
    assert sorted(r["id"] for r in got) == list(range(RECORDS))  # each once, none lost
    assert all(r["value"] == r["id"] ** 2 for r in got)
    assert len({r["pid"] for r in got}) == 2, "one replica read every record"
    # Every record was acknowledged by the replica that read it.
    assert asyncio.run(unacked(nats_server.url, ["vf-replicas-items"], "WORK")) == 0


def record(decode: str, i: int, bad: bool) -> bytes:
    if decode == "msgpack":
        return b"\xc1 not msgpack" if bad else msgspec.msgpack.encode({"i": i})
    # A foreign envelope whose event time is NaN: it used to stop the source (the
    # setter refuses it), or, before the setter did, crash the join it reached.
    return envelope({"i": i}, math.nan if bad else T0 + i, i)


@pytest.mark.parametrize("decode", ["msgpack", "envelope"])
def test_garbage_is_counted_kept_and_the_flow_goes_on(tmp_path: Path,
                                                      nats_server: embedded.EmbeddedServer,
                                                      decode: str) -> None:
    async def publish() -> None:
        nc = await nats.connect(nats_server.url)
        for i in range(10):
            data = record(decode, i, bad=i in (2, 6))
            await nc.publish("loose.numbers", data, headers={EVENT_TIME_HEADER: str(T0 + i)}
                             if decode == "msgpack" else None)
        await nc.flush()
        await nc.close()

    # The source makes the stream over the core subject (create=True) before anything
    # is published; the publisher then uses plain core NATS.
    numbers = SubjectSource(subject="loose.numbers", create=True, decode=decode,
                            idle_end=3.0, name="numbers")
    out = tmp_path / "got.jsonl"
    sink = JsonLines(str(out), name="sink")(numbers)
    flow = Flow([numbers], [sink], BATCH, name="garbage")

    async def run() -> Any:
        running = asyncio.ensure_future(asyncio.to_thread(flow.run, nats_server.url,
                                                          view=False))
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        for _ in range(200):  # until the source made its stream
            try:
                await js.find_stream_name_by_subject("loose.numbers")
                break
            except nats.js.errors.NotFoundError:
                await asyncio.sleep(0.05)
        await nc.close()
        await publish()
        return await running

    report = asyncio.run(run())
    assert report.outcome == "completed", report.format()
    assert report.nodes["numbers"].dropped.get("undecodable") == 2
    assert sorted(v["i"] for v in read_lines(out)) == [0, 1, 3, 4, 5, 7, 8, 9]
    letters = [entry.record for entry in dlq_list(nats_server.url, "garbage")]
    assert [(r.reason, r.node, r.envelope) for r in letters if r is not None] == [
        ("undecodable", "numbers", record(decode, i, bad=True)) for i in (2, 6)]


@pytest.mark.parametrize("arguments, error", [
    ({}, "stream, a subject"),
    ({"subject": "a", "decode": "xml"}, "decode"),
    ({"subject": "a", "shape": (2, 2)}, "together"),
    ({"subject": "a", "count": 0}, "count"),
    ({"subject": "a", "idle_end": float("nan")}, "idle_end"),
    ({"subject": "a", "batch": 1.5}, "batch"),
    ({"subject": "a", "count": 10, "nb_tasks": 2}, "replicas share the records"),
])
def test_a_source_refuses_bad_arguments(arguments: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        SubjectSource(**arguments)
