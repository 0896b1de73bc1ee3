"""`videoflow dlq purge`: removing dead letters from the flow's dead-letter stream, by
sequence or by subject filter; the stream itself stays."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import nats.js.errors
from nats.aio.client import Client

from videoflow.broker.failures import JSErrorCode, not_found
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import dlq_stream_name
from videoflow.errors import BrokerUnavailable
from videoflow.ops.broker_calls import (
    API_PREFIX,
    DEFAULT_TIMEOUT_SECONDS,
    Budget,
    already_deleted,
    run_sync,
    unavailable,
)
from videoflow.ops.dead_letters import DeadLetterNotFound, dlq_selection


def _api_refusal(failure: object) -> nats.js.errors.APIError:
    """A JSON API "error" object as the APIError nats-py would have raised for it."""
    if isinstance(failure, dict):
        try:
            # from_error raises the mapped subclass (NotFoundError, BadRequestError, ...)
            nats.js.errors.APIError.from_error(failure)
        except nats.js.errors.APIError as refused:
            return refused
    return nats.js.errors.APIError(description=str(failure))


async def _purge_filter(nc: Client, flow_id: str, subject_filter: str, budget: Budget,
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
        raise unavailable(f"purging {name}", error, errors) from error
    failure = answer.get("error") if isinstance(answer, dict) else None
    if failure is not None:
        refused = _api_refusal(failure)
        if refused.err_code == JSErrorCode.STREAM_NOT_FOUND:
            raise DeadLetterNotFound(f"flow {flow_id!r} has no dead-letter stream {name}",
                                     flow_id=flow_id)
        raise unavailable(f"purging {name}", refused, errors)
    purged = answer.get("purged", 0) if isinstance(answer, dict) else None
    if not answer.get("success") or not isinstance(purged, int):
        raise BrokerUnavailable(f"purging {name}: unexpected answer {answer!r}")
    return purged


async def _purge_seqs(nc: Client, flow_id: str, seqs: Sequence[int], budget: Budget,
                      errors: ErrorLog) -> int:
    name = dlq_stream_name(flow_id)
    jsm = nc.jsm()
    removed = 0
    for seq in seqs:
        try:
            await budget.run(jsm.delete_msg(name, seq))
        except Exception as error:
            if already_deleted(error):
                continue  # already gone: nothing to remove
            if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
                raise DeadLetterNotFound(
                    f"flow {flow_id!r} has no dead-letter stream {name}",
                    flow_id=flow_id) from error
            raise unavailable(f"deleting seq {seq} of {name} ({removed} removed before)",
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
    subject_filter, wanted = dlq_selection(flow_id, run_id, node, seqs)

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> int:
        if wanted is None:
            return await _purge_filter(nc, flow_id, subject_filter, budget, errors)
        return await _purge_seqs(nc, flow_id, wanted, budget, errors)

    return run_sync(nats_url, timeout, work)
