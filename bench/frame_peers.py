"""What a user would write with nats-py alone to move the frame benchmark's frames from
one process to another (bench/test_bench_frames.py): the ceilings its videoflow cases
are read against.

- ``core``: plain core NATS, one frame per message (the server must take a frame's
  size: max_payload), published from the pool frame's own buffer;
- ``object_store``: nats-py's own object store, put by the camera, its name sent on a
  core subject, read and deleted by the sink.

Both keep at most WINDOW frames unanswered: the sink answers each frame on a core
subject, and the camera waits for those answers. Unpaced core NATS drops what a slow
subscriber cannot take (slow consumer), and a peer that loses frames is no reference.

Each side is a spawned process (run_pair) that writes the figures the frame stages
write (frame_bench_nodes): first and last frame, count, CPU, and for the sink the
frames that arrived whole and unmixed.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any

import nats
import numpy as np

from flow_bench_nodes import Window, cpu_since, mark_ready, wait_ready, write_stats
from frame_bench_nodes import POOL, SAMPLES, SHAPE, pool_frame, pool_samples

WINDOW = 4
"""Frames the camera keeps unanswered."""

SECONDS = 300.0
"""The most one side may take before the pair is called failed."""

BUCKET = "bench-frames-peer"


async def _camera(url: str, out: str, n: int, how: str) -> None:
    pool = [pool_frame(k) for k in range(POOL)]
    nc = await nats.connect(url)
    answered = asyncio.Semaphore(WINDOW)

    async def answer(_msg: Any) -> None:
        answered.release()

    await nc.subscribe("peer.answer", cb=answer)
    store = None
    if how == "object_store":
        store = await nc.jetstream().create_object_store(BUCKET)
    wait_ready(out, ["sink"])
    first, cpu_first = time.monotonic(), time.process_time()
    for i in range(n):
        await answered.acquire()
        frame = memoryview(pool[i % POOL]).cast("B")
        if store is None:
            await nc.publish("peer.frames", frame, headers={"i": str(i)})
        else:
            name = f"frame-{i}"
            await store.put(name, frame.tobytes())
            await nc.publish("peer.frames", name.encode(), headers={"i": str(i)})
    for _ in range(WINDOW):
        await answered.acquire()
    ended = time.monotonic()
    write_stats(out, "camera", count=n, first=first, last=ended, cpu=cpu_since(cpu_first))
    await nc.close()


async def _sink(url: str, out: str, n: int, how: str) -> None:
    expected = pool_samples()
    nc = await nats.connect(url)
    store = None
    if how == "object_store":
        store = await nc.jetstream().create_object_store(BUCKET)
    window = Window()
    seen = np.zeros(n, dtype=bool)
    bad = duplicates = 0
    sub = await nc.subscribe("peer.frames", pending_bytes_limit=-1, pending_msgs_limit=-1)
    await nc.flush()
    mark_ready(out, "sink")
    for _ in range(n):
        msg = await sub.next_msg(timeout=SECONDS)
        i = int((msg.headers or {})["i"])
        if store is None:
            data = msg.data
        else:
            name = msg.data.decode()
            data = (await store.get(name)).data
            await store.delete(name)
        frame = np.frombuffer(data, np.uint8)
        window.tick()  # once the frame is in hand, as a videoflow sink's consume()
        if frame.size != int(np.prod(SHAPE)) or not np.array_equal(
                frame[SAMPLES], expected[i % POOL]):
            bad += 1
        duplicates += bool(seen[i])
        seen[i] = True
        await nc.publish("peer.answer", b"")
    await nc.flush()
    write_stats(out, "sink", **window.fields(), distinct=int(seen.sum()),
                duplicates=duplicates, out_of_range=0, bad=bad, mapped=0)
    await nc.close()


def _run(side: str, url: str, out: str, n: int, how: str) -> None:
    run = _camera if side == "camera" else _sink
    asyncio.run(asyncio.wait_for(run(url, out, n, how), SECONDS))


def run_pair(url: str, out: str, n: int, how: str) -> None:
    """camera -> sink with nats-py alone (how: 'core' or 'object_store'), each a spawned
    process; both must end cleanly within SECONDS."""
    context = multiprocessing.get_context("spawn")
    sides = [context.Process(target=_run, args=(side, url, out, n, how), name=side)
             for side in ("sink", "camera")]
    for process in sides:
        process.start()
    for process in sides:
        process.join(SECONDS + 30)
    codes = {p.name: p.exitcode for p in sides}
    for process in sides:
        if process.is_alive():
            process.kill()
    assert all(code == 0 for code in codes.values()), f"peer sides failed: {codes}"
