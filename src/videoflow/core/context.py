"""What a node reaches from inside next/process/consume: RuntimeContext, set on
node.context by the replica before open()."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

from videoflow.core.engine import CHECKPOINT_METADATA_KEY, Messenger


def event_time(value: Any, setter: str) -> float:
    """An event time a node set, checked where it was set: a time join downstream
    cannot place a NaN or an infinity, and a string would only fail later, far from
    the call that made it.

    Arguments:
        value: the event time given (epoch seconds): any real number but a bool.
        setter: the setter it was given to, named in the error.

    Returns:
        value as a float.

    Raises:
        ValueError: value is not a number (a str, None, a bool) or not finite.
    """
    if value.__class__ is not float:  # a float, by far the common case, skips these
        if isinstance(value, bool) or not isinstance(value, Real):
            raise ValueError(f"{setter}: an event time must be a number of epoch seconds, "
                             f"got {value!r} ({type(value).__name__})")
        try:
            value = float(value)
        except OverflowError:  # an int beyond a float's range
            raise ValueError(f"{setter}: an event time must be finite, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{setter}: an event time must be finite, got {value!r}")
    return value


class RuntimeContext:
    """What a node reaches from inside next/process/consume (``self.context``).

    Arguments:
        messenger: the replica's messenger.
        node_name: the node's name in the flow.
        parents: its parents' names, in wiring order (the order of its inputs).
        publishes: whether the node has an output (a consumer has none).
        broker_url: the URL of the broker the flow runs on ('' when not known).

    Attributes:
        node_name, parents, replica_id, nb_tasks, flow_id, run_id: who and where this is.
        broker_url: the flow's broker, for a node that talks to NATS itself (a sink
            writing a plain subject).
    """

    def __init__(self, messenger: Messenger, node_name: str, *,
                 parents: tuple[str, ...] = (), publishes: bool = True, replica_id: int = 0,
                 nb_tasks: int = 1, flow_id: str = "", run_id: str = "",
                 broker_url: str = "") -> None:
        self._messenger = messenger
        self.node_name, self.parents = node_name, tuple(parents)
        self.replica_id, self.nb_tasks = replica_id, nb_tasks
        self.flow_id, self.run_id = flow_id, run_id
        self.broker_url = broker_url
        self._pending: bytes | None = None
        self._publishes = publishes

    def checkpoint(self, state: bytes) -> None:
        """Commit the node's state with the input it is processing (RUN-022).

        A consumer's checkpoint is committed now: its input produces no output. A
        processor's or producer's rides with its next output, committed in the same
        ledger write once the output is accepted. A ledger that dies with the process
        refuses (DurabilityUnavailable) rather than faking durability.

        Raises:
            TypeError: state is not bytes.
        """
        if not isinstance(state, bytes):
            raise TypeError(f"a checkpoint's state must be bytes, got {type(state).__name__}")
        if self._publishes:
            self._pending = state
        else:
            self._messenger.checkpoint(state)  # type: ignore[attr-defined]

    def restore(self) -> bytes | None:
        """The state last committed for this node replica, or None (call it in open())."""
        return self._messenger.restore_checkpoint()  # type: ignore[attr-defined]

    def set_event_timestamp(self, value: float) -> None:
        """The capture time (epoch seconds) of the next output; by default an output
        inherits its input group's event time.

        Raises:
            ValueError: value is not a finite number (NaN, an infinity, a str, None,
                a bool): refused here, where it was set, not by a join downstream.
        """
        self._messenger.set_output_event_timestamp(event_time(value, "set_event_timestamp"))

    def set_source_offset(self, offset: int) -> None:
        """A replayable producer whose source numbers its records (a stream's
        sequence): the next output's id is minted from offset (MSGID-6), so the same
        record published again, after a restart, is the same message to the broker.

        Raises:
            ValueError: an offset below 1, or a node that is not a replayable producer.
        """
        self._messenger.set_output_source_offset(offset)  # type: ignore[attr-defined]

    @property
    def accepted_outputs(self) -> int:
        """A replayable producer's outputs the broker accepted in this process, in the
        order they were published: a source acknowledges the records they came from."""
        count = getattr(self._messenger, "accepted_outputs", None)
        return 0 if count is None else int(count())

    @property
    def stop_requested(self) -> bool:
        """Whether the replica was asked to stop (the flow's stop, a quiesce): a
        producer waiting on a live source checks it while nothing comes, and ends
        (StopIteration) when it is set."""
        check = getattr(self._messenger, "check_for_termination", None)
        return bool(check()) if check is not None else False

    def set_partition_key(self, value: Any) -> None:
        """The key a partitioned child routes the next output by."""
        self._messenger.set_output_partition_key(value)

    @property
    def last_input_key(self) -> str | None:
        """A stable identity of the input group being processed, the same after a
        redelivery: a sink keys its effects on it to apply each group once."""
        key = getattr(self._messenger, "last_input_key", None)
        return None if key is None else key()

    @property
    def input_info(self) -> dict[str, Any] | None:
        """Per parent: event_ts, metadata, trace_id, seq and clock_offset (seconds a
        time join added to the event time, JoinPolicy.clock_offsets) of the current
        group."""
        info = getattr(self._messenger, "last_input_info", None)
        return None if info is None else info()

    @property
    def traceparent(self) -> str | None:
        """A W3C traceparent continuing the current input group's trace, for what the
        node sends outside videoflow itself; None with tracing off."""
        make = getattr(self._messenger, "output_traceparent", None)
        return None if make is None else make()

    def publish_external(self, subject: str, data: bytes, headers: dict[str, str],
                         msg_id: str | None = None) -> None:
        """Publish data on a subject outside the flow that a JetStream stream captures,
        for the current input group: it goes out at once, and the group's inputs are
        acknowledged only once the stream accepted it (a refusal fails the group).

        Arguments:
            subject / data / headers: the message, as its readers take it.
            msg_id: its Nats-Msg-Id, the same when the group comes again.
        """
        self._messenger.publish_external(  # type: ignore[attr-defined]
            subject, data, headers, msg_id)

    @property
    def dropped(self) -> dict[str, int]:
        """The inputs this replica of the node gave up on so far, by reason (a join's
        join_evicted, a REALTIME node's superseded, ...): what the run report will
        count for it. Empty for a producer."""
        dropped = getattr(self._messenger, "dropped", None)
        return {} if dropped is None else dropped()

    def count_drop(self, reason: str) -> None:
        """Count one input the node gave up on itself, by reason ('undecodable' for a
        source's record it cannot read): it shows in the run report's drops.

        Raises:
            ValueError: a reason the messenger does not count.
        """
        count = getattr(self._messenger, "count_drop", None)
        if count is not None:
            count(reason)

    def take_metadata(self) -> dict[str, Any] | None:
        """For the task: the metadata carrying a pending checkpoint to the next output
        (None without one); the checkpoint is then no longer pending."""
        pending, self._pending = self._pending, None
        return None if pending is None else {CHECKPOINT_METADATA_KEY: pending}


__all__ = ["RuntimeContext", "event_time"]
