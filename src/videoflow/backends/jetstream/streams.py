"""The broker half of topology: reading a run's streams back, creating streams and
durables idempotently with a read-back, and tearing a run down by exact ownership.

Everything here talks to a broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Final, cast

import nats
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, StreamConfig, StreamInfo, StreamsListIterator
from nats.js.manager import JetStreamManager

from videoflow.backends.jetstream.configs import (
    stream_config_for,
)
from videoflow.backends.jetstream.verification import (
    STREAM_FIELDS,
    VerifiedConsumer,
    VerifiedStream,
    consumer_mismatches,
    stream_mismatches,
)
from videoflow.backends.messaging import CleanupObservation, Unknown
from videoflow.broker.client import connect
from videoflow.broker.failures import JSErrorCode, not_found, observation_failure, unknown_from
from videoflow.broker.link import servers_of
from videoflow.broker.options import connect_options_for
from videoflow.core.constants import REALTIME
from videoflow.core.naming import (
    KIND_DLQ,
    LABEL_FLOW_ID,
    LABEL_GENERATION,
    LABEL_KIND,
    LABEL_NODE,
    LABEL_PREFIX,
    LABEL_RUN_ID,
    sanitize,
    subject_for,
    subject_owner,
    user_metadata,
)

logger = logging.getLogger(__name__)

DEFAULT_READ_BACK_TIMEOUT_SECONDS: Final = 30.0
"""How long read_back_streams gives the broker, connect included, before every stream it
was asked about is reported Unknown('timeout')."""

CLOSE_TIMEOUT_SECONDS: Final = 2.0
"""How long a short-lived observation connection is given to close."""


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
    this flow type (stream_config_for; a REALTIME stream's per-subject bound as the
    stream holds it, since it follows readers this call is not told of) and whose
    mismatches are the requested fields the broker does not honour, or an Unknown saying
    why nothing can be said: missing (the stream does not exist — a definite
    observation, kept apart from the unobservable ones), or timeout / auth /
    unreachable / api / malformed (observation_failure).

    stream_info returns the applied configuration (nats-py 2.15.0, nats/js/manager.py
    stream_info -> api.StreamInfo.config), and a stream that does not exist is
    nats.js.errors.NotFoundError (JSErrorCode.STREAM_NOT_FOUND).

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
            if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
                result[node] = Unknown("missing", f"stream {config.name} does not exist")
            else:
                result[node] = unknown_from(error, reported)
            continue
        effective = info.config
        held = effective.max_msgs_per_subject
        if flow_type == REALTIME and isinstance(held, int) and held >= 1:
            # A REALTIME stream's per-subject bound follows its readers and its
            # replicas (realtime_buffer_for), which a read-back by node name does not
            # know: it is requested as the stream holds it, and max_msgs with it.
            config = stream_config_for(flow_id, run_id, node, flow_type,
                                       generation=generation, replicas=replicas,
                                       realtime_buffer=held)
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

    options = connect_options_for(timeout, fail_fast, error_cb, nats_url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        # S4: a refused connect can loop inside nats.connect; bound it ourselves.
        nc = await asyncio.wait_for(connect(servers_of(nats_url), **options), timeout)
    except Exception as error:
        failed = unknown_from(error, reported)
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
        failed = unknown_from(error, reported)
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
            if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
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
    config (STREAM_NAME_IN_USE) is updated by read-modify-write, because update_stream is
    a full replace that would reset every field the request left out (NATS_FACTS S6). An
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
            at all (e.g. replicas > 1 on a standalone server, REPLICAS_UNSUPPORTED).
    """
    assert config.name is not None
    requested = config.evolve()
    try:
        await js.add_stream(requested.evolve())
    except nats.js.errors.BadRequestError as error:
        if error.err_code != JSErrorCode.STREAM_NAME_IN_USE:
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
        nats.js.errors.NotFoundError: the stream does not exist (STREAM_NOT_FOUND).
    """
    durable = config.durable_name or config.name
    assert durable is not None
    requested = config.evolve()
    try:
        await js.add_consumer(stream, requested.evolve())
    except nats.js.errors.APIError as error:
        if not_found(error, JSErrorCode.STREAM_NOT_FOUND):
            raise
        logger.warning("durable %s on %s was not created or updated as requested (%s)",
                       durable, stream, error)
    try:
        effective = (await js.consumer_info(stream, durable)).config
    except Exception as error:
        reason, detail = observation_failure(error)
        return VerifiedConsumer(requested, None, (f"read-back failed ({reason}): {detail}",))
    return VerifiedConsumer(requested, effective, consumer_mismatches(requested, effective))


__all__ = [
    "delete_run_streams",
    "read_back_streams",
    "read_back_streams_async",
]
