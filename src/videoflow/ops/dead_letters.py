"""`videoflow dlq list` and `dlq show`: reading the flow's dead-letter stream, a page
per round trip (list) or one record by sequence (show), nothing consumed or
acknowledged; and the line a run's report ends with when it dead-lettered inputs."""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import nats.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from videoflow.broker.failures import JSErrorCode, not_found
from videoflow.broker.link import redact_url
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import dlq_stream_name, dlq_subject_filter
from videoflow.errors import VideoflowError
from videoflow.messaging.dead_letters import DeadLetter, decode_dead_letter
from videoflow.ops.broker_calls import (
    DEFAULT_TIMEOUT_SECONDS,
    READER_IDLE_SECONDS,
    Budget,
    run_sync,
    unavailable,
)


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


def _entry(seq: int, subject: str, data: bytes | None) -> DeadLetterEntry:
    try:
        return DeadLetterEntry(seq, subject, decode_dead_letter(data or b""))
    except ValueError as error:  # WireError is a ValueError
        return DeadLetterEntry(seq, subject, None, str(error))


PAGE: Final = 512
"""Records one fetch asks for: a page of the dead-letter stream per round trip."""


async def dlq_entries(
    nc: Client, flow_id: str, subject_filter: str, limit: int | None, budget: Budget,
    errors: ErrorLog, after: int = 0,
) -> list[DeadLetterEntry]:
    """Records on the flow's DLQ stream matching subject_filter, in sequence order, from
    the first after sequence `after`: read a page (PAGE) per round trip through an
    ephemeral pull consumer that acknowledges nothing. The stream keeps its records by
    LIMITS retention, so nothing is consumed; the consumer is deleted once read (and
    the server removes it on its own if this process dies first). One request per
    record took 3,000 round trips for 3,000 records."""
    jsm = nc.jsm()
    name = dlq_stream_name(flow_id)
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL,
        opt_start_seq=after + 1 if after else None,
        ack_policy=AckPolicy.NONE, filter_subject=subject_filter, mem_storage=True,
        num_replicas=1, inactive_threshold=READER_IDLE_SECONDS)
    try:
        info = await budget.run(jsm.add_consumer(name, config))
    except Exception as error:
        if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
            raise DeadLetterNotFound(f"flow {flow_id!r} has no dead-letter stream {name}",
                                     flow_id=flow_id) from error
        raise unavailable(f"reading {name}", error, errors) from error
    entries: list[DeadLetterEntry] = []
    try:
        pending = info.num_pending or 0
        reader = await nc.jetstream().pull_subscribe_bind(info.name, name)
        while pending and (limit is None or len(entries) < limit):
            want = PAGE if limit is None else min(PAGE, limit - len(entries))
            try:
                page = await budget.run(reader.fetch(want, timeout=max(budget.left(), 0.01)))
            except Exception as error:  # records pending, and no page came
                raise unavailable(f"reading {name}", error, errors) from error
            for msg in page:
                meta = msg.metadata
                entries.append(_entry(meta.sequence.stream, msg.subject or "", msg.data))
                pending = meta.num_pending
        await reader.unsubscribe()
    finally:
        try:
            await asyncio.wait_for(jsm.delete_consumer(name, info.name),
                                   max(min(budget.left(), 2.0), 0.5))
        except (asyncio.TimeoutError, nats.errors.Error):
            pass  # inactive_threshold removes it
    return entries[:limit] if limit is not None else entries


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
    after: int = 0,
) -> list[DeadLetterEntry]:
    """The flow's dead letters, oldest first, optionally for one run and/or one node
    (the node that gave up), read a page per round trip.

    Nothing is consumed or acknowledged: records are read by sequence. A record that
    does not decode is listed with its sequence and the decode error, never skipped.

    Arguments:
        nats_url: the broker.
        flow_id: the flow.
        run_id: only this run's records (None: every run).
        node: only records of this node (None: every node).
        limit: at most this many (the oldest), or None for all.
        timeout: overall bound in seconds, connect included.
        after: only records after this DLQ sequence: the next page of a listing
            whose last record was `after`.

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
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"after must be a DLQ sequence >= 0, got {after!r}")

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> list[DeadLetterEntry]:
        return await dlq_entries(nc, flow_id, subject_filter, limit, budget, errors, after)

    return run_sync(nats_url, timeout, work)


def _check_seq(seq: int) -> None:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"a DLQ sequence must be an int >= 1, got {seq!r}")


def dlq_selection(flow_id: str, run_id: str | None, node: str | None,
               seqs: Iterable[int] | None) -> tuple[str, list[int] | None]:
    """The records a replay or purge names: a subject filter by run and node, or
    exact sequences (sorted, each checked) -- not both.

    Raises:
        ValueError: seqs together with run_id/node, a bad seq or name.
    """
    subject_filter = dlq_subject_filter(flow_id, run_id, node)
    wanted = None if seqs is None else sorted(set(seqs))
    if wanted is not None:
        if run_id is not None or node is not None:
            raise ValueError("give seqs or run_id/node filters, not both")
        for seq in wanted:
            _check_seq(seq)
    return subject_filter, wanted


async def dlq_get(nc: Client, flow_id: str, seq: int, budget: Budget,
                   errors: ErrorLog) -> DeadLetterEntry:
    name = dlq_stream_name(flow_id)
    try:
        msg = await budget.run(nc.jsm().get_msg(name, seq=seq))
    except Exception as error:
        if not_found(error, JSErrorCode.MESSAGE_NOT_FOUND):
            raise DeadLetterNotFound(f"no dead letter at seq {seq} of {name}",
                                     flow_id=flow_id, seq=seq) from error
        if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
            raise DeadLetterNotFound(f"flow {flow_id!r} has no dead-letter stream {name}",
                                     flow_id=flow_id, seq=seq) from error
        raise unavailable(f"reading seq {seq} of {name}", error, errors) from error
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

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> DeadLetterEntry:
        return await dlq_get(nc, flow_id, seq, budget, errors)

    return run_sync(nats_url, timeout, work)


def dead_letters_line(count: int, flow_id: str, run_id: str, nats_url: str | None = None,
                      store_dir: str | os.PathLike[str] | None = None,
                      ephemeral: bool = False) -> str:
    """The last line of a run's report when its nodes dead-lettered inputs: how many,
    and the `videoflow dlq list` command that lists them.

    Arguments:
        count: the inputs dead-lettered.
        flow_id / run_id: the run.
        nats_url / store_dir: the broker or store the run was given, named in the
            command (one the environment gave, the command reads there too); a URL's
            password is never printed.
        ephemeral: the run's store was thrown away, its dead letters with it.

    Returns:
        '4 inputs dead-lettered, listed by: videoflow dlq list --flow F --run R ...';
        '' for a count of 0.
    """
    if not count:
        return ""
    said = f"{count} input{'s' if count != 1 else ''} dead-lettered"
    if ephemeral:
        return f"{said}: gone with the ephemeral store (--ephemeral)"
    words = ["videoflow", "dlq", "list", "--flow", flow_id, "--run", run_id]
    if nats_url:
        words += ["--nats-url", redact_url(nats_url)]
    elif store_dir is not None:
        words += ["--store-dir", os.fspath(store_dir)]
    return f"{said}, listed by: {shlex.join(words)}"
