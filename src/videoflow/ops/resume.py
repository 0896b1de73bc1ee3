"""Resuming a kept run: which of its nodes' replicas already ended their stream, read
from the end-of-stream markers on the run's own streams.

A BATCH run that did not finish — its broker gone past the outage budget, a failure,
a stop — keeps its streams (run_teardown.teardown_processed). Running the flow again
under the same run id with resume=True (`videoflow run … --resume RUN`) starts the
replicas that have not ended: their durables still hold what they had not settled, so
they take up where the run left off. A replica whose clean end-of-stream marker is on
its stream is not started again: its outputs and its end are already there.

What the failed run's replicas had received and not settled is leased to processes
that no longer exist: the broker would hand it out again only once ack_wait lapsed on
each (30 s by default), with the resumed replicas idle meanwhile once the rest is done.
release_leases makes those leases lapse at once: each durable still holding some gets a
short ack_wait for a moment (the server checks its pending deliveries again 100 ms
after a change of ack_wait), then its own back. A lapsed lease is redelivered first,
counted as a delivery like any lapse (max_deliver still holds), and what was acked is
not delivered again, unlike a consumer reset (ADR-60), which rewinds to the ack floor.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from videoflow.backends.jetstream.configs import LAPSE_HOLD_SECONDS, LAPSE_SECONDS
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import eos_subject_for, stream_name_for
from videoflow.errors import RunNotKept
from videoflow.ops.broker_calls import DEFAULT_TIMEOUT_SECONDS, Budget, run_sync, unavailable
from videoflow.wire.serialization import decode_envelope

_FETCH_BATCH = 256

_GIVE_BACK_SECONDS: Final = 2.0
"""The least time each durable's own ack_wait is given to be set back in."""


async def _clean_ends(nc: Client, budget: Budget, flow_id: str, run_id: str,
                      node: str) -> set[int]:
    """The replica ids whose clean end-of-stream marker is on node's stream (an abort
    is no end: that replica is started again)."""
    return {replica for _, replica, aborted in await _markers(nc, budget, flow_id, run_id,
                                                              node) if not aborted}


async def _markers(nc: Client, budget: Budget, flow_id: str, run_id: str,
                   node: str) -> list[tuple[int, int, bool]]:
    """The end-of-stream markers on node's stream: (stream sequence, replica id,
    whether it is an abort), in order.

    Raises:
        RunNotKept: node has no stream.
    """
    js = nc.jetstream(timeout=max(budget.left(), 0.1))
    stream = stream_name_for(flow_id, run_id, node)
    try:
        info = await budget.run(js.stream_info(
            stream, subjects_filter=eos_subject_for(flow_id, run_id, node)))
    except nats.js.errors.NotFoundError as error:
        raise RunNotKept(f"run {run_id!r} of flow {flow_id!r} has no stream for node "
                         f"{node!r} on this broker (it never ran here, was torn down, or "
                         "is another flow's): there is nothing to resume") from error
    if not sum((info.state.subjects or {}).values()):
        return []
    # An ephemeral reader, deleted once read: left to its inactive_threshold it would
    # count the resumed replicas' new end markers as pending, and a resumed run that
    # ends within the threshold would find its stream 'unprocessed' and be kept.
    reader = await budget.run(nc.jsm().add_consumer(stream, ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE,
        filter_subject=eos_subject_for(flow_id, run_id, node), mem_storage=True,
        num_replicas=1, inactive_threshold=5.0)))
    subscription = await budget.run(js.pull_subscribe_bind(reader.name, stream))
    found: list[tuple[int, int, bool]] = []
    try:
        while True:
            try:
                msgs = await subscription.fetch(_FETCH_BATCH, timeout=min(
                    1.0, max(budget.left(), 0.1)))
            except nats.errors.TimeoutError:
                return found
            for msg in msgs:
                marker = decode_envelope(msg.data)
                replica = marker.get("replica_id")
                ended = marker.get("is_stop_signal") or marker.get("is_abort")
                if ended and isinstance(replica, int):
                    found.append((msg.metadata.sequence.stream, replica,
                                  bool(marker.get("is_abort"))))
            if len(msgs) < _FETCH_BATCH:
                return found
    finally:
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            await subscription.unsubscribe()
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            # inactive_threshold removes it if this fails
            await asyncio.wait_for(nc.jsm().delete_consumer(stream, reader.name),
                                   max(min(budget.left(), 2.0), 0.5))


def drop_abort_markers(nats_url: str, flow_id: str, run_id: str, nodes: Iterable[str], *,
                       timeout: float = DEFAULT_TIMEOUT_SECONDS) -> int:
    """For a run about to be resumed, before any of its replicas starts: delete the
    abort markers on its nodes' streams. A resumed child reads its parents' markers
    from the start, and an abort there would end it again, although the replica that
    aborted is started again and ends its stream anew (clean ends stay: those replicas
    are not started again). The children's ledgers forget them too
    (runtime.forget_aborts).

    Returns:
        how many were deleted.

    Raises:
        RunNotKept: a node's stream is missing.
        BrokerUnavailable: the broker unreachable, or a marker could not be deleted.
    """
    names = list(nodes)

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> int:
        dropped = 0
        for node in names:
            stream = stream_name_for(flow_id, run_id, node)
            try:
                for seq, _, aborted in await _markers(nc, budget, flow_id, run_id, node):
                    if aborted:
                        await budget.run(nc.jsm().delete_msg(stream, seq))
                        dropped += 1
            except (nats.errors.Error, asyncio.TimeoutError) as error:
                raise unavailable(f"deleting the abort markers of {node!r} in run "
                                  f"{run_id!r}", error, errors) from error
        return dropped

    return run_sync(nats_url, timeout, work)


def ended_replicas(nats_url: str, flow_id: str, run_id: str, nodes: Iterable[str], *,
                   timeout: float = DEFAULT_TIMEOUT_SECONDS) -> dict[str, set[int]]:
    """Per node that has an output stream, the replicas that ended their stream cleanly.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the kept run.
        nodes: the nodes to look at (those with an output stream: not the sinks).
        timeout: overall bound in seconds, connect included.

    Raises:
        RunNotKept: a node's stream is missing (the run was torn down, never ran on
            this broker, or is another flow's: nothing to resume).
        BrokerUnavailable: the broker unreachable.
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


def release_leases(nats_url: str, flow_id: str, run_id: str, nodes: Iterable[str], *,
                   durables: Iterable[str] | None = None,
                   timeout: float = DEFAULT_TIMEOUT_SECONDS) -> int:
    """Make the leases a kept run's dead replicas still hold on its data durables lapse
    now, so a resumed run is handed their deliveries at once instead of after ack_wait
    (see the module docstring). Call it before any replica of the resumed run starts:
    a live replica's leases would lapse too (delivered twice, never lost).

    Only durables without a delivery cap (max_deliver unlimited, as the kv ledger's
    are): on a capped one, a lease on its last delivery would lapse into a
    max-deliveries advisory that no replica is there yet to hear, and its message
    would be neither processed nor dead-lettered. Those wait out ack_wait, as before.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the kept run.
        nodes: the nodes whose streams are read (those with an output stream).
        durables: only the data durables of these names (a restarted replica's, while
            the rest of the run goes on); None: every one.
        timeout: overall bound in seconds, connect included.

    Returns:
        how many deliveries were leased when they were made to lapse.

    Raises:
        BrokerUnavailable: the broker unreachable, or a durable's ack_wait could not be
            changed or given back. A durable left with the short one is harmless: no
            replica reads it before it binds, which sets its ack_wait back.
    """
    streams = [stream_name_for(flow_id, run_id, node) for node in nodes]
    only = None if durables is None else set(durables)

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> int:
        jsm = nc.jsm()
        holding: list[tuple[str, ConsumerConfig, float, int]] = []
        try:
            for stream in streams:
                for info in await _all_consumers(jsm, stream, budget):
                    config = info.config
                    name = config.durable_name or ""
                    if ("--from--" in name and (only is None or name in only)  # data
                            and info.num_ack_pending
                            and config.ack_policy == AckPolicy.EXPLICIT
                            and (config.max_deliver or -1) <= 0):
                        holding.append((stream, config, float(config.ack_wait or 0.0),
                                        info.num_ack_pending))
            if not holding:
                return 0
            changed: list[tuple[str, ConsumerConfig, float]] = []
            try:
                for stream, config, ack_wait, _held in holding:
                    # Counted as changed before it is sent: a request that timed out may
                    # have been applied all the same, and is given back too.
                    changed.append((stream, config, ack_wait))
                    config.ack_wait = LAPSE_SECONDS
                    await budget.run(jsm.add_consumer(stream, config))
                await asyncio.sleep(LAPSE_HOLD_SECONDS)  # whole, whatever the budget
            finally:
                # Each given back, even past the budget or after another failed.
                failed: BaseException | None = None
                for stream, config, ack_wait in changed:
                    config.ack_wait = ack_wait
                    try:
                        await asyncio.wait_for(jsm.add_consumer(stream, config),
                                               max(budget.left(), _GIVE_BACK_SECONDS))
                    except (nats.errors.Error, asyncio.TimeoutError) as error:
                        failed = failed or error
                if failed is not None:
                    raise failed
            return sum(held for *_, held in holding)
        except (nats.errors.Error, asyncio.TimeoutError) as error:
            raise unavailable(f"making the leases of run {run_id!r} lapse", error,
                              errors) from error

    return run_sync(nats_url, timeout, work)


async def _all_consumers(jsm: Any, stream: str, budget: Budget) -> list[Any]:
    """Every consumer of stream, page by page (the API answers 256 at most at a time:
    the per-process EOS durables of a run's dead processes can be that many)."""
    found: list[Any] = []
    while True:
        page = await budget.run(jsm.consumers_info(stream, offset=len(found)))
        found.extend(page)
        if not page:
            return found


__all__ = ["LAPSE_SECONDS", "drop_abort_markers", "ended_replicas", "release_leases"]
