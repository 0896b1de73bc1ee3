"""`videoflow dlq replay`: publishing dead letters' original envelopes again onto
their parent's data subject, each confirmed by a publish ack."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from videoflow.broker.failures import JSErrorCode, not_found, observation_failure
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import stream_name_for, subject_for
from videoflow.ops.broker_calls import (
    DEFAULT_TIMEOUT_SECONDS,
    Budget,
    run_sync,
)
from videoflow.ops.dead_letters import (
    DeadLetterEntry,
    DeadLetterNotFound,
    dlq_entries,
    dlq_get,
    dlq_selection,
)

REPLAY_MSG_ID_PREFIX: Final = "dlq-replay:"
"""Nats-Msg-Id of a replayed dead letter is this plus its DLQ sequence, so replaying the
same record twice within the parent stream's duplicate window stores it once."""

TORN_DOWN: Final = "the run's streams were torn down"

REPLAY_INTO_LIVE_RUN: Final = (
    "nothing reads that run any more; the record is kept: replay it into a run of the "
    "flow whose workers are running (--into-run RUN)")
"""What a replay into a torn-down run says can be done instead."""

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


async def _replay_one(nc: Client, entry: DeadLetterEntry, budget: Budget,
                      errors: ErrorLog, into_run: str | None = None) -> ReplayResult:
    record = entry.record
    if record is None:
        return ReplayResult(entry.seq, "failed", reason=f"undecodable record: {entry.error}")
    run_id = record.run_id if into_run is None else into_run
    try:
        subject = subject_for(record.flow_id, run_id, record.parent)
        stream = stream_name_for(record.flow_id, run_id, record.parent)
    except ValueError as error:
        return ReplayResult(entry.seq, "failed", reason=f"unusable provenance: {error}")
    js = nc.jetstream()
    try:
        await budget.run(js.stream_info(stream))
    except Exception as error:
        if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
            return ReplayResult(entry.seq, "failed", subject, reason=(
                f"{TORN_DOWN} ({stream} of run {run_id!r} does not exist): "
                f"{REPLAY_INTO_LIVE_RUN}"))
        reason, detail = observation_failure(error, errors.texts())
        return ReplayResult(entry.seq, "failed", subject,
                            reason=f"{stream} could not be read ({reason}): {detail}")
    headers = {"Nats-Msg-Id": f"{REPLAY_MSG_ID_PREFIX}{entry.seq}"}
    try:
        ack = await budget.run(js.publish(subject, record.envelope, timeout=budget.left(),
                                          stream=stream, headers=headers))
    except nats.js.errors.NoStreamResponseError:
        return ReplayResult(entry.seq, "failed", subject, reason=(
            f"{TORN_DOWN} (no stream captures {subject}): {REPLAY_INTO_LIVE_RUN}"))
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
    into_run: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> ReplayReport:
    """Publish dead letters' original envelopes again, onto the data subject of the
    parent that first delivered them in the record's own run
    (subject_for(flow, run, parent)), or in into_run, each confirmed by a real publish
    ack.

    Every child of that parent receives the replayed message — a parent's stream fans
    out to one durable per child — not only the node that dead-lettered it; the message
    gets a new sequence on the parent's stream. Each replay carries the Nats-Msg-Id
    dlq-replay:{dlq seq}, so replaying a record again within the stream's duplicate
    window (120 s) is reported as a duplicate and stored once. Replay only helps while
    workers of that run still read the parent's stream: a run that has ended was torn
    down, and its records fail with TORN_DOWN and what to do instead — replay them
    into_run, a run of the same flow whose workers are running (its parent's stream
    must exist: the same parent node). The record itself is left on the dead-letter
    stream (dlq_purge removes it).

    Arguments:
        nats_url: the broker.
        flow_id: the flow.
        seqs: the DLQ sequences to replay; None replays every record matching run_id
            and node.
        run_id / node: filters for seqs=None (not combinable with seqs).
        into_run: the run to replay into; None for each record's own run.
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
    subject_filter, wanted = dlq_selection(flow_id, run_id, node, seqs)
    if into_run is not None:
        subject_for(flow_id, into_run, "node")  # ValueError for an empty or reserved id

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> ReplayReport:
        results: list[ReplayResult] = []
        if wanted is None:
            entries = await dlq_entries(nc, flow_id, subject_filter, None, budget, errors)
        else:
            entries = []
            for seq in wanted:
                try:
                    entries.append(await dlq_get(nc, flow_id, seq, budget, errors))
                except DeadLetterNotFound as error:
                    if error.seq is None or budget.left() <= 0:
                        raise
                    results.append(ReplayResult(seq, "failed", reason=str(error)))
        for entry in entries:
            if budget.left() <= 0:
                results.append(ReplayResult(entry.seq, "failed",
                                            reason="the timeout elapsed before its turn"))
                continue
            results.append(await _replay_one(nc, entry, budget, errors, into_run))
        return ReplayReport(tuple(sorted(results, key=lambda r: r.seq)))

    return run_sync(nats_url, timeout, work)
