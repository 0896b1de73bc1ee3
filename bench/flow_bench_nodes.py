"""Stages of the whole-flow benchmarks (bench/test_bench_flow.py), both sides of each
pair: videoflow node classes, and the hand-written nats-py peer stages.

Module level, because every stage runs in a spawned process of its own that imports
this file: the videoflow replicas unpickle their node from it, the peer stages are
started by name through ``run_stage``. bench/ is on sys.path under pytest (it has a
conftest.py and no __init__.py), and a spawned process inherits its parent's sys.path.

Every stage measures itself: the monotonic time (system-wide on one machine) of its
first and last message and how many it handled, written as JSON to ``<out>/<stage>.json``
when it ends, for the parent to read back. Rates come from those windows, not from
the wall time of a whole run, so process start-up is on neither side of a ratio.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec

from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode

PAD = "x" * 72
"""Filler that makes one message about 100 bytes as msgpack (index, time stamp, pad)."""

SMALL_BYTES = 8
"""A small message's size: its index alone, as an IMU sample or an odometry tick is a
few numbers (the small-message rate case, issue 43)."""

EVENT_BASE = 1_000_000.0
"""Event time of the join's instant 0 (epoch seconds; any fixed value will do)."""

CALL_SECONDS = 10.0
"""Bound of every broker wait of a peer stage: a hang fails the stage, never stalls it."""

STAGE_SECONDS = 240.0
"""Bound of a whole peer stage (the test's own timeout is the outer bound)."""

FETCH_BATCH = 64
"""Peer fetch batch, and the window of publishes gathered and inputs acked per batch."""

PUBLISH_WINDOW = 256
"""PubAcks a peer producer keeps in flight (NATS_FACTS section 10: 256 is at the
ceiling already). Every stage's publish_async_max_pending is above what it keeps in
flight, so publish_async never stalls and needs no wait_stall: a wait_stall wraps the
semaphore in a task per publish (asyncio.wait_for), which made the peer producer
several times slower. A hung
future (NATS_FACTS S1) still fails the stage, through the bounded awaits."""

PUBLISH_CHUNK = 64
"""A producer awaits its oldest PubAcks this many at a time, under one bound."""

CREDIT = 256
"""max_ack_pending of a peer durable on a linear edge: more than one fetch batch, so
the broker never waits on the stage."""

JOIN_CREDIT = 1024
"""max_ack_pending of the peer joiner's durables: a camera may run ahead of the
others by this many unacked frames before the broker holds it back."""

READY_SECONDS = 60.0
"""How long a producer waits for its readers to start before it fails."""

MARK_EVERY = 100
"""A sink notes the time of every MARK_EVERY-th message (Tally.marks): how many had
arrived by any instant, for rates over a window two flows ran side by side."""

BATCH_MAX_MSGS = 10_000
"""Backlog bound of a peer BATCH stream, the same as a videoflow BATCH stream's
(DiscardPolicy.NEW beyond it)."""

ENCODE = msgspec.msgpack.Encoder().encode
DECODE = msgspec.msgpack.Decoder().decode


def write_stats(out: str, stage: str, **fields: Any) -> None:
    """Write one stage's figures to ``<out>/<stage>.json``.

    Arguments:
        out (str): the round's directory.
        stage (str): the stage's name (file name).
        **fields: JSON-serialisable figures (count, first, last, ...).
    """
    Path(out, f"{stage}.json").write_text(json.dumps(fields))


def read_stats(out: Path, stage: str) -> dict[str, Any]:
    """Read back what write_stats wrote.

    Raises:
        FileNotFoundError: the stage never finished (it wrote nothing).
    """
    loaded: dict[str, Any] = json.loads((out / f"{stage}.json").read_text())
    return loaded


def mark_ready(out: str, stage: str) -> None:
    """Say this reader is started (its input bound), so producers may begin."""
    Path(out, f"ready-{stage}").touch()


def wait_ready(out: str, stages: list[str]) -> None:
    """Wait until every reader in stages marked itself ready: a producer starts only
    then, on both sides, so no stage is measured while others are still starting (and
    a REALTIME stream does not drop everything but the newest before anyone reads).

    Raises:
        TimeoutError: not all ready within READY_SECONDS.
    """
    _wait_for([Path(out, f"ready-{stage}") for stage in stages], f"readers {stages}")


def wait_gate(gate: str) -> None:
    """Wait until the file gate exists: what starts the producers of flows run side
    by side at one moment.

    Raises:
        TimeoutError: no gate within READY_SECONDS.
    """
    _wait_for([Path(gate)], f"start gate {gate}")


def _wait_for(files: list[Path], what: str) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while not all(file.exists() for file in files):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not there within {READY_SECONDS} s")
        time.sleep(0.001)


def message(i: int, small: bool = False) -> Any:
    """The i-th message of a linear flow, the same on every side: {"i", "t", "pad"}
    (t: time.time() now), or when small its index as SMALL_BYTES little-endian bytes."""
    return i.to_bytes(SMALL_BYTES, "little") if small else {"i": i, "t": time.time(),
                                                            "pad": PAD}


def ident(value: Any) -> int:
    """A linear flow's message's index (message)."""
    return int.from_bytes(value, "little") if isinstance(value, bytes) else value["i"]


def is_last(value: Any) -> bool:
    """Whether a REALTIME peer's message is marked the last of its run."""
    return isinstance(value, dict) and bool(value.get("last"))


def transform(value: Any) -> Any:
    """The linear processor's work, the same on every side: keep the fields, add one; a
    small message passes as it is."""
    if isinstance(value, bytes):
        return value
    return {"i": value["i"], "t": value["t"], "pad": value["pad"], "y": 2 * value["i"]}


class Window:
    """First and last monotonic time of a stage's messages, how many it handled, and
    the CPU its process spent from the first one (cpu_since)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None
        self.cpu_first = 0.0

    def tick(self, n: int = 1) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first, self.cpu_first = now, time.process_time()
        self.last = now
        self.count += n

    def fields(self) -> dict[str, Any]:
        return {"count": self.count, "first": self.first, "last": self.last,
                "cpu": cpu_since(self.cpu_first) if self.first is not None else None}


def cpu_since(cpu_first: float) -> float:
    """CPU seconds this process (every thread of it) spent since time.process_time()
    read cpu_first: what a stage cost, from its first message to its end."""
    return time.process_time() - cpu_first


class Tally:
    """What a sink received: distinct ids, duplicates, receive-minus-send latencies,
    join groups whose members mixed two instants."""

    def __init__(self, latency: bool) -> None:
        self.window = Window()
        self.seen: set[int] = set()
        self.duplicates = 0
        self.mixed = 0
        self.latency = latency
        self.latencies: list[float] = []
        self.last_id = -1
        self.out_of_order = 0
        self.marks: list[float] = []

    def add(self, value: dict[str, Any], received: float) -> None:
        """Count one message (received: its time.time() on arrival)."""
        self.window.tick()
        if self.window.count % MARK_EVERY == 0:
            self.marks.append(self.window.last or 0.0)
        if isinstance(value, dict) and "ks" in value:  # a fused join group: one instant
            index = value["ks"][0]
            self.mixed += len(set(value["ks"])) != 1
        else:
            index = ident(value)
            if self.latency:
                self.latencies.append(received - value["t"])
        if index in self.seen:
            self.duplicates += 1
        self.seen.add(index)
        self.out_of_order += index < self.last_id
        self.last_id = max(self.last_id, index)

    def fields(self) -> dict[str, Any]:
        return {**self.window.fields(), "distinct": len(self.seen),
                "duplicates": self.duplicates, "mixed": self.mixed,
                "out_of_order": self.out_of_order, "last_id": self.last_id,
                "latencies": self.latencies, "marks": self.marks}


# ------------------------------------------------------------------ videoflow nodes


class Numbers(ProducerNode):
    """message(i, small) for i in 0 .. count-1, paced at `rate` per second if rate > 0.

    Its first next() waits for the readers to be started (wait_ready), and then for
    the file gate when one is named (wait_gate). Records the time of its first next()
    call (after those waits) and of the call that ends its stream (StopIteration), so
    its rate covers count outputs handed to the task.
    """

    def __init__(self, count: int, out: str, readers: list[str], rate: float = 0.0,
                 gate: str | None = None, small: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.count, self.out, self.readers, self.rate = count, out, readers, rate
        self.gate, self.small = gate, small

    def open(self) -> None:
        self.i = 0
        self.first: float | None = None
        self.ended: float | None = None
        self.cpu_first = 0.0

    def next(self) -> dict[str, Any]:
        if self.first is None:
            wait_ready(self.out, self.readers)
            if self.gate is not None:
                mark_ready(self.out, self.name)  # for whoever opens the gate
                wait_gate(self.gate)
        now = time.monotonic()
        if self.first is None:
            self.first, self.cpu_first = now, time.process_time()
        if self.i >= self.count:
            self.ended = now
            raise StopIteration
        if self.rate:  # on a schedule from the first call, so a late wake-up catches up
            time.sleep(max(0.0, self.first + self.i / self.rate - time.monotonic()))
        value = message(self.i, self.small)
        self.i += 1
        return value

    def close(self) -> None:
        write_stats(self.out, self.name, count=self.i, first=self.first, last=self.ended,
                    cpu=None if self.first is None else cpu_since(self.cpu_first))


class Camera(ProducerNode):
    """Frame k = 0 .. count-1 of camera `cam`, stamped at the k-th instant
    (EVENT_BASE + k * dt): every camera's k-th frame is of one instant. Starts once
    its readers are (wait_ready)."""

    def __init__(self, cam: int, count: int, dt: float, out: str, readers: list[str],
                 **options: Any) -> None:
        super().__init__(**options)
        self.cam, self.count, self.dt, self.out, self.readers = cam, count, dt, out, readers

    def open(self) -> None:
        self.k = 0
        self.window = Window()

    def next(self) -> dict[str, Any]:
        if self.k == 0 and self.window.first is None:
            wait_ready(self.out, self.readers)
        if self.k >= self.count:
            raise StopIteration
        assert self.context is not None
        self.context.set_event_timestamp(EVENT_BASE + self.k * self.dt)
        self.window.tick()
        value = {"cam": self.cam, "k": self.k, "pad": PAD}
        self.k += 1
        return value

    def close(self) -> None:
        write_stats(self.out, self.name, **self.window.fields())


class _Stage(ProcessorNode):
    """A processor that says it is ready once open and records its window at close."""

    def __init__(self, out: str, **options: Any) -> None:
        super().__init__(**options)
        self.out = out

    def open(self) -> None:
        self.window = Window()
        mark_ready(self.out, self.name)

    def close(self) -> None:
        write_stats(self.out, self.name, **self.window.fields())


class Transform(_Stage):
    """transform() per input; records its window."""

    def process(self, value: dict[str, Any]) -> dict[str, Any]:
        self.window.tick()
        return transform(value)


class FailOnce(Transform):
    """transform() per input, but the first attempt of every `every`-th input raises a
    transient error (retried by the delivery policy: a NAK with the backoff's delay);
    every=0 never fails. Records its window and how many attempts it failed."""

    def __init__(self, out: str, every: int, **options: Any) -> None:
        super().__init__(out, **options)
        self.every = every

    def open(self) -> None:
        super().open()
        self.failed: set[int] = set()

    def process(self, value: dict[str, Any]) -> dict[str, Any]:
        i = value["i"]
        if self.every and i % self.every == 0 and i not in self.failed:
            self.failed.add(i)
            raise RuntimeError(f"a transient failure of input {i}")
        return super().process(value)

    def close(self) -> None:
        write_stats(self.out, self.name, failed=len(self.failed), **self.window.fields())


class Fuse(_Stage):
    """One output per join group: the instants of its members (one per camera, in
    wiring order), which the sink checks are all the same."""

    def process(self, *frames: dict[str, Any]) -> dict[str, Any]:
        self.window.tick()
        return {"ks": [f["k"] for f in frames], "cams": [f["cam"] for f in frames]}


class Sink(ConsumerNode):
    """Counts what arrives (Tally); with latency=True keeps every message's
    receive time minus its send time."""

    def __init__(self, out: str, latency: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.out, self.latency = out, latency

    def open(self) -> None:
        self.tally = Tally(self.latency)
        mark_ready(self.out, self.name)

    def consume(self, value: dict[str, Any]) -> None:
        self.tally.add(value, time.time())

    def close(self) -> None:
        write_stats(self.out, self.name, **self.tally.fields())


# ------------------------------------------------------------------ peer stages


class StageFailed(RuntimeError):
    """A peer stage could not finish: what went wrong, for the parent's assertion."""


async def connect(url: str) -> tuple[Any, list[str]]:
    """A fail-fast connection (NATS_FACTS S4) whose error_cb collects errors: a
    publish_async API error reaches only error_cb (S1)."""
    import nats

    errors: list[str] = []

    async def error_cb(error: Exception) -> None:
        errors.append(repr(error))

    nc = await nats.connect(url, error_cb=error_cb, allow_reconnect=False,
                            max_reconnect_attempts=1, reconnect_time_wait=0.1,
                            connect_timeout=2)
    return nc, errors


async def _fetch(psub: Any, deadline: float, what: str) -> list[Any]:
    """The next batch of up to FETCH_BATCH (fetch returns with what is ready,
    NATS_FACTS S10); an idle fetch simply tries again until the stage's deadline."""
    while True:
        try:
            batch: list[Any] = await psub.fetch(FETCH_BATCH, timeout=1.0)
            return batch
        except asyncio.TimeoutError:
            if time.monotonic() > deadline:
                raise StageFailed(f"{what}: nothing arrived for too long") from None


async def _settle(msgs: list[Any], confirmed: bool) -> None:
    """Ack a batch: every ack_sync in flight at once (BATCH: the broker confirmed
    each), or fire-and-forget ack() (REALTIME: max_deliver 1, a lost ack redelivers
    nothing)."""
    if confirmed:
        await asyncio.wait_for(
            asyncio.gather(*(m.ack_sync(timeout=CALL_SECONDS) for m in msgs)),
            CALL_SECONDS)
    else:
        for m in msgs:
            await m.ack()


async def _publish_gathered(js: Any, subject: str, items: list[tuple[str, bytes]]) -> None:
    """publish_async every (msg id, payload), then wait for all their PubAcks under
    one bound (a future can hang on an API error, NATS_FACTS S1/S2)."""
    futures = [await js.publish_async(subject, payload, headers={"Nats-Msg-Id": msg_id})
               for msg_id, payload in items]
    await _confirmed(futures, subject)


async def _confirmed(futures: list[Any], what: str) -> None:
    """Wait for PubAcks under one bound (a future can hang on an API error and never
    times out by itself, NATS_FACTS S1/S2); none may be a duplicate."""
    acks = await asyncio.wait_for(asyncio.gather(*futures), CALL_SECONDS)
    if any(a.duplicate for a in acks):
        raise StageFailed(f"{what}: a publish was a duplicate")


async def peer_producer(url: str, out: str, stage: str, subject: str, count: int,
                        readers: list[str], rate: float = 0.0, cam: int | None = None,
                        realtime: bool = False, small: bool = False) -> None:
    """Publish count messages with publish_async: up to PUBLISH_WINDOW PubAcks in
    flight; as the window fills, the oldest PUBLISH_CHUNK are awaited under one bound.

    Arguments:
        url / out / stage: the broker, the round's directory, this stage's name.
        subject: where to publish.
        count: messages.
        readers: the stages to wait for (wait_ready) before the first publish.
        rate: messages per second (0: as fast as the window allows).
        cam: publish join frames {"cam", "k", "pad"} of this camera instead of
            {"i", "t", "pad"}.
        realtime: mark the last message "last" (a REALTIME stream may drop any other
            message, never the newest one, so the end marker always arrives).
        small: publish message(i, small=True), SMALL_BYTES each.

    Records: the time of the first publish and of the last confirmed PubAck.
    """
    nc, errors = await connect(url)
    js = nc.jetstream(publish_async_max_pending=2 * PUBLISH_WINDOW)
    window: collections.deque[Any] = collections.deque()
    first: float | None = None
    cpu_first = 0.0
    try:
        await asyncio.to_thread(wait_ready, out, readers)
        for i in range(count):
            if rate and first is not None:
                await asyncio.sleep(max(0.0, first + i / rate - time.monotonic()))
            value = {"cam": cam, "k": i, "pad": PAD} if cam is not None else message(i, small)
            if realtime and i == count - 1:
                value["last"] = True
            future = await js.publish_async(subject, ENCODE(value),
                                            headers={"Nats-Msg-Id": f"{stage}-{i}"})
            if first is None:
                first, cpu_first = time.monotonic(), time.process_time()
            window.append(future)
            if len(window) >= PUBLISH_WINDOW:
                await _confirmed([window.popleft() for _ in range(PUBLISH_CHUNK)], stage)
        await _confirmed(list(window), stage)
        last = time.monotonic()
        if errors:
            raise StageFailed(f"{stage}: {errors}")
        write_stats(out, stage, count=count, first=first, last=last,
                    cpu=None if first is None else cpu_since(cpu_first))
    finally:
        await nc.close()


async def peer_processor(url: str, out: str, stage: str, stream: str, durable: str,
                         subject: str, count: int, realtime: bool = False) -> None:
    """Pull fetch(FETCH_BATCH), transform each, publish the batch's outputs
    (publish_async, PubAcks gathered), then ack the batch's inputs: ack_sync gathered
    in BATCH, ack() in REALTIME.

    Arguments:
        stream / durable: the input edge.
        subject: the output subject.
        count: inputs to expect (BATCH: exactly these; REALTIME: until "last").

    Records: its window and count, and the inputs the broker dropped before it read
    them (REALTIME: superseded, the gaps in the stream sequence).
    """
    nc, errors = await connect(url)
    js = nc.jetstream(publish_async_max_pending=4 * FETCH_BATCH)
    window = Window()
    deadline = time.monotonic() + STAGE_SECONDS
    last_seq, ended = 0, False
    try:
        psub = await js.pull_subscribe_bind(durable=durable, stream=stream)
        mark_ready(out, stage)
        while not ended and (realtime or window.count < count):
            msgs = await _fetch(psub, deadline, stage)
            if window.first is None:  # from the first input's arrival
                window.first = time.monotonic()
            items = []
            for m in msgs:
                value = DECODE(m.data)
                marked = is_last(value)
                ended = ended or marked
                output = transform(value)
                if marked:
                    output["last"] = True
                items.append((f"{stage}-{ident(value)}", ENCODE(output)))
                last_seq = max(last_seq, m.metadata.sequence.stream)
            await _publish_gathered(js, subject, items)
            await _settle(msgs, confirmed=not realtime)
            window.tick(len(msgs))
        if errors:
            raise StageFailed(f"{stage}: {errors}")
        write_stats(out, stage, **window.fields(), superseded=last_seq - window.count)
    finally:
        await nc.close()


async def peer_sink(url: str, out: str, stage: str, stream: str, durable: str,
                    count: int, realtime: bool = False, latency: bool = False) -> None:
    """Pull fetch(FETCH_BATCH), apply each (Tally), then ack the batch: ack_sync
    gathered in BATCH, ack() in REALTIME.

    Arguments:
        stream / durable: the input edge.
        count: distinct messages to expect (BATCH), or read until "last" (REALTIME).
        latency: keep each message's receive time minus its send time.
    """
    nc, errors = await connect(url)
    js = nc.jetstream()
    tally = Tally(latency)
    deadline = time.monotonic() + STAGE_SECONDS
    last_seq, ended = 0, False
    try:
        psub = await js.pull_subscribe_bind(durable=durable, stream=stream)
        mark_ready(out, stage)
        while not ended and (realtime or len(tally.seen) < count):
            msgs = await _fetch(psub, deadline, stage)
            received = time.time()
            for m in msgs:
                value = DECODE(m.data)
                ended = ended or is_last(value)
                tally.add(value, received)
                last_seq = max(last_seq, m.metadata.sequence.stream)
            await _settle(msgs, confirmed=not realtime)
        if errors:
            raise StageFailed(f"{stage}: {errors}")
        write_stats(out, stage, **tally.fields(), superseded=last_seq - tally.window.count)
    finally:
        await nc.close()


async def peer_joiner(url: str, out: str, stage: str, edges: list[tuple[str, str]],
                      subject: str, count: int) -> None:
    """Join the cameras by frame index: one fetch loop per camera durable files each
    frame under its k; a group with all cameras is ready. An emitter publishes every
    ready group's fused output (publish_async, PubAcks gathered), then acks all
    their inputs (ack_sync gathered), while the fetch loops go on.

    Arguments:
        edges: (stream, durable) per camera, in camera order.
        subject: the fused output subject.
        count: groups to emit (frames per camera).

    Records: its window (groups emitted, first to last confirmed emission).
    """
    nc, errors = await connect(url)
    js = nc.jetstream(publish_async_max_pending=8 * FETCH_BATCH)
    cameras = len(edges)
    pending: dict[int, dict[int, tuple[Any, int]]] = {}  # k -> cam -> (msg, its k)
    ready: asyncio.Queue[int] = asyncio.Queue()
    window = Window()
    deadline = time.monotonic() + STAGE_SECONDS

    async def pull(cam: int, psub: Any) -> None:
        while window.count < count:
            for m in await _fetch(psub, deadline, f"{stage} cam{cam}"):
                k = DECODE(m.data)["k"]
                group = pending.setdefault(k, {})
                complete = len(group) == cameras
                group[cam] = (m, k)  # a redelivered frame replaces its first copy
                if not complete and len(group) == cameras:
                    ready.put_nowait(k)

    async def emit() -> None:
        while window.count < count:
            ks = [await asyncio.wait_for(ready.get(), STAGE_SECONDS)]
            while not ready.empty() and len(ks) < FETCH_BATCH:
                ks.append(ready.get_nowait())
            if window.first is None:  # from the first group's completion
                window.first = time.monotonic()
            groups = [(k, pending.pop(k)) for k in ks]
            await _publish_gathered(js, subject, [
                (f"{stage}-{k}", ENCODE({"ks": [group[c][1] for c in range(cameras)],
                                         "cams": list(range(cameras))}))
                for k, group in groups])
            await _settle([m for _, group in groups for m, _ in group.values()], True)
            window.tick(len(groups))

    pullers: list[asyncio.Future[None]] = []
    failures: list[BaseException] = []
    try:
        bound = [await js.pull_subscribe_bind(durable=d, stream=s) for s, d in edges]
        mark_ready(out, stage)
        emitter = asyncio.ensure_future(emit())

        def failed(task: asyncio.Future[None]) -> None:
            # A puller only ends on its own once every group is out, or by failing:
            # then the emitter would wait for groups that never complete.
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())  # type: ignore[arg-type]
                emitter.cancel()

        for cam, psub in enumerate(bound):
            pullers.append(asyncio.ensure_future(pull(cam, psub)))
            pullers[-1].add_done_callback(failed)
        try:
            await emitter
        except asyncio.CancelledError:
            if failures:
                raise failures[0] from None
            raise
        if errors:
            raise StageFailed(f"{stage}: {errors}")
        write_stats(out, stage, **window.fields())
    finally:
        for task in pullers:
            task.cancel()
        await asyncio.gather(*pullers, return_exceptions=True)
        await nc.close()


PEER_STAGES: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "producer": peer_producer, "processor": peer_processor, "sink": peer_sink,
    "joiner": peer_joiner}


def run_stage(kind: str, kwargs: dict[str, Any]) -> None:
    """A peer stage's process entry (multiprocessing spawn target): run the stage to
    its end; an exception exits the process non-zero, with its traceback on stderr.

    Arguments:
        kind: a key of PEER_STAGES.
        kwargs: the stage function's arguments.
    """
    asyncio.run(PEER_STAGES[kind](**kwargs))
