"""The record a run leaves of itself: when it started, when it ended and how, kept
after its streams are gone, so `videoflow ls` and `videoflow status` find a finished
run again.

A run's streams are deleted when it ends, and its ledger records purged with them;
the flow's ledger bucket (KV ``vf-ledger-{flow}``) outlives its runs, so each run's
record is one key there, under a prefix no ledger key has (RUN_RECORD_PREFIX: a
ledger key starts with an escaped flow id, which never starts with '=runs'). The
engine writes it as the run starts ('running') and again as it ends (its outcome);
one whose engine died stays 'running' until a teardown ends it ('lost').
`videoflow buckets remove` removes the records with the bucket.

The record is also how a new run holds its id: claim_run writes its start only if no
run holds the id, in one conditional write the broker decides, so of two runs started
at once with one id exactly one gets it. A run holds its id until its record says it
ended; an ended run's id is free again once its streams are gone.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from videoflow.backends.messaging import Unknown
from videoflow.broker.failures import unknown_from
from videoflow.broker.listing import present_keys
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import ledger_bucket, subject_for
from videoflow.core.runtime_records import key_token
from videoflow.errors import BrokerUnavailable, RevisionConflict, RunExists
from videoflow.logs import say
from videoflow.ops.broker_calls import (
    DEFAULT_TIMEOUT_SECONDS,
    Budget,
    run_sync,
    unavailable,
)

RUN_RECORD_PREFIX: Final = "=runs."
"""The ledger bucket's keys of run records: '=runs.<run token>'. key_token escapes a
'=' as '=3D', so no escaped flow id (the first token of every ledger key) is '=runs'."""

RUNNING: Final = "running"

LOST: Final = "lost"
"""The outcome a teardown gives a run whose record still said 'running': its engine
ended without writing its end (it was killed, or its broker was away just then)."""


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a run says of itself in its flow's ledger bucket (JSON, readable with
    `nats kv get`). New fields get defaults and go last.

    Attributes:
        flow_id / run_id: the run.
        outcome: 'running' while it runs (and after, if its engine died); then the
            report's: 'completed', 'failed' or 'stopped'; 'lost' when a teardown
            ended it for an engine that never wrote its end (LOST).
        started_at: when it started, in seconds since the epoch (UTC).
        ended_at: when it ended; None while running.
        torn_down: its streams were deleted at its end.
        kept: when they were not, what was kept and how to resume or delete it.
    """

    flow_id: str
    run_id: str
    outcome: str
    started_at: float
    ended_at: float | None = None
    torn_down: bool = False
    kept: str = ""


    def describe(self, has_streams: bool) -> list[str]:
        """What `videoflow status` says of the run by its record: when it started, and
        how and when it ended, in lines.

        Arguments:
            has_streams: whether the run's streams are still on the broker.
        """
        started = f"started {utc_text(self.started_at)}"
        if self.outcome == LOST and self.ended_at is not None:
            return [f"{started}; its engine ended without recording its end, and it was "
                    f"torn down {utc_text(self.ended_at)}"]
        if self.ended_at is None:
            return [f"{started}; running, or its engine ended without a word"
                    + ("" if has_streams else ", and its streams are gone")]
        took = self.ended_at - self.started_at
        lines = [f"{started}; {self.outcome} {utc_text(self.ended_at)} after {took:.1f} s"]
        if self.torn_down:
            lines.append("its streams were deleted at its end (its dead letters stay)")
        elif self.kept:
            lines.append(self.kept)
        return lines


def utc_text(seconds: float) -> str:
    """A time since the epoch as an operator reads it: UTC, to the millisecond."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(RunRecord)


def run_record_key(run_id: str) -> str:
    """The ledger bucket's key of a run's record."""
    return RUN_RECORD_PREFIX + key_token(run_id)


async def _ledger(js: JetStreamContext, budget: Budget, bucket: str,
                  replicas: int) -> KeyValue:
    """The flow's ledger bucket, created when the flow has none yet as the KV ledger
    creates it (history 1, replicas copies: the same config, so two creating it at once
    both get the one bucket, NATS_FACTS §9)."""
    try:
        return await budget.run(js.key_value(bucket))
    except nats.js.errors.BucketNotFoundError:
        return await budget.run(js.create_key_value(bucket=bucket, history=1,
                                                    replicas=replicas))


def record_run(nats_url: str, record: RunRecord, *, replicas: int = 1,
               last: int | None = None, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> int:
    """Write record to its flow's ledger bucket, creating the bucket when the flow has
    none yet (as the KV ledger does: history 1, replicas copies), replacing the run's
    record before it.

    Arguments:
        nats_url: the broker.
        record: the run's record.
        replicas: the copies a clustered broker keeps of a bucket made here.
        last: replace only the record at this revision (the one the run wrote, or
            claimed its id with); None replaces whatever is there.
        timeout: overall bound in seconds, connect included.

    Returns:
        the record's revision.

    Raises:
        RevisionConflict: the record is no longer at revision last: a teardown ended
            it (its engine taken for dead), and a new run may hold the id since.
        BrokerUnavailable: the broker could not be reached, or did not take the record,
            within timeout.
        ValueError: an empty or reserved flow_id or run_id, or a bad timeout.
    """
    async def write(kv: KeyValue, key: str, value: bytes, budget: Budget) -> int:
        try:
            if last is None:
                return await budget.run(kv.put(key, value))
            return await budget.run(kv.update(key, value, last=last))
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise RevisionConflict(
                f"the record of run {record.run_id!r} of flow {record.flow_id!r} changed "
                "since this run wrote it: a teardown ended it, and a new run may hold its "
                "id now", key=key, expected_revision=last) from error

    return _write_record(nats_url, record, replicas, timeout, "recording", write)


def claim_run(nats_url: str, record: RunRecord, *, replicas: int = 1,
              timeout: float = DEFAULT_TIMEOUT_SECONDS) -> int:
    """Take record's run id for a new run: write record, the run's start, to its flow's
    ledger bucket only if no run holds the id, in one conditional write the broker
    decides (a KV create when the id has no record, else a compare-and-set on the
    revision of an ended run's record). Of runs that claim one id at once, exactly one
    gets it and the others RunExists.

    Whether the ended run's streams are gone is the caller's to check first (the
    engine's stream check): a kept run's streams hold its id as well.

    Arguments:
        nats_url: the broker.
        record: the new run's record ('running').
        replicas: the copies a clustered broker keeps of a bucket made here.
        timeout: overall bound in seconds, connect included.

    Returns:
        the record's revision, for the write of the run's end (record_run's last).

    Raises:
        RunExists: a run holds the id: its record has not ended (it is starting,
            running, or its engine ended without a word), or another run took it at the
            same moment.
        BrokerUnavailable: the broker could not be reached, or did not answer, within
            timeout. A claim whose answer was lost may have been stored all the same
            (NATS_FACTS S3): the id then stays held until a teardown ends its record.
        ValueError: an empty or reserved flow_id or run_id, or a bad timeout.
    """
    async def write(kv: KeyValue, key: str, value: bytes, budget: Budget) -> int:
        try:
            try:
                entry = await budget.run(kv.get(key))
            except nats.js.errors.KeyNotFoundError:  # none, or deleted
                return await budget.run(kv.create(key, value))
            held = _decoded(entry.value)
            if held is not None and held.ended_at is None:
                raise _held(held)
            # Ended (or not a record at all): free, unless it changes meanwhile.
            return await budget.run(kv.update(key, value, last=entry.revision))
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise RunExists(f"run {record.run_id!r} of flow {record.flow_id!r} was taken by "
                            "another run started at the same moment: a new run needs an "
                            "id of its own") from error

    return _write_record(nats_url, record, replicas, timeout, "claiming", write)


def _write_record(nats_url: str, record: RunRecord, replicas: int, timeout: float,
                  doing: str, write: Callable[[KeyValue, str, bytes, Budget],
                                              Awaitable[int]]) -> int:
    """record_run's and claim_run's part in common: the ids checked, the flow's ledger
    bucket (made when missing), the record's key and bytes handed to write, whose
    RunExists or RevisionConflict passes as it is and any other failure is the broker
    not taking the record (doing: what the message says was under way)."""
    subject_for(record.flow_id, record.run_id, "node")  # validates both
    bucket = ledger_bucket(record.flow_id)

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> int:
        js = nc.jetstream(timeout=max(budget.left(), 0.1))
        key, value = run_record_key(record.run_id), _ENCODER.encode(record)
        try:
            kv = await _ledger(js, budget, bucket, replicas)
            return await write(kv, key, value, budget)
        except (RunExists, RevisionConflict):
            raise
        except Exception as error:
            raise unavailable(f"{doing} run {record.run_id!r}", error, errors) from error

    return run_sync(nats_url, timeout, work)


def _held(record: RunRecord) -> RunExists:
    """The refusal of a new run's claim on the id record holds."""
    return RunExists(
        f"run {record.run_id!r} of flow {record.flow_id!r} is held by a run that started "
        f"{utc_text(record.started_at)} and has not ended (it is starting or running, or "
        "its engine ended without a word): a new run needs an id of its own; once that "
        f"engine is gone, `videoflow teardown --flow {record.flow_id} --run "
        f"{record.run_id}` ends it")


def _decoded(value: bytes | None) -> RunRecord | None:
    """The run record in value, None when it is not one."""
    try:
        return _DECODER.decode(value or b"")
    except msgspec.DecodeError:
        return None


async def end_lost_record(nc: Client, budget: Budget, flow_id: str,
                          run_id: str) -> RunRecord | None:
    """For a teardown: end the record of a run that still says 'running' (its engine
    ended without writing its end) as LOST, so `ls` shows how it ended and its id is
    free again. A run that left no record, or whose record ended, is left alone, as is
    one whose record changes meanwhile (its engine writing its end after all).

    Returns:
        the record written, None when none was.

    Raises:
        nats.errors.Error / TimeoutError: the broker did not answer.
    """
    js = nc.jetstream(timeout=max(budget.left(), 0.1))
    key = run_record_key(run_id)
    try:
        kv = await budget.run(js.key_value(ledger_bucket(flow_id)))
        entry = await budget.run(kv.get(key))
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return None
    held = _decoded(entry.value)
    if held is None or held.ended_at is not None:
        return None
    lost = msgspec.structs.replace(held, outcome=LOST, ended_at=time.time(), torn_down=True)
    try:
        await budget.run(kv.update(key, _ENCODER.encode(lost), last=entry.revision))
    except nats.js.errors.KeyWrongLastSequenceError:
        return None
    return lost


async def read_run_records(nc: Client, budget: Budget, bucket: str) -> list[RunRecord]:
    """Every run record of a flow's ledger bucket (naming.ledger_bucket), oldest first;
    none when there is no such bucket. A record that does not decode is left out.

    Raises:
        nats.errors.Error / TimeoutError: the broker did not answer.
    """
    js = nc.jetstream(timeout=max(budget.left(), 0.1))
    try:
        keys = await budget.run(present_keys(js, bucket, RUN_RECORD_PREFIX))
        kv = await budget.run(js.key_value(bucket))
    except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
        return []
    records = []
    for key in keys:
        try:
            entry = await budget.run(kv.get(key))
        except nats.js.errors.KeyNotFoundError:  # removed meanwhile
            continue
        try:
            records.append(_DECODER.decode(entry.value or b""))
        except msgspec.DecodeError:
            continue
    return sorted(records, key=lambda r: (r.started_at, r.run_id))


def run_records(nats_url: str, flow_id: str, *,
                timeout: float = DEFAULT_TIMEOUT_SECONDS) -> list[RunRecord]:
    """The run records of flow_id (read_run_records), oldest first, on their own
    connection.

    Raises:
        BrokerUnavailable: the broker could not be reached, or did not answer, within
            timeout.
        ValueError: an empty or reserved flow_id, or a bad timeout.
    """
    subject_for(flow_id, "run", "node")  # validates flow_id

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> list[RunRecord]:
        try:
            found = await read_run_records(nc, budget, ledger_bucket(flow_id))
            return [record for record in found if record.flow_id == flow_id]
        except Exception as error:
            raise unavailable(f"reading the runs of flow {flow_id!r}", error,
                              errors) from error

    return run_sync(nats_url, timeout, work)


def run_record(nats_url: str, flow_id: str, run_id: str, *,
               timeout: float = DEFAULT_TIMEOUT_SECONDS) -> RunRecord | Unknown | None:
    """The record run_id of flow_id left: None when it left none, Unknown when it
    could not be read (never taken for none).

    Raises:
        BrokerUnavailable: the broker could not be reached within timeout.
        ValueError: an empty or reserved flow_id or run_id, or a bad timeout.
    """
    subject_for(flow_id, run_id, "node")  # validates both

    async def work(nc: Client, budget: Budget,
                   errors: ErrorLog) -> RunRecord | Unknown | None:
        js = nc.jetstream(timeout=max(budget.left(), 0.1))
        try:
            kv = await budget.run(js.key_value(ledger_bucket(flow_id)))
            entry = await budget.run(kv.get(run_record_key(run_id)))
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
            return None
        except Exception as error:  # every failure is reported, never inferred
            return unknown_from(error, errors.texts())
        try:
            return _DECODER.decode(entry.value or b"")
        except msgspec.DecodeError as error:
            return Unknown("malformed", f"run record: {error}")

    return run_sync(nats_url, timeout, work)


RECORD_TIMEOUT_SECONDS: Final = 5.0
"""The bound on keep_record's write."""


def keep_record(nats_url: str, record: RunRecord, replicas: int = 1,
                last: int | None = None) -> int | None:
    """record_run, for the engine: a broker that does not take the record within
    RECORD_TIMEOUT_SECONDS, or a record another run took over since (last), is said on
    stderr, and the run goes on without it.

    Returns:
        the record's revision, or None when it was not kept.
    """
    try:
        return record_run(nats_url, record, replicas=replicas, last=last,
                          timeout=RECORD_TIMEOUT_SECONDS)
    except RevisionConflict as error:
        say(f"run {record.run_id}: its end was not recorded ({error})", level="WARNING")
    except BrokerUnavailable as error:
        say(f"run {record.run_id}: its record was not kept ({error}); `videoflow ls` "
            "will not list it once its streams are gone", level="WARNING")
    return None


def started_record(flow_id: str, run_id: str) -> RunRecord:
    """The record of a run starting now."""
    return RunRecord(flow_id=flow_id, run_id=run_id, outcome=RUNNING,
                     started_at=time.time())


def ended_record(record: RunRecord, outcome: str, torn_down: bool,
                 kept: str) -> RunRecord:
    """The record of a run ending now with outcome: its streams deleted (torn_down) or
    kept, and why (kept)."""
    return msgspec.structs.replace(record, outcome=outcome, ended_at=time.time(),
                                   torn_down=torn_down, kept=kept)


__all__ = [
    "LOST",
    "RECORD_TIMEOUT_SECONDS",
    "RUNNING",
    "RUN_RECORD_PREFIX",
    "RunRecord",
    "claim_run",
    "end_lost_record",
    "ended_record",
    "keep_record",
    "read_run_records",
    "record_run",
    "run_record",
    "run_record_key",
    "run_records",
    "started_record",
    "utc_text",
]
