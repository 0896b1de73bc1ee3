"""`videoflow teardown`: deleting every stream a run owns and purging its ledger
records; the flow's dead-letter stream is never touched."""

from __future__ import annotations

import asyncio

import nats.js.errors
from nats.aio.client import Client

from videoflow.backends.messaging import CleanupObservation
from videoflow.errors import BrokerUnavailable
from videoflow.messaging.jetstream_loop import ErrorLog
from videoflow.messaging.naming import subject_for
from videoflow.messaging.provisioning import delete_run_streams
from videoflow.ops._broker import DEFAULT_TIMEOUT_SECONDS, _Budget, _run_sync


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
