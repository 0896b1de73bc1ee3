"""The nodes a person writes: producers, processors and consumers.

A node is a plain object with a small lifecycle. Its task (videoflow.core.task)
calls ``open()`` once in the worker process, then ``next()`` (a producer),
``process(*inputs)`` (a processor) or ``consume(*inputs)`` (a consumer) once per
input, then ``close()``. Inputs arrive one per parent, in the order the parents were
given when the node was wired: the parent's message; None for a parent missing from
a quorum group; a list of messages for a collect parent's window.

Wiring is by calling a node on its parents, which returns the node::

    fused = Fusion(join_policy={"mode": "time", "tolerance_ms": 5})(cam1, cam2, imu)

Nodes are built in the process that defines the flow and run in worker processes,
so their classes must be importable (module-level, not defined in a function) and
their constructor arguments picklable; the compiler checks the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from videoflow.core.policies import DeliveryPolicy, JoinPolicy
from videoflow.errors import NodeNotRunning
from videoflow.wire.codecs import CodecChoice, parse_codecs

if TYPE_CHECKING:
    from videoflow.core.context import RuntimeContext


class Node:
    """Base of every node.

    Arguments:
        name: unique in its flow; names the node's stream and durables. None lets the
            compiler name it after its class.
        nb_tasks: replicas of the node, each in its own process.
        partition_by: route inputs to replicas by this key (the partition key a
            parent set with RuntimeContext.set_partition_key); None lets the replicas
            compete for inputs.
        join_policy: a JoinPolicy or its dict, overlaid on the flow type's default
            (nodes with two or more parents).
        delivery: a DeliveryPolicy or its dict, overlaid on the flow type's preset.
        codec: how the arrays this node publishes are encoded (videoflow.wire.codecs):
            a codec name ('jpeg', 'png', 'zstd'), a dict with its 'name' and options
            ({"name": "jpeg", "quality": 80}), or a list of those, the first that takes
            an array encoding it; 'raw' for none. None takes the flow's (Flow's
            codec). Readers get the decoded arrays, whatever the payload store.
        pack: small outputs (up to 16 KiB) travel several to a broker message (a
            pack: docs/WIRE.md), whose cost is the broker's per message. A producer's
            made faster than they go out are packed; a processor's are packed as its
            inputs came: the outputs of one inbound pack's members go as one pack, so
            processing them again makes the same pack, fenced by the broker as each
            output alone is. Readers still get each as an input of its own, but take
            and acknowledge them a pack at a time: an input of a pack retried, or in
            hand when its reader died, brings the pack's others back too, and one
            replica takes a whole pack. For high-rate sensors (an IMU, odometry) read
            by fast nodes. A live producer, or a processor with one parent, of a BATCH
            flow only (compile_flow refuses it elsewhere).

    Attributes:
        parents: the nodes this one reads, set by calling it; empty for a producer.
        context: the RuntimeContext of the running replica, set before open(); reading
            it outside a run raises NodeNotRunning.

    Raises:
        ValueError: a bad nb_tasks, name, policy, codec or pack, naming the node.
        MissingDependency: a codec whose library is not installed, naming the extra.
    """

    kind: str = ""

    def __init__(
        self,
        *,
        name: str | None = None,
        nb_tasks: int = 1,
        partition_by: str | None = None,
        join_policy: JoinPolicy | Mapping[str, Any] | None = None,
        delivery: DeliveryPolicy | Mapping[str, Any] | None = None,
        codec: Any = None,
        pack: bool = False,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"a node's name must be a non-empty str, got {name!r}")
        where = f"node {name or type(self).__name__!r}"
        if isinstance(nb_tasks, bool) or not isinstance(nb_tasks, int) or nb_tasks < 1:
            raise ValueError(f"{where}: nb_tasks must be an int >= 1, got {nb_tasks!r}")
        self._name = name
        self.nb_tasks = nb_tasks
        self.partition_by = partition_by
        self.join_policy = _policy(where, "join_policy", join_policy, JoinPolicy)
        self.delivery = _policy(where, "delivery", delivery, DeliveryPolicy)
        self.codec: tuple[CodecChoice, ...] | None = (
            None if codec is None else parse_codecs(codec, f"{where}: codec"))
        if not isinstance(pack, bool):
            raise ValueError(f"{where}: pack must be True or False, got {pack!r}")
        self.pack = pack
        self.flow_codec: tuple[CodecChoice, ...] = ()
        """The flow's codecs, set when the flow is compiled: this node's unless it
        names its own."""
        self.parents: tuple[Node, ...] = ()
        self._context: RuntimeContext | None = None

    @property
    def codecs(self) -> tuple[CodecChoice, ...]:
        """The codecs this node's outputs are encoded with: its own, else its flow's."""
        return self.flow_codec if self.codec is None else self.codec

    @property
    def name(self) -> str:
        """The node's name: the one it was given, else the one the compiler assigned
        (the class name until then)."""
        return self._name or type(self).__name__

    @property
    def context(self) -> RuntimeContext:
        """What the node reaches while it runs (RuntimeContext): its event-time and
        partition-key setters, its checkpoint, the current input's info.

        Typed non-optional, since node code only runs inside a run, so a producer's
        ``self.context.set_event_timestamp(t)`` needs no None check.

        Raises:
            NodeNotRunning: read outside a run (before open(), or on a node the
                flow only describes), naming the node.
        """
        context = self._context
        if context is None:
            raise NodeNotRunning(
                f"node {self.name!r} has no context outside a run: its replica sets "
                "node.context before open(), so read it in open(), next(), process(), "
                "consume() or close()")
        return context

    @context.setter
    def context(self, context: RuntimeContext) -> None:
        self._context = context

    @context.deleter
    def context(self) -> None:
        self._context = None

    @property
    def named(self) -> bool:
        """Whether the user gave the name (the compiler names the others)."""
        return self._name is not None

    def __call__(self, *parents: Node) -> Node:
        """Wire the node to its parents, in the order its inputs are presented.

        Returns:
            the node itself.

        Raises:
            TypeError: a parent that is not a Node, or wiring a producer.
            ValueError: no parents, a repeated parent, or wiring twice.
        """
        if self.kind == "producer":
            raise TypeError(f"node {self.name!r}: a producer has no parents")
        if not parents:
            raise ValueError(f"node {self.name!r}: call it with at least one parent")
        for parent in parents:
            if not isinstance(parent, Node):
                raise TypeError(f"node {self.name!r}: a parent must be a Node, "
                                f"got {type(parent).__name__}")
            if parent.kind == "consumer":
                raise TypeError(f"node {self.name!r}: {parent.name!r} is a consumer and "
                                "publishes nothing")
        if len({id(p) for p in parents}) != len(parents):
            raise ValueError(f"node {self.name!r}: a parent is given twice")
        if self.parents:
            raise ValueError(f"node {self.name!r} is already wired to "
                             f"{[p.name for p in self.parents]}")
        self.parents = tuple(parents)
        return self

    def open(self) -> None:
        """Acquire what the node needs (models, files, devices), in the worker
        process, before its first input. Default: nothing."""
        return None

    def close(self) -> None:
        """Release what open() acquired; called once the node's stream ended, and
        after a failure too. Default: nothing."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class ProducerNode(Node):
    """A source: next() returns one output at a time; StopIteration ends the stream.

    A live producer (a camera) mints new events. A replayable one (a file, a log)
    sets ``replayable = True`` and implements resume(offset): after a restart the
    task calls it with the number of outputs already accepted, and each output's id
    comes from its offset, so a replay deduplicates at the broker (MSGID-6).
    """

    kind = "producer"
    replayable: bool = False

    def next(self) -> Any:
        """The next output. Call context.set_event_timestamp first for time-sensitive
        data.

        Raises:
            StopIteration: the source is exhausted; the node's stream ends.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement next()")

    def resume(self, offset: int) -> None:
        """A replayable producer: skip the first offset outputs, already accepted
        before a restart. Called once, after open(), only when offset > 0."""
        raise NotImplementedError(f"{type(self).__name__} is replayable and must "
                                  "implement resume(offset)")


class ProcessorNode(Node):
    """A transformation: ``process(*inputs)`` returns the output published for them."""

    kind = "processor"

    def process(self, *inputs: Any) -> Any:
        """The output for one input group (one input per parent, see the module
        docstring). Raise PoisonMessage for an input that can never succeed,
        WorkerFatal when this worker cannot go on; other exceptions are retried
        per the delivery policy."""
        raise NotImplementedError(f"{type(self).__name__} must implement process()")


class ConsumerNode(Node):
    """A sink: ``consume(*inputs)`` applies one input group and publishes nothing."""

    kind = "consumer"

    def consume(self, *inputs: Any) -> None:
        """Apply one input group (see process for inputs and errors)."""
        raise NotImplementedError(f"{type(self).__name__} must implement consume()")


def _policy(where: str, field: str, value: Any,
            policy: type[JoinPolicy] | type[DeliveryPolicy]) -> dict[str, Any] | None:
    """A policy override as a validated dict (None stays None)."""
    if value is None:
        return None
    if isinstance(value, policy):
        return value.to_dict()
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: {field} must be a {policy.__name__}, a dict or None, "
                         f"got {value!r}")
    try:
        policy.from_dict(dict(value))
    except ValueError as error:
        raise ValueError(f"{where}: {field}: {error}") from error
    return dict(value)


__all__ = ["ConsumerNode", "Node", "ProcessorNode", "ProducerNode"]
