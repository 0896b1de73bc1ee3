"""`videoflow tap` and `videoflow hz`: what flows on an edge, live.

A tap is a plain NATS subscription on a node's data subject (vf.{flow}.{run}.{node},
every run's when none is named). It sees each message as it is published, decodes its
envelope, and hands it on; it binds no durable and acknowledges nothing, so the flow's
own readers are not touched and nothing is kept once the tap ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from nats.aio.client import Client
from nats.js.api import StreamInfo

from videoflow.broker.link import Outage, outage_budget_from_env, redact_url
from videoflow.broker.loop import ErrorLog, close_client, connect_fail_fast, registered
from videoflow.core.naming import (
    LABEL_NODE,
    SUBJECT_ROOT,
    eos_subject_for,
    sanitize,
    subject_for,
    user_metadata,
)
from videoflow.errors import BrokerUnavailable, CredentialsRefused, WireError
from videoflow.ops.broker_calls import Budget
from videoflow.ops.runs import stream_owner
from videoflow.ops.status import all_streams
from videoflow.wire.packs import decode_pack, is_pack
from videoflow.wire.serialization import decode_envelope

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tapped:
    """One message seen on the edge.

    Attributes:
        subject: where it was published (its run is the subject's third token).
        received_at: when the tap saw it, epoch seconds.
        envelope: the decoded envelope (decode_envelope), None if it did not decode.
        error: why it did not decode ('' when it did).
    """

    subject: str
    received_at: float
    envelope: dict[str, Any] | None
    error: str = ""

    @property
    def run_id(self) -> str:
        return self.subject.split(".")[2]


def edge_subject(flow_id: str, node: str, run_id: str | None = None) -> str:
    """The subject a tap listens on: the node's data subject in run_id, or in any run."""
    if run_id is not None:
        return subject_for(flow_id, run_id, node)
    probe = subject_for(flow_id, "run", node).split(".")  # checks flow and node
    return ".".join((SUBJECT_ROOT, probe[1], "*", probe[3]))


_LINK_LOGS: Final = logging.getLogger("videoflow.broker.link")
"""The connection's own outage lines (-v): when they show, the tap does not repeat them."""

NOTICE_SECONDS: Final = 10.0
"""A tap given a broker that has seen nothing this long looks again whether the flow
has a run there (edge_notice), and says so once if not."""

POLL_SECONDS: Final = 0.25
"""How often a tap looks for a run's broker on the store (following runs), and how soon
it notices its broker went away."""


def tap(broker: str | Callable[[], str | None], flow_id: str, node: str,
        seen: Callable[[Tapped], None], *, run_id: str | None = None,
        count: int | None = None, seconds: float | None = None, timeout: float = 10.0,
        every: float | None = None, tick: Callable[[bool], None] | None = None,
        ready: Callable[[str], None] | None = None,
        status: Callable[[str], None] | None = None) -> int:
    """Show the messages a node publishes, live, until count of them were seen or
    seconds passed (None: until interrupted).

    Arguments:
        broker: the broker's URL: the tap rides out its outages within the outage
            budget (VIDEOFLOW_OUTAGE_BUDGET, else broker.link's default). Or a
            function giving the URL of the broker a run is using now, None while none
            is (ops.embedded.RunBrokers): the tap follows run after run, waiting for
            one, watching it until its broker stops, then waiting for the next.
        seen: called with each message, in order, on this thread: with each member
            of a pack (videoflow.wire.packs), as of a message alone.
        run_id: one run's edge; None for any run of the flow.
        timeout: the bound of each connect.
        every / tick: tick(away) is called every `every` seconds, messages or not
            (hz's windows), waits for a run included; away: the broker was away during
            the window, so what it saw is not all there was.
        ready: called with the subject once the subscription is in place (at each
            broker, when following runs): from then on, nothing published there is
            missed.
        status: called with a line for the user when the tap waits for a run, and when
            a broker goes away, comes back or stops.

    Returns:
        How many messages were seen, a pack's members each.

    Raises:
        BrokerUnavailable: the broker could not be reached within timeout, or it was
            away for longer than the outage budget.
        ValueError: a bad name, count or duration, or VIDEOFLOW_OUTAGE_BUDGET; given a
            broker, a node of the flow's there that only reads (edge_notice).
    """
    if count is not None and (isinstance(count, bool) or count < 1):
        raise ValueError(f"count must be None or >= 1, got {count!r}")
    for name, value in (("seconds", seconds), ("every", every)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be None or a finite number > 0, got {value!r}")
    subject = edge_subject(flow_id, node, run_id)
    pace = _Pace(seconds, every, tick)
    say = status or (lambda line: None)

    async def watch(url: str, following: bool, wanted: int | None) -> int:
        """What one broker shows, until wanted messages were seen, the pace ended, or
        (following) the broker stopped."""
        errors = ErrorLog()
        # A run's broker is not waited for once it stops: the next run's is another.
        outage = Outage(budget=0.0 if following else outage_budget_from_env(),
                        where=redact_url(url))
        try:
            nc = await asyncio.wait_for(
                connect_fail_fast(url, timeout, errors, outage), timeout)
        except asyncio.TimeoutError as error:
            # connect_fail_fast's own failures are BrokerUnavailable (CredentialsRefused
            # among them), each one line that says what failed: they go as they are.
            raise BrokerUnavailable(f"the broker at {redact_url(url)} did not answer "
                                    f"within {timeout:g} s") from error
        queue: asyncio.Queue[Any] = asyncio.Queue()
        n, away = 0, False
        asking: asyncio.Future[str | None] | None = None
        try:
            await nc.subscribe(subject, cb=queue.put)
            await registered(nc, timeout)  # what is published after `ready` is seen
            if ready is not None:
                ready(subject)
            pace.start()  # given a URL, --seconds and the windows count from here
            # Following runs, a run's broker answers before its streams are made: only
            # a broker given is asked what it holds, now (a flow not there yet is
            # usual: its run starts after the tap) and after NOTICE_SECONDS of silence.
            # The questions run beside the tap, which never waits on them (a broker
            # lost meanwhile is told of as it goes).
            ask_at = None if following else time.monotonic() + NOTICE_SECONDS
            asking = None if following else asyncio.ensure_future(edge_notice(
                nc, flow_id, node, run_id, timeout, flow_absent=False))
            while (wanted is None or n < wanted) and not pace.step():
                if asking is not None and asking.done():
                    notice, asking = asking.result(), None  # ValueError: only reads
                    if notice is not None:
                        say(notice)
                        ask_at = None
                if asking is None and ask_at is not None and time.monotonic() >= ask_at:
                    ask_at = None
                    if n == 0:
                        asking = asyncio.ensure_future(edge_notice(
                            nc, flow_id, node, run_id, timeout, flow_absent=True))
                if nc.is_closed:
                    if outage.given_up is not None:
                        raise BrokerUnavailable(outage.given_up)
                    break  # following: the run's broker stopped
                pace.away = pace.away or outage.away
                if outage.away != away:
                    away = outage.away
                    if not _LINK_LOGS.isEnabledFor(logging.WARNING):  # else it says so
                        say(f"lost the broker at {redact_url(url)}; reconnecting" if away
                            else f"the broker at {redact_url(url)} is back")
                try:
                    msg = await asyncio.wait_for(queue.get(), pace.wait(POLL_SECONDS))
                except asyncio.TimeoutError:
                    continue
                for message in _tapped_all(msg.subject, msg.data):
                    if wanted is not None and n >= wanted:
                        break
                    seen(message)
                    n += 1
            return n
        finally:
            if asking is not None and not asking.done():
                asking.cancel()
            elif asking is not None and not asking.cancelled():
                asking.exception()  # read: the tap ended before it was told
            await close_client(nc)

    async def main() -> int:
        if not callable(broker):
            return await watch(broker, False, count)
        pace.start()  # following runs, the waits count too
        n, waiting = 0, False
        while (count is None or n < count) and not pace.step():
            url = broker()
            if url is None:
                if not waiting:
                    say(f"waiting for a run on {broker}")
                    waiting = True
                await asyncio.sleep(pace.wait(POLL_SECONDS))
                continue
            try:
                n += await watch(url, True, None if count is None else count - n)
            except CredentialsRefused:
                raise
            except BrokerUnavailable:
                pass  # the run ended before the tap could attach: wait for the next
            else:
                waiting = False
                if (count is not None and n >= count) or pace.ended:
                    break
                if broker() == url:  # the server runs on: only the connection went
                    say(f"lost the connection to the run's broker at {redact_url(url)}; "
                        "attaching again")
                else:
                    say(f"the run's broker at {redact_url(url)} stopped")
            await asyncio.sleep(pace.wait(POLL_SECONDS))
        return n

    return asyncio.run(main())


async def edge_notice(nc: Client, flow_id: str, node: str, run_id: str | None,
                      timeout: float, flow_absent: bool = True) -> str | None:
    """What to tell the user when no run of flow_id on the broker has a stream for node
    (so a tap of it would wait in silence): a line naming what is there, None when a
    stream is there or the broker could not say (the tap listens either way). One
    stream listing; the consumers of the flow's streams are read only when node has
    none, to tell a node that only reads.

    Arguments:
        flow_absent: whether a flow with no run on the broker at all is told of (else
            None: a tap started before the run it watches is the usual way).

    Raises:
        ValueError: node is one of the flow's and only reads: it publishes nothing, in
            this run or any other (a usage error).
    """
    try:
        budget = Budget(timeout)
        infos = await all_streams(nc.jsm(), budget)
    except Exception as error:  # advisory only: no JetStream, a slow broker
        logger.debug("could not list the broker's streams for the tap: %r", error)
        return None
    owned = [(owner, info) for info in infos if (owner := _data_owner(info)) is not None
             and sanitize(owner[0]) == sanitize(flow_id)]
    if not owned:
        if not flow_absent:
            return None
        flows = sorted({owner[0] for info in infos if (owner := _data_owner(info))})
        here = f"flows here: {', '.join(flows)}" if flows else "no flow here"
        return (f"no run of flow {flow_id!r} is on this broker ({here}); listening "
                "anyway, for a run that starts later")
    if run_id is not None:
        runs = sorted({owner[1] for owner, _ in owned})
        owned = [(owner, info) for owner, info in owned
                 if sanitize(owner[1]) == sanitize(run_id)]
        if not owned:
            return (f"flow {flow_id!r} has no run {run_id!r} on this broker (runs: "
                    f"{', '.join(runs)}); listening anyway, for a run that starts later")
    nodes = sorted({owner[2] for owner, _ in owned})
    if any(sanitize(name) == sanitize(node) for name in nodes):
        try:
            return await _ended(nc, [(owner, info) for owner, info in owned
                                     if sanitize(owner[2]) == sanitize(node)], budget)
        except Exception as error:  # as below: the tap listens anyway
            logger.debug("could not read the node's end of stream for the tap: %r", error)
            return None
    with_output = f"nodes with output: {', '.join(nodes)}"
    try:
        reads = await _reads(nc, [info for _, info in owned], node, budget)
    except Exception as error:  # as above: the tap listens anyway
        logger.debug("could not list the flow's durables for the tap: %r", error)
        reads = False
    if reads:
        raise ValueError(f"node {node!r} of flow {flow_id!r} publishes nothing: it only "
                         f"reads ({with_output})")
    return (f"flow {flow_id!r} has no node {node!r} on this broker ({with_output}); "
            "listening anyway")


async def _ended(nc: Client, streams: list[tuple[tuple[str, str, str], StreamInfo]],
                 budget: Budget) -> str | None:
    """A line saying the node ended its stream in every run of streams (an end marker
    is on its EOS subject), so a tap, which sees only what is published from now on,
    would wait in silence; None when a run of it has not ended."""
    jsm = nc.jsm()
    for (flow, run, node), info in streams:
        eos = eos_subject_for(flow, run, node)
        found = await budget.run(jsm.stream_info(info.config.name or "",
                                                 subjects_filter=eos))
        if not (found.state.subjects or {}).get(eos):
            return None
    (flow, _, node), runs = streams[0][0], sorted({owner[1] for owner, _ in streams})
    return (f"node {node!r} of flow {flow!r} has ended its stream (run"
            f"{'s' if len(runs) > 1 else ''} {', '.join(runs)}): it publishes nothing more, "
            "and a tap shows only what is published from now on; listening anyway, for a "
            "run that starts later")


def _data_owner(info: StreamInfo) -> tuple[str, str, str] | None:
    """(flow, run, node) of a node's data stream; None for any other stream."""
    owner = stream_owner(info)
    if owner is None or owner[1] is None or owner[2] is None:
        return None
    return owner[0], owner[1], owner[2]


async def _reads(nc: Client, streams: list[StreamInfo], node: str, budget: Budget) -> bool:
    """Whether a durable of node's (owner labels) reads one of streams."""
    jsm = nc.jsm()
    for info in streams:
        consumers = await budget.run(jsm.consumers_info(info.config.name or ""))
        if any(sanitize(user_metadata(getattr(c.config, "metadata", None)).get(
                LABEL_NODE, "")) == sanitize(node) for c in consumers):
            return True
    return False


class _Pace:
    """A tap's clock: when it ends (seconds after start), and hz's ticks (every
    `every` seconds from start).

    Arguments:
        seconds: how long the tap runs once started; None: until interrupted.
        every / tick: tick(away) every `every` seconds once started; None: no ticks.

    Attributes:
        away: the broker was away at some point of the window (the tap sets it): what
            the window saw is then not all there was.
    """

    def __init__(self, seconds: float | None, every: float | None,
                 tick: Callable[[bool], None] | None) -> None:
        self.seconds, self.every, self.tick = seconds, every, tick
        self.ends: float | None = None
        self.next_tick: float | None = None
        self.started = self.ended = self.away = False

    def start(self) -> None:
        """Start the clock (once: a later call leaves it running)."""
        if not self.started:
            now = time.monotonic()
            self.ends = None if self.seconds is None else now + self.seconds
            self.next_tick = None if self.every is None else now + self.every
            self.started = True

    def step(self) -> bool:
        """Tick if one is due (once, however late: a window missed while the tap was
        connecting is not made up in a burst); whether the tap's time is up."""
        now = time.monotonic()
        if self.next_tick is not None and now >= self.next_tick:
            if self.tick is not None:
                self.tick(self.away)
            self.away = False  # set again while the broker is still away
            every = self.every or 0.0
            self.next_tick += every
            if self.next_tick <= now:
                self.next_tick = now + every
        self.ended = self.ends is not None and now >= self.ends
        return self.ended

    def wait(self, at_most: float) -> float:
        """How long to wait for something before stepping again."""
        now = time.monotonic()
        return max(0.0, min([t - now for t in (self.ends, self.next_tick) if t is not None]
                            + [at_most]))


def _tapped(subject: str, data: bytes) -> Tapped:
    try:
        return Tapped(subject, time.time(), decode_envelope(data))
    except WireError as error:
        return Tapped(subject, time.time(), None, str(error))


def _tapped_all(subject: str, data: bytes) -> list[Tapped]:
    """What one message carries: its envelope, or each member of a pack (a pack that
    does not decode is one undecodable message)."""
    if is_pack(data):
        try:
            return [_tapped(subject, member) for member in decode_pack(data).members]
        except WireError as error:
            return [Tapped(subject, time.time(), None, str(error))]
    return [_tapped(subject, data)]


@dataclass
class Rate:
    """What `videoflow hz` says of a window of messages on an edge.

    Feed it each message (add); read() gives the window's figures and starts the next.
    """

    arrivals: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    undecodable: int = 0

    def add(self, message: Tapped) -> None:
        self.arrivals.append(message.received_at)
        if message.envelope is None:
            self.undecodable += 1
            return
        event_ts = message.envelope.get("event_ts")
        if event_ts is not None:
            self.event_times.append(event_ts)
            self.lags.append(message.received_at - event_ts)

    def read(self, window_seconds: float, away: bool = False) -> dict[str, Any]:
        """The window's figures: messages, rate per second, the gaps between arrivals
        (min, mean, max, standard deviation, ms), the event-time span the window
        covered and how far behind its event time each message arrived (p50, max, ms);
        None where the window holds too few messages to say. away: the broker was away
        during the window: the rate is unknown (None, and 'unknown' says why), never
        the few or none seen."""
        times, lags, events = self.arrivals, self.lags, self.event_times
        gaps = [(b - a) * 1000.0 for a, b in zip(times, times[1:], strict=False)]

        def ms(seconds: float) -> float:
            return round(seconds * 1000.0, 3)

        figures: dict[str, Any] = {
            "messages": len(times),
            "rate_per_second": round(len(times) / window_seconds, 3),
            "gap_ms": None if not gaps else {
                "min": round(min(gaps), 3), "mean": round(statistics.fmean(gaps), 3),
                "max": round(max(gaps), 3),
                "std": round(statistics.pstdev(gaps), 3)},
            "event_span_ms": ms(max(events) - min(events)) if events else None,
            "event_lag_ms": None if not lags else {
                "p50": ms(statistics.median(lags)), "max": ms(max(lags))},
            "undecodable": self.undecodable,
        }
        if away:
            figures["rate_per_second"] = None
            figures["unknown"] = "the broker was away during the window"
        self.arrivals, self.lags, self.event_times, self.undecodable = [], [], [], 0
        return figures


__all__ = ["Rate", "Tapped", "edge_notice", "edge_subject", "tap"]
