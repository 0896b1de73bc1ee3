"""What a compiled flow says about each of its nodes.

The compiler proper — turning a graph of Node objects into NodeSpecs, deriving
blob_readers and blob_reader_ids from the children — is a later issue. This module
holds only the record it will produce, because provisioning
(videoflow.messaging.topology.provision_flow) and the messenger read it already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from videoflow.core.constants import REALTIME
from videoflow.core.policies import DeliveryPolicy, JoinPolicy

PRODUCER: Final = "producer"
PROCESSOR: Final = "processor"
CONSUMER: Final = "consumer"

NODE_KINDS: Final = (PRODUCER, PROCESSOR, CONSUMER)
"""Producers have no parents and publish; processors have parents and publish;
consumers (sinks) have parents and publish nothing."""

PUBLISHING_KINDS: Final = (PRODUCER, PROCESSOR)
"""The kinds that own an output stream."""


@dataclass(frozen=True)
class NodeSpec:
    """One node of a compiled flow, as the compiler (a later issue) produces it and as
    provisioning and the messenger read it.

    Attributes:
        name: the node's name, unique in the flow; names its stream, subjects and
            durables (videoflow.messaging.naming).
        kind: 'producer' (no parents, publishes), 'processor' (parents, publishes) or
            'consumer' (parents, publishes nothing).
        parents: the names of the node's real parents, in the order its inputs are
            presented; one durable per (node, parent) edge. Empty for a producer.
        nb_tasks: replicas of the node. Competing replicas share one durable per parent;
            partitioned replicas each own one.
        partition_by: the key the node's inputs are routed to replicas by (one durable
            per replica and parent, partitioned_durable_name_for); None means the
            replicas compete for one shared durable.
        join_policy: the node's join override as a dict (JoinPolicy fields), overlaid on
            its flow type's default; decides its join credit (join_item_credit). None
            takes the default.
        delivery: the node's DeliveryPolicy override as a dict, overlaid on its flow
            type's preset; decides max_deliver (max_deliver_for). None takes the preset.
        blob_readers: how many downstream reads each message this node publishes
            receives (the sum over children of nb_tasks if partitioned else 1), for
            refcounted blob reclamation (BLOB-5); None disables it.
        blob_reader_ids: the reader obligations every payload put acquires (BLOB-14):
            '<child>' per competing child, '<child>/p<i>' per partitioned replica; None
            when the compiler derived none.

    Raises:
        ValueError: naming the node, for a spec no flow could contain (see
            __post_init__).
    """

    name: str
    kind: str
    parents: tuple[str, ...] = ()
    nb_tasks: int = 1
    partition_by: str | None = None
    join_policy: dict[str, Any] | None = None
    delivery: dict[str, Any] | None = None
    blob_readers: int | None = None
    blob_reader_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        """Normalises sequences to tuples and policy overrides to private dict copies
        (a caller mutating its own dict later cannot change the spec), then refuses
        nonsense: an empty name, an unknown kind, a producer with parents (or with a
        partition key or join policy, which only inputs can have), a processor or
        consumer without parents, duplicate or self parents, nb_tasks below 1, and
        policy overrides JoinPolicy / DeliveryPolicy refuse."""
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"node name must be a non-empty str, got {self.name!r}")
        where = f"node {self.name!r}"
        if self.kind not in NODE_KINDS:
            raise ValueError(f"{where}: kind must be one of {NODE_KINDS}, got {self.kind!r}")
        if isinstance(self.parents, str) or not isinstance(self.parents, Sequence):
            raise ValueError(f"{where}: parents must be a sequence of node names, "
                             f"got {self.parents!r}")
        parents = tuple(self.parents)
        object.__setattr__(self, "parents", parents)
        for parent in parents:
            if not isinstance(parent, str) or not parent.strip():
                raise ValueError(f"{where}: parent names must be non-empty str, got {parent!r}")
        if len(set(parents)) != len(parents):
            raise ValueError(f"{where}: parents must be distinct, got {list(parents)!r}")
        if self.name in parents:
            raise ValueError(f"{where}: a node cannot be its own parent")
        if self.kind == PRODUCER:
            if parents:
                raise ValueError(f"{where}: a producer has no parents, got {list(parents)!r}")
            if self.partition_by is not None or self.join_policy is not None:
                raise ValueError(f"{where}: a producer has no inputs to partition or join")
        elif not parents:
            raise ValueError(f"{where}: a {self.kind} needs at least one parent")
        if (
            isinstance(self.nb_tasks, bool)
            or not isinstance(self.nb_tasks, int)
            or self.nb_tasks < 1
        ):
            raise ValueError(f"{where}: nb_tasks must be an int >= 1, got {self.nb_tasks!r}")
        if self.partition_by is not None and (
            not isinstance(self.partition_by, str) or not self.partition_by
        ):
            raise ValueError(f"{where}: partition_by must be a non-empty str or None, "
                             f"got {self.partition_by!r}")
        object.__setattr__(self, "join_policy", self._policy_dict(
            where, "join_policy", self.join_policy, JoinPolicy))
        object.__setattr__(self, "delivery", self._policy_dict(
            where, "delivery", self.delivery, DeliveryPolicy))
        if self.join_policy is not None and len(parents) > 1:
            overlay = {**JoinPolicy.default_for(REALTIME).to_dict(), **self.join_policy}
            try:
                JoinPolicy.from_dict(overlay).validate_for(parents)
            except ValueError as error:
                raise ValueError(f"{where}: join_policy: {error}") from error
        if self.blob_readers is not None and (
            isinstance(self.blob_readers, bool)
            or not isinstance(self.blob_readers, int)
            or self.blob_readers < 0
        ):
            raise ValueError(f"{where}: blob_readers must be an int >= 0 or None, "
                             f"got {self.blob_readers!r}")
        if self.blob_reader_ids is not None:
            if isinstance(self.blob_reader_ids, str) or not isinstance(
                self.blob_reader_ids, Sequence
            ):
                raise ValueError(f"{where}: blob_reader_ids must be a sequence of str, "
                                 f"got {self.blob_reader_ids!r}")
            ids = tuple(self.blob_reader_ids)
            if any(not isinstance(i, str) or not i for i in ids):
                raise ValueError(f"{where}: blob_reader_ids must be non-empty str, "
                                 f"got {list(ids)!r}")
            object.__setattr__(self, "blob_reader_ids", ids)

    @staticmethod
    def _policy_dict(
        where: str, field: str, value: Any, policy: type[JoinPolicy] | type[DeliveryPolicy]
    ) -> dict[str, Any] | None:
        if value is None:
            return None
        if isinstance(value, policy):
            return value.to_dict()
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: {field} must be a dict or None, got {value!r}")
        copied = dict(value)
        try:
            # Unknown keys and invalid values fail here, naming the node, rather than at
            # provisioning or in a worker.
            policy.from_dict(copied)
        except ValueError as error:
            raise ValueError(f"{where}: {field}: {error}") from error
        return copied

    @property
    def publishes(self) -> bool:
        """Whether the node owns an output stream (producers and processors do)."""
        return self.kind in PUBLISHING_KINDS

    @property
    def partitioned(self) -> bool:
        """Whether each replica owns its own durable per parent."""
        return self.partition_by is not None


__all__ = [
    "CONSUMER",
    "NODE_KINDS",
    "NodeSpec",
    "PROCESSOR",
    "PRODUCER",
    "PUBLISHING_KINDS",
]
