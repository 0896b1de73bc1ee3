"""The operator's side of a flow on NATS JetStream: what `videoflow status`, `videoflow dlq`
and `videoflow teardown` do, as plain synchronous functions.

Every function opens a short-lived connection of its own with the fail-fast options
(NATS_FACTS S4, §8), bounds everything it asks of the broker by one overall timeout, and
closes the connection again. A broker that cannot be reached raises BrokerUnavailable
within that timeout; a value that could not be read once connected is Unknown(reason,
detail), never 0 (MSG-012).

Runs are found by ownership — their owner labels, or for an unlabelled stream its data
subject (STREAM-14, provisioning._owned_stream) — never by a stream-name prefix, which
cannot tell run r-x from run r. Dead letters live on the flow-scoped stream
vf-{flow}-dlq (STREAM-8) under vf.{flow}._dlq.{run}.{node}; nothing here but dlq_purge
ever removes one, and teardown never touches that stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, cast

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ConsumerInfo, StreamInfo
from nats.js.manager import JetStreamManager

from videoflow.backends.messaging import CleanupObservation, Known, Unknown, UnknownReason
from videoflow.errors import BrokerUnavailable, VideoflowError
from videoflow.messaging.dead_letters import DeadLetter, decode_dead_letter
from videoflow.messaging.jetstream_loop import ErrorLog, close_client, connect_fail_fast
from videoflow.messaging.naming import (
    LABEL_KIND,
    LABEL_NODE,
    dlq_stream_name,
    dlq_subject_filter,
    stream_name_for,
    subject_for,
    subject_owner,
    user_metadata,
)
from videoflow.messaging.provisioning import _owned_stream, delete_run_streams
from videoflow.messaging.stream_configs import connect_options_for
from videoflow.messaging.verification import observation_failure

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS: Final = 10.0
"""The overall bound of one operator command, connect included."""

REPLAY_MSG_ID_PREFIX: Final = "dlq-replay:"
"""Nats-Msg-Id of a replayed dead letter is this plus its DLQ sequence, so replaying the
same record twice within the parent stream's duplicate window stores it once."""

API_PREFIX: Final = "$JS.API"

STREAM_NOT_FOUND: Final = 10059
"""err_code of a stream that does not exist (NATS_FACTS §7)."""

MESSAGE_NOT_FOUND: Final = 10037
"""err_code of STREAM.MSG.GET / MSG.DELETE for a sequence the stream does not hold."""

MESSAGE_DELETE_FAILED: Final = 10057
"""err_code of STREAM.MSG.DELETE that failed; a 500 with 'no message found' when the
sequence is already gone."""

CONSUMER_PAGE: Final = 256
"""Consumers per CONSUMER.LIST page (the server's limit)."""

TORN_DOWN: Final = "the run's streams were torn down"


class DeadLetterNotFound(VideoflowError, LookupError):
    """A dead letter that is not there: no record at that sequence of the flow's
    dead-letter stream, or no dead-letter stream for the flow at all. A ``LookupError``
    so callers that only know the standard library still catch it. Not retryable.

    Attributes:
        flow_id: the flow asked about.
        seq: the DLQ sequence asked for, or None when the whole stream is missing.
    """

    def __init__(self, message: str, *, flow_id: str = "", seq: int | None = None) -> None:
        super().__init__(message)
        self.flow_id = flow_id
        self.seq = seq


# --------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------

Count = Known[int] | Unknown


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


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One record of the flow's dead-letter stream.

    Attributes:
        seq: its sequence on the dead-letter stream (what dlq_show, dlq_replay and
            dlq_purge take).
        subject: vf.{flow}._dlq.{run}.{node}.
        record: the decoded DeadLetter, or None when the bytes do not decode.
        error: why it did not decode ('' when it did).
    """

    seq: int
    subject: str
    record: DeadLetter | None
    error: str = ""

    @property
    def decodable(self) -> bool:
        return self.record is not None


ReplayOutcome = Literal["replayed", "duplicate", "failed"]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What replaying one dead letter did.

    Attributes:
        seq: the dead letter's DLQ sequence.
        outcome: 'replayed' (stored anew on the parent's stream), 'duplicate' (the
            stream already held this replay: its duplicate window caught it) or
            'failed'.
        subject: the data subject it was published to ('' when it never got that far).
        stream_seq: its sequence on the parent's stream (the original one for a
            duplicate), None when failed.
        reason: why it failed ('' otherwise).
    """

    seq: int
    outcome: ReplayOutcome
    subject: str = ""
    stream_seq: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """Every replay attempted, in DLQ order."""

    results: tuple[ReplayResult, ...]

    def _seqs(self, outcome: ReplayOutcome) -> tuple[int, ...]:
        return tuple(r.seq for r in self.results if r.outcome == outcome)

    @property
    def replayed(self) -> tuple[int, ...]:
        return self._seqs("replayed")

    @property
    def duplicates(self) -> tuple[int, ...]:
        return self._seqs("duplicate")

    @property
    def failed(self) -> tuple[int, ...]:
        return self._seqs("failed")


# --------------------------------------------------------------------------------------
# Connection and bounds
# --------------------------------------------------------------------------------------


class _Budget:
    """The monotonic deadline every request of one operation shares."""

    def __init__(self, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.deadline = self._loop.time() + timeout

    def left(self) -> float:
        return max(self.deadline - self._loop.time(), 0.0)

    async def run(self, awaitable: Awaitable[T]) -> T:
        """awaitable, bounded by what is left (asyncio.TimeoutError when it elapses)."""
        return await asyncio.wait_for(awaitable, self.left())


def _check_timeout(timeout: float) -> None:
    connect_options_for(timeout, True, _ignore)  # ValueError unless finite and > 0


async def _ignore(_error: BaseException) -> None:
    return None


def _run_sync(
    nats_url: str,
    timeout: float,
    work: Callable[[Client, _Budget, ErrorLog], Awaitable[T]],
) -> T:
    """work on a fresh loop and a fresh fail-fast connection, all within timeout."""
    _check_timeout(timeout)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("videoflow.ops functions cannot run inside an event loop")

    async def main() -> T:
        budget = _Budget(timeout)
        errors = ErrorLog()
        nc = await connect_fail_fast(nats_url, timeout, errors)
        try:
            return await work(nc, budget, errors)
        finally:
            await close_client(nc, timeout=min(2.0, max(budget.left(), 0.5)))

    return asyncio.run(main())


def _unknown(error: BaseException, errors: ErrorLog | None = None) -> Unknown:
    if isinstance(error, nats.js.errors.NotFoundError):
        return Unknown("missing", f"{error.description or error}")
    reason, detail = observation_failure(error, errors.texts() if errors else ())
    return Unknown(cast(UnknownReason, reason), detail)


def _unavailable(
    what: str, error: BaseException, errors: ErrorLog | None = None
) -> BrokerUnavailable:
    reason, detail = observation_failure(error, errors.texts() if errors else ())
    code = getattr(error, "err_code", None)
    return BrokerUnavailable(f"{what} failed ({reason}): {detail}",
                             code=code if isinstance(code, int) else None)


def _is(error: BaseException, err_code: int) -> bool:
    return isinstance(error, nats.js.errors.NotFoundError) and error.err_code == err_code


def _already_deleted(error: BaseException) -> bool:
    return _is(error, MESSAGE_NOT_FOUND) or (
        isinstance(error, nats.js.errors.APIError)
        and error.err_code == MESSAGE_DELETE_FAILED
        and "no message found" in str(error.description or "").lower()
    )


def _count(value: object, what: str) -> Count:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return Unknown("malformed", f"{what} is {value!r}")
    return Known(value)


# --------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------


async def _all_streams(jsm: JetStreamManager, budget: _Budget) -> list[StreamInfo]:
    """Every stream of the account, page by page (STREAM.LIST pages)."""
    infos: list[StreamInfo] = []
    while True:
        page: Any = await budget.run(jsm.streams_info_iterator(offset=len(infos)))
        got = list(page)
        infos.extend(got)
        if not got or len(infos) >= page.total:
            return infos


async def _all_consumers(jsm: JetStreamManager, stream: str,
                         budget: _Budget) -> list[ConsumerInfo]:
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
        pending=_count(info.num_pending, "num_pending"),
        ack_pending=_count(info.num_ack_pending, "num_ack_pending"),
        redelivered=_count(info.num_redelivered, "num_redelivered"),
        unresolved=Unknown(
            "unread", "counted only by the run's own receivers (MAX_DELIVERIES advisories)"
        ),
    )


async def _stream_status(jsm: JetStreamManager, info: StreamInfo, budget: _Budget,
                         errors: ErrorLog) -> StreamStatus:
    name = info.config.name or ""
    state = info.state
    durables: tuple[DurableStatus, ...] | Unknown
    try:
        consumers = await _all_consumers(jsm, name, budget)
        durables = tuple(sorted((_durable_status(c) for c in consumers),
                                key=lambda d: d.name))
    except Exception as error:  # every failure is reported, never inferred
        durables = _unknown(error, errors)
    retention = info.config.retention
    return StreamStatus(
        name=name,
        node=_node_of(info),
        retention=str(getattr(retention, "value", retention) or "limits"),
        messages=_count(getattr(state, "messages", None), "messages"),
        bytes=_count(getattr(state, "bytes", None), "bytes"),
        first_seq=_count(getattr(state, "first_seq", None), "first_seq"),
        last_seq=_count(getattr(state, "last_seq", None), "last_seq"),
        durables=durables,
    )


async def _dlq_count(jsm: JetStreamManager, flow_id: str, run_id: str, budget: _Budget,
                     errors: ErrorLog) -> Count:
    name = dlq_stream_name(flow_id)
    try:
        info = await budget.run(
            jsm.stream_info(name, subjects_filter=dlq_subject_filter(flow_id, run_id)))
    except Exception as error:
        if _is(error, STREAM_NOT_FOUND):
            return Unknown("missing", f"the flow has no dead-letter stream {name}")
        return _unknown(error, errors)
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
    _check_timeout(timeout)
    log = errors if errors is not None else ErrorLog()
    budget = _Budget(timeout)
    jsm = nc.jsm()
    streams: tuple[StreamStatus, ...] | Unknown
    try:
        infos = await _all_streams(jsm, budget)
    except Exception as error:
        streams = _unknown(error, log)
    else:
        owned = sorted((i for i in infos if i.config.name
                        and _owned_stream(i.config, flow_id, run_id)),
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

    async def work(nc: Client, budget: _Budget, errors: ErrorLog) -> RunStatus:
        return await run_status_async(nc, flow_id, run_id,
                                      timeout=max(budget.left(), 0.001), errors=errors)

    return _run_sync(nats_url, timeout, work)


# --------------------------------------------------------------------------------------
# dlq list / show
# --------------------------------------------------------------------------------------


def _entry(seq: int, subject: str, data: bytes | None) -> DeadLetterEntry:
    try:
        return DeadLetterEntry(seq, subject, decode_dead_letter(data or b""))
    except ValueError as error:  # WireError is a ValueError
        return DeadLetterEntry(seq, subject, None, str(error))


async def _dlq_entries(
    nc: Client, flow_id: str, subject_filter: str, limit: int | None, budget: _Budget,
    errors: ErrorLog,
) -> list[DeadLetterEntry]:
    """Records on the flow's DLQ stream matching subject_filter, in sequence order:
    STREAM.MSG.GET with next_by_subj, one record per request, so nothing is consumed
    and no consumer is left behind."""
    jsm = nc.jsm()
    name = dlq_stream_name(flow_id)
    entries: list[DeadLetterEntry] = []
    seq = 1
    while limit is None or len(entries) < limit:
        try:
            msg = await budget.run(jsm.get_msg(name, seq=seq, subject=subject_filter,
                                               next=True))
        except Exception as error:
            if _is(error, MESSAGE_NOT_FOUND):
                return entries  # nothing at or after seq
            if _is(error, STREAM_NOT_FOUND):
                raise DeadLetterNotFound(
                    f"flow {flow_id!r} has no dead-letter stream {name}",
                    flow_id=flow_id) from error
            raise _unavailable(f"reading {name}", error, errors) from error
        if not isinstance(msg.seq, int) or msg.seq < seq:
            raise BrokerUnavailable(f"reading {name}: the broker answered seq {msg.seq!r} "
                                    f"for a request at or after {seq}")
        entries.append(_entry(msg.seq, msg.subject or "", msg.data))
        seq = msg.seq + 1
    return entries


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")


def dlq_list(
    nats_url: str,
    flow_id: str,
    *,
    run_id: str | None = None,
    node: str | None = None,
    limit: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[DeadLetterEntry]:
    """The flow's dead letters, oldest first, optionally for one run and/or one node
    (the node that gave up).

    Nothing is consumed or acknowledged: records are read by sequence. A record that
    does not decode is listed with its sequence and the decode error, never skipped.

    Arguments:
        nats_url: the broker.
        flow_id: the flow.
        run_id: only this run's records (None: every run).
        node: only records of this node (None: every node).
        limit: at most this many (the oldest), or None for all.
        timeout: overall bound in seconds, connect included.

    Returns:
        list of DeadLetterEntry in DLQ sequence order (empty when none match).

    Raises:
        DeadLetterNotFound: the flow has no dead-letter stream.
        BrokerUnavailable: the broker could not be reached, or stopped answering,
            within timeout.
        ValueError: a bad name, limit or timeout.
    """
    subject_filter = dlq_subject_filter(flow_id, run_id, node)
    _check_limit(limit)

    async def work(nc: Client, budget: _Budget, errors: ErrorLog) -> list[DeadLetterEntry]:
        return await _dlq_entries(nc, flow_id, subject_filter, limit, budget, errors)

    return _run_sync(nats_url, timeout, work)


def _check_seq(seq: int) -> None:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"a DLQ sequence must be an int >= 1, got {seq!r}")


async def _dlq_get(nc: Client, flow_id: str, seq: int, budget: _Budget,
                   errors: ErrorLog) -> DeadLetterEntry:
    name = dlq_stream_name(flow_id)
    try:
        msg = await budget.run(nc.jsm().get_msg(name, seq=seq))
    except Exception as error:
        if _is(error, MESSAGE_NOT_FOUND):
            raise DeadLetterNotFound(f"no dead letter at seq {seq} of {name}",
                                     flow_id=flow_id, seq=seq) from error
        if _is(error, STREAM_NOT_FOUND):
            raise DeadLetterNotFound(f"flow {flow_id!r} has no dead-letter stream {name}",
                                     flow_id=flow_id, seq=seq) from error
        raise _unavailable(f"reading seq {seq} of {name}", error, errors) from error
    return _entry(seq, msg.subject or "", msg.data)


def dlq_show(
    nats_url: str, flow_id: str, seq: int, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> DeadLetterEntry:
    """One dead letter by its sequence on the flow's dead-letter stream.

    Arguments:
        nats_url: the broker.
        flow_id: the flow.
        seq: the record's DLQ sequence (as dlq_list reports it).
        timeout: overall bound in seconds, connect included.

    Returns:
        DeadLetterEntry (record None, with the error, when it does not decode).

    Raises:
        DeadLetterNotFound: no record at seq (purged, aged out, never written), or no
            dead-letter stream for the flow.
        BrokerUnavailable: the broker could not be reached, or did not answer, within
            timeout.
        ValueError: a bad flow_id, seq or timeout.
    """
    dlq_subject_filter(flow_id)
    _check_seq(seq)

    async def work(nc: Client, budget: _Budget, errors: ErrorLog) -> DeadLetterEntry:
        return await _dlq_get(nc, flow_id, seq, budget, errors)

    return _run_sync(nats_url, timeout, work)


# --------------------------------------------------------------------------------------
# dlq replay
# --------------------------------------------------------------------------------------


async def _replay_one(nc: Client, entry: DeadLetterEntry, budget: _Budget,
                      errors: ErrorLog) -> ReplayResult:
    record = entry.record
    if record is None:
        return ReplayResult(entry.seq, "failed", reason=f"undecodable record: {entry.error}")
    try:
        subject = subject_for(record.flow_id, record.run_id, record.parent)
        stream = stream_name_for(record.flow_id, record.run_id, record.parent)
    except ValueError as error:
        return ReplayResult(entry.seq, "failed", reason=f"unusable provenance: {error}")
    js = nc.jetstream()
    try:
        await budget.run(js.stream_info(stream))
    except Exception as error:
        if _is(error, STREAM_NOT_FOUND):
            return ReplayResult(entry.seq, "failed", subject,
                                reason=f"{TORN_DOWN} ({stream} does not exist)")
        reason, detail = observation_failure(error, errors.texts())
        return ReplayResult(entry.seq, "failed", subject,
                            reason=f"{stream} could not be read ({reason}): {detail}")
    headers = {"Nats-Msg-Id": f"{REPLAY_MSG_ID_PREFIX}{entry.seq}"}
    try:
        ack = await budget.run(js.publish(subject, record.envelope, timeout=budget.left(),
                                          stream=stream, headers=headers))
    except nats.js.errors.NoStreamResponseError:
        return ReplayResult(entry.seq, "failed", subject,
                            reason=f"{TORN_DOWN} (no stream captures {subject})")
    except (asyncio.TimeoutError, nats.errors.TimeoutError) as error:
        # NATS_FACTS S3: it may be stored anyway; the msg id makes a retry safe.
        return ReplayResult(entry.seq, "failed", subject, reason=(
            f"no publish ack in time ({error!r}); it may have been stored — replaying "
            "again within the duplicate window is safe"))
    except Exception as error:
        reason, detail = observation_failure(error, errors.texts())
        return ReplayResult(entry.seq, "failed", subject,
                            reason=f"publish refused ({reason}): {detail}")
    outcome: ReplayOutcome = "duplicate" if ack.duplicate else "replayed"
    return ReplayResult(entry.seq, outcome, subject, ack.seq)


def dlq_replay(
    nats_url: str,
    flow_id: str,
    seqs: Iterable[int] | None = None,
    *,
    run_id: str | None = None,
    node: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> ReplayReport:
    """Publish dead letters' original envelopes again, onto the data subject of the
    parent that first delivered them in the record's own run
    (subject_for(flow, run, parent)), each confirmed by a real publish ack.

    Every child of that parent receives the replayed message — a parent's stream fans
    out to one durable per child — not only the node that dead-lettered it; the message
    gets a new sequence on the parent's stream. Each replay carries the Nats-Msg-Id
    dlq-replay:{dlq seq}, so replaying a record again within the stream's duplicate
    window (120 s) is reported as a duplicate and stored once. Replay only helps while
    workers of that run still read the parent's stream; the record itself is left on
    the dead-letter stream (dlq_purge removes it).

    Arguments:
        nats_url: the broker.
        flow_id: the flow.
        seqs: the DLQ sequences to replay; None replays every record matching run_id
            and node.
        run_id / node: filters for seqs=None (not combinable with seqs).
        timeout: overall bound in seconds, connect included; a record not replayed
            within it is reported failed.

    Returns:
        ReplayReport, one result per record, in DLQ order: replayed, duplicate, or
        failed with its reason — an undecodable record, a missing seq, a torn-down
        run ("the run's streams were torn down"), a refusal, or no ack in time.

    Raises:
        DeadLetterNotFound: the flow has no dead-letter stream.
        BrokerUnavailable: the broker could not be reached, or stopped answering while
            the records were listed.
        ValueError: seqs together with run_id/node, a bad seq, name or timeout.
    """
    subject_filter = dlq_subject_filter(flow_id, run_id, node)
    wanted = None if seqs is None else sorted(set(seqs))
    if wanted is not None:
        if run_id is not None or node is not None:
            raise ValueError("give seqs or run_id/node filters, not both")
        for seq in wanted:
            _check_seq(seq)

    async def work(nc: Client, budget: _Budget, errors: ErrorLog) -> ReplayReport:
        results: list[ReplayResult] = []
        if wanted is None:
            entries = await _dlq_entries(nc, flow_id, subject_filter, None, budget, errors)
        else:
            entries = []
            for seq in wanted:
                try:
                    entries.append(await _dlq_get(nc, flow_id, seq, budget, errors))
                except DeadLetterNotFound as error:
                    if error.seq is None or budget.left() <= 0:
                        raise
                    results.append(ReplayResult(seq, "failed", reason=str(error)))
        for entry in entries:
            if budget.left() <= 0:
                results.append(ReplayResult(entry.seq, "failed",
                                            reason="the timeout elapsed before its turn"))
                continue
            results.append(await _replay_one(nc, entry, budget, errors))
        return ReplayReport(tuple(sorted(results, key=lambda r: r.seq)))

    return _run_sync(nats_url, timeout, work)


# --------------------------------------------------------------------------------------
# dlq purge
# --------------------------------------------------------------------------------------


def _api_refusal(failure: object) -> nats.js.errors.APIError:
    """A JSON API "error" object as the APIError nats-py would have raised for it."""
    if isinstance(failure, dict):
        try:
            # from_error raises the mapped subclass (NotFoundError, BadRequestError, ...)
            nats.js.errors.APIError.from_error(failure)
        except nats.js.errors.APIError as refused:
            return refused
    return nats.js.errors.APIError(description=str(failure))


async def _purge_filter(nc: Client, flow_id: str, subject_filter: str, budget: _Budget,
                        errors: ErrorLog) -> int:
    # STREAM.PURGE answers {"success", "purged"}; nats-py's purge_stream keeps only
    # success, so the request is made here to report the count.
    name = dlq_stream_name(flow_id)
    try:
        reply = await budget.run(nc.request(
            f"{API_PREFIX}.STREAM.PURGE.{name}",
            json.dumps({"filter": subject_filter}).encode(), timeout=budget.left()))
        answer = json.loads(reply.data)
    except Exception as error:
        raise _unavailable(f"purging {name}", error, errors) from error
    failure = answer.get("error") if isinstance(answer, dict) else None
    if failure is not None:
        refused = _api_refusal(failure)
        if refused.err_code == STREAM_NOT_FOUND:
            raise DeadLetterNotFound(f"flow {flow_id!r} has no dead-letter stream {name}",
                                     flow_id=flow_id)
        raise _unavailable(f"purging {name}", refused, errors)
    purged = answer.get("purged", 0) if isinstance(answer, dict) else None
    if not answer.get("success") or not isinstance(purged, int):
        raise BrokerUnavailable(f"purging {name}: unexpected answer {answer!r}")
    return purged


async def _purge_seqs(nc: Client, flow_id: str, seqs: Sequence[int], budget: _Budget,
                      errors: ErrorLog) -> int:
    name = dlq_stream_name(flow_id)
    jsm = nc.jsm()
    removed = 0
    for seq in seqs:
        try:
            await budget.run(jsm.delete_msg(name, seq))
        except Exception as error:
            if _already_deleted(error):
                continue  # already gone: nothing to remove
            if _is(error, STREAM_NOT_FOUND):
                raise DeadLetterNotFound(
                    f"flow {flow_id!r} has no dead-letter stream {name}",
                    flow_id=flow_id) from error
            raise _unavailable(f"deleting seq {seq} of {name} ({removed} removed before)",
                               error, errors) from error
        removed += 1
    return removed


def dlq_purge(
    nats_url: str,
    flow_id: str,
    *,
    run_id: str | None = None,
    node: str | None = None,
    seqs: Iterable[int] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> int:
    """Remove dead letters from the flow's dead-letter stream: the given sequences, or
    every record matching run_id and node (STREAM.PURGE with a subject filter — the
    whole flow's records when neither is given). The stream itself stays.

    Arguments:
        nats_url: the broker.
        flow_id: the flow.
        run_id / node: filters when seqs is None (not combinable with seqs).
        seqs: DLQ sequences to delete one by one; a sequence already gone is not an
            error and not counted.
        timeout: overall bound in seconds, connect included.

    Returns:
        How many records were removed.

    Raises:
        DeadLetterNotFound: the flow has no dead-letter stream.
        BrokerUnavailable: the broker could not be reached, refused, or did not answer
            within timeout (some sequences may have been deleted; re-running is safe).
        ValueError: seqs together with run_id/node, a bad seq, name or timeout.
    """
    subject_filter = dlq_subject_filter(flow_id, run_id, node)
    wanted = None if seqs is None else sorted(set(seqs))
    if wanted is not None:
        if run_id is not None or node is not None:
            raise ValueError("give seqs or run_id/node filters, not both")
        for seq in wanted:
            _check_seq(seq)

    async def work(nc: Client, budget: _Budget, errors: ErrorLog) -> int:
        if wanted is None:
            return await _purge_filter(nc, flow_id, subject_filter, budget, errors)
        return await _purge_seqs(nc, flow_id, wanted, budget, errors)

    return _run_sync(nats_url, timeout, work)


# --------------------------------------------------------------------------------------
# teardown
# --------------------------------------------------------------------------------------


async def _purge_run_ledger(nc: Client, flow_id: str, run_id: str) -> None:
    """Purge the run's records from the flow's ledger bucket (its FlowRuntime keys);
    a flow whose replicas kept no ledger there has nothing to purge."""
    from videoflow.core.runtime import run_key_filter
    from videoflow.core.worker import ledger_bucket

    bucket = ledger_bucket(flow_id)
    try:
        await nc.jetstream().purge_stream(
            f"KV_{bucket}", subject=f"$KV.{bucket}.{run_key_filter(flow_id, run_id)}")
    except nats.js.errors.NotFoundError:
        pass


def teardown(
    nats_url: str, flow_id: str, run_id: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> CleanupObservation:
    """Delete every stream the run owns, and with them their durables
    (delete_run_streams: exact ownership, never a name prefix), and purge the run's
    records from the flow's ledger bucket. The flow's dead-letter stream is never
    deleted (STREAM-8): its records outlive the run on purpose.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the run.
        timeout: overall bound in seconds, connect included.

    Returns:
        CleanupObservation: removed (gone, already-gone included), remaining (deletes
        that failed) and complete. A run with nothing left is complete with nothing
        removed. complete is False when the inventory could not be read.

    Raises:
        BrokerUnavailable: the broker could not be reached, or teardown did not finish
            within timeout (some streams may be gone; re-running is safe).
        ValueError: an empty or reserved flow_id or run_id, or a bad timeout.
    """
    subject_for(flow_id, run_id, "node")

    async def work(nc: Client, budget: _Budget, errors: ErrorLog) -> CleanupObservation:
        try:
            cleanup = await budget.run(delete_run_streams(nc, flow_id, run_id))
            await budget.run(_purge_run_ledger(nc, flow_id, run_id))
            return cleanup
        except asyncio.TimeoutError as error:
            raise BrokerUnavailable(
                f"teardown of run {run_id!r} of flow {flow_id!r} did not finish within "
                f"{timeout:g} s; re-running it is safe") from error

    return _run_sync(nats_url, timeout, work)


__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "REPLAY_MSG_ID_PREFIX",
    "DeadLetterEntry",
    "DeadLetterNotFound",
    "DurableStatus",
    "ReplayReport",
    "ReplayResult",
    "RunStatus",
    "StreamStatus",
    "dlq_list",
    "dlq_purge",
    "dlq_replay",
    "dlq_show",
    "run_status",
    "run_status_async",
    "teardown",
]
