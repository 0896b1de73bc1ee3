"""What a simulation is given (the inputs its producers send, the faults it plays) and
what it gives back (outputs, groups, drops, dead letters, the report)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from videoflow.core.report import RunReport
from videoflow.messaging.dead_letters import DeadLetter


@dataclass(frozen=True)
class Input:
    """One message a scripted producer sends.

    Arguments:
        message: what the producer's next() would have returned.
        event_ts: its event time, epoch seconds (what set_event_timestamp stamps);
            None leaves it unstamped.
        at: when it is sent, in simulated seconds from the start; None sends it at
            its event time (simulated time 0 is the script's earliest event time),
            or, unstamped, right after the producer's previous input.
        duplicate: the producer sends it twice (the same message and event time, as
            two messages), as a camera driver that repeats a frame does.
        redeliver: the broker delivers it twice to each node that reads it: the
            first delivery's lease lapses at once, as an acknowledgement lost or a
            node slower than ack_wait makes it.
    """

    message: Any
    event_ts: float | None = None
    at: float | None = None
    duplicate: bool = False
    redeliver: bool = False


@dataclass(frozen=True)
class Silent:
    """The last item of a producer's inputs: from ``at`` on (simulated seconds; None:
    after its last input) it sends nothing more, and no end of stream either — a
    camera unplugged. The simulation then runs until its ``until``."""

    at: float | None = None


@dataclass(frozen=True)
class Crash:
    """A node replica dies, as a killed process does, while it processes a group:
    that group is never acknowledged, and its inputs are delivered again once their
    lease (ack_wait) lapses.

    Arguments:
        node: the node's name.
        after: how many groups the replica processed before the one it dies in.
        replica: which replica.
        restart: the replica is started again, as the local engine restarts one.
    """

    node: str
    after: int
    replica: int = 0
    restart: bool = True


@dataclass(frozen=True)
class Output:
    """One message a node published.

    Attributes:
        node: the node that published it.
        message: the message, decoded.
        event_ts: its event time (epoch seconds), None if it has none.
        trace_id / seq: its lineage: the trace it belongs to (its producer's message
            it descends from) and its number in its node's stream of that trace.
        stream_seq: its sequence on the node's stream.
        at: when it was published, simulated seconds.
    """

    node: str
    message: Any
    event_ts: float | None
    trace_id: str
    seq: int
    stream_seq: int
    at: float


@dataclass(frozen=True)
class Group:
    """One group a node processed and acknowledged.

    Attributes:
        node / replica: who processed it.
        inputs: per parent, what the node was given: an Output, None for a parent
            missing from a quorum group, a list of Outputs for a collect parent.
        outputs: what the node published while processing it.
        at: when it was handed to the node, simulated seconds.
    """

    node: str
    replica: int
    inputs: Mapping[str, Output | list[Output] | None]
    outputs: list[Output]
    at: float

    def event_times(self) -> dict[str, float | list[float | None] | None]:
        """Per parent, the event time of its input (a list for a collect parent, None
        for a missing one): the shape a join test asserts on."""
        times: dict[str, float | list[float | None] | None] = {}
        for parent, given in self.inputs.items():
            if isinstance(given, list):
                times[parent] = [o.event_ts for o in given]
            else:
                times[parent] = None if given is None else given.event_ts
        return times


@dataclass(frozen=True)
class Drop:
    """One input a node gave up on without processing it.

    Attributes:
        node / parent: who gave up on what parent's input.
        reason: why: 'join_evicted' (no group took it in time), 'join_late' (it came
            behind its parent's watermark), 'exhausted' (its retries were spent
            without a dead letter), and the messenger's other DROP_REASONS.
        input: the input, as its parent published it (None if unknown).
    """

    node: str
    parent: str
    reason: str
    input: Output | None


@dataclass
class SimulationResult:
    """What a simulated run did.

    Attributes:
        outputs: per publishing node, every message it published, in order.
        groups: per node with parents, every group it processed and acknowledged.
        drops: every input given up on, with its reason.
        dead_letters: every dead letter written.
        join_status: per node with parents, its join's status at the end
            (Messenger.join_status of its last replica).
        report: the run's RunReport, as Flow.run would return it; its times are
            simulated seconds.
        seconds: simulated seconds the run took.
        errors: per actor that raised, what (a node's own failure is in the report
            too; these include a scripted producer's).
    """

    outputs: dict[str, list[Output]] = field(default_factory=dict)
    groups: dict[str, list[Group]] = field(default_factory=dict)
    drops: list[Drop] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    join_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    report: RunReport | None = None
    seconds: float = 0.0
    errors: dict[str, BaseException] = field(default_factory=dict)

    def messages(self, node: str) -> list[Any]:
        """The messages node published, in order."""
        return [o.message for o in self.outputs.get(node, [])]
