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

The pure half lives in submodules this one re-exports: naming, jetstream.configs, credit
and verification; nothing in them needs a broker. The broker half (read-back, teardown,
idempotent create, provisioning a whole flow) lives in jetstream.flow_provisioning,
re-exported here too.
"""

from __future__ import annotations

from videoflow.backends.jetstream.configs import (
    DEFAULT_BATCH_MAX_MSGS,
    DEFAULT_MAX_ACK_PENDING,
    DEFAULT_REALTIME_BUFFER,
    EOS_ACK_WAIT_SECONDS,
    consumer_config_for,
    dlq_stream_config,
    eos_anchor_config,
    eos_consumer_config,
    stream_config_for,
)
from videoflow.backends.jetstream.flow_provisioning import (
    provision_flow,
    provision_flow_connect,
    provision_flow_sync,
)
from videoflow.backends.jetstream.streams import (
    DEFAULT_READ_BACK_TIMEOUT_SECONDS,
    delete_run_streams,
    read_back_streams,
    read_back_streams_async,
)
from videoflow.backends.jetstream.verification import (
    CONSUMER_FIELDS,
    STREAM_FIELDS,
    VerifiedConsumer,
    VerifiedStream,
    consumer_mismatches,
    profile_mismatches,
    stream_mismatches,
    verify_channel_profiles,
)
from videoflow.backends.messaging_types import DLQ_RETENTION_SECONDS, DUPLICATE_WINDOW_SECONDS
from videoflow.broker.failures import observation_failure
from videoflow.broker.options import (
    FAIL_FAST_CONNECT_TIMEOUT,
    FAIL_FAST_RECONNECT_ATTEMPTS,
    FAIL_FAST_RECONNECT_WAIT,
    RETRY_RECONNECT_ATTEMPTS,
    RETRY_RECONNECT_WAIT,
    connect_options_for,
    quiet_error_cb,
)
from videoflow.core.credit import (
    DEFAULT_ITEM_CREDIT,
    DEFAULT_PREFETCH,
    LEGACY_BIND_CREDIT,
    PIPELINE_PREFETCH,
    RECEIVE_PREFETCH,
    SETTLE_BATCH,
    WINDOW_GROUPS,
    consumer_credit,
    credit_admits,
    join_item_credit,
    max_deliver_for,
    node_credit,
)
from videoflow.core.naming import (
    CONTROL_TOKEN,
    DLQ_TOKEN,
    EOS_TOKEN,
    KIND_DLQ,
    KIND_DURABLE,
    KIND_EOS_ANCHOR,
    KIND_EOS_DURABLE,
    KIND_STREAM,
    LABEL_FLOW_ID,
    LABEL_GENERATION,
    LABEL_KIND,
    LABEL_NODE,
    LABEL_PREFIX,
    LABEL_RUN_ID,
    RESERVED_TOKENS,
    SERVER_METADATA_PREFIX,
    SUBJECT_ROOT,
    control_subject_for,
    dlq_stream_name,
    dlq_subject_filter,
    dlq_subject_for,
    durable_name_for,
    eos_anchor_durable_name_for,
    eos_durable_name_for,
    eos_subject_for,
    owner_labels,
    partitioned_durable_name_for,
    sanitize,
    stream_label_selector,
    stream_name_for,
    subject_for,
    subject_owner,
    user_metadata,
)

__all__ = [
    "CONSUMER_FIELDS",
    "CONTROL_TOKEN",
    "DEFAULT_BATCH_MAX_MSGS",
    "DEFAULT_ITEM_CREDIT",
    "DEFAULT_MAX_ACK_PENDING",
    "DEFAULT_PREFETCH",
    "DEFAULT_READ_BACK_TIMEOUT_SECONDS",
    "DEFAULT_REALTIME_BUFFER",
    "DLQ_RETENTION_SECONDS",
    "DLQ_TOKEN",
    "DUPLICATE_WINDOW_SECONDS",
    "EOS_ACK_WAIT_SECONDS",
    "EOS_TOKEN",
    "FAIL_FAST_CONNECT_TIMEOUT",
    "FAIL_FAST_RECONNECT_ATTEMPTS",
    "FAIL_FAST_RECONNECT_WAIT",
    "KIND_DLQ",
    "KIND_DURABLE",
    "KIND_EOS_ANCHOR",
    "KIND_EOS_DURABLE",
    "KIND_STREAM",
    "LABEL_FLOW_ID",
    "LABEL_GENERATION",
    "LABEL_KIND",
    "LABEL_NODE",
    "LABEL_PREFIX",
    "LABEL_RUN_ID",
    "LEGACY_BIND_CREDIT",
    "PIPELINE_PREFETCH",
    "RECEIVE_PREFETCH",
    "SETTLE_BATCH",
    "RESERVED_TOKENS",
    "RETRY_RECONNECT_ATTEMPTS",
    "RETRY_RECONNECT_WAIT",
    "SERVER_METADATA_PREFIX",
    "STREAM_FIELDS",
    "SUBJECT_ROOT",
    "VerifiedConsumer",
    "VerifiedStream",
    "WINDOW_GROUPS",
    "connect_options_for",
    "consumer_config_for",
    "consumer_credit",
    "consumer_mismatches",
    "control_subject_for",
    "credit_admits",
    "delete_run_streams",
    "dlq_stream_config",
    "dlq_stream_name",
    "dlq_subject_filter",
    "dlq_subject_for",
    "durable_name_for",
    "eos_anchor_config",
    "eos_anchor_durable_name_for",
    "eos_consumer_config",
    "eos_durable_name_for",
    "eos_subject_for",
    "join_item_credit",
    "node_credit",
    "max_deliver_for",
    "observation_failure",
    "owner_labels",
    "partitioned_durable_name_for",
    "profile_mismatches",
    "provision_flow",
    "provision_flow_connect",
    "provision_flow_sync",
    "quiet_error_cb",
    "read_back_streams",
    "read_back_streams_async",
    "sanitize",
    "stream_config_for",
    "stream_label_selector",
    "stream_mismatches",
    "stream_name_for",
    "subject_for",
    "subject_owner",
    "user_metadata",
    "verify_channel_profiles",
]
