"""The compiler: a flow of Node objects -> NodeSpecs, in topological order.

compile_flow checks what a worker would otherwise find out too late (cycles, parents
outside the flow, duplicate names, a join policy naming a non-parent, a node class a
worker process cannot import) and derives what the messaging layer reads from each
node's children and policies: blob_readers and blob_reader_ids (BLOB-5, BLOB-14), and
per node its NodePlan -- its effective join and delivery policies, the credit and
max_deliver of its durables -- which provisioning, the worker and the messenger read
from its NodeSpec, so that they agree (MSG-017). Every error names the node and the
problem.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar

import msgspec

from videoflow.core.credit import (
    effective_delivery_policy,
    effective_join_policy,
    max_deliver_for,
    node_credit,
)
from videoflow.core.policies import DeliveryPolicy, JoinPolicy
from videoflow.wire.codecs import require as require_codec

PRODUCER: Final = "producer"
PROCESSOR: Final = "processor"
CONSUMER: Final = "consumer"

NODE_KINDS: Final = (PRODUCER, PROCESSOR, CONSUMER)
"""Producers have no parents and publish; processors have parents and publish;
consumers (sinks) have parents and publish nothing."""

PUBLISHING_KINDS: Final = (PRODUCER, PROCESSOR)
"""The kinds that own an output stream."""

_Policy = TypeVar("_Policy", JoinPolicy, DeliveryPolicy)


class NodePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What one node's durables are created and bound with, and its messenger decides
    by, derived once (node_plan): compile_flow puts it on the node's NodeSpec, where
    provisioning and every replica read it, so that they agree (MSG-017).

    Attributes:
        join: the node's effective join policy: its override over the flow type's
            default (effective_join_policy). Its assembler's, and what its credit
            holds.
        delivery: its effective delivery policy: the flow type's preset with the run's
            max_retries, then its override (effective_delivery_policy).
        credit: max_ack_pending of each of its data durables (node_credit:
            consumer_credit over its join's working set, with room for the publication
            window; STREAM-15, RUN-005).
        max_deliver: its data durables' delivery cap (max_deliver_for): -1 when the
            run's ledger counts attempts.

    A producer has no durables: its credit and max_deliver bind nothing.
    """

    join: JoinPolicy
    delivery: DeliveryPolicy
    credit: int
    max_deliver: int


def node_plan(flow_type: str, parents: Sequence[str], nb_tasks: int = 1,
              partitioned: bool = False, join_policy: Any = None, delivery: Any = None,
              *, max_retries: int = 3, ledger_budget: bool = False) -> NodePlan:
    """The NodePlan of a node: its overrides laid over the flow type's defaults once,
    and its credit and delivery cap derived from the policies that gives.

    Arguments:
        flow_type: REALTIME or BATCH.
        parents / nb_tasks / partitioned: the node's (NodeSpec's).
        join_policy / delivery: its overrides (NodeSpec.join_policy, NodeSpec.delivery),
            or None.
        max_retries: the run's retry count, under a max_retries in delivery.
        ledger_budget: the run's retry budgets are counted in a durable, shared ledger
            (max_deliver_for).

    Raises:
        ValueError: an unknown flow type, an override invalid for these parents, or a
            count out of range.
    """
    join = effective_join_policy(flow_type, join_policy)
    policy = effective_delivery_policy(flow_type, max_retries, delivery)
    return NodePlan(
        join=join, delivery=policy,
        credit=node_credit(nb_tasks, partitioned, parents, join, flow_type),
        max_deliver=max_deliver_for(flow_type, max_retries, policy, ledger_budget))


@dataclass(frozen=True)
class NodeSpec:
    """One node of a compiled flow, as compile_flow produces it and as provisioning and
    the messenger read it.

    Attributes:
        name: the node's name, unique in the flow; names its stream, subjects and
            durables (videoflow.core.naming).
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
        plan: what compile_flow derived from the above for the run's flow type, retry
            count and ledger (NodePlan), read by provisioning, the worker and the
            messenger. None in a spec built by hand: provisioning derives it then
            (node_plan), from its own arguments.

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
    plan: NodePlan | None = None

    def __post_init__(self) -> None:
        """Normalises sequences to tuples and policy overrides to private dict copies
        (a caller mutating its own dict later cannot change the spec), then refuses
        nonsense: an empty name, an unknown kind, a producer with parents (or with a
        partition key or join policy, which only inputs can have), a processor or
        consumer without parents, duplicate or self parents, nb_tasks below 1, a join
        with competing replicas (they would split its groups), a join policy on a node
        with one parent, policy overrides JoinPolicy / DeliveryPolicy refuse (a join's
        for its parents), and a plan that is not a NodePlan."""
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
        join_policy, join = self._override(where, "join_policy", self.join_policy, JoinPolicy)
        object.__setattr__(self, "join_policy", join_policy)
        delivery, _ = self._override(where, "delivery", self.delivery, DeliveryPolicy)
        object.__setattr__(self, "delivery", delivery)
        if len(parents) > 1 and self.nb_tasks > 1 and self.partition_by is None:
            # Competing replicas each take what comes next from each parent: a group's
            # members would land in different processes, none of them whole.
            raise ValueError(
                f"{where}: a join's replicas would split its groups (they compete for "
                f"each parent's messages, so a group's members land in different "
                f"replicas): run it with nb_tasks=1, or give it partition_by, a key its "
                f"parents' messages share, so that each group's members reach one replica")
        if self.join_policy is not None and len(parents) == 1:
            # Silently dropped, a collect window or quorum asked for would never apply.
            raise ValueError(f"{where}: join_policy is for a node with two parents or more; "
                             f"it has one ({parents[0]!r}), so there is nothing to join")
        if join is not None and len(parents) > 1:
            # The override over JoinPolicy's defaults: every flow type's default joins
            # by trace with no collect window or quorum, so one with these parents
            # fails here as it would over any of them.
            try:
                join.validate_for(parents)
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
        if self.plan is not None and not isinstance(self.plan, NodePlan):
            raise ValueError(f"{where}: plan must be a NodePlan or None, got {self.plan!r}")

    @staticmethod
    def _override(
        where: str, field: str, value: Any, policy: type[_Policy]
    ) -> tuple[dict[str, Any], _Policy] | tuple[None, None]:
        """An override as a private dict, and the policy it reads as over the policy's
        own defaults; None and None for None."""
        if value is None:
            return None, None
        if isinstance(value, policy):
            return value.to_dict(), value
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: {field} must be a dict or None, got {value!r}")
        copied = dict(value)
        try:
            # Unknown keys and invalid values fail here, naming the node, rather than at
            # provisioning or in a worker.
            return copied, policy.from_dict(copied)
        except ValueError as error:
            raise ValueError(f"{where}: {field}: {error}") from error

    @property
    def publishes(self) -> bool:
        """Whether the node owns an output stream (producers and processors do)."""
        return self.kind in PUBLISHING_KINDS

    @property
    def partitioned(self) -> bool:
        """Whether each replica owns its own durable per parent."""
        return self.partition_by is not None


@dataclass(frozen=True)
class CompiledFlow:
    """A flow the compiler accepted.

    Attributes:
        flow_id: the flow's name: its subjects, streams and dead-letter stream.
        flow_type: REALTIME or BATCH.
        specs: one NodeSpec per node, parents before children, each with its plan.
        nodes: the Node objects by name.
        profile: the stream profile of every output stream ('live_latest' for a
            REALTIME flow, 'reliable_work' for BATCH).
    """

    flow_id: str
    flow_type: str
    specs: tuple[NodeSpec, ...]
    nodes: Mapping[str, Any]
    profile: str

    def spec(self, name: str) -> NodeSpec:
        """The spec of the named node.

        Raises:
            KeyError: no node of that name, listing the flow's nodes.
        """
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise KeyError(f"flow {self.flow_id!r} has no node {name!r}; its nodes: "
                       f"{[s.name for s in self.specs]}")


def compile_flow(flow: Any, max_retries: int = 3, ledger_budget: bool = False) -> CompiledFlow:
    """Compile a Flow into NodeSpecs.

    Arguments:
        flow: a videoflow.flow.Flow.
        max_retries: the delivery preset's retry count, for max_deliver.
        ledger_budget: retry budgets are counted in a durable shared ledger (a NATS
            KV FlowRuntime), so the broker's cap is lifted (max_deliver_for).

    Returns:
        CompiledFlow.

    Raises:
        ValueError: a cycle, a node reached from the consumers that is not wired to
            the flow's producers, a producer no consumer reads, two nodes with one
            name, a policy the node cannot have, a class a worker cannot import, pack
            on a node that cannot pack -- each naming the node.
        MissingDependency: a codec a node's outputs are to be encoded with whose
            library is not installed, naming the extra.
    """
    from videoflow.core.constants import BATCH
    from videoflow.core.naming import stream_name_for
    from videoflow.core.node import Node

    order = _topological(flow.producers, flow.consumers)
    names = _names(order)
    children: dict[int, list[Node]] = {id(n): [] for n in order}
    for node in order:
        for parent in node.parents:
            children[id(parent)].append(node)
    specs, nodes = [], {}
    subjects: dict[str, str] = {}
    flow_codec = getattr(flow, "codec", ())
    for node in order:
        name = names[id(node)]
        where = f"node {name!r}"
        _check_importable(where, node)
        node.flow_codec = flow_codec
        for choice in node.codecs:  # its library here, or the flow is refused now
            require_codec(choice.name)
        try:
            stream = stream_name_for(flow.flow_id, "run", name)  # a legal subject part
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from error
        if stream in subjects:  # names differing only in what sanitize replaces
            raise ValueError(f"{where}: would have the same subjects and streams as "
                             f"{subjects[stream]!r}; rename one")
        subjects[stream] = name
        readers = children[id(node)]
        reader_ids = tuple(
            rid for child in readers for rid in (
                [f"{names[id(child)]}/p{i}" for i in range(child.nb_tasks)]
                if child.partition_by is not None else [names[id(child)]]))
        spec = NodeSpec(
            name, node.kind, parents=tuple(names[id(p)] for p in node.parents),
            nb_tasks=node.nb_tasks, partition_by=node.partition_by,
            join_policy=node.join_policy, delivery=node.delivery,
            blob_readers=len(reader_ids) if node.kind != CONSUMER else None,
            blob_reader_ids=reader_ids if node.kind != CONSUMER else None)
        if node.kind == CONSUMER and not spec.parents:
            raise ValueError(f"{where}: a consumer needs at least one parent")
        if getattr(node, "pack", False):
            _check_pack(where, node, flow.flow_type)
        if spec.publishes and not readers:
            raise ValueError(f"{where}: nothing reads its output; end the branch with a "
                             "consumer")
        specs.append(replace(spec, plan=node_plan(
            flow.flow_type, spec.parents, spec.nb_tasks, spec.partitioned,
            spec.join_policy, spec.delivery, max_retries=max_retries,
            ledger_budget=ledger_budget)))
        nodes[name] = node
    profile = "reliable_work" if flow.flow_type == BATCH else "live_latest"
    return CompiledFlow(flow.flow_id, flow.flow_type, tuple(specs), nodes, profile)


def _check_pack(where: str, node: Any, flow_type: str) -> None:
    """pack=True is a live producer's, or a one-parent processor's, in a BATCH flow
    (Node's pack).

    Raises:
        ValueError: anywhere else, saying why.
    """
    from videoflow.core.constants import BATCH

    if node.kind == CONSUMER:
        raise ValueError(f"{where}: pack=True is for a node's outputs; a consumer "
                         "publishes none")
    if node.kind != PRODUCER and len(node.parents) != 1:
        raise ValueError(f"{where}: pack=True on a processor needs one parent, whose "
                         f"packs fix its own; it has {len(node.parents)}")
    if getattr(node, "replayable", False):
        raise ValueError(f"{where}: pack=True is a live producer's; a replayable one's "
                         "outputs are sent again under their ids, one per message")
    if flow_type != BATCH:
        raise ValueError(f"{where}: pack=True needs a BATCH flow; a REALTIME stream keeps "
                         "its newest messages, one output each")


def _topological(producers: Sequence[Any], consumers: Sequence[Any]) -> list[Any]:
    """Every node from the consumers back to the producers, parents first, in a
    deterministic order (the consumers' order, then the parents' wiring order)."""
    from videoflow.core.node import Node

    for what, group, kind in (("producers", producers, PRODUCER),
                              ("consumers", consumers, CONSUMER)):
        if not group:
            raise ValueError(f"a flow needs at least one of its {what}")
        for node in group:
            if not isinstance(node, Node) or node.kind != kind:
                raise ValueError(f"{what} must be {kind} nodes, got {node!r}")
    order: list[Any] = []
    state: dict[int, str] = {}  # 'open' while its parents are walked, then 'done'

    def visit(node: Any, path: list[Any]) -> None:
        mark = state.get(id(node))
        if mark == "done":
            return
        if mark == "open":
            cycle = [*path[path.index(node):], node]
            raise ValueError("the flow has a cycle: " + " -> ".join(n.name for n in cycle))
        state[id(node)] = "open"
        if node.kind != PRODUCER and not node.parents:
            raise ValueError(f"node {node.name!r}: a {node.kind} must be wired to its "
                             "parents (call it on them)")
        for parent in node.parents:
            visit(parent, [*path, node])
        state[id(node)] = "done"
        order.append(node)

    for consumer in consumers:
        visit(consumer, [])
    reached = {id(n) for n in order}
    for producer in producers:
        if id(producer) not in reached:
            raise ValueError(f"node {producer.name!r}: a producer no consumer reads")
    listed = {id(p) for p in producers}
    for node in order:
        if node.kind == PRODUCER and id(node) not in listed:
            raise ValueError(f"node {node.name!r}: a producer the flow reads but its "
                             "producers do not list")
    return order


def _names(order: list[Any]) -> dict[int, str]:
    """Given names as given (duplicates refused); the others from their class name,
    snake_case, numbered from 2 in topological order when taken."""
    names: dict[int, str] = {}
    taken: dict[str, Any] = {}
    for node in order:
        if node.named:
            if node.name in taken:
                raise ValueError(f"node {node.name!r}: two nodes have this name "
                                 f"({taken[node.name]!r} and {node!r})")
            taken[node.name] = node
            names[id(node)] = node.name
    for node in order:
        if node.named:
            continue
        base = re.sub(r"(?<!^)(?=[A-Z])", "_", type(node).__name__).lower()
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken[name] = node
        names[id(node)] = name
    return names


def _check_importable(where: str, node: Any) -> None:
    """A worker process rebuilds the node from its class: the class must be reachable
    by module and qualified name."""
    cls = type(node)
    if "<locals>" in cls.__qualname__:
        raise ValueError(f"{where}: its class {cls.__qualname__} is defined inside a "
                         "function; define it at module level so worker processes "
                         "can import it")
    if cls.__module__ == "__main__" and not getattr(sys.modules.get("__main__"), "__file__",
                                                     None):
        raise ValueError(f"{where}: its class {cls.__qualname__} is defined in an "
                         "interactive session, which worker processes cannot import; "
                         "define it in a module")
    try:
        found: Any = importlib.import_module(cls.__module__)
        for part in cls.__qualname__.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{where}: its class {cls.__module__}.{cls.__qualname__} is "
                         f"not importable ({error})") from error
    if found is not cls:
        raise ValueError(f"{where}: {cls.__module__}.{cls.__qualname__} names another "
                         "class than the node's")


__all__ = [
    "CONSUMER",
    "CompiledFlow",
    "NodePlan",
    "compile_flow",
    "node_plan",
    "NODE_KINDS",
    "NodeSpec",
    "PROCESSOR",
    "PRODUCER",
    "PUBLISHING_KINDS",
]
