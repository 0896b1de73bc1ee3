"""Broker credit per replica plan (STREAM-15, RUN-005, RUN-024) and delivery caps."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from videoflow.core.constants import check_flow_type
from videoflow.core.policies import DeliveryPolicy, JoinPolicy

DEFAULT_ITEM_CREDIT: Final = 1
"""Inputs one replica holds in processing at a time."""

DEFAULT_PREFETCH: Final = 4
"""Deliveries a worker parks locally per subscription beyond the one it is processing,
so the next input is already in hand when the current one settles."""

WINDOW_GROUPS: Final = 64
"""Input groups one replica keeps in flight after processing them -- outputs being
confirmed, inputs not yet settled (videoflow.messaging.messenger_window)."""

PRODUCER_WINDOW: Final = 16 * WINDOW_GROUPS
"""Outputs a producer keeps in flight (its window's byte bound still applies). Its
groups are single outputs with no inputs to hold, and the turns of the loop that send
them and read their PubAcks are what pace it: the more one turn finds to send, the
less each costs. Measured in one process on the embedded server: 9,000 outputs/s at 64,
13,500-14,300 at 256, 17,500-18,500 at 1,024."""

RECEIVE_PREFETCH: Final = 64
"""Deliveries a node replica's backend parks per subscription: its pull requests ask
for up to this many at once, and the task takes everything ready in one hand-off. At
DEFAULT_PREFETCH's depth a node spent most of its time asking the broker for more."""

SETTLE_BATCH: Final = 64
"""Completed settlements a replica gathers at most before it sends them
(videoflow.messaging.messenger_deliveries); until then their inputs stay unsettled on
the broker."""

PIPELINE_PREFETCH: Final = WINDOW_GROUPS + SETTLE_BATCH + RECEIVE_PREFETCH
"""What a node replica holds unsettled per durable beyond the group it is processing:
its window's groups, the settled groups whose acks are gathered (fewer than
SETTLE_BATCH) and its parked prefetch. node_credit passes it as consumer_credit's
prefetch. Without the gathered acks, a processor with a full window and a linger's
worth of acks gathered reached max_ack_pending, and the broker held its input back
until they went."""

REALTIME_BURST: Final = 16
"""Messages per subject a REALTIME stream keeps when every node reading it has that one
parent (realtime_buffer_for): the longest burst such a reader that keeps up still gets
whole, where a stream that kept one had each message of a burst evict the one before it
on the broker before any reader was handed it. 16 ms of a 1 kHz IMU that stalled, half
a second of a 30 fps camera. A reader that does not keep up still works on the newest
only (videoflow.messaging.freshness)."""


def realtime_buffer_for(nb_tasks: int, readers_parents: Sequence[int]) -> int:
    """The per-subject bound of a REALTIME node's stream: REALTIME_BURST when every
    reader has one parent, 1 when a join reads it (a join takes whatever its parents'
    streams keep, and one slower than its cameras would work through their backlog,
    always that far behind the newest frames), and never below the node's replica count
    (room on the end-marker subject for every replica's marker).

    Arguments:
        nb_tasks: the node's replicas.
        readers_parents: how many parents each node reading the stream has.
    """
    one_parent = bool(readers_parents) and all(n == 1 for n in readers_parents)
    return max(REALTIME_BURST if one_parent else 1, nb_tasks)


LEGACY_BIND_CREDIT: Final = DEFAULT_PREFETCH + 2
"""A worker's bind credit of its local queue depth plus two, which does not follow the
replica plan (STREAM-15); kept, like DEFAULT_MAX_ACK_PENDING, as a reviewed value the
conformance negative controls reproduce."""

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
    positive_int("nb_tasks", nb_tasks)
    per_replica = positive_int("item_credit", item_credit) + _nonneg_int("prefetch", prefetch)
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
    per_replica = positive_int("item_credit", item_credit) + _nonneg_int("prefetch", prefetch)
    if isinstance(effective_credit, bool) or not isinstance(effective_credit, int):
        raise ValueError(f"effective_credit must be an int, got {effective_credit!r}")
    if partitioned:
        return 1
    if effective_credit < 0:
        return sys.maxsize
    return effective_credit // per_replica


def node_credit(nb_tasks: int, partitioned: bool, parents: Sequence[str],
                join_policy: dict | JoinPolicy | None, flow_type: str) -> int:
    """The max_ack_pending of each of a node's data durables: consumer_credit over its
    join_item_credit, with room for the publication window (PIPELINE_PREFETCH). The
    compiler derives it once per node (videoflow.core.compiler.node_plan), and
    provisioning and the worker's bind read that, so the durable created and the
    durable bound agree (MSG-017).

    Raises:
        ValueError: as consumer_credit and join_item_credit.
    """
    return consumer_credit(nb_tasks, partitioned,
                           join_item_credit(parents, join_policy, flow_type),
                           PIPELINE_PREFETCH)


def _flow_default_overlay(default: Mapping[str, Any], override: Any, what: str) -> dict[str, Any]:
    merged = dict(default)
    if override is None:
        return merged
    if not isinstance(override, Mapping):
        raise ValueError(f"{what} must be a dict or None, got {override!r}")
    merged.update(override)
    return merged


def effective_join_policy(flow_type: str, join_policy: Any = None) -> JoinPolicy:
    """A node's join policy: its override (a dict of JoinPolicy fields) laid over the
    flow type's default (JoinPolicy.default_for), or a JoinPolicy as it is — what
    provisioning, the bind and the messenger's assembler all use.

    Raises:
        ValueError: an unknown flow type or an invalid override.
    """
    check_flow_type(flow_type)
    if isinstance(join_policy, JoinPolicy):
        return join_policy
    return JoinPolicy.from_dict(_flow_default_overlay(
        JoinPolicy.default_for(flow_type).to_dict(), join_policy, "join_policy"))


def effective_delivery_policy(flow_type: str, max_retries: int = 3,
                              delivery: Any = None) -> DeliveryPolicy:
    """A node's delivery policy: the flow type's preset with the deployment's
    max_retries, then the node's own override (a dict) laid over it; or a
    DeliveryPolicy as it is.

    Raises:
        ValueError: an unknown flow type or an invalid override.
    """
    check_flow_type(flow_type)
    if isinstance(delivery, DeliveryPolicy):
        return delivery
    preset = DeliveryPolicy.default_for(flow_type).to_dict()
    preset["max_retries"] = max_retries
    return DeliveryPolicy.from_dict(_flow_default_overlay(preset, delivery, "delivery"))


def join_item_credit(
    parents: Sequence[str], join_policy: dict | JoinPolicy | None, flow_type: str
) -> int:
    """The per-replica processing credit a node needs: one input group for a
    single-parent node; for a join, its policy's working set — every half of every
    pending group plus the group being assembled (JoinPolicy.working_set) — because a
    credit smaller than that lets an adversarial parent ordering fill the durables with
    halves that can never complete (RUN-005). Provisioning and the bind derive it
    identically.

    Arguments:
        parents (Sequence[str]): the node's parents.
        join_policy (dict | JoinPolicy | None): the node's join override
            (NodeSpec.join_policy), whose keys overlay the flow type's default policy
            (JoinPolicy.default_for); or its effective policy, taken as it is.
        flow_type (str): REALTIME or BATCH.

    Returns:
        DEFAULT_ITEM_CREDIT for zero or one parent, else the working set.

    Raises:
        ValueError: an unknown flow type, or a policy invalid for these parents.
    """
    check_flow_type(flow_type)
    parents = list(parents)
    if len(parents) <= 1:
        return DEFAULT_ITEM_CREDIT
    return effective_join_policy(flow_type, join_policy).working_set(parents)  # RUN-005


def max_deliver_for(
    flow_type: str,
    max_retries: int = 3,
    delivery: dict | DeliveryPolicy | None = None,
    ledger_budget: bool = False,
) -> int:
    """Broker-side delivery cap for one node's durables.

    Derived from the node's effective DeliveryPolicy rather than from the flow type
    alone, because delivery is overridable per node: an at-least-once sink in a REALTIME
    flow needs a cap above 1 or its retries would be silently impossible, and a
    best-effort node in a BATCH flow should not be retried at all. Provisioning and the
    messenger read what the compiler derived with it (videoflow.core.compiler.node_plan),
    so the durable they create and the durable they bind agree.

    Arguments:
        flow_type: supplies the preset (DeliveryPolicy.default_for).
        max_retries: deployment-level retry count (VF_MAX_RETRIES); replaces the
            preset's, and is itself replaced by a max_retries in delivery.
        delivery: the node's own override, as a dict (NodeSpec.delivery); or its
            effective policy, taken as it is (max_retries then unread).
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
    policy = effective_delivery_policy(flow_type, max_retries, delivery)
    if ledger_budget and policy.mode == "at_least_once":
        return -1  # STREAM-15 / D11: the ledger counts attempts, not the broker
    return policy.max_deliveries


def positive_int(name: str, value: Any) -> int:
    """value, once checked to be an int >= 1 (not a bool); ValueError names `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value
