"""The /metrics endpoint (Prometheus text format) of a node process and of the local
engine: the same families, built at scrape time from task snapshots (TaskStats.snapshot
plus the process's broker observation, 'subscriptions').

A worker process serves its own replica's live snapshot; the local engine serves every
replica's latest report (about one a second), a replica's processes that died and were
started again summed into it, so its counters never go back. Needs prometheus-client
(``pip install prometheus-client``).

Families (labelled flow, node and replica, and by parent, reason or outcome where
named; the broker's counts by flow, node, parent and durable instead):
- videoflow_received_total{parent}: first deliveries of inputs.
- videoflow_processed_total: input groups the node completed and acknowledged.
- videoflow_outputs_total: outputs published.
- videoflow_failures_total: input groups the node raised on.
- videoflow_dropped_total{reason}: inputs given up on, by reason.
- videoflow_dead_letters_total: inputs dead-lettered.
- videoflow_publications_total{outcome}: publication outcomes (accepted, duplicate,
  unknown, dropped, rejected).
- videoflow_pending_messages{parent,durable} / videoflow_unresolved_messages{parent,
  durable}: work waiting on the broker (available + leased), and retained work nothing
  will resolve (MSG-012), per data durable: the replicas of a node share one per parent
  (a partitioned node's have one each), so a shared one is one series, not one per
  replica. Absent when the broker could not be read -- never 0 for unknown; then
  videoflow_pending_unknown{parent,durable,reason} is 1.
- videoflow_join_latency_seconds: a group's first member arriving to the node
  receiving the group (histogram; a node with inputs: a producer has no groups).
- videoflow_hop_latency_seconds: a group's first member arriving to the node done
  with it, output handed to the broker (histogram; a node with inputs).
- videoflow_watermark_lag_seconds{parent}: a time join's parent, how far its
  event-time watermark is behind the most advanced parent's.
- videoflow_held_back_seconds_total{parent}: a time join's parent, how long event-time
  alignment has left its input on the broker while it ran ahead of the slowest.
- videoflow_held_back{parent}: 1 while it does.
- videoflow_clock_offset_seconds{parent}: a time join's parent, how far its event
  times read ahead of the other parents' (behind when negative), as the join estimates
  it (videoflow.messaging.clock_estimates); absent until it has enough samples.
- videoflow_join_waiting{parent,why}: 1 for each parent a join's oldest incomplete
  group waits for, with why: budget (its producer waits for payload room), silent
  (nothing came from it for a second or more), behind (its input is on its way).
- videoflow_payload_held_bytes / videoflow_payload_share_bytes: a replica writing into
  the shared-memory payload store, the bytes it holds there and its share of the
  budget; videoflow_payload_waiting is 1 while it waits for room, and
  videoflow_payload_wait_seconds_total how long it waited in all.
- videoflow_budget_waits_total: times receiving paused on a full byte budget.
- videoflow_codec_arrays_total{codec,way}: arrays a codec encoded (way 'encoded', a
  publishing node) or decoded (way 'decoded', a reading one);
  videoflow_codec_bytes_total{codec,side}: the encoded arrays' bytes before (side
  'raw') and after ('coded'); videoflow_codec_seconds_total{codec,way}: the time it
  took. Per replica process.
- videoflow_restarts_total (engine only): processes of the replica started again.
- videoflow_replica_up: 1 while the replica's process runs and has not ended.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from videoflow.core.histogram import Histogram

METRICS_PORT_ENV: Final = "VIDEOFLOW_METRICS_PORT"
"""The port a videoflow process serves /metrics on (0: one the OS picks)."""
METRICS_HOST_ENV: Final = "VIDEOFLOW_METRICS_HOST"
"""The address it listens on; 127.0.0.1 unless set (0.0.0.0 for a scraper elsewhere)."""


class MetricsUnavailable(RuntimeError):
    """Metrics were asked for and cannot be served: prometheus-client is not
    installed, or the port cannot be bound (the message says which)."""


@dataclass(frozen=True)
class ReplicaSample:
    """What a scrape reads of one replica.

    Attributes:
        node / replica: the labels.
        stats: TaskStats.snapshot(), with 'subscriptions' when observed.
        restarts: processes of the replica started again (None: not counted here).
        inputs: the node has inputs (False for a producer, whose latency histograms,
            never observed, are not exported: a quarter of a 3-node flow's lines,
            rendered at every scrape for nothing).
    """

    node: str
    replica: str
    stats: Mapping[str, Any]
    restarts: int | None = None
    inputs: bool = True


Samples = Callable[[], list[ReplicaSample]]


def metrics_port_from_env() -> int | None:
    """VIDEOFLOW_METRICS_PORT as a port, None when unset.

    Raises:
        ValueError: not a whole number from 0 to 65535.
    """
    text = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not text:
        return None
    return check_port(text, METRICS_PORT_ENV)


def check_port(value: Any, what: str = "metrics port") -> int:
    """value as a TCP port (0 lets the OS pick).

    Raises:
        ValueError: not a whole number from 0 to 65535.
    """
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a port number, got {value!r}") from None
    if isinstance(value, bool) or not 0 <= port <= 65535:
        raise ValueError(f"{what} must be from 0 to 65535, got {value!r}")
    return port


class SnapshotCollector:
    """A prometheus-client collector over snapshots read at scrape time.

    Arguments:
        flow: the flow's id (every family's flow label).
        samples: returns the replicas' samples (called on the server's thread: it
            must only read, and copy what another thread changes).
    """

    def __init__(self, flow: str, samples: Samples) -> None:
        self.flow, self.samples = flow, samples

    def describe(self) -> list[Any]:
        return []  # unchecked: the families depend on what the replicas report

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        base = ["flow", "node", "replica"]

        def counter(name: str, doc: str, *extra: str) -> Any:
            return CounterMetricFamily(name, doc, labels=[*base, *extra])

        def gauge(name: str, doc: str, *extra: str) -> Any:
            return GaugeMetricFamily(name, doc, labels=[*base, *extra])

        received = counter("videoflow_received", "First deliveries of inputs.", "parent")
        processed = counter("videoflow_processed", "Input groups completed and acked.")
        outputs = counter("videoflow_outputs", "Outputs published.")
        failures = counter("videoflow_failures", "Input groups the node raised on.")
        dropped = counter("videoflow_dropped", "Inputs given up on, by reason.", "reason")
        dead = counter("videoflow_dead_letters", "Inputs dead-lettered.")
        published = counter("videoflow_publications", "Publication outcomes.", "outcome")
        waits = counter("videoflow_budget_waits", "Receives paused on a full byte budget.")
        restarts = counter("videoflow_restarts", "Processes of the replica started again.")
        coded = counter("videoflow_codec_arrays", "Arrays a codec encoded or decoded.",
                        "codec", "way")
        coded_bytes = counter("videoflow_codec_bytes",
                              "Encoded arrays' bytes before (raw) and after (coded).",
                              "codec", "side")
        coded_seconds = counter("videoflow_codec_seconds",
                                "Seconds a codec spent encoding or decoding.", "codec", "way")
        by_durable = ["flow", "node", "parent", "durable"]
        pending = GaugeMetricFamily("videoflow_pending_messages",
                                    "Inputs waiting on the broker (available + leased).",
                                    labels=by_durable)
        unresolved = GaugeMetricFamily("videoflow_unresolved_messages",
                                       "Retained inputs nothing will resolve (MSG-012).",
                                       labels=by_durable)
        unknown = GaugeMetricFamily("videoflow_pending_unknown",
                                    "1 where the broker's count could not be read, with why.",
                                    labels=[*by_durable, "reason"])
        lag = gauge("videoflow_watermark_lag_seconds",
                    "A time join's parent, behind the most advanced one in event time.",
                    "parent")
        up = gauge("videoflow_replica_up", "1 while the replica's process runs.")
        held_total = counter("videoflow_held_back_seconds",
                             "A time join's parent, held back by event-time alignment.",
                             "parent")
        held_now = gauge("videoflow_held_back", "1 while alignment holds the parent back.",
                         "parent")
        clock_offset = gauge("videoflow_clock_offset_seconds",
                             "A time join's parent, how far its event times read ahead "
                             "of the other parents', as estimated.", "parent")
        waiting_on = gauge("videoflow_join_waiting",
                           "1 per parent the oldest incomplete group waits for, with why.",
                           "parent", "why")
        payload_held = gauge("videoflow_payload_held_bytes",
                             "Bytes the replica holds in the shared-memory payload store.")
        payload_share = gauge("videoflow_payload_share_bytes",
                              "The replica's share of the shared-memory payload budget.")
        payload_waiting = gauge("videoflow_payload_waiting",
                                "1 while the replica waits for room in its payload share.")
        payload_waited = counter("videoflow_payload_wait_seconds",
                                 "Seconds the replica waited for room in its payload share.")
        join = HistogramMetricFamily(
            "videoflow_join_latency_seconds",
            "A group's first member arriving to the node receiving the group.",
            labels=base)
        hop = HistogramMetricFamily(
            "videoflow_hop_latency_seconds",
            "A group's first member arriving to the node done with it.", labels=base)

        samples = self.samples()
        for sample in samples:
            s, labels = sample.stats, [self.flow, sample.node, sample.replica]
            for parent, n in sorted((s.get("received") or {}).items()):
                received.add_metric([*labels, parent], n)
            processed.add_metric(labels, s.get("processed", 0))
            outputs.add_metric(labels, s.get("emitted", 0))
            failures.add_metric(labels, s.get("failed", 0))
            for reason, n in sorted((s.get("drops") or {}).items()):
                dropped.add_metric([*labels, reason], n)
            dead.add_metric(labels, s.get("dead_lettered", 0))
            for outcome, n in sorted((s.get("publications") or {}).items()):
                published.add_metric([*labels, outcome], n)
            waits.add_metric(labels, s.get("budget_waits", 0))
            for codec, c in sorted((s.get("codecs") or {}).items()):
                for way in ("encoded", "decoded"):
                    coded.add_metric([*labels, codec, way], c.get(way, 0))
                    coded_seconds.add_metric([*labels, codec, way],
                                             c.get(f"{way[:-1]}_seconds", 0.0))
                for side in ("raw", "coded"):
                    coded_bytes.add_metric([*labels, codec, side], c.get(f"{side}_bytes", 0))
            if sample.restarts is not None:
                restarts.add_metric(labels, sample.restarts)
            up.add_metric(labels, 1.0 if s.get("outcome", "running") == "running" else 0.0)
            for parent, seconds in sorted((s.get("watermark_lag") or {}).items()):
                lag.add_metric([*labels, parent], seconds)
            holding = s.get("held_back_now") or {}
            for parent, seconds in sorted((s.get("held_back") or {}).items()):
                held_total.add_metric([*labels, parent], seconds)
                held_now.add_metric([*labels, parent], 1.0 if parent in holding else 0.0)
            for parent, why in sorted((s.get("waiting_on") or {}).items()):
                waiting_on.add_metric([*labels, parent, why], 1.0)
            for parent, estimate in sorted((s.get("clock_offsets") or {}).items()):
                clock_offset.add_metric([*labels, parent], float(estimate["offset_s"]))
            payload = s.get("payload")
            if payload:
                payload_held.add_metric(labels, payload.get("held_bytes") or 0)
                if payload.get("share_bytes") is not None:
                    payload_share.add_metric(labels, payload["share_bytes"])
                payload_waiting.add_metric(
                    labels, 0.0 if payload.get("waiting_seconds") is None else 1.0)
                payload_waited.add_metric(labels, payload.get("waited_seconds") or 0.0)
            for family, key in ((join, "join_latency"), (hop, "hop_latency")):
                if sample.inputs and s.get(key):
                    histogram = Histogram()
                    histogram.add(s[key])
                    family.add_metric(labels, histogram.cumulative(), histogram.total)
        by_node: dict[str, list[Mapping[str, Any]]] = {}
        for sample in samples:
            by_node.setdefault(sample.node, []).append(sample.stats)
        for node, snapshots in sorted(by_node.items()):
            for (parent, durable), seen in sorted(per_durable(snapshots).items()):
                labels = [self.flow, node, parent, durable]
                if "unknown" in seen:
                    unknown.add_metric([*labels, str(seen["unknown"])], 1.0)
                else:
                    pending.add_metric(labels, seen["available"] + seen["leased"])
                    unresolved.add_metric(labels, seen["unresolved"])
        yield from (received, processed, outputs, failures, dropped, dead, published,
                    waits, restarts, pending, unresolved, unknown, lag, up, join, hop,
                    held_total, held_now, waiting_on, clock_offset, payload_held,
                    payload_share,
                    payload_waiting, payload_waited, coded, coded_bytes, coded_seconds)


def per_durable(snapshots: Iterable[Mapping[str, Any]],
                ) -> dict[tuple[str, str], Mapping[str, Any]]:
    """The broker's count of each data durable the snapshots (one node's replicas')
    observed, keyed (parent, durable): the replicas of a node share one durable per
    parent and each reports it, so it is counted once, as the latest of them to read
    it saw it ('at'), with the most unresolved any knows of (each hears of the
    exhaustions of its own deliveries). A partitioned node's replicas each have their
    own, by name. A reading that is unknown, if the latest, stays unknown."""
    latest: dict[tuple[str, str], tuple[float, Mapping[str, Any]]] = {}
    most: dict[tuple[str, str], int] = {}
    for snapshot in snapshots:
        at = float(snapshot.get("at") or 0.0)
        for parent, seen in (snapshot.get("subscriptions") or {}).items():
            key = (parent, str(seen.get("durable", "")))
            if at >= latest.get(key, (-1.0, seen))[0]:
                latest[key] = (at, seen)
            if "unresolved" in seen:
                most[key] = max(most.get(key, 0), int(seen["unresolved"]))
    return {key: seen if "unknown" in seen else {**seen, "unresolved": most[key]}
            for key, (_, seen) in latest.items()}


def pending_word(seen: Any) -> int | str:
    """A pending observation as a progress report carries it: the count, or why it
    is unknown (never 0 for unknown)."""
    value = getattr(seen, "value", None)
    return value if isinstance(value, int) else str(getattr(seen, "reason", "unknown"))


def observed_snapshot(task: Any) -> tuple[dict[str, Any], int | str | None]:
    """task's TaskStats.snapshot() with 'subscriptions' -- per parent, the broker's
    count of its work (available, leased, unresolved), or {'unknown': reason} when it
    could not be read -- and the replica's pending (pending_word; None for a
    producer, which has none), both from one read of the broker (observe_work)."""
    snapshot = task.stats.snapshot()
    observe = getattr(task.messenger, "observe_work", None)
    if observe is None or task.node.kind == "producer":
        return snapshot, None
    try:
        pending, seen = observe()
    except Exception as error:  # an observation must never kill the replica
        why = f"unread: {type(error).__name__}"
        snapshot["subscriptions"] = {"*": {"unknown": why}}
        return snapshot, why
    durables: dict[str, str] = getattr(task.messenger, "durables", dict)()
    subscriptions: dict[str, dict[str, Any]] = {}
    for parent, observed in seen.items():
        value = getattr(observed, "value", None)
        if value is None:
            subscriptions[parent] = {"unknown": str(getattr(observed, "reason", "unknown"))}
        else:
            subscriptions[parent] = {"available": value.available, "leased": value.leased,
                                     "unresolved": value.unresolved}
        if parent in durables:
            subscriptions[parent]["durable"] = durables[parent]
    snapshot["subscriptions"] = subscriptions
    return snapshot, pending_word(pending)


def merged(snapshots: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One replica's snapshots, its current process's last, summed into one: counters
    and histograms add up over the processes it had (so they never go back when one
    is started again); the rest is the current process's."""
    if len(snapshots) == 1:
        return dict(snapshots[0])
    out = dict(snapshots[-1])
    for key in ("processed", "emitted", "failed", "dead_lettered", "budget_waits"):
        out[key] = sum(int(s.get(key, 0)) for s in snapshots)
    for key in ("received", "drops", "publications"):
        total: dict[str, int] = {}
        for s in snapshots:
            for name, n in (s.get(key) or {}).items():
                total[name] = total.get(name, 0) + int(n)
        out[key] = total
    for key in ("join_latency", "hop_latency"):
        histogram = Histogram()
        for s in snapshots:
            if s.get(key):
                histogram.add(s[key])
        out[key] = histogram.as_dict()
    codecs: dict[str, dict[str, float]] = {}
    for s in snapshots:
        for name, counts in (s.get("codecs") or {}).items():
            into = codecs.setdefault(name, {})
            for field_name, value in counts.items():
                into[field_name] = into.get(field_name, 0) + value
    out["codecs"] = codecs
    return out


class MetricsServer:
    """/metrics over HTTP on a thread of this process, for a collector.

    Arguments:
        collector: what a scrape reads.
        port: the port (0: one the OS picks; see .port).
        host: the address to listen on (VIDEOFLOW_METRICS_HOST, else 127.0.0.1).

    Raises:
        MetricsUnavailable: prometheus-client is not installed, or the port cannot be
            bound.
    """

    def __init__(self, collector: SnapshotCollector, port: int, host: str | None = None) -> None:
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError as error:
            raise MetricsUnavailable("serving metrics needs prometheus-client: "
                                     "pip install prometheus-client") from error
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        address = host or os.environ.get(METRICS_HOST_ENV) or "127.0.0.1"
        try:
            self._server = _scrape_server(address, check_port(port))
        except OSError as error:
            raise MetricsUnavailable(f"cannot serve metrics on {address}:{port}: "
                                     f"{error.strerror or error}") from error
        self._server.set_app(make_wsgi_app(registry))
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="videoflow-metrics", daemon=True)
        self._thread.start()
        self.port: int = self._server.server_port
        self.url = f"http://{address}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving; a scrape under way gets its whole answer first (at most
        SCRAPE_TIMEOUT_SECONDS per read or write of a stalled client)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


SCRAPE_TIMEOUT_SECONDS: Final = 5.0
"""How long the /metrics server waits on one read or write of a scraper."""


class _ScrapeServer(ThreadingMixIn, WSGIServer):
    # prometheus-client's own server answers on daemon threads, which a process ending
    # cuts off mid-answer (a scraper then reads half the headers): here server_close
    # joins the scrapes under way (Python >= 3.10 drops the finished threads as it goes).
    daemon_threads = False
    block_on_close = True


class _ScrapeServer6(_ScrapeServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_SECONDS  # a stalled client holds close() this long at most

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's)
        pass  # a scrape is not news


def _scrape_server(address: str, port: int) -> _ScrapeServer:
    """A threaded WSGI server bound to address:port, of the address's family."""
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    kind = _ScrapeServer6 if family == socket.AF_INET6 else _ScrapeServer
    return kind((address, port), _QuietHandler)


__all__ = ["METRICS_HOST_ENV", "METRICS_PORT_ENV", "MetricsServer", "MetricsUnavailable",
           "ReplicaSample", "SnapshotCollector", "check_port", "merged",
           "metrics_port_from_env", "observed_snapshot", "pending_word", "per_durable"]
