"""Stages of the frame benchmark (bench/test_bench_frames.py): a camera producer of
1920x1080x3 uint8 frames, a pass-through processor, and a sink that checks and counts
them, as videoflow node classes.

Module level, because every replica runs in a spawned process of its own that imports
this file (bench/ is on sys.path under pytest, and a spawned process inherits it).

The producer does no heavy work per frame: it hands out frames of a small pool of
distinct ones made at open() (pool_frame), each in a dict beside its index,
{"i": i, "frame": pool_frame(i % POOL)}. The sink knows the pool by a few sampled
bytes per frame (SAMPLES, from the first byte to the last), so it checks cheaply that
every frame arrived once, whole (its shape and dtype, its last byte), and unmixed (its
bytes are those of its index's pool frame).

Every stage measures itself, as the flow benchmarks' stages do (flow_bench_nodes):
first and last frame (time.monotonic, system-wide), how many, the CPU spent, written
as JSON to ``<out>/<stage>.json`` at close, for the test to read back; a producer
starts only once its readers have left their ready files (wait_ready).
"""

from __future__ import annotations

import mmap
import time
from typing import Any

import numpy as np

from flow_bench_nodes import Window, cpu_since, mark_ready, wait_ready, write_stats
from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode

SHAPE = (1080, 1920, 3)
"""One frame: 1080p, three uint8 channels (6,220,800 bytes)."""

FRAME_BYTES = int(np.prod(SHAPE))

POOL = 4
"""Distinct frames the producer cycles through: enough that a frame handed to the
wrong index is seen (its bytes are another pool frame's), few enough to make at once.
Together (25 MB) they are larger than a cache, so no stage reads them from one."""

SEED = 14
"""Seed of the pool's frames (issue 14), so the sink can make the same ones."""

SAMPLES = np.unique(np.concatenate([
    np.linspace(0, FRAME_BYTES - 1, 48, dtype=np.int64),
    np.random.default_rng(SEED + 1000).integers(0, FRAME_BYTES, 16, dtype=np.int64)]))
"""Flat byte offsets the sink compares against the pool: spread evenly from the first
byte to the last, and 16 random ones."""


def pool_frame(k: int, camera: bool = False) -> np.ndarray:
    """Pool frame k: uniform noise from its own seed, so any two pool frames differ at
    nearly every sampled byte. With camera, what a camera sees instead (for a lossy
    codec, which noise would cost its worst case): gradients and soft shapes placed by
    k, and sensor noise (sigma 2)."""
    rng = np.random.default_rng(SEED + k)
    if not camera:
        return rng.integers(0, 256, SHAPE, dtype=np.uint8)
    y, x = np.mgrid[0:SHAPE[0], 0:SHAPE[1]].astype(np.float32)
    shift = 97.0 * (k + 1)
    planes = [(x + shift) % SHAPE[1] * 255 / SHAPE[1], y * 255 / SHAPE[0],
              128 + 100 * np.sin((x + shift) / 41.0) * np.cos(y / 29.0)]
    image = np.stack(planes, -1) + rng.normal(0.0, 2.0, SHAPE).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def pool_samples(camera: bool = False) -> np.ndarray:
    """The sampled bytes of every pool frame, shape (POOL, len(SAMPLES))."""
    return np.stack([pool_frame(k, camera).reshape(-1)[SAMPLES] for k in range(POOL)])


def shared_budget_waits(node: Any) -> dict[str, int | None]:
    """How often this replica waited on a byte budget, as its messenger knows it: puts
    that waited for room in the shared-memory store (shm only: the object store has no
    budget), and times receiving paused with its byte budget full. None where unknown.
    Read through the context's messenger, which no public API exposes: a diagnostic
    for the summary, never a figure the test asserts on."""
    messenger = getattr(getattr(node, "context", None), "_messenger", None)
    store = getattr(messenger, "payload_store", None)
    puts = getattr(store, "budget_waits", None)
    try:
        receives = None if messenger is None else int(messenger.budget_waits)
    except Exception:  # a diagnostic: any messenger that cannot say is unknown
        receives = None
    return {"put_budget_waits": puts if isinstance(puts, int) else None,
            "receive_budget_waits": receives}


class Frames(ProducerNode):
    """count frames {"i": i, "frame": pool_frame(i % POOL)}, unpaced, or paced at fps
    frames a second (a camera's rate), each then stamped with its wall-clock time when
    handed out ("t", time.time()) for the sink's latency. The pool is made at open();
    the first next() waits for the readers to be started (wait_ready). Records the time
    of its first next() call (after that wait) and of the call that ends its stream, so
    its rate covers count frames handed to the task."""

    def __init__(self, count: int, out: str, readers: list[str], camera: bool = False,
                 fps: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.count, self.out, self.readers, self.camera = count, out, readers, camera
        self.fps = fps

    def open(self) -> None:
        self.pool = [pool_frame(k, self.camera) for k in range(POOL)]
        self.i = 0
        self.first: float | None = None
        self.ended: float | None = None
        self.cpu_first = 0.0

    def next(self) -> dict[str, Any]:
        if self.first is None:
            wait_ready(self.out, self.readers)
            self.first, self.cpu_first = time.monotonic(), time.process_time()
        if self.i >= self.count:
            self.ended = time.monotonic()
            raise StopIteration
        value: dict[str, Any] = {"i": self.i, "frame": self.pool[self.i % POOL]}
        if self.fps:
            time.sleep(max(0.0, self.first + self.i / self.fps - time.monotonic()))
            value["t"] = time.time()
        self.i += 1
        return value

    def close(self) -> None:
        write_stats(self.out, self.name, count=self.i, first=self.first, last=self.ended,
                    cpu=None if self.first is None else cpu_since(self.cpu_first),
                    **shared_budget_waits(self))


class PassThrough(ProcessorNode):
    """Returns its input as it came (the dict holding the frame): the case issue 14
    wants to pass on without a copy. Says it is ready once open; records its window."""

    def __init__(self, out: str, **options: Any) -> None:
        super().__init__(**options)
        self.out = out

    def open(self) -> None:
        self.window = Window()
        mark_ready(self.out, self.name)

    def process(self, value: dict[str, Any]) -> dict[str, Any]:
        self.window.tick()
        return value

    def close(self) -> None:
        write_stats(self.out, self.name, **self.window.fields(), **shared_budget_waits(self))


class FrameSink(ConsumerNode):
    """Checks and counts each frame: its index new and in range, its shape and dtype,
    its sampled bytes those of pool frame i % POOL. Records its window (first to last
    frame received), the frames received, distinct, duplicated, out of range and bad
    (wrong shape, dtype or bytes; up to 5 described), and how many arrived as
    read-only views of a mapping (the shared-memory store's zero-copy read). With
    latency, each frame's receive time minus its camera's stamp (paced Frames), in
    seconds."""

    def __init__(self, out: str, count: int, camera: bool = False, lossy: bool = False,
                 latency: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.out, self.count, self.camera, self.lossy = out, count, camera, lossy
        self.latency = latency

    def open(self) -> None:
        self.expected = pool_samples(self.camera)
        self.window = Window()
        self.seen = np.zeros(self.count, dtype=bool)
        self.duplicates = self.out_of_range = self.bad = self.mapped = 0
        self.bad_examples: list[str] = []
        self.latencies: list[float] = []
        mark_ready(self.out, self.name)

    def consume(self, value: dict[str, Any]) -> None:
        if self.latency:
            self.latencies.append(time.time() - value["t"])
        self.window.tick()
        i, frame = value["i"], value["frame"]
        if not 0 <= i < self.count:
            self.out_of_range += 1
            return
        if self.seen[i]:
            self.duplicates += 1
        self.seen[i] = True
        problem = None
        if frame.shape != SHAPE or frame.dtype != np.uint8:
            problem = f"frame {i}: shape {frame.shape}, dtype {frame.dtype}"
        elif not frame.flags.c_contiguous:
            problem = f"frame {i}: not contiguous"
        elif not self.lossy and not np.array_equal(frame.reshape(-1)[SAMPLES],
                                                   self.expected[i % POOL]):
            problem = f"frame {i}: sampled bytes are not pool frame {i % POOL}'s"
        elif self.lossy:
            # Close to its own pool frame, not equal: nearest to it of the pool's.
            error = np.abs(self.expected.astype(np.int16)
                           - frame.reshape(-1)[SAMPLES].astype(np.int16)).mean(axis=1)
            if int(error.argmin()) != i % POOL or error[i % POOL] > 8:
                problem = (f"frame {i}: sampled bytes {error[i % POOL]:.1f} off pool frame "
                           f"{i % POOL}'s, nearest pool frame {int(error.argmin())}")
        if problem is not None:
            self.bad += 1
            if len(self.bad_examples) < 5:
                self.bad_examples.append(problem)
        owner = frame
        while isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        self.mapped += (isinstance(getattr(owner, "obj", None), mmap.mmap)
                        and not frame.flags.writeable)

    def close(self) -> None:
        write_stats(self.out, self.name, **self.window.fields(),
                    distinct=int(self.seen.sum()), duplicates=self.duplicates,
                    out_of_range=self.out_of_range, bad=self.bad,
                    bad_examples=self.bad_examples, mapped=self.mapped,
                    latencies=self.latencies, **shared_budget_waits(self))
