"""Names of a run's broker resources and the owner labels that make ownership exact."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

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

    Every run of characters outside ``[A-Za-z0-9_-]`` becomes one '_': dots (the subject
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


def ledger_bucket(flow_id: str) -> str:
    """The KV bucket of a flow's FlowRuntime ledgers."""
    return f"vf-ledger-{sanitize(flow_id)}"


def payload_bucket(flow_id: str) -> str:
    """The object store of a flow's by-ref payloads."""
    return f"vf-payloads-{sanitize(flow_id)}"
