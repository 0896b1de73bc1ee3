"""The broker half of topology: reading a run's streams back, creating streams and
durables idempotently with a read-back, and tearing a run down by exact ownership.

Part of videoflow.messaging.topology, which re-exports every public name here. Unlike
the pure submodules, everything here talks to a broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import nats
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, StreamConfig, StreamInfo, StreamsListIterator
from nats.js.manager import JetStreamManager

from videoflow.backends.jetstream.configs import (
    DEFAULT_REALTIME_BUFFER,
    consumer_config_for,
    dlq_stream_config,
    eos_anchor_config,
    stream_config_for,
)
from videoflow.backends.jetstream.verification import (
    STREAM_FIELDS,
    VerifiedConsumer,
    VerifiedStream,
    consumer_mismatches,
    stream_mismatches,
)
from videoflow.backends.messaging import CleanupObservation, Unknown, UnknownReason
from videoflow.broker.failures import observation_failure
from videoflow.broker.link import TRANSIENT_RETRY_SECONDS, servers_of, transient
from videoflow.broker.options import connect_options_for
from videoflow.core.compiler import CONSUMER, NodeSpec
from videoflow.core.constants import check_flow_type
from videoflow.core.credit import max_deliver_for, node_credit, positive_int
from videoflow.core.naming import (
    KIND_DLQ,
    LABEL_FLOW_ID,
    LABEL_GENERATION,
    LABEL_KIND,
    LABEL_NODE,
    LABEL_PREFIX,
    LABEL_RUN_ID,
    partitioned_durable_name_for,
    sanitize,
    stream_name_for,
    subject_for,
    subject_owner,
    user_metadata,
)

logger = logging.getLogger(__name__)

DEFAULT_READ_BACK_TIMEOUT_SECONDS: Final = 30.0
"""How long read_back_streams gives the broker, connect included, before every stream it
was asked about is reported Unknown('timeout')."""

STREAM_NOT_FOUND: Final = 10059
"""err_code of the NotFoundError for a stream that does not exist (NATS_FACTS §7)."""

STREAM_NAME_IN_USE: Final = 10058
"""err_code of add_stream for a name already in use with a different configuration."""

CLOSE_TIMEOUT_SECONDS: Final = 2.0
"""How long a short-lived observation connection is given to close."""


def _stream_missing(error: BaseException) -> bool:
    return (
        isinstance(error, nats.js.errors.NotFoundError)
        and error.err_code == STREAM_NOT_FOUND
    )


def _failure(error: BaseException, reported: Sequence[Any]) -> Unknown:
    reason, detail = observation_failure(error, [*reported])
    # observation_failure answers in the Unknown vocabulary (UNKNOWN_REASONS).
    return Unknown(cast(UnknownReason, reason), detail)


# --------------------------------------------------------------------------------------
# Read-back
# --------------------------------------------------------------------------------------


async def read_back_streams_async(
    js: JetStreamContext,
    flow_id: str,
    run_id: str,
    node_names: Sequence[str],
    flow_type: str,
    replicas: int = 1,
    generation: str | None = None,
    reported: Sequence[Any] = (),
) -> dict[str, VerifiedStream | Unknown]:
    """Read the streams of the named nodes back from a JetStream context, keyed by node.

    Each entry is a VerifiedStream whose requested is what provisioning asks for under
    this flow type (stream_config_for) and whose mismatches are the requested fields the
    broker does not honour, or an Unknown saying why nothing can be said: missing (the
    stream does not exist — a definite observation, kept apart from the unobservable
    ones), or timeout / auth / unreachable / api / malformed (observation_failure).

    stream_info returns the applied configuration (nats-py 2.15.0, nats/js/manager.py
    stream_info -> api.StreamInfo.config), and a stream that does not exist is
    nats.js.errors.NotFoundError (err_code 10059).

    Arguments:
        js: a JetStream context on a connected client.
        flow_id / run_id: the run.
        node_names: the nodes whose output streams to read.
        flow_type / replicas / generation: what provisioning requested, so
            VerifiedStream.mismatches is meaningful.
        reported: what the connection's error_cb has seen (a live list is read at the
            moment of each failure), so a permissions violation that arrives only
            there (NATS_FACTS S15) is classified auth rather than timeout.

    Returns:
        node name -> VerifiedStream or Unknown, in node_names order.

    Raises:
        ValueError: an unknown flow_type, a replica count below 1, or a bad name —
            before anything is asked of the broker.
    """
    requested = {
        node: stream_config_for(
            flow_id, run_id, node, flow_type, generation=generation, replicas=replicas
        )
        for node in node_names
    }
    result: dict[str, VerifiedStream | Unknown] = {}
    for node, config in requested.items():
        assert config.name is not None  # stream_config_for always names the stream
        try:
            info = await js.stream_info(config.name)
        except Exception as error:  # every failure is reported, never inferred
            if _stream_missing(error):
                result[node] = Unknown("missing", f"stream {config.name} does not exist")
            else:
                result[node] = _failure(error, reported)
            continue
        effective = info.config
        result[node] = VerifiedStream(config, effective, stream_mismatches(config, effective))
    return result


async def _read_back_connect(
    nats_url: str,
    flow_id: str,
    run_id: str,
    node_names: Sequence[str],
    flow_type: str,
    timeout: float,
    replicas: int,
    generation: str | None,
    fail_fast: bool,
) -> dict[str, VerifiedStream | Unknown]:
    nodes = list(dict.fromkeys(node_names))
    # Validate the request before the broker is involved: a bad name is a caller error.
    for node in nodes:
        stream_config_for(flow_id, run_id, node, flow_type, replicas=replicas)
    reported: list[BaseException] = []

    async def error_cb(error: BaseException) -> None:
        # The refusal and any permissions violation arrive only here (NATS_FACTS §8).
        reported.append(error)

    options = connect_options_for(timeout, fail_fast, error_cb)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        # S4: a refused connect can loop inside nats.connect; bound it ourselves.
        nc = await asyncio.wait_for(nats.connect(servers_of(nats_url), **options), timeout)
    except Exception as error:
        failed = _failure(error, reported)
        return {node: failed for node in nodes}
    try:
        js = nc.jetstream()
        return await asyncio.wait_for(
            read_back_streams_async(
                js, flow_id, run_id, nodes, flow_type, replicas=replicas,
                generation=generation, reported=reported,
            ),
            max(deadline - loop.time(), 0.0),
        )
    except Exception as error:  # the overall bound elapsed mid read-back
        failed = _failure(error, reported)
        return {node: failed for node in nodes}
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT_SECONDS)


def read_back_streams(
    nats_url: str,
    flow_id: str,
    run_id: str,
    node_names: Sequence[str],
    flow_type: str,
    timeout: float = DEFAULT_READ_BACK_TIMEOUT_SECONDS,
    replicas: int = 1,
    generation: str | None = None,
    fail_fast: bool = True,
) -> dict[str, VerifiedStream | Unknown]:
    """read_back_streams_async over a short-lived connection of its own — for a worker
    checking its channels before it opens, or the provision entrypoint checking what it
    just created — so nothing reaches into a messenger's live connection. A connect that
    fails within timeout reports every node as the same Unknown (observation_failure);
    nothing is ever inferred.

    Arguments:
        nats_url: the broker.
        flow_id / run_id: the run.
        node_names: the nodes whose output streams to read.
        flow_type / replicas / generation: what provisioning requested, so
            VerifiedStream.mismatches is meaningful.
        timeout: overall bound, connect included; when it elapses every node is
            Unknown('timeout') (or 'unreachable' when the refusals were reported).
        fail_fast: no reconnects (the operator's machine, a worker whose broker is
            already up); False lets the client retry a broker that is still starting,
            as the in-cluster provision Job does.

    Returns:
        node name -> VerifiedStream or Unknown (see read_back_streams_async).

    Raises:
        ValueError: a timeout that is not a finite number > 0, an unknown flow_type or
            a bad name.
        RuntimeError: when called from a running event loop (use
            read_back_streams_async there).
    """
    # Raises ValueError for a bad timeout before any loop is started.
    connect_options_for(timeout, fail_fast, _ignore_error)
    return asyncio.run(
        _read_back_connect(
            nats_url, flow_id, run_id, node_names, flow_type, timeout, replicas,
            generation, fail_fast,
        )
    )


async def _ignore_error(_e: BaseException) -> None:
    return None


# --------------------------------------------------------------------------------------
# Teardown
# --------------------------------------------------------------------------------------


def _run_tokens(flow_id: str, run_id: str) -> tuple[str, str]:
    # subject_for validates both parts (empty, reserved) exactly as provisioning did.
    tokens = subject_for(flow_id, run_id, "node").split(".")
    return tokens[1], tokens[2]


def owned_stream(
    config: StreamConfig,
    flow_id: str,
    run_id: str,
    node_names: Iterable[str] | None = None,
    generation: str | None = None,
) -> bool:
    """Whether a stream belongs to this run (and, when narrowed, to one of these nodes).

    A stream carrying RFC 0006 owner labels (any videoflow.io/ key; STREAM-14) is this
    run's iff the flow and run labels equal flow_id and run_id verbatim, and the
    generation label equals generation when one is given. An unlabelled stream is this
    run's iff every one of its subjects is a data or EOS subject (subject_owner) naming
    this flow and run token for token — never a name prefix, so run r-x is never taken
    for run r. With a generation, an unlabelled stream is never owned: it predates the
    labels, so no provisioning of that generation created it. A stream with a custom
    subject is not attributed at all.

    The flow's DLQ stream is never owned (STREAM-8): its labels carry no run id and its
    subject is not a data subject; its kind label is checked as well, belt and braces.

    Arguments:
        config: the stream's configuration as listed by the broker.
        flow_id / run_id: the run, as provisioning was given them (unsanitized).
        node_names: narrow ownership to these nodes' streams; None means every node.
        generation: require this provisioning generation.

    Returns:
        True iff delete_run_streams may delete the stream.
    """
    labels = user_metadata(config.metadata)
    nodes = None if node_names is None else set(node_names)
    if any(key.startswith(LABEL_PREFIX) for key in labels):
        if labels.get(LABEL_KIND) == KIND_DLQ:  # STREAM-8
            return False
        if labels.get(LABEL_FLOW_ID) != flow_id or labels.get(LABEL_RUN_ID) != run_id:
            return False
        if generation is not None and labels.get(LABEL_GENERATION) != generation:
            return False
        return nodes is None or labels.get(LABEL_NODE) in nodes
    if generation is not None:
        return False
    owners = {subject_owner(subject) for subject in (config.subjects or [])}
    if len(owners) != 1:
        return False  # no subjects, a custom subject, or several owners
    owner = owners.pop()
    if owner is None:
        return False
    flow_token, run_token = _run_tokens(flow_id, run_id)
    if (owner[0], owner[1]) != (flow_token, run_token):
        return False
    return nodes is None or owner[2] in {sanitize(n) for n in nodes}


async def _list_streams(jsm: JetStreamManager) -> list[StreamInfo]:
    """Every stream in the account, page by page (the server pages STREAM.LIST)."""
    infos: list[StreamInfo] = []
    while True:
        page = cast(StreamsListIterator, await jsm.streams_info_iterator(offset=len(infos)))
        got = list(page)
        infos.extend(got)
        if not got or len(infos) >= page.total:
            return infos


async def delete_run_streams(
    nc: Client,
    flow_id: str,
    run_id: str,
    node_names: Iterable[str] | None = None,
    generation: str | None = None,
) -> CleanupObservation:
    """Teardown: delete the streams this run owns — by exact ownership, never by name
    prefix — and report truthfully what happened.

    Ownership, per stream (owned_stream): a stream carrying RFC 0006 owner labels is
    this run's iff the labels equal (flow_id, run_id) verbatim (and generation, when
    given); an unlabelled stream is this run's iff its data subject names this run token
    for token. Neither can mistake run r-x for run r the way startswith('vf-{flow}-{run}-')
    did, and neither needs the graph: node_names ([spec.name for spec in specs]) only
    narrows the deletion to those nodes' streams, for a caller tearing down its own
    provisioning. Deleting a stream deletes its durables and EOS anchors with it.

    What is not attributed — and is therefore left standing, and not reported, since
    nothing on it says whose it is: an unlabelled stream provisioned with custom
    subjects by something other than this module. Nothing in-tree does that.

    The flow's dead-letter stream is deliberately never one of them (STREAM-8).
    Teardown runs in a finally on success, failure, stall and Ctrl-C alike, so deleting
    the DLQ here destroyed exactly the evidence an operator wants after a failed run. It
    ages out on its own retention instead, and videoflow dlq purge removes it on
    purpose.

    Arguments:
        nc: a connected nats client.
        flow_id / run_id: the run to tear down.
        node_names: narrow the deletion to these nodes' streams; None deletes every
            stream the run owns.
        generation: delete only what the provisioning of this generation created.

    Returns:
        CleanupObservation: removed are confirmed gone (a stream that was already gone
        counts), remaining are owned streams whose delete failed, and complete is False
        whenever anything remains or the inventory could not be read — a listing
        failure deletes nothing and is not "nothing to delete". Re-running is safe, and
        is the remedy.

    Raises:
        ValueError: an empty or reserved flow_id or run_id (nothing is listed).
    """
    _run_tokens(flow_id, run_id)
    nodes = None if node_names is None else tuple(node_names)
    jsm = nc.jsm()
    try:
        infos = await _list_streams(jsm)
    except Exception as error:
        reason, detail = observation_failure(error)
        logger.warning(
            "teardown of run %r of flow %r: the stream inventory could not be read "
            "(%s: %s); nothing was deleted", run_id, flow_id, reason, detail,
        )
        return CleanupObservation(removed=(), remaining=(), complete=False)
    owned = [
        info.config.name
        for info in infos
        if info.config.name
        and owned_stream(info.config, flow_id, run_id, nodes, generation)
    ]
    removed: list[str] = []
    remaining: list[str] = []
    for name in owned:
        try:
            await jsm.delete_stream(name)
        except Exception as error:
            if _stream_missing(error):
                removed.append(name)  # already gone: the goal holds
                continue
            reason, detail = observation_failure(error)
            logger.warning("teardown: stream %s was not deleted (%s: %s)", name, reason,
                           detail)
            remaining.append(name)
            continue
        removed.append(name)
    return CleanupObservation(
        removed=tuple(removed), remaining=tuple(remaining), complete=not remaining
    )


# --------------------------------------------------------------------------------------
# Idempotent create with read-back
# --------------------------------------------------------------------------------------


def _merged_stream_config(requested: StreamConfig, existing: StreamConfig) -> StreamConfig:
    """The full replacement update_stream needs (S6): the existing config with every
    field the request set laid over it, and user metadata merged rather than wiped."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(requested):
        value = getattr(requested, field.name)
        # A dataclass default (discard OLD, deny_delete False, ...) is not a request
        # unless the read-back compares the field; laying it over would undo settings
        # the stream was given on purpose.
        if value is None or (
            field.name not in STREAM_FIELDS and value == field.default
        ):
            continue
        changes[field.name] = value
    metadata = user_metadata(existing.metadata)
    metadata.update(user_metadata(requested.metadata))
    changes["metadata"] = metadata
    return existing.evolve(**changes)


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> VerifiedStream:
    """Create a stream idempotently, then read it back and report what the broker did
    not honour, rather than trusting the create's answer.

    add_stream with an identical config is a no-op; a name already in use with another
    config (err_code 10058) is updated by read-modify-write, because update_stream is a
    full replace that would reset every field the request left out (NATS_FACTS S6). An
    update the broker refuses (retention to or from WORK_QUEUE, storage type) is not
    raised: the stream as it stands is read back and its mismatches say what differs.

    Arguments:
        js: a JetStream context on a connected client.
        config: the requested stream (stream_config_for, dlq_stream_config); never
            mutated.

    Returns:
        VerifiedStream: effective None when the read-back itself failed, with the
        failure as the only mismatch.

    Raises:
        nats.js.errors.APIError and connection errors: the stream could not be created
            at all (e.g. replicas > 1 on a standalone server, 10074).
    """
    assert config.name is not None
    requested = config.evolve()
    try:
        await js.add_stream(requested.evolve())
    except nats.js.errors.BadRequestError as error:
        if error.err_code != STREAM_NAME_IN_USE:
            raise
        existing = (await js.stream_info(config.name)).config
        try:
            await js.update_stream(_merged_stream_config(requested, existing))
        except nats.js.errors.APIError as refused:
            logger.warning("stream %s exists with another config the broker will not "
                           "update to (%s)", config.name, refused)
    try:
        effective = (await js.stream_info(config.name)).config
    except Exception as error:
        reason, detail = observation_failure(error)
        return VerifiedStream(requested, None, (f"read-back failed ({reason}): {detail}",))
    return VerifiedStream(requested, effective, stream_mismatches(requested, effective))


async def ensure_consumer(
    js: JetStreamContext, stream: str, config: ConsumerConfig
) -> VerifiedConsumer:
    """Create or update a durable consumer idempotently, then read it back and report
    what the broker did not honour.

    add_consumer, never pull_subscribe: pull_subscribe silently binds to an existing
    durable and ignores the config it was given (NATS_FACTS S5), while add_consumer
    updates the editable fields. The broker is handed a copy, since nats-py mutates the
    ConsumerConfig it is given (S18). An update the broker refuses (a non-editable field
    such as filter_subject on some servers) is not raised: the durable as it stands is
    read back and its mismatches say what differs.

    Arguments:
        js: a JetStream context on a connected client.
        stream: the stream the durable reads.
        config: the requested durable (consumer_config_for, eos_anchor_config); never
            mutated.

    Returns:
        VerifiedConsumer: effective None when the read-back itself failed, with the
        failure as the only mismatch.

    Raises:
        nats.js.errors.NotFoundError: the stream does not exist (10059).
    """
    durable = config.durable_name or config.name
    assert durable is not None
    requested = config.evolve()
    try:
        await js.add_consumer(stream, requested.evolve())
    except nats.js.errors.APIError as error:
        if _stream_missing(error):
            raise
        logger.warning("durable %s on %s was not created or updated as requested (%s)",
                       durable, stream, error)
    try:
        effective = (await js.consumer_info(stream, durable)).config
    except Exception as error:
        reason, detail = observation_failure(error)
        return VerifiedConsumer(requested, None, (f"read-back failed ({reason}): {detail}",))
    return VerifiedConsumer(requested, effective, consumer_mismatches(requested, effective))


# --------------------------------------------------------------------------------------
# Provisioning a flow
# --------------------------------------------------------------------------------------

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
    (partitioned_durable_name_for) — with max_deliver from max_deliver_for(flow_type,
    max_retries, spec.delivery, ledger_budget) and max_ack_pending from
    node_credit(nb_tasks, partitioned, parents, join_policy, flow_type) -- consumer_credit
    over join_item_credit, with room for the publication window -- unless
    max_ack_pending is given (STREAM-15, MSG-017). Every stream and
    durable carries the owner labels, with generation when given (STREAM-14).

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
                # Room on the EOS subject for every replica's marker (REALTIME).
                realtime_buffer=max(DEFAULT_REALTIME_BUFFER, spec.nb_tasks),
            ))
            durables.append((
                stream_name_for(flow_id, run_id, spec.name),
                eos_anchor_config(flow_id, run_id, spec.name, generation=generation),
            ))
    for spec in by_name.values():
        if not spec.parents:
            continue
        deliver = max_deliver_for(flow_type, max_retries, spec.delivery, ledger_budget)
        credit = max_ack_pending
        if credit is None:  # STREAM-15 / MSG-017: the worker derives the same
            credit = node_credit(spec.nb_tasks, spec.partitioned, spec.parents,
                                 spec.join_policy, flow_type)
        for parent in spec.parents:
            config = consumer_config_for(
                flow_id, run_id, spec.name, parent, ack_wait=ack_wait,
                max_deliver=deliver, max_ack_pending=credit, generation=generation,
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
        max_retries: deployment-level retry count (VF_MAX_RETRIES) for max_deliver_for.
        ack_wait: seconds a data delivery stays leased before the broker redelivers it.
        max_ack_pending: broker-side credit per durable. None derives it from the
            consuming node's replica count and join working set (consumer_credit,
            STREAM-15).
        generation: provisioning generation recorded in the owner labels (RFC 0006), so
            delete_run_streams can be asked to remove only what this provisioning
            created. None leaves that label out.
        replicas: stream copies to request (a replicated broker profile's
            jetstream_replicas); read back and reported like every other field.
        ledger_budget: provision at-least-once durables with max_deliver = -1 because
            the workers' runtime ledger enforces the retry budget (max_deliver_for); the
            workers derive the same from the same store.

    Raises:
        TypeError / ValueError: as _flow_plan, before the broker is touched.
        nats.js.errors.APIError and connection errors: a stream or durable could not be
            created at all (e.g. replicas > 1 on a standalone server, 10074).
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


def _default_connect_options() -> dict[str, Any]:
    # Retry forever (max_reconnect_attempts -1; 0 would too, but says it less plainly):
    # the in-cluster provision Job's broker may still be starting (NATS_FACTS §8).
    return {
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": PROVISION_RECONNECT_WAIT_SECONDS,
        "error_cb": _log_connect_error,
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
        as provision_flow; and what nats.connect raises (NoServersError once its
        attempts run out, an auth error).
    """
    # A bad spec is reported now, not after waiting for a broker that may never come.
    _flow_plan(specs, flow_id, run_id, flow_type, **kwargs)
    options = {**_default_connect_options(), **(connect_options or {})}
    nc = await nats.connect(servers_of(nats_url), **options)
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
        as provision_flow_connect otherwise.
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
            f"provisioning run {run_id!r} of flow {flow_id!r} on {nats_url} did not "
            f"finish within {timeout:g} s (is the broker reachable?)"
        ) from None


__all__ = [
    "delete_run_streams",
    "provision_flow",
    "provision_flow_connect",
    "provision_flow_sync",
    "read_back_streams",
    "read_back_streams_async",
]
