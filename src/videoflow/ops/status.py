"""`videoflow status`: what the broker holds for one run — its streams, their durables,
and how many dead letters the run left."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from nats.aio.client import Client
from nats.js.api import ConsumerInfo, StreamInfo
from nats.js.manager import JetStreamManager

from videoflow.backends.jetstream.streams import owned_stream
from videoflow.backends.messaging import Known, Unknown
from videoflow.broker.failures import JSErrorCode, not_found, unknown_from
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import (
    LABEL_KIND,
    LABEL_NODE,
    dlq_stream_name,
    dlq_subject_filter,
    subject_for,
    subject_owner,
    user_metadata,
)
from videoflow.ops.broker_calls import (
    DEFAULT_TIMEOUT_SECONDS,
    Budget,
    Count,
    check_timeout,
    count_of,
    run_sync,
)

CONSUMER_PAGE: Final = 256
"""Consumers per CONSUMER.LIST page (the server's limit)."""


@dataclass(frozen=True, slots=True)
class DurableStatus:
    """One durable of a run's stream, as consumer_info reports it.

    Attributes:
        name: the durable's name.
        kind: its owner label (durable, eos_durable, eos_anchor), '' when unlabelled.
        filter_subject: the subject it reads ('' for the whole stream).
        pending: messages not yet delivered (num_pending; SubscriptionObservation's
            available).
        ack_pending: delivered and not yet settled (num_ack_pending, nak'd ones
            included; SubscriptionObservation's leased).
        redelivered: messages redelivered and not yet acked (num_redelivered; an
            exhausted message stays counted, NATS_FACTS §7).
        unresolved: retained but exhausted work nothing will terminate (MSG-012).
            Always Unknown('unread') here: only the run's own receivers count it (the
            MAX_DELIVERIES advisories and mark_exhausted), and consumer_info does not
            say — so it is never reported as 0.
    """

    name: str
    kind: str
    filter_subject: str
    pending: Count
    ack_pending: Count
    redelivered: Count
    unresolved: Count


@dataclass(frozen=True, slots=True)
class StreamStatus:
    """One stream of a run.

    Attributes:
        name: the stream's name.
        node: the node whose output it holds (owner label, else its data subject).
        retention: 'limits', 'interest' or 'workqueue'.
        messages / bytes / first_seq / last_seq: its state.
        durables: every consumer on it, or Unknown when they could not be listed.
    """

    name: str
    node: str
    retention: str
    messages: Count
    bytes: Count
    first_seq: Count
    last_seq: Count
    durables: tuple[DurableStatus, ...] | Unknown


@dataclass(frozen=True, slots=True)
class RunStatus:
    """What the broker holds for one run.

    Attributes:
        flow_id / run_id: the run.
        streams: every stream the run owns, sorted by name (empty when the run has
            none: never provisioned, or torn down), or Unknown when the inventory
            could not be read.
        dlq_stream: the flow's dead-letter stream's name.
        dlq_count: dead letters of this run on it (vf.{flow}._dlq.{run}.*), or
            Unknown — 'missing' when the flow has no dead-letter stream.
    """

    flow_id: str
    run_id: str
    streams: tuple[StreamStatus, ...] | Unknown
    dlq_stream: str
    dlq_count: Count

    @property
    def exists(self) -> Known[bool] | Unknown:
        """Whether the run has any stream on the broker (Unknown when unread)."""
        if isinstance(self.streams, Unknown):
            return self.streams
        return Known(bool(self.streams))


async def all_streams(jsm: JetStreamManager, budget: Budget) -> list[StreamInfo]:
    """Every stream of the account, page by page (STREAM.LIST pages)."""
    infos: list[StreamInfo] = []
    while True:
        page: Any = await budget.run(jsm.streams_info_iterator(offset=len(infos)))
        got = list(page)
        infos.extend(got)
        if not got or len(infos) >= page.total:
            return infos


async def _all_consumers(jsm: JetStreamManager, stream: str,
                         budget: Budget) -> list[ConsumerInfo]:
    consumers: list[ConsumerInfo] = []
    while True:
        page = await budget.run(jsm.consumers_info(stream, offset=len(consumers)))
        consumers.extend(page)
        if len(page) < CONSUMER_PAGE:
            return consumers


def _node_of(info: StreamInfo) -> str:
    node = user_metadata(info.config.metadata).get(LABEL_NODE)
    if node:
        return node
    for subject in info.config.subjects or ():
        owner = subject_owner(subject)
        if owner is not None:
            return owner[2]
    return ""


def _durable_status(info: ConsumerInfo) -> DurableStatus:
    config = info.config
    return DurableStatus(
        name=info.name,
        kind=user_metadata(getattr(config, "metadata", None)).get(LABEL_KIND, ""),
        filter_subject=config.filter_subject or "",
        pending=count_of(info.num_pending, "num_pending"),
        ack_pending=count_of(info.num_ack_pending, "num_ack_pending"),
        redelivered=count_of(info.num_redelivered, "num_redelivered"),
        unresolved=Unknown(
            "unread", "counted only by the run's own receivers (MAX_DELIVERIES advisories)"
        ),
    )


async def _stream_status(jsm: JetStreamManager, info: StreamInfo, budget: Budget,
                         errors: ErrorLog) -> StreamStatus:
    name = info.config.name or ""
    state = info.state
    durables: tuple[DurableStatus, ...] | Unknown
    try:
        consumers = await _all_consumers(jsm, name, budget)
        durables = tuple(sorted((_durable_status(c) for c in consumers),
                                key=lambda d: d.name))
    except Exception as error:  # every failure is reported, never inferred
        durables = unknown_from(error, errors.texts())
    retention = info.config.retention
    return StreamStatus(
        name=name,
        node=_node_of(info),
        retention=str(getattr(retention, "value", retention) or "limits"),
        messages=count_of(getattr(state, "messages", None), "messages"),
        bytes=count_of(getattr(state, "bytes", None), "bytes"),
        first_seq=count_of(getattr(state, "first_seq", None), "first_seq"),
        last_seq=count_of(getattr(state, "last_seq", None), "last_seq"),
        durables=durables,
    )


async def _dlq_count(jsm: JetStreamManager, flow_id: str, run_id: str, budget: Budget,
                     errors: ErrorLog) -> Count:
    name = dlq_stream_name(flow_id)
    try:
        info = await budget.run(
            jsm.stream_info(name, subjects_filter=dlq_subject_filter(flow_id, run_id)))
    except Exception as error:
        if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
            return Unknown("missing", f"the flow has no dead-letter stream {name}")
        return unknown_from(error, errors.texts())
    # The server answered the filtered request: no subjects map means none matched.
    subjects = info.state.subjects or {}
    if not all(isinstance(n, int) for n in subjects.values()):
        return Unknown("malformed", f"subjects {subjects!r}")
    return Known(sum(subjects.values()))


async def run_status_async(
    nc: Client, flow_id: str, run_id: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS,
    errors: ErrorLog | None = None,
) -> RunStatus:
    """run_status over a connection the caller already holds.

    Arguments:
        nc: a connected client.
        flow_id / run_id: the run.
        timeout: bound of every request together, in seconds; what is not answered
            within it is Unknown('timeout').
        errors: the connection's error_cb log, if the caller keeps one, so a refused
            or unauthorised request is classified rather than called a timeout.

    Returns:
        RunStatus (see run_status).

    Raises:
        ValueError: an empty or reserved flow_id or run_id, or a bad timeout.
    """
    subject_for(flow_id, run_id, "node")  # validates both before the broker is asked
    check_timeout(timeout)
    log = errors if errors is not None else ErrorLog()
    budget = Budget(timeout)
    jsm = nc.jsm()
    streams: tuple[StreamStatus, ...] | Unknown
    try:
        infos = await all_streams(jsm, budget)
    except Exception as error:
        streams = unknown_from(error, log.texts())
    else:
        owned = sorted((i for i in infos if i.config.name
                        and owned_stream(i.config, flow_id, run_id)),
                       key=lambda i: i.config.name or "")
        streams = tuple([await _stream_status(jsm, i, budget, log) for i in owned])
    count = await _dlq_count(jsm, flow_id, run_id, budget, log)
    return RunStatus(flow_id, run_id, streams, dlq_stream_name(flow_id), count)


def run_status(
    nats_url: str, flow_id: str, run_id: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> RunStatus:
    """Every stream one run owns — messages, bytes, first and last sequence — every
    durable on each — pending, ack pending, redelivered — and how many dead letters the
    run left on its flow's dead-letter stream.

    Streams are the run's by ownership (owner labels, or the run's data subject), never
    by name prefix. Anything that could not be read is Unknown(reason, detail), never 0.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the run.
        timeout: overall bound in seconds, connect included.

    Returns:
        RunStatus; a run with no streams (never provisioned, or torn down) has
        streams == () — not an exception.

    Raises:
        BrokerUnavailable: the broker could not be reached within timeout.
        ValueError: an empty or reserved flow_id or run_id, or a timeout that is not a
            finite number > 0.
        RuntimeError: called from a running event loop (use run_status_async).
    """
    subject_for(flow_id, run_id, "node")

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> RunStatus:
        return await run_status_async(nc, flow_id, run_id,
                                      timeout=max(budget.left(), 0.001), errors=errors)

    return run_sync(nats_url, timeout, work)
