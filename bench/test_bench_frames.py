"""Camera frames through a whole flow, against a plain memory copy, in one run
(issue 14, "Camera frames at memory speed": its figures before the stores change).

Frames of 1920x1080x3 uint8 (6,220,800 bytes) go producer -> processor -> sink as a
videoflow flow, run with ``Flow(...).run(url, view=False, payloads=...)`` on the
embedded nats-server, every node replica a spawned process of its own (node classes
in bench/frame_bench_nodes.py). The producer hands out frames of a small pool of
distinct ones, each in a dict beside its index ({"i", "frame"}), so it does no heavy
work per frame; the processor returns its input as it came (the pass-through that
issue 14 wants zero-copy); the sink checks each frame cheaply (its index new, its
shape, its sampled bytes those of its pool frame) and counts. A producer starts only
once its readers have (ready files, as in the flow benchmarks).

Cases (one benchmark group, ``frames_1080p``):

``memcpy``: the physical reference, in the test's own process: np.copyto of the same
frames (the same pool, the same number of frames as ``shm``) into one preallocated
array, timed from before the first copy to after the last.

``shm``: the flow with ``payloads="shm"`` (the local engine's default): every frame is
written once into shared memory per hop, and readers map it.

``object_store``: the flow with ``payloads="object_store"``, as workers on several
hosts would run it, on the embedded server (max_payload 8 MiB): a frame fits a
message, so it travels inline, one stream message per hop.

``object_store_chunks``: the same flow on a server at nats-server's own max_payload
(1 MiB), as a cluster configured by default is: every frame goes through the flow's
NATS object store (chunks, a meta message and the obligation records).

``object_store_jpeg``: the inline flow with the flow's codec jpeg (quality 90): the
camera and the pass-through encode what they publish, each reader decodes; the frames
are camera-like (gradients, soft shapes, sensor noise) instead of noise, whose JPEG is
its worst case, and the sink checks each is close to its own pool frame. Its bytes/s count the raw
frames delivered, as the others do.

``object_store_30fps``: the inline flow at a camera's pace instead of as fast as it
goes: the camera hands out 30 frames a second (one 1080p camera, 187 MB/s), each
stamped with its time, for 10 s a round. The unpaced rounds above are short bursts
(60 frames: the camera is done early and the pass-through then has the machine to
itself); this one says whether the flow keeps up with a camera for good, and how
late each frame reaches the sink: the latency per frame, camera to sink (two hops),
p50 and p99.

``natspy_core`` and ``natspy_object_store``: the ceilings, camera -> sink with nats-py
alone (bench/frame_peers.py), each side a process: plain core publish -> subscribe of
one frame per message, and nats-py's own object store (put, name sent, get, delete);
at most 4 frames unanswered, so neither loses any.

The figure is bytes per second at the sink: the frames received after the first, times
the frame's bytes, over the sink's first-to-last window (time.monotonic), as the flow
benchmarks time their stages; for memcpy, the frames copied times their bytes over
the copies' time. Each case's extra_info has every round: producer, processor and
sink frames per second, each stage's CPU per frame (its process, from its first
frame to its end), how many frames reached the sink as read-only views of a mapping,
and how often a stage waited on a byte budget (shared-memory puts that waited for
room; receives paused with the byte budget full).

How to read it: the summary at the end gives per case the best round's bytes/s (on a
shared 2-core machine the least disturbed one) and the median's, and the ratios
shm / memcpy (how far from memory speed), shm / object_store, each object-store case
over plain core NATS (issue 44 asks 0.8), inline over chunks, and chunks over nats-py's
own object store, from the best rounds and from the medians. Compare ratios within
one run, never absolute figures across runs. The pytest-benchmark times themselves
are whole runs (process start-up included) and are not the figures.

Sizes: with timing on, 300 frames per round for memcpy and shm and 60 for every
unpaced case through the broker (a frame there is several megabytes through a socket
per hop, so 300 would make its rounds minutes long), 300 for the paced one (10 s at
30 fps), 3 rounds per case; with --benchmark-disable, 10 frames per case in one round,
a smoke check that still asserts every frame arrived once, whole and unmixed.
Overrides: VF_BENCH_FRAMES_N (memcpy and shm frames), VF_BENCH_FRAMES_OBJECT_N (frames
through the broker; default the smaller of 60 and N), VF_BENCH_FRAMES_PACED_N (the
paced case's frames; default N), VF_BENCH_FRAMES_ROUNDS.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench_summary import summary_at_end
from flow_bench_nodes import BATCH_MAX_MSGS, read_stats
from frame_bench_nodes import (
    FRAME_BYTES,
    POOL,
    SHAPE,
    Frames,
    FrameSink,
    PassThrough,
    pool_frame,
)
from frame_peers import run_pair
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.flow import Flow

pytestmark = pytest.mark.timeout(900)

CASES = ["memcpy", "shm", "object_store", "object_store_chunks", "object_store_jpeg",
         "object_store_30fps", "natspy_core", "natspy_object_store"]
PEERS = {"natspy_core": "core", "natspy_object_store": "object_store"}
STAGES = ["camera", "pass", "sink"]
OBJECT_STORE_FRAMES = 60
"""Default frames per object-store round with timing on (see Sizes in the docstring)."""

PACED = {"object_store_30fps": 30.0}
"""The paced cases and their camera's frames per second: one 1080p camera."""

# case -> {"best", "median", "frames", "rounds"}; printed by `summary`.
_RESULTS: dict[str, dict[str, Any]] = {}


# ------------------------------------------------------------------ sizes, results


@dataclass(frozen=True)
class Sizes:
    """What one case runs: frames per round (memcpy and shm, object store), rounds."""

    frames: int
    object_frames: int
    paced_frames: int
    rounds: int

    def for_case(self, case: str) -> int:
        if case in PACED:
            return self.paced_frames
        return self.frames if case in ("memcpy", "shm") else self.object_frames


def sizes_for(benchmark: Any) -> Sizes:
    """Small sizes when timing is off (a smoke check), meaningful ones when it is on;
    either overridden by VF_BENCH_FRAMES_N / _OBJECT_N / _PACED_N / _ROUNDS.

    Raises:
        pytest.UsageError: a frame count below 2 (no window to time) or at or above a
            BATCH stream's backlog bound.
    """
    off = benchmark.disabled
    frames = int(os.environ.get("VF_BENCH_FRAMES_N", 10 if off else 300))
    object_frames = int(os.environ.get("VF_BENCH_FRAMES_OBJECT_N",
                                       min(frames, OBJECT_STORE_FRAMES)))
    paced_frames = int(os.environ.get("VF_BENCH_FRAMES_PACED_N", frames))
    sizes = Sizes(frames, object_frames, paced_frames,
                  1 if off else int(os.environ.get("VF_BENCH_FRAMES_ROUNDS", 3)))
    if not all(1 < n < BATCH_MAX_MSGS
               for n in (sizes.frames, sizes.object_frames, sizes.paced_frames)):
        raise pytest.UsageError(
            f"VF_BENCH_FRAMES_N / _OBJECT_N / _PACED_N must be in 2..{BATCH_MAX_MSGS - 1}")
    return sizes


def bytes_rate(value: float | None) -> str:
    """Bytes per second, in GB/s from 1 GB/s up, else in MB/s (10^9, 10^6 bytes)."""
    if value is None:
        return "-"
    return f"{value / 1e9:.2f} GB/s" if value >= 1e9 else f"{value / 1e6:,.0f} MB/s"


def median_of(rounds: list[dict[str, Any]], key: str) -> float | None:
    """The median of a figure over rounds, None when no round has it."""
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def record(benchmark: Any, case: str, frames: int, rounds: list[dict[str, Any]]) -> None:
    """Keep a case's bytes/s (best and median round) for the summary and extra_info."""
    values = [r["bytes_per_s"] for r in rounds if r.get("bytes_per_s")]
    assert len(values) == len(rounds), f"{case}: a round measured no rate: {rounds}"
    kept = {"best": max(values), "median": statistics.median(values), "frames": frames,
            "rounds": rounds}
    _RESULTS[case] = kept
    benchmark.extra_info.update({"bytes_per_s_best": kept["best"],
                                 "bytes_per_s_median": kept["median"],
                                 "frames_per_round": frames, "frame_bytes": FRAME_BYTES,
                                 "rounds": rounds})


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the module's end, the cases' bytes/s and their ratios, through the terminal
    reporter (output capture would swallow a plain print). Not with timing off: the
    smoke sizes make no figures worth reading."""
    yield from summary_at_end(request, lambda: bool(_RESULTS), write_summary)


def write_summary(write: Callable[[str], None]) -> None:
    write("")
    write(f"1080p frames ({FRAME_BYTES:,} bytes) producer -> processor -> sink: bytes/s "
          "at the sink, best round (median in brackets)")
    write(f"  {'case':<20}{'frames':>8}{'rounds':>8}{'best':>14}{'median':>14}")
    for case in CASES:
        kept = _RESULTS.get(case)
        if kept is None:
            continue
        write(f"  {case:<20}{kept['frames']:>8}{len(kept['rounds']):>8}"
              f"{bytes_rate(kept['best']):>14}{bytes_rate(kept['median']):>14}")
        rounds = kept["rounds"]
        if case == "memcpy":
            continue
        fps = [median_of(rounds, f"{stage}_fps") for stage in STAGES]
        write(f"  {'':<20}frames/s camera / pass / sink (median): "
              + " / ".join("-" if f is None else f"{f:,.1f}" for f in fps))
        cpu = [median_of(rounds, f"{stage}_cpu_ms_per_frame") for stage in STAGES]
        write(f"  {'':<20}CPU ms/frame camera / pass / sink (median): "
              + " / ".join("-" if c is None else f"{c:,.2f}" for c in cpu))
        if case in PACED:
            latency = [median_of(rounds, f"latency_{q}_ms") for q in ("p50", "p99")]
            if None not in latency:
                write(f"  {'':<20}paced at {PACED[case]:g} fps: latency camera -> sink "
                      f"(two hops, median) p50 {latency[0]:,.1f} ms, p99 {latency[1]:,.1f} ms")
        if case == "object_store_jpeg":
            jpeg = [median_of(rounds, f"jpeg_{key}") for key in
                    ("bytes_per_frame", "encode_ms", "decode_ms")]
            if None not in jpeg:
                write(f"  {'':<20}jpeg (median): {jpeg[0] / 1e3:,.0f} KB a frame, encode "
                      f"{jpeg[1]:.1f} ms, decode {jpeg[2]:.1f} ms; bytes/s counts raw frames")
        if case in PEERS:
            continue
        totals = {key: sum(r[key] for r in rounds) if all(r.get(key) is not None
                                                          for r in rounds) else None
                  for key in ("put_budget_waits", "receive_budget_waits", "mapped")}
        puts = (f"shm puts that waited for room {_known(totals['put_budget_waits'])}, "
                if case == "shm" else "")  # the object store keeps no budget
        write(f"  {'':<20}over its rounds: {puts}receives paused on the byte budget "
              f"{_known(totals['receive_budget_waits'])}, frames read as mapped views "
              f"{_known(totals['mapped'])}")
    for top, bottom in (("shm", "memcpy"), ("shm", "object_store"),
                        ("object_store", "natspy_core"), ("object_store_chunks", "natspy_core"),
                        ("object_store", "object_store_chunks"),
                        ("object_store_jpeg", "object_store"),
                        ("object_store_chunks", "natspy_object_store")):
        a, b = _RESULTS.get(top), _RESULTS.get(bottom)
        if a and b:
            write(f"  {top} / {bottom}: {a['best'] / b['best']:.3f} (best), "
                  f"{a['median'] / b['median']:.3f} (median)")


def _known(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def run_rounds(benchmark: Any, rounds: int, target: Callable[[], None]) -> None:
    """Run target `rounds` times, once per round and without warm-up: one flow run
    takes seconds, and each starts from fresh streams and processes anyway."""
    benchmark.pedantic(target, rounds=rounds, iterations=1)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def server_1mib() -> Iterator[embedded.EmbeddedServer]:
    """A server at nats-server's own max_payload (1 MiB), as a cluster configured by
    default is: a frame does not fit a message there, so it goes through the object
    store's chunks."""
    with embedded.start(max_payload=None) as started:
        yield started


# ------------------------------------------------------------------ the rounds


def memcpy_round(pool: list[np.ndarray], target: np.ndarray, n: int) -> dict[str, Any]:
    """np.copyto of n frames (pool frame i % POOL) into target, timed whole."""
    started = time.perf_counter()
    for i in range(n):
        np.copyto(target, pool[i % POOL])
    seconds = time.perf_counter() - started
    assert np.array_equal(target, pool[(n - 1) % POOL])
    return {"bytes_per_s": n * FRAME_BYTES / seconds, "seconds": seconds}


def per_second(stats: dict[str, Any], intervals: int) -> float | None:
    """intervals over a stage's first-to-last window (None for an empty window)."""
    span = (stats.get("last") or 0.0) - (stats.get("first") or 0.0)
    return intervals / span if intervals > 0 and span > 0 else None


def flow_round(url: str, out: Path, n: int, payloads: str,
               codec: str | None = None, fps: float = 0.0) -> dict[str, Any]:
    """camera -> pass -> sink as a videoflow flow with the given payload store; checks
    that every frame arrived once, whole and unmixed. With a codec (the flow's: every hop
    encodes), the camera sends camera-like frames, and the sink checks each is close to
    its own. With fps, the camera is paced at that rate and the sink times each frame
    from its camera's stamp.

    Returns:
        the round's figures: bytes/s at the sink, every stage's frames/s and CPU
        ms/frame, frames read as mapped views, budget waits; paced, the latency per
        frame camera -> sink, p50 and p99 (ms).
    """
    lossy = codec is not None
    camera = Frames(n, str(out), ["pass", "sink"], camera=lossy, fps=fps, name="camera")
    passed = PassThrough(str(out), name="pass")(camera)
    sink = FrameSink(str(out), n, camera=lossy, lossy=lossy, latency=bool(fps),
                     name="sink")(passed)
    flow = Flow([camera], [sink], BATCH, name=f"bench-frames-{payloads.replace('_', '-')}",
                codec=codec)
    report = flow.run(url, view=False, payloads=payloads)
    assert report.outcome == "completed", report.format()
    stats = {stage: read_stats(out, stage) for stage in STAGES}
    got = stats["sink"]
    assert (got["count"], got["distinct"], got["duplicates"], got["out_of_range"],
            got["bad"]) == (n, n, 0, 0, 0), got
    assert stats["camera"]["count"] == n and report.nodes["camera"].emitted == n
    assert report.nodes["pass"].processed == n and report.nodes["sink"].processed == n, (
        report.format())
    figures: dict[str, Any] = {
        # Frames after the first, over the window from the first to the last.
        "bytes_per_s": (n - 1) * FRAME_BYTES / (got["last"] - got["first"])
        if got["last"] > got["first"] else None,
        "mapped": got["mapped"],
    }
    if fps:
        latencies = got["latencies"]
        assert len(latencies) == n, f"{len(latencies)} latencies for {n} frames"
        figures["latency_p50_ms"] = 1e3 * statistics.median(latencies)
        figures["latency_p99_ms"] = 1e3 * float(np.percentile(latencies, 99))
    if codec is not None:
        counts = report.nodes["camera"].codecs[codec]
        figures.update({f"{codec}_bytes_per_frame": counts["coded_bytes"] / counts["encoded"],
                        f"{codec}_encode_ms": 1e3 * counts["encode_seconds"] / counts["encoded"]})
        read = report.nodes["pass"].codecs[codec]
        figures[f"{codec}_decode_ms"] = 1e3 * read["decode_seconds"] / read["decoded"]
    for stage in STAGES:
        s = stats[stage]
        # The camera's window runs from its first next() to the one that ends it, so
        # it covers all n frames; the readers' from their first frame to their last.
        figures[f"{stage}_fps"] = per_second(s, n if stage == "camera" else n - 1)
        figures[f"{stage}_cpu_ms_per_frame"] = None if s.get("cpu") is None else (
            1e3 * s["cpu"] / n)
    for key in ("put_budget_waits", "receive_budget_waits"):
        counts = [stats[stage].get(key) for stage in STAGES]
        figures[key] = None if None in counts else sum(counts)
    return figures


def peer_round(url: str, out: Path, n: int, how: str) -> dict[str, Any]:
    """camera -> sink with nats-py alone (frame_peers); checks every frame arrived once,
    whole and unmixed.

    Returns:
        the round's figures, as flow_round's (no pass stage).
    """
    run_pair(url, str(out), n, how)
    stats = {stage: read_stats(out, stage) for stage in ("camera", "sink")}
    got = stats["sink"]
    assert (got["count"], got["distinct"], got["duplicates"], got["bad"]) == (n, n, 0, 0), got
    figures: dict[str, Any] = {
        "bytes_per_s": (n - 1) * FRAME_BYTES / (got["last"] - got["first"])
        if got["last"] > got["first"] else None,
        "mapped": 0, "put_budget_waits": None, "receive_budget_waits": None,
        "pass_fps": None, "pass_cpu_ms_per_frame": None}
    for stage, s in stats.items():
        figures[f"{stage}_fps"] = per_second(s, n if stage == "camera" else n - 1)
        figures[f"{stage}_cpu_ms_per_frame"] = 1e3 * s["cpu"] / n
    return figures


# ------------------------------------------------------------------ the case


@pytest.mark.benchmark(group="frames_1080p")
@pytest.mark.parametrize("case", CASES)
def test_frames_1080p(benchmark: Any, summary: None, server: embedded.EmbeddedServer,
                      server_1mib: embedded.EmbeddedServer,
                      rounds_dir: Callable[[], Path], case: str) -> None:
    sizes = sizes_for(benchmark)
    n = sizes.for_case(case)
    rounds: list[dict[str, Any]] = []
    if case == "memcpy":
        pool = [pool_frame(k) for k in range(POOL)]
        target = np.empty(SHAPE, np.uint8)
        target.fill(0)  # its pages touched before the timing (np.zeros maps them lazily)
        run_rounds(benchmark, sizes.rounds,
                   lambda: rounds.append(memcpy_round(pool, target, n)))
    elif case in PEERS:
        run_rounds(benchmark, sizes.rounds,
                   lambda: rounds.append(peer_round(server.url, rounds_dir(), n, PEERS[case])))
    else:
        url = server_1mib.url if case == "object_store_chunks" else server.url
        payloads = "shm" if case == "shm" else "object_store"
        codec = "jpeg" if case == "object_store_jpeg" else None
        fps = PACED.get(case, 0.0)
        run_rounds(benchmark, sizes.rounds, lambda: rounds.append(
            flow_round(url, rounds_dir(), n, payloads, codec, fps)))
    record(benchmark, case, n, rounds)
