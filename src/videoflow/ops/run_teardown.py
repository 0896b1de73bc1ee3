"""`videoflow teardown`: deleting every stream a run owns and purging its ledger
records, and ending the run's record when its engine never did (so its id is free
again); the flow's dead-letter stream is never touched. And the end of a BATCH run
(teardown_processed): torn down only once nothing of it is left unprocessed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import nats.js.errors
from nats.aio.client import Client

from videoflow.backends.jetstream.streams import delete_run_streams
from videoflow.backends.messaging import CleanupObservation, Known, Unknown
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import KIND_DURABLE, sanitize, subject_for
from videoflow.errors import BrokerUnavailable
from videoflow.ops.broker_calls import DEFAULT_TIMEOUT_SECONDS, Budget, run_sync, unavailable
from videoflow.ops.run_records import end_lost_record
from videoflow.ops.status import RunStatus, run_status


async def _purge_run_ledger(nc: Client, flow_id: str, run_id: str) -> None:
    """Purge the run's records from the flow's ledger bucket (its FlowRuntime keys);
    a flow whose replicas kept no ledger there has nothing to purge."""
    from videoflow.core.naming import ledger_bucket
    from videoflow.core.runtime_records import run_key_filter

    bucket = ledger_bucket(flow_id)
    try:
        await nc.jetstream().purge_stream(
            f"KV_{bucket}", subject=f"$KV.{bucket}.{run_key_filter(flow_id, run_id)}")
    except nats.js.errors.NotFoundError:
        pass


def teardown(
    nats_url: str, flow_id: str, run_id: str, *, end_record: bool = True,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> CleanupObservation:
    """Delete every stream the run owns, and with them their durables
    (delete_run_streams: exact ownership, never a name prefix), and purge the run's
    records from the flow's ledger bucket. The flow's dead-letter stream is never
    deleted (STREAM-8): its records outlive the run on purpose. Once every stream is
    gone, the run's shared-memory payloads on this host go too (clear_run_payloads),
    but for those its dead letters pin, and a run record that still says 'running' is
    ended as 'lost' (run_records.end_lost_record): its engine ended without a word, and
    the id it held is free again.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the run.
        end_record: end a 'running' run record; the engine, which writes its run's end
            itself, passes False.
        timeout: overall bound in seconds, connect included.

    Returns:
        CleanupObservation: removed (gone, already-gone included), remaining (deletes
        that failed) and complete. A run with nothing left is complete with nothing
        removed. complete is False when the inventory could not be read.

    Raises:
        BrokerUnavailable: the broker could not be reached, or teardown did not finish
            within timeout, or the run's record could not be ended (some streams may be
            gone; re-running is safe).
        ValueError: an empty or reserved flow_id or run_id, or a bad timeout.
    """
    subject_for(flow_id, run_id, "node")

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> CleanupObservation:
        try:
            cleanup = await budget.run(delete_run_streams(nc, flow_id, run_id))
            await budget.run(_purge_run_ledger(nc, flow_id, run_id))
            if end_record and cleanup.complete:
                try:
                    await end_lost_record(nc, budget, flow_id, run_id)
                except Exception as error:
                    raise unavailable(f"ending the record of run {run_id!r}", error,
                                      errors) from error
            return cleanup
        except asyncio.TimeoutError as error:
            raise BrokerUnavailable(
                f"teardown of run {run_id!r} of flow {flow_id!r} did not finish within "
                f"{timeout:g} s; re-running it is safe") from error

    cleanup = run_sync(nats_url, timeout, work)
    if cleanup.complete:
        clear_run_payloads(flow_id, run_id)
    return cleanup


def clear_run_payloads(flow_id: str, run_id: str) -> int:
    """Reclaim a run's shared-memory payloads on this host that no dead letter pins,
    and remove its folder (and its flow's, once no run is left in it) when nothing is
    left in it: what a run that was kept, or whose engine died, leaves in /dev/shm.
    A run that ran elsewhere, or whose payloads went by the object store, has none
    here.

    Arguments:
        flow_id / run_id: the run.

    Returns:
        How many payloads were reclaimed.
    """
    from videoflow.backends.shm_payload import SharedMemoryPayloadStore, shm_root

    folder = shm_root() / sanitize(flow_id) / sanitize(run_id)
    if not folder.is_dir():
        return 0
    with contextlib.suppress(FileNotFoundError):  # another teardown took it meanwhile
        return SharedMemoryPayloadStore(folder).clear()
    return 0


@dataclass(frozen=True, slots=True)
class RunTeardown:
    """How a run's end left its streams (teardown_processed).

    Attributes:
        torn_down: every stream the run owned is gone.
        kept: the streams left standing, because they still hold work nobody has
            processed, or because nothing could be read or deleted.
        unprocessed: per durable (stream/durable), the messages it has not settled
            yet (pending + ack pending), or why that is unknown.
        note: one sentence for the operator: what was kept and how to resume the run
            or delete it; '' when torn down.
        left_over: the run was kept with work left over: unprocessed inputs, a
            replayable producer not finished, or what is left could not be read (never
            taken for nothing). False when torn down, and when kept only because a
            delete failed once nothing was left.
    """

    torn_down: bool
    kept: tuple[str, ...] = ()
    unprocessed: dict[str, int | str] = field(default_factory=dict)
    note: str = ""
    left_over: bool = False


def unprocessed_work(status: RunStatus) -> dict[str, int | str] | None:
    """What a run's data durables have not settled yet: per durable with anything
    left, pending + ack pending, or why that could not be read (never taken for 0).
    End-of-stream durables and anchors are not work. None when the streams could not
    be listed at all."""
    if isinstance(status.streams, Unknown):
        return None
    left: dict[str, int | str] = {}
    for stream in status.streams:
        if isinstance(stream.durables, Unknown):
            left[stream.name] = f"unknown ({stream.durables.reason})"
            continue
        for durable in stream.durables:
            if durable.kind not in ("", KIND_DURABLE):
                continue
            counts = (durable.pending, durable.ack_pending)
            unread = [c for c in counts if isinstance(c, Unknown)]
            where = f"{stream.name}/{durable.name}"
            if unread:
                left[where] = f"unknown ({unread[0].reason})"
            else:
                total = sum(c.value for c in counts if isinstance(c, Known))
                if total:
                    left[where] = total
    return left


def teardown_processed(
    nats_url: str, flow_id: str, run_id: str, *, resume_hint: str = "",
    unfinished: Sequence[str] = (), end_record: bool = True,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> RunTeardown:
    """A BATCH run's end: tear it down (teardown) only once nothing of it is left
    unprocessed. A run that holds work nobody settled — it failed, was stopped, or lost
    its broker for longer than the outage budget — keeps every stream it owns, and its
    ledger records, so the run can be resumed and lose nothing; so does a run whose
    durables could not be read, and one a replayable producer did not finish (what it
    published was all processed, but a resume takes it up where it stopped). A broker
    that cannot be reached deletes nothing either.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the run.
        resume_hint: how to resume this run (e.g. the command line), quoted in the note.
        unfinished: the replayable producers that did not end their stream.
        end_record: as teardown's.
        timeout: overall bound in seconds of the reading and the deleting each.

    Returns:
        RunTeardown.
    """
    resume = resume_hint or f"run the flow again with resume={run_id!r}"
    delete = f"`videoflow teardown --flow {flow_id} --run {run_id}`"
    try:
        status = run_status(nats_url, flow_id, run_id, timeout=timeout)
    except BrokerUnavailable as error:
        return RunTeardown(False, note=(
            f"kept run {run_id}: its broker could not be reached to check or delete its "
            f"streams ({error}); once it is back, {resume}, or delete it with {delete}"),
            left_over=True)
    left = unprocessed_work(status)
    names = () if isinstance(status.streams, Unknown) else tuple(s.name for s in status.streams)
    if left is None or left or unfinished:
        why = []
        if left is None:
            why.append("its streams could not be listed")
        elif left:
            why.append("unprocessed: " + ", ".join(f"{k} {v}" for k, v in sorted(left.items())))
        if unfinished:
            why.append(f"not finished: {', '.join(unfinished)}, replayable")
        what = "; ".join(why)
        return RunTeardown(False, names, left or {}, note=(
            f"kept run {run_id} ({what}): {resume}, or delete it with {delete}"),
            left_over=True)
    try:
        cleanup = teardown(nats_url, flow_id, run_id, end_record=end_record,
                           timeout=timeout)
    except BrokerUnavailable as error:
        return RunTeardown(False, names, note=(
            f"run {run_id} was not torn down ({error}); delete it with {delete}"))
    if not cleanup.complete:
        return RunTeardown(False, tuple(cleanup.remaining), note=(
            f"run {run_id} was not wholly torn down (left: "
            f"{', '.join(cleanup.remaining) or 'unknown'}); delete it with {delete}"))
    return RunTeardown(True)
