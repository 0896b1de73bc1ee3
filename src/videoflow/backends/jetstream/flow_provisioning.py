"""Provisioning a flow: every stream, durable, EOS anchor and the DLQ a run needs,
created idempotently and read back (provision_flow and its connect and sync forms),
made again while a cluster is between leaders.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from nats.aio.client import Client
from nats.js.api import ConsumerConfig, StreamConfig

from videoflow.backends.jetstream.configs import (
    consumer_config_for,
    dlq_stream_config,
    eos_anchor_config,
    stream_config_for,
)
from videoflow.backends.jetstream.streams import (
    CLOSE_TIMEOUT_SECONDS,
    ensure_consumer,
    ensure_stream,
)
from videoflow.broker.link import (
    TRANSIENT_RETRY_SECONDS,
    connect_or_refused,
    redact_url,
    transient,
)
from videoflow.broker.options import auth_options
from videoflow.core.compiler import CONSUMER, NodeSpec, node_plan
from videoflow.core.constants import check_flow_type
from videoflow.core.credit import positive_int, realtime_buffer_for
from videoflow.core.naming import (
    partitioned_durable_name_for,
    stream_name_for,
)

logger = logging.getLogger(__name__)


PROVISION_RECONNECT_WAIT_SECONDS: Final = 2.0
"""Seconds between connect attempts of the default (retry-forever) provisioning connect."""


@dataclass(frozen=True)
class _FlowPlan:
    """Everything provision_flow creates, in creation order: streams first (the flow's
    DLQ, then one output stream per publishing node), then every durable as
    (stream, config) — EOS interest anchors and data durables. Built without a broker,
    so a bad spec fails before anything is asked of one."""

    streams: tuple[StreamConfig, ...]
    durables: tuple[tuple[str, ConsumerConfig], ...]


def _checked_specs(specs: Sequence[NodeSpec]) -> dict[str, NodeSpec]:
    """The specs by name, after the checks that need the whole flow: distinct names,
    parents that exist and publish (a consumer has no output stream to read)."""
    by_name: dict[str, NodeSpec] = {}
    for spec in specs:
        if not isinstance(spec, NodeSpec):
            raise TypeError(f"specs must be NodeSpec instances, got {spec!r}")
        if spec.name in by_name:
            raise ValueError(f"node {spec.name!r} appears twice in the flow")
        by_name[spec.name] = spec
    for spec in by_name.values():
        for parent in spec.parents:
            if parent not in by_name:
                raise ValueError(f"node {spec.name!r}: parent {parent!r} is not in the flow")
            if not by_name[parent].publishes:
                raise ValueError(
                    f"node {spec.name!r}: parent {parent!r} is a {CONSUMER} and "
                    "publishes nothing"
                )
    return by_name


def _flow_plan(
    specs: Sequence[NodeSpec],
    flow_id: str,
    run_id: str,
    flow_type: str,
    max_retries: int = 3,
    ack_wait: int = 60,
    max_ack_pending: int | None = None,
    generation: str | None = None,
    replicas: int = 1,
    ledger_budget: bool = False,
) -> _FlowPlan:
    """What provision_flow will create for these specs, without a broker.

    Streams: the flow's DLQ (dlq_stream_config, STREAM-8: flow-scoped, kept a week)
    and, for every node that publishes (producers and processors; a consumer publishes
    nothing), its output stream (stream_config_for) — whether or not any node reads it,
    since its messenger publishes data and EOS there regardless.

    Durables, on the publishing node's stream: its EOS interest anchor
    (eos_anchor_config), so a BATCH stream retains an EOS published before the child's
    per-process EOS durable exists; and for every (consuming node, parent) edge one
    shared data durable (durable_name_for), or one per replica for a partitioned node
    (partitioned_durable_name_for) — with the max_deliver and max_ack_pending of the
    node's plan (NodeSpec.plan, what its replicas bind; STREAM-15, MSG-017), the latter
    unless max_ack_pending is given. A spec without a plan (built by hand) gets one
    from flow_type, max_retries and ledger_budget (node_plan). Every stream and durable
    carries the owner labels, with generation when given (STREAM-14).

    Arguments:
        as provision_flow.

    Returns:
        _FlowPlan.

    Raises:
        TypeError: a spec that is not a NodeSpec.
        ValueError: an unknown flow type, duplicate node names, a parent missing from
            the flow or one that publishes nothing, a bad name, or an ack_wait,
            max_retries, max_ack_pending or replica count out of range.
    """
    check_flow_type(flow_type)
    if isinstance(ack_wait, bool) or not isinstance(ack_wait, (int, float)) or not (
        0 < ack_wait < float("inf")
    ):
        raise ValueError(f"ack_wait must be a finite number of seconds > 0, got {ack_wait!r}")
    if max_ack_pending is not None:
        positive_int("max_ack_pending", max_ack_pending)
    by_name = _checked_specs(specs)
    streams = [dlq_stream_config(flow_id, replicas=replicas)]
    durables: list[tuple[str, ConsumerConfig]] = []
    for spec in by_name.values():
        if spec.publishes:
            streams.append(stream_config_for(
                flow_id, run_id, spec.name, flow_type, generation=generation,
                replicas=replicas,
                realtime_buffer=realtime_buffer_for(spec.nb_tasks, [
                    len(child.parents) for child in by_name.values()
                    if spec.name in child.parents]),
            ))
            durables.append((
                stream_name_for(flow_id, run_id, spec.name),
                eos_anchor_config(flow_id, run_id, spec.name, generation=generation),
            ))
    for spec in by_name.values():
        if not spec.parents:
            continue
        plan = spec.plan if spec.plan is not None else node_plan(  # STREAM-15, MSG-017
            flow_type, spec.parents, spec.nb_tasks, spec.partitioned, spec.join_policy,
            spec.delivery, max_retries=max_retries, ledger_budget=ledger_budget)
        credit = plan.credit if max_ack_pending is None else max_ack_pending
        for parent in spec.parents:
            config = consumer_config_for(
                flow_id, run_id, spec.name, parent, ack_wait=ack_wait,
                max_deliver=plan.max_deliver, max_ack_pending=credit,
                generation=generation,
            )
            stream = stream_name_for(flow_id, run_id, parent)
            if not spec.partitioned:
                durables.append((stream, config))
                continue
            for replica in range(spec.nb_tasks):
                durables.append((stream, config.evolve(
                    durable_name=partitioned_durable_name_for(spec.name, parent, replica)
                )))
    return _FlowPlan(streams=tuple(streams), durables=tuple(durables))


async def provision_flow(
    nc: Client,
    specs: list[NodeSpec],
    flow_id: str,
    run_id: str,
    flow_type: str,
    max_retries: int = 3,
    ack_wait: int = 60,
    max_ack_pending: int | None = None,
    generation: str | None = None,
    replicas: int = 1,
    ledger_budget: bool = False,
) -> None:
    """Idempotently create every stream and durable consumer a flow needs, before any
    worker publishes (_flow_plan says which).

    Required for BATCH: under INTEREST retention a message published with no registered
    consumer interest is discarded immediately, so the durables must exist first. Every
    resource is read back after creation (ensure_stream/ensure_consumer), so a broker
    that did not honour a requested field is reported — one warning per resource, on
    this module's logger — rather than trusted. Running it again with the same
    arguments changes nothing; with a changed credit or ack_wait it updates the
    durables in place.

    Arguments:
        nc: a connected nats client.
        specs: list of videoflow.core.compiler.NodeSpec.
        flow_id / run_id: the run.
        flow_type: REALTIME or BATCH.
        max_retries: deployment-level retry count (VF_MAX_RETRIES), for the
            max_deliver of a spec without a plan (max_deliver_for).
        ack_wait: seconds a data delivery stays leased before the broker redelivers it.
        max_ack_pending: broker-side credit per durable. None takes the consuming
            node's plan's, derived from its replica count and join working set
            (consumer_credit, STREAM-15).
        generation: provisioning generation recorded in the owner labels (RFC 0006), so
            delete_run_streams can be asked to remove only what this provisioning
            created. None leaves that label out.
        replicas: stream copies to request (a replicated broker profile's
            jetstream_replicas); read back and reported like every other field.
        ledger_budget: provision at-least-once durables of a spec without a plan
            with max_deliver = -1 because the workers' runtime ledger enforces the retry
            budget (max_deliver_for); a compiled spec's plan says the same
            (compile_flow's ledger_budget), and the workers bind it.

    Raises:
        TypeError, ValueError: as _flow_plan, before the broker is touched.
        nats.js.errors.APIError: a stream or durable could not be created at all (e.g.
            replicas > 1 on a standalone server, REPLICAS_UNSUPPORTED); the client's
            connection errors pass through likewise.
    """
    plan = _flow_plan(
        specs, flow_id, run_id, flow_type, max_retries=max_retries, ack_wait=ack_wait,
        max_ack_pending=max_ack_pending, generation=generation, replicas=replicas,
        ledger_budget=ledger_budget,
    )
    js = nc.jetstream()
    for stream_config in plan.streams:
        verified = await ensure_stream(js, stream_config)
        if verified.mismatches:
            logger.warning("provision: stream %s is not as requested: %s",
                           stream_config.name, "; ".join(verified.mismatches))
    for stream, consumer_config in plan.durables:
        consumer = await ensure_consumer(js, stream, consumer_config)
        if consumer.mismatches:
            logger.warning("provision: durable %s on %s is not as requested: %s",
                           consumer_config.durable_name, stream,
                           "; ".join(consumer.mismatches))
    logger.info("provisioned run %r of flow %r: %d streams, %d durables", run_id, flow_id,
                len(plan.streams), len(plan.durables))


async def _log_connect_error(error: BaseException) -> None:
    # One line per failed attempt instead of the client's default traceback: an
    # operator waiting on a provision Job sees why it waits.
    logger.warning("provision: nats: %s", error)


def _default_connect_options(nats_url: str) -> dict[str, Any]:
    # Retry forever (max_reconnect_attempts -1; 0 would too, but says it less plainly):
    # the in-cluster provision Job's broker may still be starting (NATS_FACTS §8). A
    # refusal of the credentials is not waited on (connect_or_refused).
    return {
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": PROVISION_RECONNECT_WAIT_SECONDS,
        "error_cb": _log_connect_error,
        **auth_options(nats_url),
    }


async def provision_flow_connect(
    nats_url: str,
    specs: list[NodeSpec],
    flow_id: str,
    run_id: str,
    flow_type: str,
    connect_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> None:
    """Connects to NATS, provisions, and drains — a self-contained entrypoint.

    Arguments:
        nats_url: the broker.
        specs / flow_id / run_id / flow_type: as provision_flow.
        connect_options: extra kwargs for nats.connect, laid over the default (retry
            forever, two seconds apart, one log line per failed attempt). The default is
            right for the in-cluster provision Job, whose broker may still be starting;
            a local run passes fail-fast options instead so an unreachable broker
            reports itself rather than hanging. Note that nats.connect retries a refused
            server regardless of allow_reconnect (NATS_FACTS S4): only
            max_reconnect_attempts > 0, or provision_flow_sync's timeout, bounds it.
        **kwargs: provision_flow's keyword arguments.

    Raises:
        CredentialsRefused: the broker refused the credentials (at once, not retried).
        nats.errors.NoServersError: nats.connect's attempts ran out; what else
            nats.connect or provision_flow raises passes through.
    """
    # A bad spec is reported now, not after waiting for a broker that may never come.
    _flow_plan(specs, flow_id, run_id, flow_type, **kwargs)
    options = {**_default_connect_options(nats_url), **(connect_options or {})}
    nc = await connect_or_refused(nats_url, **options)
    try:
        await _provision_riding(nc, specs, flow_id, run_id, flow_type, **kwargs)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT_SECONDS)
        raise
    await nc.drain()


async def _provision_riding(nc: Client, specs: list[NodeSpec], flow_id: str, run_id: str,
                            flow_type: str, **kwargs: Any) -> None:
    """provision_flow, made again while it fails transiently for up to
    TRANSIENT_RETRY_SECONDS: a cluster electing its meta leader (a node just lost)
    answers JetStream requests with a timeout or a 503 for a few seconds, and
    provisioning reconciles what exists, so doing it again is safe."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        try:
            await provision_flow(nc, specs, flow_id, run_id, flow_type, **kwargs)
            return
        except Exception as error:
            cause = error if transient(error) else error.__cause__
            if (cause is None or not transient(cause)
                    or loop.time() - started > TRANSIENT_RETRY_SECONDS):
                raise
            logger.warning("provisioning run %r of flow %r: %s; trying again", run_id,
                           flow_id, error)
            await asyncio.sleep(PROVISION_RETRY_SECONDS)


PROVISION_RETRY_SECONDS: Final = 0.5
"""The wait before provisioning is made again after a transient failure."""


def provision_flow_sync(
    nats_url: str,
    specs: list[NodeSpec],
    flow_id: str,
    run_id: str,
    flow_type: str,
    connect_options: dict[str, Any] | None = None,
    timeout: float | None = None,
    **kwargs: Any,
) -> None:
    """Synchronous wrapper for callers outside an event loop (the local engine, the init
    entrypoint): provision_flow_connect on a loop of its own.

    Arguments:
        nats_url / specs / flow_id / run_id / flow_type / connect_options / **kwargs:
            as provision_flow_connect.
        timeout: overall bound in seconds, connect included, or None (the default) to
            wait indefinitely. nats.connect retries an unreachable server forever —
            allow_reconnect/max_reconnect_attempts only govern reconnects after a
            successful connect — so a caller that would rather report the problem than
            block must set this. Provisioning cut short by it is safe to run again.

    Raises:
        TimeoutError: when timeout elapses first.
        ValueError: a timeout that is not None or a finite number > 0, or a bad spec
            (as _flow_plan), before anything connects.
        RuntimeError: when called from a running event loop (await
            provision_flow_connect there).
        CredentialsRefused, nats.errors.NoServersError: as provision_flow_connect,
            whose other errors pass through too.
    """
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < float("inf")
    ):
        raise ValueError(f"timeout must be None or a finite number > 0, got {timeout!r}")
    _flow_plan(specs, flow_id, run_id, flow_type, **kwargs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "provision_flow_sync cannot run inside an event loop; await "
            "provision_flow_connect instead"
        )
    asyncio.run(_provision_bounded(
        nats_url, specs, flow_id, run_id, flow_type, connect_options, timeout, kwargs
    ))


async def _provision_bounded(
    nats_url: str,
    specs: list[NodeSpec],
    flow_id: str,
    run_id: str,
    flow_type: str,
    connect_options: dict[str, Any] | None,
    timeout: float | None,
    kwargs: dict[str, Any],
) -> None:
    work = provision_flow_connect(
        nats_url, specs, flow_id, run_id, flow_type, connect_options, **kwargs
    )
    if timeout is None:
        await work
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        await asyncio.wait_for(work, timeout)
    except asyncio.TimeoutError:
        if loop.time() < deadline:
            raise  # a request inside timed out on its own: reported as itself
        raise TimeoutError(
            f"provisioning run {run_id!r} of flow {flow_id!r} on {redact_url(nats_url)} did not "
            f"finish within {timeout:g} s (is the broker reachable?)"
        ) from None


__all__ = [
    "PROVISION_RECONNECT_WAIT_SECONDS",
    "PROVISION_RETRY_SECONDS",
    "provision_flow",
    "provision_flow_connect",
    "provision_flow_sync",
]
