"""Resuming a kept run: which of its nodes' replicas already ended their stream, read
from the end-of-stream markers on the run's own streams.

A BATCH run that did not finish — its broker gone past the outage budget, a failure,
a stop — keeps its streams (run_teardown.teardown_processed). Running the flow again
under the same run id with resume=True (`videoflow run … --resume RUN`) starts the
replicas that have not ended: their durables still hold what they had not settled, so
they take up where the run left off. A replica whose clean end-of-stream marker is on
its stream is not started again: its outputs and its end are already there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import eos_subject_for, stream_name_for
from videoflow.errors import BrokerUnavailable
from videoflow.ops.broker_calls import DEFAULT_TIMEOUT_SECONDS, Budget, run_sync, unavailable
from videoflow.wire.serialization import decode_envelope

_FETCH_BATCH = 256


async def _clean_ends(nc: Client, budget: Budget, flow_id: str, run_id: str,
                      node: str) -> set[int]:
    """The replica ids whose clean end-of-stream marker is on node's stream (an abort
    is no end: that replica is started again)."""
    js = nc.jetstream(timeout=max(budget.left(), 0.1))
    stream = stream_name_for(flow_id, run_id, node)
    try:
        info = await budget.run(js.stream_info(
            stream, subjects_filter=eos_subject_for(flow_id, run_id, node)))
    except nats.js.errors.NotFoundError as error:
        raise BrokerUnavailable(f"run {run_id!r} of flow {flow_id!r} has no stream for "
                                f"node {node!r}: it cannot be resumed") from error
    if not sum((info.state.subjects or {}).values()):
        return set()
    # An ephemeral reader, deleted once read: left to its inactive_threshold it would
    # count the resumed replicas' new end markers as pending, and a resumed run that
    # ends within the threshold would find its stream 'unprocessed' and be kept.
    reader = await budget.run(nc.jsm().add_consumer(stream, ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
        filter_subject=eos_subject_for(flow_id, run_id, node), mem_storage=True,
        num_replicas=1, inactive_threshold=5.0)))
    subscription = await budget.run(js.pull_subscribe_bind(reader.name, stream))
    ended: set[int] = set()
    try:
        while True:
            try:
                msgs = await subscription.fetch(_FETCH_BATCH, timeout=min(
                    1.0, max(budget.left(), 0.1)))
            except nats.errors.TimeoutError:
                return ended
            for msg in msgs:
                marker = decode_envelope(msg.data)
                if marker.get("is_stop_signal") and not marker.get("is_abort"):
                    replica = marker.get("replica_id")
                    if isinstance(replica, int):
                        ended.add(replica)
            if len(msgs) < _FETCH_BATCH:
                return ended
    finally:
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            await subscription.unsubscribe()
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            # inactive_threshold removes it if this fails
            await asyncio.wait_for(nc.jsm().delete_consumer(stream, reader.name),
                                   max(min(budget.left(), 2.0), 0.5))


def ended_replicas(nats_url: str, flow_id: str, run_id: str, nodes: Iterable[str], *,
                   timeout: float = DEFAULT_TIMEOUT_SECONDS) -> dict[str, set[int]]:
    """Per node that has an output stream, the replicas that ended their stream cleanly.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the kept run.
        nodes: the nodes to look at (those with an output stream: not the sinks).
        timeout: overall bound in seconds, connect included.

    Raises:
        BrokerUnavailable: the broker unreachable, or a node's stream missing (the run
            was torn down, or never provisioned: nothing to resume).
    """
    names = list(nodes)

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> dict[str, set[int]]:
        ended: dict[str, set[int]] = {}
        for node in names:
            try:
                ended[node] = await _clean_ends(nc, budget, flow_id, run_id, node)
            except (nats.errors.Error, asyncio.TimeoutError) as error:
                raise unavailable(f"reading the ends of {node!r} in run {run_id!r}",
                                   error, errors) from error
        return ended

    return run_sync(nats_url, timeout, work)


__all__ = ["ended_replicas"]
