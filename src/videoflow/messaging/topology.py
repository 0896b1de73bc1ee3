"""Broker topology: naming, JetStream stream/consumer configuration, and up-front
provisioning of a flow's streams and durable consumers.

Everything that decides how a message routes — subject names, stream names, durable
names, and the retention/discard policies that give REALTIME vs BATCH their semantics —
lives here, so the messenger, the compiler, the manifests, and the provisioning
entrypoint all agree on one source of truth.

Naming is scoped by flow_id and run_id so that re-running or redeploying a flow gets a
fresh set of streams instead of colliding with the previous run's durables.

Ownership is a separate question from naming, and this module answers it too. Names
are hyphen-joined and hyphens are legal inside every part, so a stream name alone
cannot say where the run ends and the node begins: vf-f-r-x-n is node x-n of run r and
node n of run r-x. Two things make ownership exact anyway. Every stream and durable is
created with owner labels in its JetStream metadata (videoflow.io/flow-id, run-id,
node, kind, generation; RFC 0006 STREAM-14) that teardown compares verbatim. For
streams that predate the labels, the stream's own data subject is the authority:
subjects are dot-delimited and sanitize never lets a dot through, so vf.f.r.x-n and
vf.f.r-x.n are distinct strings — teardown reads the run out of the subject token,
never out of a name prefix.

This module holds the pure half (names, configs, credits, profile checks); nothing in
it needs a broker.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StreamConfig,
)

from videoflow.backends.messaging import (
    LIVE_LATEST,
    PROFILES,
    RELIABLE_WORK,
    ProfileRequest,
    Unknown,
)
from videoflow.core.constants import FLOW_TYPES, REALTIME
from videoflow.core.policies import DeliveryPolicy, JoinPolicy
from videoflow.errors import BrokerUnavailable, IncompatibleProfile, UnobservableState

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------

DEFAULT_ITEM_CREDIT: Final = 1
"""Inputs one replica holds in processing at a time."""

DEFAULT_PREFETCH: Final = 4
"""Deliveries a worker parks locally per subscription beyond the one it is processing,
so the next input is already in hand when the current one settles."""

DEFAULT_MAX_ACK_PENDING: Final = 8
"""The broker-side max_ack_pending provisioning used before RFC 0006 (STREAM-15 replaced
it with consumer_credit); kept as the reviewed value the conformance negative controls
reproduce."""

LEGACY_BIND_CREDIT: Final = DEFAULT_PREFETCH + 2
"""The max_ack_pending a worker bound its durable with before RFC 0006 (its local queue
depth plus two); kept for the same reason."""

DEFAULT_REALTIME_BUFFER: Final = 1
"""REALTIME keeps only the freshest N messages per node and never blocks the producer (a
new publish evicts the oldest). BATCH uses INTEREST retention so acked messages are
freed, bounding the backlog to unacked messages; a full stream then rejects new
publishes (DiscardPolicy.NEW), which the publisher turns into blocking backpressure
instead of silent loss."""

DEFAULT_BATCH_MAX_MSGS: Final = 10_000
"""Unacknowledged messages a BATCH stream holds before it refuses new publishes."""

DUPLICATE_WINDOW_SECONDS: Final = 120.0
"""How long the broker remembers a Nats-Msg-Id for publish deduplication."""

DLQ_RETENTION_SECONDS: Final = 7 * 24 * 3600
"""How long dead letters are retained (STREAM-8): the forensic and replay horizon a dead
letter's payload obligation must cover too (BLOB-14 step 3)."""

DEFAULT_READ_BACK_TIMEOUT_SECONDS: Final = 30.0
"""How long read_back_streams gives the broker, connect included, before every stream it
was asked about is reported Unknown('timeout')."""

EOS_ACK_WAIT_SECONDS: Final = 30
"""ack_wait of the EOS durables: an EOS marker is acked as soon as it is seen."""

SUBJECT_ROOT: Final = "vf"
"""First token of every subject and first part of every stream name."""

EOS_TOKEN: Final = "_eos"
DLQ_TOKEN: Final = "_dlq"
CONTROL_TOKEN: Final = "_control"
RESERVED_TOKENS: Final = (EOS_TOKEN, DLQ_TOKEN, CONTROL_TOKEN)
"""Subject tokens this module writes itself. A flow, run or node whose sanitized name is
one of them would make a data subject indistinguishable from an EOS, DLQ or control
subject, so naming refuses it."""

# Owner labels (RFC 0006 STREAM-14), recorded verbatim (unsanitized) in metadata.
LABEL_PREFIX: Final = "videoflow.io/"
LABEL_FLOW_ID: Final = LABEL_PREFIX + "flow-id"
LABEL_RUN_ID: Final = LABEL_PREFIX + "run-id"
LABEL_NODE: Final = LABEL_PREFIX + "node"
LABEL_KIND: Final = LABEL_PREFIX + "kind"
LABEL_GENERATION: Final = LABEL_PREFIX + "generation"

KIND_STREAM: Final = "stream"
KIND_DURABLE: Final = "durable"
KIND_EOS_DURABLE: Final = "eos_durable"
KIND_EOS_ANCHOR: Final = "eos_anchor"
KIND_DLQ: Final = "dlq"

SERVER_METADATA_PREFIX: Final = "_nats."
"""Metadata keys nats-server adds on its own (_nats.level, _nats.req.level, _nats.ver);
never part of a comparison (NATS_FACTS S7)."""


# --------------------------------------------------------------------------------------
# Naming
# --------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def sanitize(value: str) -> str:
    """A name part made safe for subjects, stream names and durable names.

    Every run of characters outside [A-Za-z0-9_-] becomes one '_': dots (the subject
    delimiter), wildcards ('*', '>'), whitespace and path separators never get through.

    Arguments:
        value (str): a flow id, run id, node name or instance id.

    Returns:
        The sanitized part ('' for '').

    Raises:
        TypeError: if value is not a str.
    """
    if not isinstance(value, str):
        raise TypeError(f"name parts must be str, got {value!r}")
    return _UNSAFE.sub("_", value)


def _part(what: str, value: str) -> str:
    token = sanitize(value)
    if not token:
        raise ValueError(f"{what} must be a non-empty name, got {value!r}")
    if token in RESERVED_TOKENS:
        raise ValueError(f"{what} {value!r} is reserved (one of {RESERVED_TOKENS})")
    return token


def subject_for(flow_id: str, run_id: str, node_name: str) -> str:
    """The data subject a node publishes on: vf.{flow}.{run}.{node}.

    Raises:
        ValueError: for an empty or reserved part (RESERVED_TOKENS).
    """
    return ".".join(
        (SUBJECT_ROOT, _part("flow_id", flow_id), _part("run_id", run_id),
         _part("node_name", node_name))
    )


def eos_subject_for(flow_id: str, run_id: str, node_name: str) -> str:
    """The EOS subject of a node: vf.{flow}.{run}.{node}._eos, on the node's own stream.

    Data consumers filter to the data subject and never see EOS markers; each consuming
    replica observes EOS through its own durable (eos_consumer_config).
    """
    return f"{subject_for(flow_id, run_id, node_name)}.{EOS_TOKEN}"


def control_subject_for(flow_id: str, run_id: str) -> str:
    """The run's control subject: vf.{flow}.{run}._control.stop (core NATS, no stream)."""
    return ".".join(
        (SUBJECT_ROOT, _part("flow_id", flow_id), _part("run_id", run_id), CONTROL_TOKEN,
         "stop")
    )


def stream_name_for(flow_id: str, run_id: str, node_name: str) -> str:
    """The stream holding a node's output: vf-{flow}-{run}-{node}.

    Hyphen-joined, so not an ownership record (see subject_owner and the owner labels).
    """
    return "-".join(
        (SUBJECT_ROOT, _part("flow_id", flow_id), _part("run_id", run_id),
         _part("node_name", node_name))
    )


def stream_label_selector(flow_id: str, run_id: str) -> str:
    """Prefix shared by every stream of one run.

    Diagnostic only: it is also the prefix of every stream of run {run}-x, so
    delete_run_streams never selects on it — ownership comes from owner metadata or from
    the subject tokens (subject_owner). Enumerated by backends.identity.derived_names.
    """
    return f"{SUBJECT_ROOT}-{_part('flow_id', flow_id)}-{_part('run_id', run_id)}-"


def durable_name_for(consumer_node_name: str, parent_node_name: str) -> str:
    """The shared data durable of one (child, parent) edge: {child}--from--{parent}.

    Durables live on the run-scoped parent stream, so they carry no run id. Replicas of
    one consuming node share it (competing consumers); distinct children of one parent
    get distinct durables (fan-out).
    """
    child = _part("consumer_node_name", consumer_node_name)
    return f"{child}--from--{_part('parent_node_name', parent_node_name)}"


def partitioned_durable_name_for(
    consumer_node_name: str, parent_node_name: str, replica_id: int
) -> str:
    """The per-replica data durable of a partitioned node: {child}--from--{parent}--p{id}.

    Raises:
        ValueError: if replica_id is not an int >= 0.
    """
    if isinstance(replica_id, bool) or not isinstance(replica_id, int) or replica_id < 0:
        raise ValueError(f"replica_id must be an int >= 0, got {replica_id!r}")
    return f"{durable_name_for(consumer_node_name, parent_node_name)}--p{replica_id}"


def eos_durable_name_for(consumer_node_name: str, parent_node_name: str, instance_id: str) -> str:
    """The per-replica EOS durable: {child}--eos--{parent}--{instance}.

    One per consuming replica, so every replica observes EOS (a shared durable would
    hand the marker to one of them only).
    """
    child = _part("consumer_node_name", consumer_node_name)
    parent = _part("parent_node_name", parent_node_name)
    return f"{child}--eos--{parent}--{_part('instance_id', instance_id)}"


def eos_anchor_durable_name_for(node_name: str) -> str:
    """The provision-time interest anchor on a node's EOS subject (see eos_anchor_config)."""
    return f"{_part('node_name', node_name)}--eos--anchor"


def dlq_stream_name(flow_id: str) -> str:
    """The dead-letter stream, scoped to the flow rather than the run: vf-{flow}-dlq.

    Everything else about a run is disposable and is deleted with it; dead letters are
    the opposite — they are the forensic record of what went wrong, and they are most
    wanted precisely after a run that failed and was torn down (STREAM-8). The run id
    lives in the subject instead, so entries stay attributable and filterable.
    """
    return f"{SUBJECT_ROOT}-{_part('flow_id', flow_id)}-dlq"


def dlq_subject_for(flow_id: str, run_id: str, node_name: str) -> str:
    """vf.{flow}._dlq.{run}.{node} — filterable by run, by node, or by both."""
    return ".".join(
        (SUBJECT_ROOT, _part("flow_id", flow_id), DLQ_TOKEN, _part("run_id", run_id),
         _part("node_name", node_name))
    )


def dlq_subject_filter(
    flow_id: str, run_id: str | None = None, node_name: str | None = None
) -> str:
    """A subject wildcard selecting dead letters for inspection: the whole flow, one run
    of it, or one node of one run. Used by videoflow dlq.

    Arguments:
        flow_id (str): the flow.
        run_id (str | None): one run, or None for every run.
        node_name (str | None): one node, or None for every node.

    Returns:
        vf.{flow}._dlq.> for the flow, vf.{flow}._dlq.{run}.* for a run,
        vf.{flow}._dlq.*.{node} for a node across runs, vf.{flow}._dlq.{run}.{node} for
        both.
    """
    flow = _part("flow_id", flow_id)
    if run_id is None and node_name is None:
        return f"{SUBJECT_ROOT}.{flow}.{DLQ_TOKEN}.>"
    run = "*" if run_id is None else _part("run_id", run_id)
    node = "*" if node_name is None else _part("node_name", node_name)
    return f"{SUBJECT_ROOT}.{flow}.{DLQ_TOKEN}.{run}.{node}"


def subject_owner(subject: str) -> tuple[str, str, str] | None:
    """The (flow, run, node) tokens a data or EOS subject encodes — sanitized, exactly as
    subject_for/eos_subject_for wrote them — or None for any other subject (control,
    DLQ, wildcards, foreign).

    This is the one place a run boundary is exact without metadata: subject tokens are
    dot-delimited and sanitize never lets a dot through, so vf.f.r.x-n (run r, node x-n)
    and vf.f.r-x.n (run r-x, node n) are different strings although both hyphen-join to
    the stream name vf-f-r-x-n. delete_run_streams attributes streams that predate owner
    labels with it.

    Arguments:
        subject (str): a subject as a stream lists it.

    Returns:
        (flow, run, node), or None.
    """
    if not isinstance(subject, str):
        return None
    tokens = subject.split(".")
    if len(tokens) == 5 and tokens[4] == EOS_TOKEN:
        tokens = tokens[:4]
    if len(tokens) != 4 or tokens[0] != SUBJECT_ROOT:
        return None
    owner = tokens[1:]
    if any(not _TOKEN.fullmatch(t) or t in RESERVED_TOKENS for t in owner):
        return None
    return owner[0], owner[1], owner[2]


# --------------------------------------------------------------------------------------
# Owner labels (STREAM-14)
# --------------------------------------------------------------------------------------


def owner_labels(
    flow_id: str,
    run_id: str | None,
    node: str | None,
    kind: str,
    generation: str | None = None,
) -> dict[str, str]:
    """The owner labels written into a stream's or durable's metadata (STREAM-14).

    Values are verbatim (not sanitized): teardown compares them against the ids it is
    given. A None run_id, node or generation leaves that label out (the flow-scoped DLQ
    has no run; an unversioned provisioning has no generation).

    Returns:
        A fresh dict (nats-py sends metadata as-is; callers may keep their own copy).
    """
    labels = {LABEL_FLOW_ID: flow_id, LABEL_KIND: kind}
    if run_id is not None:
        labels[LABEL_RUN_ID] = run_id
    if node is not None:
        labels[LABEL_NODE] = node
    if generation is not None:
        labels[LABEL_GENERATION] = generation
    return labels


def user_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """metadata without the keys nats-server adds itself (_nats.*; NATS_FACTS S7)."""
    return {
        k: v for k, v in (metadata or {}).items() if not k.startswith(SERVER_METADATA_PREFIX)
    }


# --------------------------------------------------------------------------------------
# Stream and consumer configs
# --------------------------------------------------------------------------------------


def _check_flow_type(flow_type: str) -> None:
    if flow_type not in FLOW_TYPES:
        raise ValueError(f"flow_type must be one of {FLOW_TYPES}, got {flow_type!r}")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _num_replicas(replicas: int) -> int | None:
    # STREAM-14: 1 leaves the field to the server default, so a single-server request
    # is exactly what it always was (nats-py omits None fields from the request).
    _positive_int("replicas", replicas)
    return replicas if replicas > 1 else None


def stream_config_for(
    flow_id: str,
    run_id: str,
    node_name: str,
    flow_type: str,
    subjects: list[str] | None = None,
    realtime_buffer: int = DEFAULT_REALTIME_BUFFER,
    batch_max_msgs: int = DEFAULT_BATCH_MAX_MSGS,
    generation: str | None = None,
    replicas: int = 1,
) -> StreamConfig:
    """The stream holding one node's output (data and EOS subjects).

    REALTIME: LIMITS retention, max_msgs = realtime_buffer (at least 1), DiscardPolicy.OLD
    — the freshest messages win and the producer never blocks. BATCH: INTEREST retention,
    max_msgs = batch_max_msgs, DiscardPolicy.NEW — acked messages are freed and a full
    stream refuses new publishes (backpressure, not loss).

    Arguments:
        flow_id / run_id / node_name: the node's ids.
        flow_type: REALTIME or BATCH.
        subjects: the stream's subjects; None means [data subject, EOS subject].
        realtime_buffer: REALTIME backlog bound.
        batch_max_msgs: BATCH backlog bound.
        generation: provisioning generation recorded in the owner labels (RFC 0006);
            None leaves that label out.
        replicas: copies the stream keeps (a replicated broker profile's
            jetstream_replicas); 1 leaves the field to the server default, so a
            single-server request is exactly what it always was.

    Returns:
        A fresh nats.js.api.StreamConfig carrying the owner labels (STREAM-14).

    Raises:
        ValueError: an unknown flow_type, a bound or replica count below 1, or a bad name.
    """
    _check_flow_type(flow_type)
    name = stream_name_for(flow_id, run_id, node_name)
    if subjects is None:
        subjects = [subject_for(flow_id, run_id, node_name),
                    eos_subject_for(flow_id, run_id, node_name)]
    else:
        subjects = list(subjects)
    # STREAM-14: owner labels and replicas on every stream.
    metadata = owner_labels(flow_id, run_id, node_name, KIND_STREAM, generation)
    num_replicas = _num_replicas(replicas)
    if flow_type == REALTIME:
        if isinstance(realtime_buffer, bool) or not isinstance(realtime_buffer, int):
            raise ValueError(f"realtime_buffer must be an int, got {realtime_buffer!r}")
        return StreamConfig(
            name=name,
            subjects=subjects,
            retention=RetentionPolicy.LIMITS,
            max_msgs=max(1, realtime_buffer),
            discard=DiscardPolicy.OLD,
            duplicate_window=DUPLICATE_WINDOW_SECONDS,
            metadata=metadata,
            num_replicas=num_replicas,
        )
    return StreamConfig(
        name=name,
        subjects=subjects,
        retention=RetentionPolicy.INTEREST,
        max_msgs=_positive_int("batch_max_msgs", batch_max_msgs),
        discard=DiscardPolicy.NEW,
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
        metadata=metadata,
        num_replicas=num_replicas,
    )


def dlq_stream_config(flow_id: str, replicas: int = 1) -> StreamConfig:
    """The flow's dead-letter stream (STREAM-8): every vf.{flow}._dlq.> subject, kept
    DLQ_RETENTION_SECONDS (7 days) under LIMITS retention, labelled with the flow only —
    no run id, so no run's teardown can ever own it.

    Arguments:
        flow_id (str): the flow.
        replicas (int): stream copies, as stream_config_for.

    Returns:
        A fresh nats.js.api.StreamConfig.
    """
    return StreamConfig(
        name=dlq_stream_name(flow_id),
        subjects=[dlq_subject_filter(flow_id)],
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        max_age=float(DLQ_RETENTION_SECONDS),  # STREAM-8: a week of dead letters
        duplicate_window=DUPLICATE_WINDOW_SECONDS,
        metadata=owner_labels(flow_id, None, None, KIND_DLQ),  # STREAM-8: flow-scoped
        num_replicas=_num_replicas(replicas),
    )


def consumer_config_for(
    flow_id: str,
    run_id: str,
    consumer_node_name: str,
    parent_node_name: str,
    ack_wait: int = 60,
    max_deliver: int = 1,
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING,
    generation: str | None = None,
) -> ConsumerConfig:
    """Durable pull-consumer config for one (child, parent) edge.

    Filters to the parent's data subject so EOS markers (on the _eos subject of the
    same stream) are handled by a separate per-replica consumer instead. max_deliver is
    1 for REALTIME (no redelivery — freshest wins) and retries + 1 for BATCH (see
    max_deliver_for); max_ack_pending bounds how many un-acked messages the broker will
    hand out before it stops delivering (this is the server-side half of prefetch
    bounding). Under RFC 0006 the durable is labelled with its consuming node as owner.

    Returns:
        A fresh nats.js.api.ConsumerConfig (pull_subscribe mutates the one it is given,
        NATS_FACTS S18, so never share one between binds).
    """
    return ConsumerConfig(
        durable_name=durable_name_for(consumer_node_name, parent_node_name),
        filter_subject=subject_for(flow_id, run_id, parent_node_name),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        max_ack_pending=max_ack_pending,
        # STREAM-14: the consuming node owns its durable.
        metadata=owner_labels(flow_id, run_id, consumer_node_name, KIND_DURABLE, generation),
    )


def eos_consumer_config(
    flow_id: str,
    run_id: str,
    consumer_node_name: str,
    parent_node_name: str,
    instance_id: str,
    inactive_threshold: int = 3600,
    generation: str | None = None,
) -> ConsumerConfig:
    """Per-replica durable pull-consumer for a parent's EOS subject.

    inactive_threshold lets the server clean it up automatically some time after the
    flow ends, so per-process (uuid-suffixed) EOS consumers don't accumulate.

    Returns:
        A fresh nats.js.api.ConsumerConfig filtered to the parent's EOS subject.
    """
    return ConsumerConfig(
        durable_name=eos_durable_name_for(consumer_node_name, parent_node_name, instance_id),
        filter_subject=eos_subject_for(flow_id, run_id, parent_node_name),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=EOS_ACK_WAIT_SECONDS,
        inactive_threshold=inactive_threshold,
        # STREAM-14
        metadata=owner_labels(
            flow_id, run_id, consumer_node_name, KIND_EOS_DURABLE, generation
        ),
    )


def eos_anchor_config(
    flow_id: str, run_id: str, node_name: str, generation: str | None = None
) -> ConsumerConfig:
    """Provision-time durable on a node's EOS subject that exists purely to create
    interest, so an EOS marker is retained by the BATCH (INTEREST-retention) stream no
    matter when it is published.

    The real EOS consumers are per-process (uuid-suffixed) durables created in each
    worker's setup — they cannot be pre-provisioned, so without this anchor an EOS
    published by a fast-finishing parent before a slow-starting child registers its EOS
    consumer is silently discarded (no interest at publish time), and the child then
    waits for EOS forever: the flow never terminates. The anchor is never fetched from
    and never acks, so the marker stays retained for any number of late-created
    consumers (their default DeliverPolicy.ALL replays it); the run's stream teardown
    deletes the anchor with everything else. No inactive_threshold: it must not be
    reaped while the run is alive.

    Returns:
        A fresh nats.js.api.ConsumerConfig labelled with the node that owns the stream.
    """
    return ConsumerConfig(
        durable_name=eos_anchor_durable_name_for(node_name),
        filter_subject=eos_subject_for(flow_id, run_id, node_name),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=EOS_ACK_WAIT_SECONDS,
        metadata=owner_labels(flow_id, run_id, node_name, KIND_EOS_ANCHOR, generation),
    )


# --------------------------------------------------------------------------------------
# Connection options (NATS_FACTS §8)
# --------------------------------------------------------------------------------------

FAIL_FAST_RECONNECT_ATTEMPTS: Final = 1
"""max_reconnect_attempts of a fail-fast connect: 0 would loop forever on a refused
connect (NATS_FACTS S4); 1 gives up after two attempts with NoServersError."""
FAIL_FAST_RECONNECT_WAIT: Final = 0.1
FAIL_FAST_CONNECT_TIMEOUT: Final = 2.0
RETRY_RECONNECT_ATTEMPTS: Final = 60
RETRY_RECONNECT_WAIT: Final = 2.0


def connect_options_for(
    timeout: float,
    fail_fast: bool,
    error_cb: Callable[[BaseException], Awaitable[None]],
) -> dict[str, Any]:
    """nats.connect keyword arguments for a short-lived observation connection.

    fail_fast (the operator's machine) disables reconnects; note that nats-py 2.15.0
    still cycles the server pool on a refused connect (nats/aio/client.py
    _select_next_server loops until a server answers, and max_reconnect_attempts = 0
    never discards one), so the caller bounds the connect with asyncio.wait_for and
    reads the refusal out of error_cb — which is also where a server-side permissions
    violation on a JetStream API subject arrives (client.py _process_err), while the
    request itself merely times out. Without fail_fast (an in-cluster entrypoint whose
    broker may still be starting) the client's own retry schedule applies: 60 attempts
    two seconds apart.

    Arguments:
        timeout (float): the caller's overall bound in seconds (> 0); a single connect
            attempt never waits longer than it.
        fail_fast (bool): see above.
        error_cb: the client's error callback (always the caller's own: the default one
            logs a traceback per attempt).

    Returns:
        A fresh dict of keyword arguments (no servers: the caller passes the URL).

    Raises:
        ValueError: if timeout is not a finite number > 0.
    """
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not timeout > 0
        or timeout == float("inf")
    ):
        raise ValueError(f"timeout must be a finite number > 0, got {timeout!r}")
    if fail_fast:
        # NATS_FACTS §8 fail-fast recipe: NoServersError in ~0.1 s when refused,
        # asyncio.TimeoutError after connect_timeout when the server hangs.
        return {
            "allow_reconnect": False,
            "max_reconnect_attempts": FAIL_FAST_RECONNECT_ATTEMPTS,
            "reconnect_time_wait": FAIL_FAST_RECONNECT_WAIT,
            "connect_timeout": min(FAIL_FAST_CONNECT_TIMEOUT, float(timeout)),
            "error_cb": error_cb,
        }
    return {
        "allow_reconnect": True,
        "max_reconnect_attempts": RETRY_RECONNECT_ATTEMPTS,
        "reconnect_time_wait": RETRY_RECONNECT_WAIT,
        "connect_timeout": min(FAIL_FAST_CONNECT_TIMEOUT, float(timeout)),
        "error_cb": error_cb,
    }


async def quiet_error_cb(_e: BaseException) -> None:
    """Silences the client's per-attempt error logging; the read-back reports the failure
    itself."""
    return None


# --------------------------------------------------------------------------------------
# Credit (STREAM-15, RUN-005, RUN-024) and delivery caps
# --------------------------------------------------------------------------------------


def _nonneg_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


def consumer_credit(
    nb_tasks: int,
    partitioned: bool,
    item_credit: int = DEFAULT_ITEM_CREDIT,
    prefetch: int = DEFAULT_PREFETCH,
) -> int:
    """STREAM-15: the broker-side max_ack_pending a subscription needs so every replica
    can hold item_credit inputs in processing plus prefetch parked, without one replica's
    un-acked work starving another's — a shared (competing) durable multiplies by the
    replica count, a per-replica (partitioned) durable does not. Provisioning and the
    worker call this so the durable created and the durable bound agree (MSG-017).

    Arguments:
        nb_tasks (int): replicas of the consuming node (>= 1).
        partitioned (bool): one durable per replica rather than one shared durable.
        item_credit (int): inputs one replica processes at once (>= 1; a join's working
            set, join_item_credit).
        prefetch (int): deliveries parked locally per replica (>= 0).

    Returns:
        (item_credit + prefetch), times nb_tasks unless partitioned.

    Raises:
        ValueError: for an argument out of range.
    """
    _positive_int("nb_tasks", nb_tasks)
    per_replica = _positive_int("item_credit", item_credit) + _nonneg_int("prefetch", prefetch)
    return per_replica if partitioned else nb_tasks * per_replica


def credit_admits(
    effective_credit: int,
    partitioned: bool,
    item_credit: int = DEFAULT_ITEM_CREDIT,
    prefetch: int = DEFAULT_PREFETCH,
) -> int:
    """The inverse of consumer_credit: how many replicas an effective max_ack_pending
    (read back from the broker) lets hold item_credit inputs in processing plus prefetch
    parked at the same time.

    A plan that admits more replicas than this is incompatible with the durable as it
    stands — the surplus replicas start but never hold an input (RUN-024): the credit
    must be re-derived and updated, not the replicas added. A per-replica (partitioned)
    durable serves one replica whatever its credit.

    Arguments:
        effective_credit (int): the durable's max_ack_pending as read back; a negative
            value is JetStream's "unlimited".
        partitioned (bool): a per-replica durable.
        item_credit / prefetch: as consumer_credit.

    Returns:
        1 for a partitioned durable; otherwise effective_credit // (item_credit +
        prefetch) (0 when it cannot feed even one replica), or sys.maxsize for an
        unlimited credit.

    Raises:
        ValueError: for an item_credit or prefetch out of range, or a non-int credit.
    """
    per_replica = _positive_int("item_credit", item_credit) + _nonneg_int("prefetch", prefetch)
    if isinstance(effective_credit, bool) or not isinstance(effective_credit, int):
        raise ValueError(f"effective_credit must be an int, got {effective_credit!r}")
    if partitioned:
        return 1
    if effective_credit < 0:
        return sys.maxsize
    return effective_credit // per_replica


def _flow_default_overlay(default: Mapping[str, Any], override: Any, what: str) -> dict[str, Any]:
    merged = dict(default)
    if override is None:
        return merged
    if isinstance(override, (JoinPolicy, DeliveryPolicy)):
        return override.to_dict()
    if not isinstance(override, Mapping):
        raise ValueError(f"{what} must be a dict or None, got {override!r}")
    merged.update(override)
    return merged


def join_item_credit(
    parents: Sequence[str], join_policy: dict | None, flow_type: str
) -> int:
    """The per-replica processing credit a node needs: one input group for a
    single-parent node; for a join, its policy's working set — every half of every
    pending group plus the group being assembled (JoinPolicy.working_set) — because a
    credit smaller than that lets an adversarial parent ordering fill the durables with
    halves that can never complete (RUN-005). Provisioning and the bind derive it
    identically.

    Arguments:
        parents (Sequence[str]): the node's parents.
        join_policy (dict | None): the node's join override (NodeSpec.join); its keys
            overlay the flow type's default policy (JoinPolicy.default_for).
        flow_type (str): REALTIME or BATCH.

    Returns:
        DEFAULT_ITEM_CREDIT for zero or one parent, else the working set.

    Raises:
        ValueError: an unknown flow type, or a policy invalid for these parents.
    """
    _check_flow_type(flow_type)
    parents = list(parents)
    if len(parents) <= 1:
        return DEFAULT_ITEM_CREDIT
    fields_ = _flow_default_overlay(
        JoinPolicy.default_for(flow_type).to_dict(), join_policy, "join_policy"
    )
    return JoinPolicy.from_dict(fields_).working_set(parents)  # RUN-005


def max_deliver_for(
    flow_type: str,
    max_retries: int = 3,
    delivery: dict | None = None,
    ledger_budget: bool = False,
) -> int:
    """Broker-side delivery cap for one node's durables.

    Derived from the node's effective DeliveryPolicy rather than from the flow type
    alone, because delivery is overridable per node: an at-least-once sink in a REALTIME
    flow needs a cap above 1 or its retries would be silently impossible, and a
    best-effort node in a BATCH flow should not be retried at all. Provisioning and the
    messenger both call this so the durable they create and the durable they bind agree.

    Arguments:
        flow_type: supplies the preset (DeliveryPolicy.default_for).
        max_retries: deployment-level retry count (VF_MAX_RETRIES); replaces the
            preset's, and is itself replaced by a max_retries in delivery.
        delivery: the node's own override, as a dict (NodeSpec.delivery).
        ledger_budget: the retry budget is enforced by the runtime ledger's attempt
            counts (RFC 0006 STREAM-15, decision D11: only with a durable, shared
            runtime store), so an at-least-once durable is provisioned with
            max_deliver = -1 — the broker never strands a message; a worker-fatal
            redelivery never counts. Best-effort durables keep their cap of 1 either
            way.

    Returns:
        DeliveryPolicy.max_deliveries of the effective policy (1 + max_retries for
        at_least_once, 1 for best_effort), or -1 as above.

    Raises:
        ValueError: an unknown flow type or an invalid override.
    """
    _check_flow_type(flow_type)
    preset = DeliveryPolicy.default_for(flow_type).to_dict()
    preset["max_retries"] = max_retries
    policy = DeliveryPolicy.from_dict(_flow_default_overlay(preset, delivery, "delivery"))
    if ledger_budget and policy.mode == "at_least_once":
        return -1  # STREAM-15 / D11: the ledger counts attempts, not the broker
    return policy.max_deliveries


# --------------------------------------------------------------------------------------
# Read-back verification
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiedStream:
    """What the broker holds after _ensure_stream: the config that was asked for, the
    config read back (None when the read-back itself failed), and each requested field
    the two differ on, rendered 'field: requested X, effective Y'. Empty mismatches
    means the broker gave the flow exactly what it asked for."""

    requested: StreamConfig
    effective: StreamConfig | None
    mismatches: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifiedConsumer:
    """VerifiedStream's counterpart for a durable consumer."""

    requested: ConsumerConfig
    effective: ConsumerConfig | None
    mismatches: tuple[str, ...] = ()


STREAM_FIELDS: Final = (
    "name", "subjects", "retention", "discard", "max_msgs", "max_msgs_per_subject",
    "max_bytes", "max_age", "duplicate_window", "storage", "num_replicas", "metadata",
)
"""The StreamConfig fields a read-back compares (only those the request set)."""

CONSUMER_FIELDS: Final = (
    "durable_name", "filter_subject", "deliver_policy", "ack_policy", "replay_policy",
    "ack_wait", "max_deliver", "max_ack_pending", "inactive_threshold", "metadata",
)
"""The ConsumerConfig fields a read-back compares (only those the request set)."""

# Dataclass defaults that mean "server default", not a request.
_UNREQUESTED_DEFAULTS: Final[Mapping[str, Any]] = {
    "duplicate_window": 0,
    "max_msgs_per_subject": -1,
}


def _plain(value: Any) -> Any:
    """A comparable form: enums to their value (read-backs carry plain str; S17), lists
    elementwise, durations as floats (ack_wait 60 reads back as 60.0)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _render(value: Any) -> str:
    value = value.value if isinstance(value, Enum) else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (list, tuple)):
        return repr([_render_scalar(v) for v in value])
    return repr(value)


def _render_scalar(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _mismatches(
    requested: StreamConfig | ConsumerConfig,
    effective: StreamConfig | ConsumerConfig,
    compared: Sequence[str],
) -> tuple[str, ...]:
    """The requested fields the effective config does not honour, each rendered
    'field: requested X, effective Y'.

    Only fields the request set take part (not None, and not a dataclass default that
    means "server default"), so server-filled values never count. Enums compare by
    value, since read-backs carry plain str (NATS_FACTS S17). metadata is a subset
    check over the user keys: the server adds _nats.* keys of its own (S7).
    """
    found: list[str] = []
    for name in compared:
        want = getattr(requested, name, None)
        if want is None or (
            name in _UNREQUESTED_DEFAULTS and want == _UNREQUESTED_DEFAULTS[name]
        ):
            continue
        got = getattr(effective, name, None)
        if name == "metadata":
            have = user_metadata(got)
            absent = {k: v for k, v in user_metadata(want).items() if have.get(k) != v}
            if absent:
                found.append(
                    f"metadata: requested {absent!r}, effective "
                    f"{ {k: have.get(k) for k in absent}!r}"
                )
            continue
        if _plain(want) != _plain(got):
            found.append(f"{name}: requested {_render(want)}, effective {_render(got)}")
    return tuple(found)


def stream_mismatches(requested: StreamConfig, effective: StreamConfig) -> tuple[str, ...]:
    """_mismatches over STREAM_FIELDS: what VerifiedStream.mismatches holds."""
    return _mismatches(requested, effective, STREAM_FIELDS)


def consumer_mismatches(
    requested: ConsumerConfig, effective: ConsumerConfig
) -> tuple[str, ...]:
    """_mismatches over CONSUMER_FIELDS: what VerifiedConsumer.mismatches holds."""
    return _mismatches(requested, effective, CONSUMER_FIELDS)


def _enum_value(value: Any) -> str | None:
    # S17: read-backs carry 'limits', not RetentionPolicy.LIMITS; compare the value.
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    return str(value).lower()


def _bounded(value: Any, *, zero_is_unbounded: bool) -> bool:
    if value is None or isinstance(value, bool):
        return False
    if not isinstance(value, (int, float)):
        return False
    return value > 0 if zero_is_unbounded else value >= 0


def profile_mismatches(profile: str, effective: StreamConfig) -> tuple[str, ...]:
    """The ways a stream's effective configuration contradicts a messaging profile — the
    semantic half of a read-back, beside the field-level _mismatches.

    A field can match the request and still not carry the profile (the request asked
    for the wrong shape), and a stream nobody here provisioned can carry the profile
    with fields no request ever set (a byte limit instead of a message limit), so the
    two checks are separate. Each finding reads '<field>: <effective value> <what that
    means>'; empty means the stream carries the profile.

    reliable_work needs retention that keeps a message until it is acknowledged
    (INTEREST or WORK_QUEUE) and DiscardPolicy.NEW at the limit — OLD on a full stream
    evicts an unacknowledged message, which is exactly the loss the profile forbids.
    live_latest needs LIMITS retention, DiscardPolicy.OLD (the freshest message wins)
    and a bound on the backlog (max_msgs, max_bytes or max_age), or "latest" is
    whatever fits on the disk. durable_control and replay_archive are not stream-level
    promises on JetStream (the planner rejects them before a stream exists), so they
    have no findings here.

    Arguments:
        profile (str): one of backends.messaging.PROFILES.
        effective (StreamConfig): the configuration read back from the broker.

    Returns:
        The findings, in field order (retention, discard, backlog bound).

    Raises:
        ValueError: for an unknown profile.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    retention = _enum_value(effective.retention) or RetentionPolicy.LIMITS.value
    discard = _enum_value(effective.discard) or DiscardPolicy.OLD.value
    found: list[str] = []
    if profile == RELIABLE_WORK:
        if retention not in (RetentionPolicy.INTEREST.value, RetentionPolicy.WORK_QUEUE.value):
            found.append(
                f"retention: {retention} does not keep a message until it is acknowledged"
            )
        if discard != DiscardPolicy.NEW.value:
            found.append(
                f"discard: {discard} evicts an unacknowledged message when the stream is full"
            )
    elif profile == LIVE_LATEST:
        if retention != RetentionPolicy.LIMITS.value:
            found.append(
                f"retention: {retention} holds messages for consumers instead of keeping "
                "the latest"
            )
        if discard != DiscardPolicy.OLD.value:
            found.append(
                f"discard: {discard} refuses the freshest message when the stream is full"
            )
        if not (
            _bounded(effective.max_msgs, zero_is_unbounded=True)
            or _bounded(effective.max_bytes, zero_is_unbounded=True)
            or _bounded(effective.max_age, zero_is_unbounded=True)
        ):
            found.append(
                f"max_msgs: {_render(effective.max_msgs)} with max_bytes "
                f"{_render(effective.max_bytes)} and max_age {_render(effective.max_age)} "
                "leaves the backlog unbounded: 'latest' is whatever fits on the disk"
            )
    return tuple(found)


# --------------------------------------------------------------------------------------
# Observation failures
# --------------------------------------------------------------------------------------

_AUTH_MARKERS: Final = ("authorization violation", "permissions violation",
                        "authentication", "user authentication expired")
_REFUSED_MARKERS: Final = ("connectionrefusederror", "connection refused", "connect call failed",
                           "errno 111", "noserverserror", "no servers available")


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # a broken __str__ must not break the failure path
        text = "<str() failed>"
    name = type(error).__name__
    return f"{name}: {text}" if text else name


def _text(item: Any) -> str:
    return _describe(item) if isinstance(item, BaseException) else str(item)


def observation_failure(
    error: BaseException, reported: Sequence[str] = ()
) -> tuple[str, str]:
    """(reason, detail) for a failed observation of the broker, in the Unknown
    vocabulary: auth (credentials refused, or a permissions violation the error callback
    saw while the request timed out), unreachable (no server answered — a refused
    connect shows up as a timeout with a ConnectionRefusedError in reported), timeout
    (the server is there and slow), malformed (an answer the client could not
    interpret), api (the server answered with a JetStream API error).

    Arguments:
        error (BaseException): what the observation raised.
        reported (Sequence[str]): what the connection's error_cb saw meanwhile (strings,
            or the exceptions themselves), oldest first.

    Returns:
        (reason, detail): detail names the error and, when there are any, the reports.
    """
    described = _describe(error)
    notes = [_text(r) for r in reported]
    detail = described if not notes else f"{described} (reported: {'; '.join(notes)})"
    everything = " ".join([described, *notes]).lower()
    # Auth first: a permissions violation reaches only error_cb while the request
    # itself times out (NATS_FACTS S15, §8).
    if isinstance(error, nats.errors.AuthorizationError) or any(
        m in everything for m in _AUTH_MARKERS
    ):
        return "auth", detail
    if isinstance(error, (nats.errors.NoServersError, ConnectionRefusedError)):
        return "unreachable", detail
    if isinstance(
        error, (asyncio.TimeoutError, TimeoutError, nats.errors.TimeoutError)
    ) or isinstance(error, nats.js.errors.FetchTimeoutError):
        refused = " ".join(notes).lower()
        if any(m in refused for m in _REFUSED_MARKERS):
            return "unreachable", detail
        return "timeout", detail
    if isinstance(error, nats.js.errors.APIError):
        return "api", detail
    if isinstance(
        error,
        (
            nats.errors.ConnectionClosedError,
            nats.errors.StaleConnectionError,
            nats.errors.SecureConnFailedError,
            OSError,
        ),
    ):
        return "unreachable", detail
    if isinstance(error, nats.errors.NoRespondersError):
        # The server is there; nothing serves the JetStream API subject (JetStream off,
        # wrong domain).
        return "api", detail
    if isinstance(
        error, (nats.errors.JsonParseError, nats.errors.ProtocolError, ValueError, KeyError,
                TypeError, AttributeError)
    ):
        return "malformed", detail
    return "api", detail


# --------------------------------------------------------------------------------------
# Profile verification
# --------------------------------------------------------------------------------------


def _who(request: ProfileRequest) -> str:
    return f" (requested by {request.requested_by})" if request.requested_by else ""


def verify_channel_profiles(
    read_back: Mapping[str, VerifiedStream | Unknown],
    requests: Sequence[ProfileRequest],
    *,
    unknown_is_fatal: bool,
    where: str,
    config_mismatches: bool = False,
) -> None:
    """Bind explicit profile requests to what the broker actually holds.

    For every request whose channel was read back: a stream whose effective
    configuration contradicts the profile (profile_mismatches) is a definite rejection;
    a stream that does not exist is a broker problem (provisioning has not run, or ran
    against another run id); a stream that could not be observed is fatal only when
    unknown_is_fatal — an explicit request must not pass on an unread guarantee — and a
    logged warning otherwise. Requests for channels the caller did not read back are not
    this caller's to judge.

    Every request is judged before anything is raised; when several fail, the most
    definite verdict wins (IncompatibleProfile, then BrokerUnavailable, then
    UnobservableState), for the first request in order that earned it. A VerifiedStream
    whose read-back failed (effective None) counts as unobserved.

    Arguments:
        read_back: node name -> VerifiedStream or Unknown (read_back_streams).
        requests: the explicit profile requests.
        unknown_is_fatal: whether an unobservable stream fails the check.
        where: provision / worker <node>, for the message.
        config_mismatches: also count the field-level VerifiedStream.mismatches (a
            num_replicas below the requested count, a clamped limit). The provision
            entrypoint knows the full request and passes True; a worker, which does not
            know the replica count asked for, judges the profile only.

    Raises:
        IncompatibleProfile: a stream definitely does not carry its requested profile.
        BrokerUnavailable: a requested channel's stream does not exist.
        UnobservableState: a requested channel could not be read back and
            unknown_is_fatal.
    """
    incompatible: IncompatibleProfile | None = None
    missing: BrokerUnavailable | None = None
    unobservable: UnobservableState | None = None
    for request in requests:
        if request.channel not in read_back:
            continue  # not this caller's to judge
        entry = read_back[request.channel]
        subject = (
            f"{where}: channel {request.channel!r}, profile {request.profile!r}{_who(request)}"
        )
        if isinstance(entry, Unknown) and entry.reason == "missing":
            if missing is None:
                missing = BrokerUnavailable(
                    f"{subject}: its stream does not exist ({entry.detail or 'missing'}); "
                    "provisioning has not run, or ran against another run id"
                )
            continue
        if isinstance(entry, Unknown) or entry.effective is None:
            if isinstance(entry, Unknown):
                reason, detail = entry.reason, entry.detail
            else:
                reason, detail = "unread", "; ".join(entry.mismatches)
            text = f"{subject}: the stream could not be read back ({reason}: {detail})"
            if not unknown_is_fatal:
                logger.warning("%s; the profile is not verified", text)
            elif unobservable is None:
                unobservable = UnobservableState(
                    f"{text}; an explicit profile request cannot pass on an unread guarantee",
                    reason=reason,
                    detail=detail,
                )
            continue
        findings = list(profile_mismatches(request.profile, entry.effective))
        if config_mismatches:
            findings.extend(entry.mismatches)
        if findings and incompatible is None:
            incompatible = IncompatibleProfile(
                f"{subject}: the stream does not carry the profile: {'; '.join(findings)}",
                channel=request.channel,
                profile=request.profile,
                findings=tuple(findings),
            )
    for verdict in (incompatible, missing, unobservable):
        if verdict is not None:
            raise verdict
