"""Whole flows: videoflow against a hand-written nats-py peer pipeline, in one run.

Each case is one benchmark group with two sides. ``videoflow`` runs the flow with
``Flow(...).run(url, view=False)`` on the embedded nats-server: every node replica a
spawned process of its own (node classes in bench/flow_bench_nodes.py). ``peer`` runs
the same pipeline written directly against nats-py, each stage a spawned process too,
with the same delivery guarantees: confirmed publishes (publish_async, a Nats-Msg-Id
per message, every PubAck awaited under a bound, NATS_FACTS S1/S2), inputs acked only
after the outputs they produced were confirmed, and streams configured as videoflow
configures its own (BATCH: interest retention, 10,000 messages, DiscardPolicy.NEW;
REALTIME: limits retention keeping the newest message, DiscardPolicy.OLD, max_deliver
1), each edge read through a durable pull consumer with explicit acks. The peer knows
how many messages to expect and has no end-of-stream protocol, ledger, dead letters
or payload store: it is the ceiling of what nats-py does with those guarantees.

A third side, ``dora``, runs the linear BATCH flow as a dora-rs dataflow (bench/
dora_peer.py): three Python nodes on dora's node API, started by ``dora run`` (its
local mode: coordinator and daemon in one process on 127.0.0.1, for this dataflow
only, stopped whatever happens). dora moves messages between processes through
shared memory, with no broker, no acks and nothing stored; its inputs' queues are as
deep as the run and hold the sender back when full, so every message is delivered.
It runs where the bench extra is installed (``pip install '.[bench]'``: dora-rs and
dora-rs-cli, Python 3.11 or newer) and is skipped otherwise, the reason saying what is
missing (CI installs dev only). Cases: ``flow_linear_batch`` and the BATCH half of
``flow_latency_1khz``; dora has no REALTIME notion (keep the newest message,
supersede the rest), so no REALTIME case.

Cases (group):

``flow_linear_batch``: producer -> processor -> sink, BATCH, N messages of about
100 bytes. Peer: the processor fetches 64, transforms them, publishes the 64 outputs
and waits for their PubAcks, then ack_syncs the 64 inputs (gathered); the sink fetches
64, applies them, ack_syncs them (gathered). Rate: at the sink, first to last message.

``flow_small_rate``: the same flow, BATCH, with SMALL_N (20,000) messages of 8 bytes
(SMALL_BYTES: the index alone, as msgpack bytes; an IMU sample or an odometry tick is
as small), all three sides. videoflow's producer and processor pack them (Node's pack:
several to a broker message; the processor's outputs of one inbound pack as one pack),
as an IMU's user would; the peer and dora send one per message. videoflow's streams
keep their backlog bound (10,000 messages, the producer held back at it); the peer's,
which hold nothing back, are as deep as the run, as dora's queues are. Rate: at the
sink, first to last message.

``flow_linear_realtime``: the same flow, REALTIME, 4 x N messages from an unpaced
producer. A REALTIME stream keeps only its newest message, so a stage slower than its
parent misses some: the figure is what the sink received per second (first to last
message), extra_info has the producer rate and how many were superseded. Checked:
every message is accounted for (received, or superseded, at every hop), none twice.
Peer: the same stream configuration; publishes still confirmed, acks fire-and-forget
(max_deliver 1: a lost ack redelivers nothing, which is all REALTIME asks); its last
message is marked, and a stream never drops its newest message, so the end arrives.

``flow_time_join``: 8 cameras -> time join -> sink, BATCH. Every camera's k-th frame is
stamped at instant k (EVENT_BASE + k / 60 s, far apart next to the 5 ms tolerance); the
videoflow join groups by event time. The peer joiner keys on the frame index: one
fetch loop per camera files frames under k, and every complete group's fused output is
published, its PubAck awaited, then its 8 inputs acked (ack_sync, gathered). Rate:
groups per second at the sink (8 frames each). Checked: every instant arrives as one
group, whole, once.

``flow_producer``: producer -> trivial sink; rate at the producer. videoflow: from its
first next() call to the one that ends the stream; peer: from its first publish_async
to its last confirmed PubAck (256 in flight, confirmed 64 at a time). The sink checks
every message arrived.

``flow_latency``: the linear BATCH flow with the producer paced, both sides at the
same rate: half the slower side's sink rate in ``flow_linear_batch`` of the same run,
so neither runs above half its own maximum (VF_BENCH_FLOW_RATE, default 300 msg/s, if
that case did not run). Each message carries its send time (time.time()); the sink
keeps receive time minus send time. The figure is the p50 per hop (over 2 hops).

``flow_latency_1khz``: the same, BATCH and REALTIME, paced at a fixed 1,000 msg/s (an
IMU's rate; issue 43): p50 and p99 per hop, and for REALTIME how many of the n
messages the sink received (a node that keeps up with its input should get them all).

``flow_observability``: the linear BATCH flow, videoflow only, watched against not:
"on" serves metrics (run_flow's metrics_port), scraped every half second (by the
test's process, as Prometheus would be a process of its own), and traces
(every output's traceparent header; no SDK, so no span); "off" serves none and runs
with VIDEOFLOW_TRACING=off. The two run side by side, each its own engine process
with its own replicas and its own broker (the two brokers change sides every pair),
their producers released at one moment (a start gate): on a shared host whose speed
drifts by tens of percent within seconds, two runs one after the other compare two
hosts, two at once share every slow and fast moment. Per pair, on / off of: the
stages' CPU per message; the same with each engine process's CPU (serving metrics);
its broker's CPU per message (every header is bytes it stores and sends on), and the
sum of the three; each sink's rate over the
window both ran (the counts read off marks its sink notes every 100 messages). The
summary gives each ratio's median over the pairs and its range. Rates of two flows
sharing two cores swing with how the scheduler happens to share them (two identical
flows: 0.8-1.3), so CPU per message is what to read here; for the cost of watching,
read the paced case below.

``flow_observability_paced``: the same pairs with both producers paced at one rate,
70% of the slower side's rate in the median flat-out pair of the same run: the cost of
watching at one load, and the figure to read. Run flat out, a flow's CPU per message
is not a constant of the code: it falls as the rate rises (batches fill, one loop
pass and one write serve more messages; measured alone, 510 us at 2,400 msg/s and 280
at 5,000), so of two flows side by side the one with more to do per message also runs
slower and then pays more per message for that too. 4 us of extra work per message
in the processor (1.3% of the stages' CPU) read as 2.8% flat out. Paced, both do the
same work per second and only what watching adds differs. The summary says how many
pairs had a side fall behind the pace (its sink below 95% of it), the all-in ratio over
the pairs that kept it, and when over a quarter fell behind, that the host was
saturated at that pace: the reading is then not one at one load.

``flow_tracing_paced``: the same paced pairs, at the same rate, with "on" serving no
metrics: what the trace header alone costs with no SDK installed (no span is made).

On both sides a producer starts only once its readers have (each reader leaves a
ready file when its input is bound, every producer waits for them), so no stage is
measured while another is still starting, and a REALTIME stream does not drop all but
its newest message before anyone reads it. Stages time themselves (first and last
message, with time.monotonic, system-wide) and write their figures to files the test
reads back.

How to read it: the table at the end of the run gives per case the videoflow and
peer figures and their ratio (videoflow / peer: a rate ratio below 1 means videoflow is
slower, a latency ratio above 1 that it adds more per hop), then the dora figure and
videoflow / dora for the cases dora runs ("-" for the others), from the best of the
rounds (on a shared 2-core machine the least disturbed one); extra_info has every
round's figures. Under each linear case, "stage CPU us/msg" is the CPU the stages'
processes spent per message (from each one's first message to its end, the broker's
own not counted, nor dora's daemon), the median over rounds: steadier than a rate or
a latency on a host whose load comes and goes, and what a latency at a paced rate
mostly follows. Compare ratios within one run, never absolute numbers across runs.
The pytest-benchmark times themselves are whole runs (process start-up included) and
are not the figures.

Sizes: with timing on, N = 5,000 messages (linear cases), 2,000 frames x 8 cameras
(join), 3 rounds per side; with --benchmark-disable, 300 and 100 in one round, a smoke
check that still asserts every count. Overrides: VF_BENCH_FLOW_N (messages),
VF_BENCH_FLOW_FRAMES (join frames per camera), VF_BENCH_FLOW_ROUNDS. N stays below the
10,000-message backlog bound of a BATCH stream: the peer has no backpressure path past
a full stream.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StreamConfig,
)

import dora_peer
from bench_summary import summary_at_end
from flow_bench_nodes import (
    BATCH_MAX_MSGS,
    CREDIT,
    JOIN_CREDIT,
    MARK_EVERY,
    Camera,
    Fuse,
    Numbers,
    Sink,
    Transform,
    connect,
    read_stats,
    run_stage,
    wait_gate,
)
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH, REALTIME
from videoflow.flow import Flow
from videoflow.messaging.tracing import TRACING_ENV

pytestmark = pytest.mark.timeout(300)

SIDES = ["videoflow", "peer"]
DORA = "dora"  # the third side, of the linear BATCH cases only (dora_linear)
OBSERVABILITY = ["on", "off"]  # metrics served and scraped, tracing: on / off
CAMERAS = 8
FRAME_DT = 1 / 60  # seconds between instants: far above the join's tolerance
TOLERANCE_MS = 5.0
HOPS = 2  # producer -> processor -> sink
PACED_SHARE = 0.7  # of the flat-out pairs' slower side: the paced pairs' rate
KEPT_PACE = 0.95  # a paced side whose sink rate is under this share of it fell behind
PEER_SECONDS = 240.0  # bound of one peer round's processes
PAIR_READY_SECONDS = 120.0  # two flows starting at once, their producers ready
LATENCY_SECONDS = {True: 1.0, False: 4.0}  # paced run length, timing off / on
PACED_1KHZ = 1000.0  # flow_latency_1khz's offered rate, msg/s
# REALTIME runs REALTIME_FACTOR x N (a REALTIME stream has no backlog bound): its
# producers are not paced, and N alone would end them within a second.
REALTIME_FACTOR = 4
SMALL_N = 20_000  # flow_small_rate's messages (VF_BENCH_SMALL_N; 300 with timing off)

# (case, side) -> {"unit", "best", "median", "rounds", ...}; printed by `summary`.
_RESULTS: dict[tuple[str, str], dict[str, Any]] = {}
_ROUND_IDS = itertools.count()


# ------------------------------------------------------------------ sizes, results


@dataclass(frozen=True)
class Sizes:
    """What one case runs: messages, join frames per camera, rounds per side."""

    messages: int
    frames: int
    rounds: int


def sizes_for(benchmark: Any) -> Sizes:
    """Small sizes when timing is off (a smoke check), meaningful ones when it is on;
    either overridden by VF_BENCH_FLOW_N / _FRAMES / _ROUNDS.

    Raises:
        pytest.UsageError: N at or above a BATCH stream's backlog bound.
    """
    off = benchmark.disabled
    sizes = Sizes(int(os.environ.get("VF_BENCH_FLOW_N", 300 if off else 5_000)),
                  int(os.environ.get("VF_BENCH_FLOW_FRAMES", 100 if off else 2_000)),
                  1 if off else int(os.environ.get("VF_BENCH_FLOW_ROUNDS", 3)))
    if not 0 < sizes.messages < BATCH_MAX_MSGS or not 0 < sizes.frames < BATCH_MAX_MSGS:
        raise pytest.UsageError(f"VF_BENCH_FLOW_N / _FRAMES must be in 1..{BATCH_MAX_MSGS - 1}")
    return sizes


def rate_of(stats: dict[str, Any]) -> float | None:
    """Messages per second over a stage's window (None for fewer than two)."""
    span = (stats["last"] or 0.0) - (stats["first"] or 0.0)
    return stats["count"] / span if stats["count"] > 1 and span > 0 else None


def p50_ms(latencies: list[float]) -> float:
    return statistics.median(latencies) * 1e3


def p99_ms(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3


def cpu_us_per_message(out: Path, stages: list[str], n: int) -> float | None:
    """The CPU every stage's process spent, from its first message to its end, summed
    and divided by the n messages of the round, in microseconds; None (unknown, never
    0) when a stage did not say. The broker's own CPU is not in it."""
    spent = [read_stats(out, stage).get("cpu") for stage in stages]
    known = [float(cpu) for cpu in spent if cpu is not None]
    if n <= 0 or len(known) < len(spent):
        return None
    return 1e6 * sum(known) / n


def record(benchmark: Any, case: str, side: str, rounds: list[dict[str, Any]],
           key: str, unit: str, lower_is_better: bool = False,
           compared: bool = True) -> dict[str, Any]:
    """Keep one side's figures for the summary and extra_info.

    Arguments:
        case / side: the row.
        rounds: each round's figures (dicts of numbers).
        key: the figure that rows are compared on.
        unit: its unit, for the table.
        lower_is_better: latency; the best round is then the lowest.
        compared: the benchmark's figure for bench/regression.py (its one
            ``<key>_best`` entry); a further row of the same benchmark keeps only its
            ``<key>_median`` in extra_info.

    Returns:
        what was recorded: best and median of `key`, and every round.
    """
    values = [r[key] for r in rounds if r.get(key) is not None]
    assert values, f"{case} {side}: no round measured {key}: {rounds}"
    best = min(values) if lower_is_better else max(values)
    kept = {"unit": unit, "key": key, "best": best, "median": statistics.median(values),
            "lower_is_better": lower_is_better, "rounds": rounds}
    _RESULTS[(case, side)] = kept
    if compared:
        benchmark.extra_info.update({f"{key}_best": best, f"{key}_median": kept["median"],
                                     "unit": unit, "rounds": rounds})
    else:
        benchmark.extra_info[f"{key}_median"] = kept["median"]
    return kept


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the module's end, the videoflow/peer table, through the terminal reporter
    (output capture would swallow a plain print). Not with timing off: the smoke
    sizes make no figures worth reading."""
    yield from summary_at_end(request, lambda: bool(_RESULTS), write_summary)


def write_summary(write: Callable[[str], None]) -> None:
    write("")
    write("videoflow flows vs hand-written nats-py peer and dora-rs peer (ratio = "
          "videoflow / peer, vf/dora = videoflow / dora; best round; median in brackets)")
    write(f"  {'case':<22}{'unit':<14}{'videoflow':>18}{'peer':>18}{'ratio':>8}"
          f"{DORA:>20}{'vf/dora':>9}")
    for case in dict.fromkeys(c for c, side in _RESULTS if side in (*SIDES, DORA)):
        vf, peer, dora = (_RESULTS.get((case, side)) for side in (*SIDES, DORA))
        unit = (vf or peer or dora or {}).get("unit", "")
        places = 2 if unit == "ms" else 1  # a hop's latency is a fraction of a ms
        shown = [f"{r['best']:>9,.{places}f} ({r['median']:,.{places}f})" if r else "-"
                 for r in (vf, peer, dora)]
        ratios = [f"{vf['best'] / other['best']:.2f}" if vf and other and other["best"]
                  else "-" for other in (peer, dora)]
        write(f"  {case:<22}{unit:<14}{shown[0]:>18}{shown[1]:>18}{ratios[0]:>8}"
              f"{shown[2]:>20}{ratios[1]:>9}")
        paced = {kept["rounds"][0].get("paced_rate")
                 for kept in (vf, peer, dora) if kept} - {None}
        if paced:
            write(f"  {'':<22}paced at " + " / ".join(f"{r:,.0f}" for r in paced) + " msg/s")
        cpu = [median_of(kept, "cpu_us_per_msg") for kept in (vf, peer, dora)]
        if any(c is not None for c in cpu):
            shown = ["-" if c is None else f"{c:,.0f}" for c in cpu]
            write(f"  {'':<22}{'stage CPU us/msg':<14}{shown[0]:>18}{shown[1]:>18}{'':>8}"
                  f"{shown[2]:>20}  (median; broker, dora daemon not included)")
    watching = "metrics and tracing"
    for case, turned_on, how in (("observability", watching, "flat out"),
                                 ("observability_paced", watching, "paced"),
                                 ("tracing_paced", "tracing", "paced")):
        on, off = _RESULTS.get((case, "on")), _RESULTS.get((case, "off"))
        if on and off:
            write_observability(write, how, on, off, turned_on)


def write_observability(write: Callable[[str], None], how: str, on: dict[str, Any],
                        off: dict[str, Any], turned_on: str = "metrics and tracing"
                        ) -> None:
    """The summary's lines for one observability case (turned_on: what "on" turns
    on): per pair, on / off, then the median and range over the pairs."""
    rate = on.get("paced_rate")
    write(f"  {turned_on} on / off, linear_batch {how}"
          + (f" at {rate:,.0f} msg/s each" if rate else "")
          + f" ({len(on['rounds'])} pairs, each pair's two runs side by side):")
    for key, what in (("cpu_us_per_msg", "stage CPU per message"),
                      ("cpu_with_engine_us_per_msg", "stage and engine CPU per message"),
                      ("broker_us_per_msg", "broker CPU per message"),
                      ("cpu_all_us_per_msg", "stage, engine and broker CPU"),
                      ("rate", "sink rate, the window both ran")):
        paired = paired_ratios(on, off, key)
        if paired:
            write(f"  {'':<6}{what:<36}{statistics.median(paired):.3f}  "
                  f"({min(paired):.3f} to {max(paired):.3f})")
    if rate:
        behind = {side: sum(r["rate"] < KEPT_PACE * rate for r in kept["rounds"])
                  for side, kept in (("on", on), ("off", off))}
        write(f"  {'':<6}pairs where a side fell below {KEPT_PACE:.0%} of the paced rate: "
              + ", ".join(f"{side} {count}" for side, count in behind.items()))
        # The pairs at that load: both sides kept the pace. Shown beside the median of
        # every pair, not in its place: a side that falls behind because watching
        # costs more leaves this subset with it.
        kept_pace = [a["cpu_all_us_per_msg"] / b["cpu_all_us_per_msg"]
                     for a, b in zip(on["rounds"], off["rounds"], strict=False)
                     if min(a["rate"], b["rate"]) >= KEPT_PACE * rate
                     and a.get("cpu_all_us_per_msg") and b.get("cpu_all_us_per_msg")]
        if kept_pace:
            write(f"  {'':<6}{'all of it, in pairs that kept pace':<36}"
                  f"{statistics.median(kept_pace):.3f}  ({len(kept_pace)} pairs)")
        if 4 * max(behind.values()) > len(on["rounds"]):
            write(f"  {'':<6}over a quarter of the pairs fell behind: at this pace the "
                  "host was saturated, so this is\n"
                  f"  {'':<6}not a reading at one load (a lower one: VF_BENCH_FLOW_RATE "
                  "with -k paced)")


def paired_ratios(on: dict[str, Any], off: dict[str, Any], key: str = "rate") -> list[float]:
    """on's figure (its rate by default) over off's in each pair of rounds run side by
    side (the i-th round of each side): the machine's load, which drifts over a run,
    weighs alike on both rounds of a pair, so their ratio is steadier than one of bests
    or medians."""
    return [a[key] / b[key] for a, b in zip(on["rounds"], off["rounds"], strict=False)
            if a.get(key) and b.get(key)]


def median_of(kept: dict[str, Any] | None, key: str) -> float | None:
    """The median of a figure over a side's rounds, None when no round has it."""
    values = [r[key] for r in (kept or {}).get("rounds", []) if r.get(key) is not None]
    return statistics.median(values) if values else None


def run_rounds(benchmark: Any, rounds: int, target: Callable[[], None]) -> None:
    """Run target `rounds` times, once per round and without warm-up: one flow run
    takes seconds, and each starts from fresh streams and processes anyway."""
    benchmark.pedantic(target, rounds=rounds, iterations=1)


# ------------------------------------------------------------------ fixtures


# ------------------------------------------------------------------ videoflow side


def run_flow(url: str, flow: Flow, **options: Any) -> Any:
    """Run a flow to its end (options: run_flow's); it must complete."""
    report = flow.run(url, view=False, **options)
    assert report.outcome == "completed", report.format()
    return report


def videoflow_linear(url: str, out: Path, n: int, flow_type: str, *, processor: bool = True,
                     rate: float = 0.0, latency: bool = False, name: str = "linear",
                     options: dict[str, Any] | None = None, gate: str | None = None,
                     small: bool = False) -> dict[str, Any]:
    """numbers -> [transform ->] sink as a videoflow flow; checks what arrived. The
    producer waits for the file gate when one is named (Numbers), and sends 8-byte
    messages when small, in packs when it is not paced (pack=True, the transform's too).

    Returns:
        the round's figures: sink, processor and producer rates (msg/s), the sink's
        count, superseded messages (REALTIME), the p50 latency per hop (latency=True).
    """
    readers = ["transform", "sink"] if processor else ["sink"]
    # 8-byte messages as fast as they come are an IMU's: its producer and the node
    # after it pack them, as their user would (Node's pack); the others go one per
    # broker message.
    pack = small and not rate
    numbers = Numbers(n, str(out), readers, rate=rate, gate=gate, small=small,
                      pack=pack, name="numbers")
    last = (Transform(str(out), name="transform", pack=pack)(numbers) if processor
            else numbers)
    sink = Sink(str(out), latency=latency, name="sink")(last)
    report = run_flow(url, Flow([numbers], [sink], flow_type, name=f"bench-{name}"),
                      **(options or {}))
    produced, got = read_stats(out, "numbers"), read_stats(out, "sink")
    assert produced["count"] == n and report.nodes["numbers"].emitted == n
    assert got["duplicates"] == 0, got
    nodes = report.nodes
    figures: dict[str, Any] = {"producer_rate": rate_of(produced), "delivered": got["count"]}
    if processor:
        figures["processor_rate"] = rate_of(read_stats(out, "transform"))
    if flow_type == BATCH:
        assert (got["distinct"], got["count"]) == (n, n), got
        assert all(node.processed == n for node in nodes.values() if node.kind != "producer")
    else:
        # Every message is accounted for at every hop: processed, or superseded by a
        # newer one (evicted on the stream, or received and skipped by the reader).
        hops = [("transform", "numbers"), ("sink", "transform")] if processor else [
            ("sink", "numbers")]
        for child, parent in hops:
            node = nodes[child]
            assert (node.processed + node.dropped.get("superseded", 0)
                    == nodes[parent].emitted), report.format()
        assert nodes["sink"].processed == got["count"], report.format()
        figures["superseded"] = n - got["count"]
        figures["last_arrived"] = got["last_id"] == n - 1  # shown, not required
    figures["rate"] = rate_of(got)
    figures["cpu_us_per_msg"] = cpu_us_per_message(
        out, ["numbers", "transform", "sink"] if processor else ["numbers", "sink"], n)
    if latency:
        per = HOPS if processor else 1
        figures["p50_ms_per_hop"] = p50_ms(got["latencies"]) / per
        figures["p99_ms_per_hop"] = p99_ms(got["latencies"]) / per
        figures["paced_rate"] = rate
    return figures


def videoflow_join(url: str, out: Path, frames: int) -> dict[str, Any]:
    """8 cameras -> time join -> sink as a videoflow flow; checks every instant
    arrived as one whole group, once.

    Returns:
        the round's figures: groups/s at the sink and at the join, frames/s.
    """
    cameras = [Camera(c, frames, FRAME_DT, str(out), ["fuse", "sink"], name=f"cam{c}")
               for c in range(CAMERAS)]
    fuse = Fuse(str(out), name="fuse",
                join_policy={"mode": "time", "tolerance_ms": TOLERANCE_MS})(*cameras)
    sink = Sink(str(out), name="sink")(fuse)
    report = run_flow(url, Flow(cameras, [sink], BATCH, name="bench-join"))
    got = read_stats(out, "sink")
    assert (got["distinct"], got["count"], got["duplicates"], got["mixed"]) == (
        frames, frames, 0, 0), got
    assert report.nodes["fuse"].processed == frames, report.format()
    rate = rate_of(got)
    return {"rate": rate, "frames_per_s": rate and rate * CAMERAS,
            "joiner_rate": rate_of(read_stats(out, "fuse"))}


# ------------------------------------------------------------------ peer side


@dataclass(frozen=True)
class Edge:
    """One peer edge: a stream, its subject, and the reader's durable."""

    stream: str
    subject: str
    durable: str


def peer_stream_config(edge: Edge, flow_type: str, max_msgs: int = BATCH_MAX_MSGS
                       ) -> StreamConfig:
    """The stream of one edge, configured as videoflow configures a node's stream
    (videoflow.backends.jetstream.configs), for its one data subject; a BATCH one
    holds max_msgs."""
    if flow_type == REALTIME:
        return StreamConfig(name=edge.stream, subjects=[edge.subject],
                            retention=RetentionPolicy.LIMITS, max_msgs_per_subject=1,
                            max_msgs=1, discard=DiscardPolicy.OLD, duplicate_window=120.0)
    return StreamConfig(name=edge.stream, subjects=[edge.subject],
                        retention=RetentionPolicy.INTEREST, max_msgs=max_msgs,
                        discard=DiscardPolicy.NEW, duplicate_window=120.0)


def peer_consumer_config(edge: Edge, flow_type: str, credit: int) -> ConsumerConfig:
    """The reader's durable: pull, explicit acks, no redelivery in REALTIME."""
    return ConsumerConfig(durable_name=edge.durable, filter_subject=edge.subject,
                          deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.EXPLICIT,
                          ack_wait=30, max_deliver=1 if flow_type == REALTIME else 4,
                          max_ack_pending=credit)


def peer_edges(case: str, names: list[str]) -> list[Edge]:
    """Fresh edges for one round (names never reused, so no round sees another's)."""
    round_id = next(_ROUND_IDS)
    return [Edge(f"PEER_{case}_{round_id}_{name}", f"peer.{case}.{round_id}.{name}",
                 f"reader_{name}") for name in names]


async def _provision(url: str, edges: list[Edge], flow_type: str, credit: int,
                     max_msgs: int) -> None:
    nc, errors = await connect(url)
    try:
        js = nc.jetstream()
        for edge in edges:
            await js.add_stream(peer_stream_config(edge, flow_type, max_msgs))
            await js.add_consumer(edge.stream, peer_consumer_config(edge, flow_type, credit))
    finally:
        await nc.close()
    assert errors == []


async def _delete(url: str, edges: list[Edge]) -> None:
    nc, _ = await connect(url)
    try:
        js = nc.jetstream()
        for edge in edges:
            await js.delete_stream(edge.stream)
    finally:
        await nc.close()


@contextlib.contextmanager
def provisioned(url: str, edges: list[Edge], flow_type: str,
                credit: int = CREDIT, max_msgs: int = BATCH_MAX_MSGS) -> Iterator[None]:
    """The edges' streams (a BATCH one holding max_msgs) and durables exist (before
    any stage publishes: interest retention drops what no consumer wants), and are
    deleted afterwards."""
    asyncio.run(asyncio.wait_for(_provision(url, edges, flow_type, credit, max_msgs), 30))
    try:
        yield
    finally:
        asyncio.run(asyncio.wait_for(_delete(url, edges), 30))


def run_peer(stages: list[tuple[str, dict[str, Any]]]) -> None:
    """Start every stage in a spawned process of its own, readers first, and wait
    for all; each must exit 0 within PEER_SECONDS (a stuck one is killed)."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=run_stage, args=(kind, kwargs),
                                 name=f"peer {kwargs['stage']}")
                 for kind, kwargs in reversed(stages)]
    deadline = time.monotonic() + PEER_SECONDS
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    codes = {p.name: p.exitcode for p in processes}
    assert all(code == 0 for code in codes.values()), f"peer stages failed: {codes}"


def peer_linear(url: str, out: Path, n: int, flow_type: str, *, processor: bool = True,
                rate: float = 0.0, latency: bool = False, name: str = "linear",
                small: bool = False) -> dict[str, Any]:
    """producer -> [processor ->] sink, each a nats-py process; checks what arrived.
    With small, 8-byte messages, and BATCH streams as deep as the run (the producer is
    not held back at a backlog bound).

    Returns:
        the same figures as videoflow_linear.
    """
    realtime = flow_type == REALTIME
    edges = peer_edges(name, ["src", "mid"] if processor else ["src"])
    common = {"url": url, "out": str(out), "realtime": realtime}
    stages: list[tuple[str, dict[str, Any]]] = [("producer", {
        **common, "stage": "producer", "subject": edges[0].subject, "count": n,
        "rate": rate, "readers": ["processor", "sink"] if processor else ["sink"],
        "small": small})]
    if processor:
        stages.append(("processor", {**common, "stage": "processor", "count": n,
                                     "stream": edges[0].stream, "durable": edges[0].durable,
                                     "subject": edges[1].subject}))
    stages.append(("sink", {**common, "stage": "sink", "count": n, "latency": latency,
                            "stream": edges[-1].stream, "durable": edges[-1].durable}))
    with provisioned(url, edges, flow_type, max_msgs=max(BATCH_MAX_MSGS, n + 1) if small
                     else BATCH_MAX_MSGS):
        run_peer(stages)
    produced, got = read_stats(out, "producer"), read_stats(out, "sink")
    assert produced["count"] == n and got["duplicates"] == 0, got
    figures: dict[str, Any] = {"producer_rate": rate_of(produced), "delivered": got["count"]}
    if processor:
        processed = read_stats(out, "processor")
        figures["processor_rate"] = rate_of(processed)
    if realtime:
        # What the processor passed on and what the sink received, plus what each
        # found superseded (sequence gaps), add up; the marked last one arrived.
        upstream = processed["count"] if processor else n
        if processor:
            assert processed["count"] + processed["superseded"] == n, processed
        assert got["count"] + got["superseded"] == upstream, got
        assert got["last_id"] == n - 1, got
        figures["superseded"] = n - got["count"]
    else:
        assert (got["distinct"], got["count"]) == (n, n), got
        if processor:
            assert processed["count"] == n, processed
    figures["rate"] = rate_of(got)
    figures["cpu_us_per_msg"] = cpu_us_per_message(
        out, ["producer", "processor", "sink"] if processor else ["producer", "sink"], n)
    if latency:
        per = HOPS if processor else 1
        figures["p50_ms_per_hop"] = p50_ms(got["latencies"]) / per
        figures["p99_ms_per_hop"] = p99_ms(got["latencies"]) / per
        figures["paced_rate"] = rate
    return figures


def peer_join(url: str, out: Path, frames: int) -> dict[str, Any]:
    """8 camera producers -> frame-index joiner -> sink, each a nats-py process;
    checks every instant arrived as one whole group, once.

    Returns:
        the same figures as videoflow_join.
    """
    edges = peer_edges("join", [f"cam{c}" for c in range(CAMERAS)] + ["fused"])
    cams, fused = edges[:CAMERAS], edges[CAMERAS]
    common = {"url": url, "out": str(out)}
    stages: list[tuple[str, dict[str, Any]]] = [
        ("producer", {**common, "stage": f"cam{c}", "subject": edge.subject,
                      "count": frames, "cam": c, "readers": ["joiner", "sink"]})
        for c, edge in enumerate(cams)]
    stages.append(("joiner", {**common, "stage": "joiner", "subject": fused.subject,
                              "count": frames,
                              "edges": [(edge.stream, edge.durable) for edge in cams]}))
    stages.append(("sink", {**common, "stage": "sink", "count": frames,
                            "stream": fused.stream, "durable": fused.durable}))
    with provisioned(url, edges, BATCH, credit=JOIN_CREDIT):
        run_peer(stages)
    got = read_stats(out, "sink")
    assert (got["distinct"], got["count"], got["duplicates"], got["mixed"]) == (
        frames, frames, 0, 0), got
    rate = rate_of(got)
    return {"rate": rate, "frames_per_s": rate and rate * CAMERAS,
            "joiner_rate": rate_of(read_stats(out, "joiner"))}


# ------------------------------------------------------------------ dora side


def dora_linear(url: str, out: Path, n: int, flow_type: str, *, processor: bool = True,
                rate: float = 0.0, latency: bool = False, name: str = "linear",
                small: bool = False) -> dict[str, Any]:
    """source -> pass-through -> sink as a dora dataflow (bench/dora_peer.py), each
    node a process that dora starts; checks every message arrived, once. url and name
    go unused (dora has no broker, and each round's dataflow is its own).

    Returns:
        the same figures as videoflow_linear.

    Raises:
        ValueError: a REALTIME flow or none without the pass-through: dora has no
            REALTIME notion, and only the three-process flow is written for it.
    """
    if flow_type != BATCH or not processor:
        raise ValueError("the dora peer runs the linear BATCH flow only")
    dora_peer.run_linear(out, n, rate=rate, latency=latency, bound=PEER_SECONDS, small=small)
    stages = ["producer", "processor", "sink"]
    produced, processed, got = (read_stats(out, stage) for stage in stages)
    assert produced["count"] == n and processed["count"] == n, (produced, processed)
    assert (got["distinct"], got["count"], got["duplicates"]) == (n, n, 0), got
    figures: dict[str, Any] = {
        "producer_rate": rate_of(produced), "processor_rate": rate_of(processed),
        "delivered": got["count"], "rate": rate_of(got),
        "cpu_us_per_msg": cpu_us_per_message(out, stages, n)}
    if latency:
        figures["p50_ms_per_hop"] = p50_ms(got["latencies"]) / HOPS
        figures["p99_ms_per_hop"] = p99_ms(got["latencies"]) / HOPS
        figures["paced_rate"] = rate
    return figures


def runnable(side: str, benchmark: Any) -> None:
    """Skip the dora side where it cannot run, saying why (dora_peer.unavailable);
    where it can, note dora's version in extra_info."""
    if side != DORA:
        return
    reason = dora_peer.unavailable()
    if reason is not None:
        pytest.skip(f"the dora side: {reason}")
    benchmark.extra_info["dora_version"] = dora_peer.version()


def linear(side: str) -> Callable[..., dict[str, Any]]:
    return {"videoflow": videoflow_linear, "peer": peer_linear, DORA: dora_linear}[side]


# ------------------------------------------------------------------ cases


@pytest.mark.benchmark(group="flow_linear_batch")
@pytest.mark.parametrize("side", [*SIDES, DORA])
def test_linear_batch(benchmark: Any, summary: None, server: embedded.EmbeddedServer,
                      rounds_dir: Callable[[], Path], side: str) -> None:
    runnable(side, benchmark)
    sizes = sizes_for(benchmark)
    rounds: list[dict[str, Any]] = []
    run_rounds(benchmark, sizes.rounds, lambda: rounds.append(
        linear(side)(server.url, rounds_dir(), sizes.messages, BATCH, name="batch")))
    record(benchmark, "linear_batch", side, rounds, "rate", "msg/s")


@pytest.mark.benchmark(group="flow_small_rate")
@pytest.mark.parametrize("side", [*SIDES, DORA])
def test_small_message_rate(benchmark: Any, summary: None, server: embedded.EmbeddedServer,
                            rounds_dir: Callable[[], Path], side: str) -> None:
    runnable(side, benchmark)
    sizes = sizes_for(benchmark)
    n = int(os.environ.get("VF_BENCH_SMALL_N", 300 if benchmark.disabled else SMALL_N))
    rounds: list[dict[str, Any]] = []
    run_rounds(benchmark, sizes.rounds, lambda: rounds.append(
        linear(side)(server.url, rounds_dir(), n, BATCH, name="small", small=True)))
    record(benchmark, "small_rate", side, rounds, "rate", "msg/s")


@pytest.mark.benchmark(group="flow_linear_realtime")
@pytest.mark.parametrize("side", SIDES)
def test_linear_realtime(benchmark: Any, summary: None, server: embedded.EmbeddedServer,
                         rounds_dir: Callable[[], Path], side: str) -> None:
    sizes = sizes_for(benchmark)
    rounds: list[dict[str, Any]] = []
    n = REALTIME_FACTOR * sizes.messages
    run_rounds(benchmark, sizes.rounds, lambda: rounds.append(
        linear(side)(server.url, rounds_dir(), n, REALTIME, name="realtime")))
    record(benchmark, "linear_realtime", side, rounds, "rate", "received/s")


@pytest.mark.benchmark(group="flow_time_join")
@pytest.mark.parametrize("side", SIDES)
def test_time_join(benchmark: Any, summary: None, server: embedded.EmbeddedServer,
                   rounds_dir: Callable[[], Path], side: str) -> None:
    sizes = sizes_for(benchmark)
    run = videoflow_join if side == "videoflow" else peer_join
    rounds: list[dict[str, Any]] = []
    run_rounds(benchmark, sizes.rounds,
               lambda: rounds.append(run(server.url, rounds_dir(), sizes.frames)))
    record(benchmark, "time_join_8", side, rounds, "rate", "groups/s")


@pytest.mark.benchmark(group="flow_producer")
@pytest.mark.parametrize("side", SIDES)
def test_producer_rate(benchmark: Any, summary: None, server: embedded.EmbeddedServer,
                       rounds_dir: Callable[[], Path], side: str) -> None:
    sizes = sizes_for(benchmark)
    rounds: list[dict[str, Any]] = []
    run_rounds(benchmark, sizes.rounds, lambda: rounds.append(linear(side)(
        server.url, rounds_dir(), sizes.messages, BATCH, processor=False, name="producer")))
    record(benchmark, "producer", side, rounds, "producer_rate", "msg/s")


def paced_rate() -> tuple[float, str]:
    """The latency case's offered rate, the same for both sides: half the slower
    side's sink rate in flow_linear_batch of this run, so each side runs at half its
    own maximum or below (a fetch-batch pipeline slows down as its batches shrink, so
    a side paced near its backlog maximum queues); VF_BENCH_FLOW_RATE (default 300
    msg/s) if that case did not run.

    Returns:
        (messages per second, how it was chosen).
    """
    measured = [_RESULTS[("linear_batch", side)]["best"] for side in SIDES
                if ("linear_batch", side) in _RESULTS]
    if len(measured) == len(SIDES):
        return min(measured) / 2, "half of the slower side in flow_linear_batch"
    return float(os.environ.get("VF_BENCH_FLOW_RATE", 300.0)), "fixed (VF_BENCH_FLOW_RATE)"


@pytest.mark.benchmark(group="flow_latency")
@pytest.mark.parametrize("side", SIDES)
def test_latency_per_hop(benchmark: Any, summary: None, server: embedded.EmbeddedServer,
                         rounds_dir: Callable[[], Path], side: str) -> None:
    sizes = sizes_for(benchmark)
    rate, basis = paced_rate()
    n = max(50, min(sizes.messages, int(rate * LATENCY_SECONDS[benchmark.disabled])))
    rounds: list[dict[str, Any]] = []
    run_rounds(benchmark, sizes.rounds, lambda: rounds.append(linear(side)(
        server.url, rounds_dir(), n, BATCH, rate=rate, latency=True, name="latency")))
    kept = record(benchmark, "latency_p50_per_hop", side, rounds, "p50_ms_per_hop", "ms",
                  lower_is_better=True)
    benchmark.extra_info["paced_rate"] = rate
    benchmark.extra_info["rate_basis"] = basis
    assert kept["best"] > 0


@pytest.mark.benchmark(group="flow_latency_1khz")
@pytest.mark.parametrize(("side", "flow_type"), [
    *((side, flow_type) for side in SIDES for flow_type in (BATCH, REALTIME)),
    (DORA, BATCH)])  # dora has no REALTIME notion
def test_latency_per_hop_at_1khz(benchmark: Any, summary: None,
                                 server: embedded.EmbeddedServer,
                                 rounds_dir: Callable[[], Path], side: str,
                                 flow_type: str) -> None:
    # An IMU's rate, small messages, whatever either side could carry at most: the
    # p50 and p99 per hop, and for REALTIME what a sink that keeps up received.
    runnable(side, benchmark)
    sizes = sizes_for(benchmark)
    n = int(PACED_1KHZ * LATENCY_SECONDS[benchmark.disabled])
    rounds: list[dict[str, Any]] = []
    run_rounds(benchmark, sizes.rounds, lambda: rounds.append(linear(side)(
        server.url, rounds_dir(), n, flow_type, rate=PACED_1KHZ, latency=True,
        name=f"paced-{flow_type}")))
    # The p50 per hop is the case's figure (bench/regression.py); the p99 and what a
    # REALTIME sink received are rows of the table.
    for figure in ("p50", "p99"):
        record(benchmark, f"1khz_{flow_type}_{figure}_hop", side, rounds,
               f"{figure}_ms_per_hop", "ms", lower_is_better=True, compared=figure == "p50")
    if flow_type == REALTIME:
        record(benchmark, "1khz_realtime_received", side, rounds, "delivered", f"of {n:,}",
               compared=False)


@pytest.fixture(scope="module")
def pair_brokers(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[list[embedded.EmbeddedServer]]:
    """Two embedded nats-servers, one per side of an observability pair: what each
    side's broker spends on it is then its own to measure."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(embedded.start(
            Path(tmp_path_factory.mktemp(f"bench-pair-{index}")) / "store"))
            for index in range(2)]


def free_port() -> int:
    """A port free now on 127.0.0.1 (the run binds it a moment later)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.contextmanager
def scraped(port: int) -> Iterator[None]:
    """/metrics on port scraped every half second by a thread (as Prometheus would,
    more often) while the block runs; it must have been scraped at least once.
    Prometheus is a process of its own: so is whatever runs this, never the engine
    whose CPU is measured."""
    import urllib.request

    done, scrapes = threading.Event(), []

    def scrape() -> None:
        while not done.wait(0.5):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=2) as answer:
                    scrapes.append(len(answer.read()))
            except OSError:  # before the run serves, or after it ended
                continue

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        yield
    finally:
        done.set()
        scraper.join(5)
    assert scrapes, "the metrics endpoint was never scraped"


@contextlib.contextmanager
def watched(side: str, port: int, metrics: bool = True) -> Iterator[dict[str, Any]]:
    """run_flow's options for a run watched ("on": metrics served on port unless
    metrics is False, every output's traceparent header; no SDK, so no span) or not
    ("off": no metrics, and VIDEOFLOW_TRACING=off, which the replicas inherit), with
    the environment set for the block."""
    saved = os.environ.get(TRACING_ENV)
    try:
        if side == "off":
            os.environ[TRACING_ENV] = "off"
            yield {}
        else:
            os.environ.pop(TRACING_ENV, None)
            yield {"metrics_port": port} if metrics else {}
    finally:
        if saved is None:
            os.environ.pop(TRACING_ENV, None)
        else:
            os.environ[TRACING_ENV] = saved


def observed_round(url: str, out: Path, n: int, side: str, gate: str | None = None,
                   rate: float = 0.0, port: int = 0, metrics: bool = True) -> dict[str, Any]:
    """One linear BATCH run, watched or not (watched; metrics on port unless metrics
    is False); its producer waits for gate when one is named, and is paced at rate per
    second when rate > 0."""
    with watched(side, port, metrics) as options:
        return videoflow_linear(url, out, n, BATCH, name=f"observed-{side}",
                                options=options, gate=gate, rate=rate)


def observed_child(url: str, out: str, n: int, side: str, gate: str, rate: float,
                   port: int, metrics: bool = True) -> None:
    """observed_round in a process of its own, its figures written to <out>/round.json
    (observed_pair runs two at once), with the CPU of the stages and of this process
    (the engine, serving metrics) from the gate's opening to the end, per message."""
    opened: list[float] = []

    def at_gate() -> None:
        wait_gate(gate)
        opened.append(time.process_time())

    watcher = threading.Thread(target=at_gate, daemon=True)
    watcher.start()
    figures = observed_round(url, Path(out), n, side, gate, rate, port, metrics)
    watcher.join(1.0)
    if opened and figures["cpu_us_per_msg"] is not None:
        engine = 1e6 * (time.process_time() - opened[0]) / n
        figures["cpu_with_engine_us_per_msg"] = figures["cpu_us_per_msg"] + engine
    Path(out, "round.json").write_text(json.dumps(figures))


def arrived_by(sink: dict[str, Any], when: float) -> float:
    """How many messages a sink had received at monotonic time `when`, read off its
    marks (every MARK_EVERY-th message's time) between its first and last message,
    linearly in between."""
    times = [sink["first"], *sink["marks"], sink["last"]]
    counts = [1, *range(MARK_EVERY, MARK_EVERY * len(sink["marks"]) + 1, MARK_EVERY),
              sink["count"]]
    at = bisect.bisect_right(times, when)
    if at == 0:
        return 0.0
    if at == len(times):
        return float(counts[-1])
    t0, t1, c0, c1 = times[at - 1], times[at], counts[at - 1], counts[at]
    return c0 + (c1 - c0) * ((when - t0) / (t1 - t0) if t1 > t0 else 1.0)


def run_pair(children: dict[str, Any], outs: dict[str, Path], gate: Path,
             at_gate: Callable[[], None] = lambda: None) -> None:
    """Start both sides' processes, open the gate once both producers are ready (then
    call at_gate), and wait for both to end, each successfully."""
    try:
        for child in children.values():
            child.start()
        deadline = time.monotonic() + PAIR_READY_SECONDS
        while not all((outs[side] / "ready-numbers").exists() for side in OBSERVABILITY):
            failed = {side: c.exitcode for side, c in children.items() if not c.is_alive()}
            assert not failed, f"a side ended before its producer was ready: {failed}"
            assert time.monotonic() < deadline, "producers not ready in time"
            time.sleep(0.005)
        gate.touch()
        at_gate()
        for child in children.values():
            child.join(PEER_SECONDS)
    finally:
        for child in children.values():
            if child.is_alive():
                child.terminate()
                child.join(10)
    assert all(c.exitcode == 0 for c in children.values()), {
        side: c.exitcode for side, c in children.items()}


def broker_cpu(server: embedded.EmbeddedServer) -> float | None:
    """The CPU seconds the server's process has spent so far, None where /proc cannot
    say (not Linux): unknown, never 0."""
    if server.process is None:
        return None
    try:
        fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def observed_pair(brokers: dict[str, embedded.EmbeddedServer], outs: dict[str, Path],
                  n: int, rate: float = 0.0, metrics: bool = True
                  ) -> dict[str, dict[str, Any]]:
    """One round of each side, run at once (observed_child), each on its own broker
    (brokers: side -> broker, its order the order the sides start in), their
    producers released together once both flows' readers are up, and paced at rate
    per second when rate > 0; "on" serves metrics, scraped, unless metrics is False.

    Returns:
        each side's figures, "rate" being its sink's over the window both sinks were
        receiving ("alone_rate": over its whole run), with "cpu_all_us_per_msg": the
        stages', its engine's and its broker's CPU per message (the broker's from the
        gate's opening until both runs ended).
    """
    context = multiprocessing.get_context("spawn")
    gate = outs["on"].with_name(f"{outs['on'].name}-gate")
    port = free_port()
    children = {side: context.Process(target=observed_child, name=f"observed-{side}",
                                      args=(brokers[side].url, str(outs[side]), n, side,
                                            str(gate), rate, port, metrics))
                for side in brokers}
    spent: dict[str, float | None] = {}

    def at_gate() -> None:
        spent.update({side: broker_cpu(brokers[side]) for side in OBSERVABILITY})

    with scraped(port) if metrics else contextlib.nullcontext():
        run_pair(children, outs, gate, at_gate)
    figures = {side: json.loads((outs[side] / "round.json").read_text())
               for side in OBSERVABILITY}
    for side in OBSERVABILITY:
        before, after = spent.get(side), broker_cpu(brokers[side])
        engine = figures[side].get("cpu_with_engine_us_per_msg")
        if before is not None and after is not None and engine is not None:
            broker = figures[side]["broker_us_per_msg"] = 1e6 * (after - before) / n
            figures[side]["cpu_all_us_per_msg"] = engine + broker
    sinks = {side: read_stats(outs[side], "sink") for side in OBSERVABILITY}
    start = max(sink["first"] for sink in sinks.values())
    end = min(sink["last"] for sink in sinks.values())
    assert end > start, f"the two runs did not overlap: {sinks}"
    for side in OBSERVABILITY:
        figures[side]["alone_rate"] = figures[side]["rate"]
        figures[side]["rate"] = (arrived_by(sinks[side], end)
                                 - arrived_by(sinks[side], start)) / (end - start)
    return figures


def observed_pairs(benchmark: Any, brokers: list[embedded.EmbeddedServer],
                   rounds_dir: Callable[[], Path], case: str, rate: float = 0.0,
                   metrics: bool = True) -> dict[str, dict[str, Any]]:
    """Pairs of runs on and off (observed_pair), recorded as `case`: four per round
    asked (a pair's ratio still varies by several percent, and its median over a
    dozen pairs is what reads a few), one with timing off. The sides swap the two
    brokers from one pair to the next, and which starts first every other pair, so
    neither side always has either.

    Returns:
        each side's record (record).
    """
    sizes = sizes_for(benchmark)
    rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in OBSERVABILITY}

    def pair() -> None:
        outs = {side: rounds_dir() for side in OBSERVABILITY}
        turn = len(rounds["on"])
        order = OBSERVABILITY if turn % 4 < 2 else OBSERVABILITY[::-1]
        sides = {side: brokers[(OBSERVABILITY.index(side) + turn) % 2] for side in order}
        for side, figures in observed_pair(sides, outs, sizes.messages, rate,
                                           metrics).items():
            rounds[side].append(figures)

    run_rounds(benchmark, sizes.rounds * 4 if not benchmark.disabled else 1, pair)
    kept = {side: record(benchmark, case, side, rounds[side], "rate", "msg/s")
            for side in OBSERVABILITY}
    benchmark.extra_info.clear()  # record() keeps one side's: keep both
    benchmark.extra_info.update({side: {k: kept[side][k] for k in ("best", "median", "rounds")}
                                 for side in OBSERVABILITY})
    benchmark.extra_info["paired_ratios"] = paired_ratios(kept["on"], kept["off"])
    return kept


@pytest.mark.benchmark(group="flow_observability")
def test_observability_cost(benchmark: Any, summary: None,
                            pair_brokers: list[embedded.EmbeddedServer],
                            rounds_dir: Callable[[], Path]) -> None:
    """The cost of watching a flow run flat out: pairs of runs on and off, the two of
    a pair run at once; the summary gives the pairs' ratios of CPU per message and of
    rate."""
    observed_pairs(benchmark, pair_brokers, rounds_dir, "observability")


def observed_rate() -> tuple[float, str]:
    """The rate both sides of every paced observability pair run at: PACED_SHARE of
    the slower side's rate in the median pair run flat out in this run (so each keeps
    up with room to spare while the other runs beside it); VF_BENCH_FLOW_RATE
    (default 300 msg/s) if that case did not run.

    Returns:
        (messages per second, how it was chosen).
    """
    on, off = _RESULTS.get(("observability", "on")), _RESULTS.get(("observability", "off"))
    slower = [min(a["rate"], b["rate"]) for a, b in zip(
        (on or {}).get("rounds", []), (off or {}).get("rounds", []), strict=False)
        if a.get("rate") and b.get("rate")]
    if slower:
        return (PACED_SHARE * statistics.median(slower),
                f"{PACED_SHARE:.0%} of the slower side's rate in flow_observability")
    return float(os.environ.get("VF_BENCH_FLOW_RATE", 300.0)), "fixed (VF_BENCH_FLOW_RATE)"


@pytest.mark.benchmark(group="flow_observability_paced")
def test_observability_cost_paced(benchmark: Any, summary: None,
                                  pair_brokers: list[embedded.EmbeddedServer],
                                  rounds_dir: Callable[[], Path]) -> None:
    """The cost of watching a flow at one load: pairs of runs on and off, both paced
    at one rate (observed_rate), so both do the same work per second and only what
    watching adds differs; the summary gives the pairs' ratios of CPU per message
    (the figure to read) and how many pairs kept pace."""
    paced_pairs(benchmark, pair_brokers, rounds_dir, "observability_paced")


def paced_pairs(benchmark: Any, brokers: list[embedded.EmbeddedServer],
                rounds_dir: Callable[[], Path], case: str, metrics: bool = True) -> None:
    """observed_pairs, both sides paced at observed_rate, recorded as `case` with the
    rate and how it was chosen."""
    rate, basis = observed_rate()
    kept = observed_pairs(benchmark, brokers, rounds_dir, case, rate, metrics)
    for side in OBSERVABILITY:
        kept[side]["paced_rate"] = rate
    benchmark.extra_info["paced_rate"] = rate
    benchmark.extra_info["rate_basis"] = basis


@pytest.mark.benchmark(group="flow_tracing_paced")
def test_tracing_cost_paced(benchmark: Any, summary: None,
                            pair_brokers: list[embedded.EmbeddedServer],
                            rounds_dir: Callable[[], Path]) -> None:
    """What the trace header alone costs (no SDK, so no span; no metrics served): the
    paced pairs of flow_observability_paced, at the same rate, with "on" serving no
    metrics."""
    paced_pairs(benchmark, pair_brokers, rounds_dir, "tracing_paced", metrics=False)
