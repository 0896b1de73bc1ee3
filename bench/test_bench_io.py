"""Plain NATS in and out: records a plain nats-py publisher wrote to a stream, taken
by a flow of SubjectSource -> SubjectSink and written to another stream, beside the
hand-written nats-py relay a user would otherwise run with the same guarantees, in
the same run (videoflow / peer: the goal is 0.8 or more).

Each round has streams of its own. N records (256 bytes, an Event-Time header) are
published into IN before anything starts; the figure is N over the time between the
first and the last message stored in OUT (the broker's own timestamps), so neither
side's start-up counts.

videoflow: SubjectSource (its durable on IN) -> the flow's edge stream ->
SubjectSink (a JetStream publish to OUT, the input acked once it is accepted): two
processes, two hops. peer: one process with a durable on IN, fetching 64 at a time,
publishing each to OUT with its PubAck awaited (the batch concurrently) and acking
each input once its output was accepted: one hop, the same at-least-once guarantee.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import statistics
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.flow import Flow
from videoflow.io import EVENT_TIME_HEADER, SubjectSink, SubjectSource

SIDES = ("videoflow", "peer")
_RESULTS: dict[str, list[float]] = {side: [] for side in SIDES}
_ROUND = iter(range(10**6))


def sizes(benchmark: Any) -> tuple[int, int]:
    """(records per round, pairs of rounds): a smoke check with timing off."""
    if benchmark.disabled:
        return 200, 1
    return int(os.environ.get("VF_BENCH_IO_N", 5_000)), int(os.environ.get(
        "VF_BENCH_IO_ROUNDS", 5))


async def prepare(url: str, tag: str, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=f"IN{tag}", subjects=[f"in.{tag}"])
    await js.add_stream(name=f"OUT{tag}", subjects=[f"out.{tag}"])
    payload = bytes(256)
    for start in range(0, n, 500):
        await asyncio.gather(*(js.publish(f"in.{tag}", payload,
                                          headers={EVENT_TIME_HEADER: str(1000.0 + i)})
                               for i in range(start, min(n, start + 500))))
    await nc.close()


async def stored_rate(url: str, tag: str, n: int) -> float:
    """n over the span of OUT's stored timestamps; every record must be there, once."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        state = (await js.stream_info(f"OUT{tag}")).state
        assert state.messages == n, f"OUT{tag} holds {state.messages} of {n}"
        first = await js.get_msg(f"OUT{tag}", state.first_seq)
        last = await js.get_msg(f"OUT{tag}", state.last_seq)
        assert first.headers is not None and last.headers is not None
        assert first.time is not None and last.time is not None
    finally:
        await nc.close()
    span = (last.time - first.time).total_seconds()
    return n / span if span > 0 else float("inf")


def videoflow_round(url: str, tag: str, n: int) -> None:
    source = SubjectSource(f"IN{tag}", decode="bytes", count=n, name="source")
    sink = SubjectSink(f"out.{tag}", encoding="bytes", name="sink")(source)
    report = Flow([source], [sink], BATCH, name=f"io{tag}").run(url, view=False)
    assert report.outcome == "completed", report.format()


def peer_relay(url: str, tag: str, n: int) -> None:
    """The hand-written relay, in a process of its own."""
    async def relay() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_consumer(f"IN{tag}", ConsumerConfig(
            durable_name="relay", ack_policy=AckPolicy.EXPLICIT, ack_wait=30,
            max_ack_pending=1024))
        sub = await js.pull_subscribe_bind("relay", stream=f"IN{tag}")
        done = 0
        while done < n:
            try:
                msgs = await sub.fetch(64, timeout=1)
            except nats.errors.TimeoutError:
                continue
            acks = await asyncio.gather(*(js.publish(
                f"out.{tag}", m.data, headers={
                    EVENT_TIME_HEADER: (m.headers or {}).get(EVENT_TIME_HEADER, ""),
                    "Nats-Msg-Id": f"relay:{m.metadata.sequence.stream}"}) for m in msgs))
            assert len(acks) == len(msgs)
            for m in msgs:
                await m.ack()
            done += len(msgs)
        await nc.flush()
        await nc.close()

    asyncio.run(relay())


def peer_round(url: str, tag: str, n: int) -> None:
    process = multiprocessing.get_context("spawn").Process(target=peer_relay,
                                                            args=(url, tag, n))
    process.start()
    process.join(300)
    assert process.exitcode == 0, process.exitcode


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin("capturemanager")
    if reporter is None or request.config.getoption("benchmark_disable") or not all(
            _RESULTS.values()):
        return
    vf, peer = (max(_RESULTS[s]) for s in SIDES)
    medians = [statistics.median(_RESULTS[s]) for s in SIDES]
    paired = [a / b for a, b in zip(_RESULTS["videoflow"], _RESULTS["peer"], strict=False)]
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line("")
        reporter.write_line(
            f"plain NATS source -> sink vs nats-py relay: {vf:,.0f} / {peer:,.0f} msg/s = "
            f"{vf / peer:.2f} (best; median {medians[0] / medians[1]:.2f}; per pair: median "
            f"{statistics.median(paired):.2f}, {min(paired):.2f} to {max(paired):.2f}; "
            "goal >= 0.8)")


@pytest.mark.benchmark(group="io_source_sink")
def test_source_to_sink(benchmark: Any, summary: None,
                        server: embedded.EmbeddedServer) -> None:
    """Rounds of the two sides alternate (videoflow first, then the peer first, ...), so
    a load that comes and goes weighs on both alike; each pair's ratio is reported."""
    n, rounds = sizes(benchmark)
    pairs = iter(range(10**6))

    def side(name: str) -> None:
        tag = f"{name[0]}{next(_ROUND)}"
        asyncio.run(prepare(server.url, tag, n))
        (videoflow_round if name == "videoflow" else peer_round)(server.url, tag, n)
        _RESULTS[name].append(asyncio.run(stored_rate(server.url, tag, n)))

    def pair() -> None:
        for name in (SIDES if next(pairs) % 2 == 0 else SIDES[::-1]):
            side(name)

    benchmark.pedantic(pair, rounds=rounds, iterations=1)
    benchmark.extra_info.update({name: list(_RESULTS[name]) for name in SIDES})
