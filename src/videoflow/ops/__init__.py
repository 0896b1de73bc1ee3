"""The operator's side of a flow on NATS JetStream: what `videoflow status`, `dlq`,
`teardown`, `buckets`, `ls`, `tap` and `hz` do, and what `run --resume` reads, as plain
synchronous functions.

Every function opens a short-lived connection of its own with the fail-fast options
(NATS_FACTS S4, §8), bounds everything it asks of the broker by one overall timeout, and
closes the connection again. A broker that cannot be reached raises BrokerUnavailable
within that timeout; a value that could not be read once connected is Unknown(reason,
detail), never 0 (MSG-012).

Runs are found by ownership — their owner labels, or for an unlabelled stream its data
subject (STREAM-14, backends.jetstream.streams.owned_stream) — never by a stream-name
prefix, which cannot tell run r-x from run r. Dead letters live on the flow-scoped stream
vf-{flow}-dlq (STREAM-8) under vf.{flow}._dlq.{run}.{node}; nothing here but dlq_purge
ever removes one, and teardown never touches that stream.

Given no broker URL, the commands talk to the embedded nats-server on the store a
`videoflow run` without a URL keeps (embedded_broker); tap and hz follow the runs on it
instead (RunBrokers).
"""

from __future__ import annotations

from typing import Final

from videoflow.broker.failures import JSErrorCode
from videoflow.ops.broker_calls import API_PREFIX as API_PREFIX
from videoflow.ops.broker_calls import DEFAULT_TIMEOUT_SECONDS
from videoflow.ops.broker_calls import Count as Count
from videoflow.ops.buckets import (
    BucketRemoval,
    BucketsInUse,
    FlowBucket,
    buckets_list,
    buckets_remove,
    flow_bucket_names,
)
from videoflow.ops.dead_letters import DeadLetterEntry, DeadLetterNotFound, dlq_list, dlq_show
from videoflow.ops.embedded import RunBrokers, embedded_broker
from videoflow.ops.purge import dlq_purge
from videoflow.ops.replay import REPLAY_INTO_LIVE_RUN as REPLAY_INTO_LIVE_RUN
from videoflow.ops.replay import REPLAY_MSG_ID_PREFIX, ReplayReport, ReplayResult, dlq_replay
from videoflow.ops.replay import TORN_DOWN as TORN_DOWN
from videoflow.ops.replay import ReplayOutcome as ReplayOutcome
from videoflow.ops.run_teardown import RunTeardown, teardown, teardown_processed, unprocessed_work
from videoflow.ops.status import CONSUMER_PAGE as CONSUMER_PAGE
from videoflow.ops.status import (
    DurableStatus,
    RunStatus,
    StreamStatus,
    run_status,
    run_status_async,
)

# The names videoflow.ops has exported these codes under since it was one module;
# JSErrorCode (videoflow.broker.failures) is their home.
STREAM_NOT_FOUND: Final = JSErrorCode.STREAM_NOT_FOUND
MESSAGE_NOT_FOUND: Final = JSErrorCode.MESSAGE_NOT_FOUND
MESSAGE_DELETE_FAILED: Final = JSErrorCode.MESSAGE_DELETE_FAILED

__all__ = [
    "BucketRemoval",
    "RunTeardown",
    "teardown_processed",
    "unprocessed_work",
    "BucketsInUse",
    "FlowBucket",
    "buckets_list",
    "buckets_remove",
    "flow_bucket_names",
    "DEFAULT_TIMEOUT_SECONDS",
    "REPLAY_MSG_ID_PREFIX",
    "DeadLetterEntry",
    "DeadLetterNotFound",
    "DurableStatus",
    "ReplayReport",
    "ReplayResult",
    "RunBrokers",
    "RunStatus",
    "StreamStatus",
    "dlq_list",
    "dlq_purge",
    "dlq_replay",
    "dlq_show",
    "embedded_broker",
    "run_status",
    "run_status_async",
    "teardown",
]
