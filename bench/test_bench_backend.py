"""Throughput of the JetStream messaging backend against the raw nats-py ceiling, on
the embedded server (videoflow.broker.server.start(), a fresh temporary store).

Two groups, each with the same message count and payload on every side:

``backend_publish`` -- ``raw_publish_async``: JetStreamContext.publish_async with a
bounded window (publish_async_max_pending) and every future bounded by a timeout
(NATS_FACTS S1/S2: a future can hang on an API error), the honest publish ceiling;
``raw_publish_seq``: one awaited js.publish at a time, one round trip per message;
``backend``: JetStreamMessagingBackend.publish_async for every message, then every
outcome, as a producer that keeps sending while receipts are in flight;
``backend_sync``: publish() in a loop, waiting for each receipt; ``backend_threads``:
publish() from PUBLISH_THREADS caller threads at once.

``backend_receive_settle`` -- ``raw_fetch_ack``: fetch(PREFETCH) + Msg.ack()
(fire-and-forget), the ceiling; ``raw_fetch_ack_sync``: fetch + Msg.ack_sync() one at
a time, confirmed acknowledgement at one round trip per message;
``raw_fetch_ack_sync_gathered``: fetch + every ack_sync of the batch in flight at
once, confirmed and pipelined; ``backend``: receive(credit=PREFETCH) and a settle_async
per delivery as a worker settles each input once it is done, the settlements in flight
while the next batch is taken, with a PREFETCH-deep prefetch; ``backend_many``: one
settle_many per received batch; ``backend_sync``: settle() one at a time, waiting for
each; ``backend_threads``: the same sync settles spread over SETTLE_THREADS threads.

Read the backend/raw ratios printed at the end of the run (and messages/s in
extra_info), never an absolute time across runs. Every case checks how many messages
were stored or settled, so a broken backend fails the run even with
--benchmark-disable (one round per case, a few seconds in all).

What the figures showed (2 vCPU, server on the same box). A settle() or publish() that
waits costs one hop into the backend's loop thread plus one broker round trip, which held
one receiver to about 0.1x of fetch+ack() and one publisher to about 0.25x of
publish_async. Hence the pipelined forms: settle_async / settle_many / publish_async
queue and return, everything queued goes out on one loop wake-up, a run of acks of one
durable is confirmed by one request (jetstream_settle), and the pull loop takes
deliveries straight from its inbox instead of through nats-py's fetch. With them the
backend is at or above the raw side of each pair: receive + settle_async about 1.05x of
fetch+ack() (confirmed against fire-and-forget), settle_many about 1.35x, publish_async
about 2.5x of publish_async.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from bench_summary import summary_at_end
from videoflow.backends.jetstream.backend import (
    JetStreamMessagingBackend,
    channel_spec_for,
    subscription_spec_for,
)
from videoflow.backends.jetstream.provisioner import ensure_channel_stream, ensure_durable
from videoflow.backends.jetstream.specs import consumer_config_for_spec, durable_of
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    Completed,
    Delivery,
    Envelope,
    Receipt,
    SettleConfirmed,
    SettleResult,
    SubscriptionId,
)
from videoflow.broker import server as embedded
from videoflow.broker.loop import (
    ErrorLog,
    LoopRunner,
    close_client,
    connect_fail_fast,
)
from videoflow.core.constants import BATCH
from videoflow.core.naming import subject_for

pytestmark = pytest.mark.timeout(300)

FLOW, RUN = "bench", "run"
MESSAGES = 2_000
PAYLOAD = bytes(range(200))  # ~200 bytes, about a small envelope (bench/test_bench_wire)
PREFETCH = 64  # backend prefetch depth = raw fetch batch = receive credit
PUBLISH_WINDOW = 256  # publish_async_max_pending of the raw ceiling (NATS_FACTS §10)
PUBLISH_THREADS = 8
SETTLE_THREADS = 8
ROUNDS = 5
CALL_SECONDS = 10.0  # bound of every broker wait here: a hang fails, never stalls
CREDIT = 4 * PREFETCH  # max_ack_pending: never the limit of either side

# (group, side, messages, fastest round s, median round s)
_RESULTS: list[tuple[str, str, int, float, float]] = []
_ROUND_IDS = itertools.count()


# ------------------------------------------------------------------ fixtures


class Raw:
    """A plain nats-py client on a loop thread of its own, as the backend holds one, so
    both sides pay the same hop into their loop once per call into it."""

    def __init__(self, url: str) -> None:
        self.runner = LoopRunner("bench-raw-loop")
        self.runner.start()
        self.errors = ErrorLog()
        self.client: Client = self.runner.run(connect_fail_fast(url, 5.0, self.errors), 10)
        self.js: JetStreamContext = self.client.jetstream(
            publish_async_max_pending=PUBLISH_WINDOW)

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return self.runner.run(coro, timeout)

    def close(self) -> None:
        self.runner.run(close_client(self.client), 10)
        self.runner.stop()


@pytest.fixture(scope="module")
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """Prints the messages/s and backend/raw ratios of this module's cases at its end,
    through the terminal reporter (output capture would swallow a plain print)."""
    yield from summary_at_end(request, lambda: bool(_RESULTS), write_summary, timed_only=False)


def write_summary(write: Callable[[str], None]) -> None:
    write("")
    write("backend vs raw nats-py (ratio = backend msg/s over raw msg/s; the fastest round"
          " is the least disturbed, the median shows state that builds up over rounds)")
    best = {(g, s): n / t for g, s, n, t, _ in _RESULTS}
    for group, side, n, fastest, middle in _RESULTS:
        write(f"  {group:<24}{side:<30}{n / fastest:>10,.0f} msg/s best"
              f"{n / middle:>10,.0f} median")
    median = {(g, s): n / t for g, s, n, _, t in _RESULTS}
    for group in dict.fromkeys(g for g, *_ in _RESULTS):
        raws = [s for g, s in best if g == group and s.startswith("raw")]
        for side in (s for g, s in best if g == group and s.startswith("backend")):
            for raw_side in raws:
                write(f"  {group}: {side} / {raw_side} = "
                      f"{best[(group, side)] / best[(group, raw_side)]:.2f} best, "
                      f"{median[(group, side)] / median[(group, raw_side)]:.2f} median")


@pytest.fixture(scope="module")
def raw(server: embedded.EmbeddedServer) -> Iterator[Raw]:
    wired = Raw(server.url)
    try:
        yield wired
    finally:
        wired.close()


@pytest.fixture
def backend(server: embedded.EmbeddedServer) -> Iterator[JetStreamMessagingBackend]:
    """A fresh backend per case: its publication ledger and pull loops start empty, so
    no case pays for what an earlier one left behind."""
    made = JetStreamMessagingBackend(server.url, FLOW, RUN, BATCH, prefetch=PREFETCH,
                                     fetch_timeout=0.5)
    made.start()
    try:
        yield made
    finally:
        made.shutdown(hand_back=False)


def channel(raw: Raw, node: str) -> tuple[str, str, SubscriptionId, str]:
    """A BATCH (interest, DiscardPolicy.NEW) channel with one data durable, created
    with the backend's own spec -> config functions and no pull loop attached.
    Returns (stream, subject, subscription, durable)."""
    sub = SubscriptionId("child", ChannelId(FLOW, RUN, node))
    spec = channel_spec_for(FLOW, RUN, node, BATCH, RELIABLE_WORK, required=[sub])
    _, verified = raw.run(ensure_channel_stream(raw.js, spec))
    assert verified.effective is not None
    sub_spec = subscription_spec_for(sub, 30.0, 5, CREDIT)
    durable = durable_of(sub, "bench")
    raw.run(ensure_durable(raw.js, verified.effective.name, durable,
                           consumer_config_for_spec(sub_spec, "bench")))
    stream = verified.effective.name
    return stream, subject_for(FLOW, RUN, node), sub, durable


def stream_state(raw: Raw, stream: str) -> tuple[int, int]:
    """(messages held, last sequence) of a stream."""
    info = raw.run(raw.js.stream_info(stream))
    return info.state.messages, info.state.last_seq


def drained(raw: Raw, stream: str) -> int:
    """Messages still held once the stream emptied or CALL_SECONDS passed: the server
    applies acknowledgements asynchronously, and interest retention removes a message
    only once acked."""
    deadline = time.monotonic() + CALL_SECONDS
    while (held := stream_state(raw, stream)[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return held


def record(benchmark: Any, group: str, side: str, messages: int) -> None:
    benchmark.extra_info["messages"] = messages
    benchmark.extra_info["payload_bytes"] = len(PAYLOAD)
    if benchmark.stats is None:  # --benchmark-disable: nothing was timed
        return
    stats = benchmark.stats.stats
    benchmark.extra_info["messages_per_s"] = messages / stats.median
    benchmark.extra_info["us_per_message"] = stats.median / messages * 1e6
    _RESULTS.append((group, side, messages, stats.min, stats.median))


def run_rounds(benchmark: Any, target: Callable[[], Any], setup: Callable[[], None]) -> None:
    benchmark.pedantic(target, setup=setup, rounds=ROUNDS, iterations=1, warmup_rounds=1)


# ------------------------------------------------------------------ publish

PUBLISH_SIDES = ["raw_publish_async", "raw_publish_seq", "backend", "backend_sync",
                 "backend_threads"]


async def raw_publish_async(js: JetStreamContext, subject: str, ids: list[str]) -> list[Any]:
    """The ceiling: a bounded window of publish_async futures. A full window waits
    (wait_stall) at most CALL_SECONDS, and the futures are awaited under one bound,
    since a future never resolves on an API error (S1) nor times out (S2)."""
    futures = [await js.publish_async(subject, PAYLOAD, wait_stall=CALL_SECONDS,
                                      headers={"Nats-Msg-Id": msg_id}) for msg_id in ids]
    return list(await asyncio.wait_for(asyncio.gather(*futures), CALL_SECONDS))


async def raw_publish_seq(js: JetStreamContext, subject: str, ids: list[str]) -> list[Any]:
    return [await js.publish(subject, PAYLOAD, timeout=CALL_SECONDS,
                             headers={"Nats-Msg-Id": msg_id}) for msg_id in ids]


@pytest.mark.benchmark(group="backend_publish")
@pytest.mark.parametrize("side", PUBLISH_SIDES)
def test_publish_throughput(benchmark: Any, summary: None, raw: Raw,
                            backend: JetStreamMessagingBackend, side: str) -> None:
    stream, subject, sub, _ = channel(raw, f"pub-{side.replace('_', '-')}")
    ids: list[str] = []
    expected_last = [stream_state(raw, stream)[1]]

    def setup() -> None:
        # The stream keeps everything (interest retention, nobody acks): check the
        # previous round stored all of its messages once each, then empty it.
        held, last = stream_state(raw, stream)
        assert (held, last) == (MESSAGES if ids else 0, expected_last[0])
        raw.run(raw.js.purge_stream(stream))
        round_id = next(_ROUND_IDS)
        ids[:] = [f"{side}-{round_id}-{i}" for i in range(MESSAGES)]
        expected_last[0] = last + MESSAGES

    def envelopes() -> list[Envelope]:
        return [Envelope(sub.channel, "data", PAYLOAD, msg_id) for msg_id in ids]

    def target() -> None:
        if side == "raw_publish_async":
            acks = raw.run(raw_publish_async(raw.js, subject, ids))
            assert len(acks) == MESSAGES and not any(a.duplicate for a in acks)
        elif side == "raw_publish_seq":
            acks = raw.run(raw_publish_seq(raw.js, subject, ids))
            assert len(acks) == MESSAGES and not any(a.duplicate for a in acks)
        elif side == "backend":
            deadline = time.monotonic() + CALL_SECONDS
            futures = [backend.publish_async(env, deadline) for env in envelopes()]
            outcomes = [f.result(timeout=2 * CALL_SECONDS) for f in futures]
            assert all(isinstance(o, Accepted) and not o.duplicate for o in outcomes)
        elif side == "backend_sync":
            for env in envelopes():
                outcome = backend.publish(env, time.monotonic() + CALL_SECONDS)
                assert isinstance(outcome, Accepted) and not outcome.duplicate, outcome
        else:
            deadline = time.monotonic() + CALL_SECONDS
            with ThreadPoolExecutor(PUBLISH_THREADS) as pool:
                outcomes = list(pool.map(lambda e: backend.publish(e, deadline),
                                         envelopes()))
            assert all(isinstance(o, Accepted) and not o.duplicate for o in outcomes)

    run_rounds(benchmark, target, setup)
    held, last = stream_state(raw, stream)
    assert (held, last) == (MESSAGES, expected_last[0])
    assert raw.errors.reports == [] and backend.errors.reports == []
    record(benchmark, "backend_publish", side, MESSAGES)


# ------------------------------------------------------------- receive + settle

RECEIVE_SIDES = ["raw_fetch_ack", "raw_fetch_ack_sync", "raw_fetch_ack_sync_gathered",
                 "backend", "backend_many", "backend_sync", "backend_threads"]


async def raw_receive(js: JetStreamContext, client: Client, stream: str, durable: str,
                      how: str) -> int:
    """Fetch PREFETCH at a time and settle each batch before the next fetch; returns
    how many were settled. Plain ack() is fire-and-forget, so a flush ends the round."""
    psub = await js.pull_subscribe_bind(durable=durable, stream=stream)
    settled = 0
    try:
        while settled < MESSAGES:
            msgs = await psub.fetch(min(PREFETCH, MESSAGES - settled), timeout=CALL_SECONDS)
            if how == "raw_fetch_ack":
                for msg in msgs:
                    await msg.ack()
            elif how == "raw_fetch_ack_sync":
                for msg in msgs:
                    await msg.ack_sync(timeout=CALL_SECONDS)
            else:
                await asyncio.gather(*(m.ack_sync(timeout=CALL_SECONDS) for m in msgs))
            settled += len(msgs)
        await client.flush(timeout=int(CALL_SECONDS))
    finally:
        await psub.unsubscribe()
    return settled


def backend_receive(backend: JetStreamMessagingBackend, sub: SubscriptionId, how: str,
                    pool: ThreadPoolExecutor | None) -> int:
    """A worker's loop: take up to PREFETCH ready deliveries and settle each Completed
    (confirmed, PAY-004), until every message is settled. ``backend`` starts each
    settlement as its input is done (settle_async) and takes the next batch while they
    are in flight, checking every result before the round ends; ``backend_many``
    settles each batch in one settle_many call; ``backend_sync`` waits for each
    settle in turn; ``backend_threads`` spreads the sync settles over a pool."""
    settled = 0
    deadline = time.monotonic() + 6 * CALL_SECONDS
    ids = itertools.count()
    in_flight: list[Receipt[SettleResult]] = []

    def complete(delivery: Delivery) -> SettleResult:
        return backend.settle(delivery.token, Completed(), f"s-{next(ids)}")

    while settled < MESSAGES:
        assert time.monotonic() < deadline, f"settled {settled} of {MESSAGES}"
        got = backend.receive(sub, min(PREFETCH, MESSAGES - settled), 0,
                              time.monotonic() + 1.0)
        if how == "backend":
            in_flight += [backend.settle_async(d.token, Completed(), f"s-{next(ids)}")
                          for d in got]
            results: list[SettleResult] = []
        elif how == "backend_many":
            results = backend.settle_many([(d.token, Completed(), f"s-{next(ids)}")
                                           for d in got])
        elif pool is None:
            results = [complete(d) for d in got]
        else:
            results = list(pool.map(complete, got))
        assert all(r == SettleConfirmed() for r in results), results
        settled += len(got)
    results = [f.result(timeout=CALL_SECONDS) for f in in_flight]
    assert all(r == SettleConfirmed() for r in results), results
    return settled


@pytest.mark.benchmark(group="backend_receive_settle")
@pytest.mark.parametrize("side", RECEIVE_SIDES)
def test_receive_settle_throughput(benchmark: Any, summary: None, raw: Raw,
                                   backend: JetStreamMessagingBackend, side: str) -> None:
    stream, subject, sub, durable = channel(raw, f"recv-{side.replace('_', '-')}")
    if side.startswith("backend"):
        backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, CREDIT), "bench")
    pool = ThreadPoolExecutor(SETTLE_THREADS) if side == "backend_threads" else None
    settled: list[int] = []

    def setup() -> None:
        # Interest retention: what the last round acked is gone; the next round's
        # messages are stored (all of them) before its clock starts.
        held = drained(raw, stream)
        assert held == 0, f"{held} messages left unsettled by the previous round"
        round_id = next(_ROUND_IDS)
        raw.run(raw_publish_async(raw.js, subject,
                                  [f"{side}-{round_id}-{i}" for i in range(MESSAGES)]))

    def target() -> None:
        if side.startswith("raw"):
            settled.append(raw.run(raw_receive(raw.js, raw.client, stream, durable, side)))
        else:
            settled.append(backend_receive(backend, sub, side, pool))

    try:
        run_rounds(benchmark, target, setup)
    finally:
        if pool is not None:
            pool.shutdown()
    assert settled and all(n == MESSAGES for n in settled), settled
    assert drained(raw, stream) == 0
    info = raw.run(raw.js.consumer_info(stream, durable))
    assert (info.num_pending, info.num_ack_pending, info.num_redelivered) == (0, 0, 0)
    assert raw.errors.reports == [] and backend.errors.reports == []
    record(benchmark, "backend_receive_settle", side, MESSAGES)
