"""The seam between a node's task loop and the messaging layer: the Messenger.

A task (videoflow.core.task) never touches a broker. It asks its
messenger for the next input group, hands it to the node, publishes what the node
returned, and then acknowledges the inputs, or fails them when the node raised. Every
promise about delivery (ack after process, the delivery-policy ladder, dead letters,
the end-of-stream drain) is the messenger's to keep;
videoflow.messaging.nats_messenger.NATSMessenger is the implementation on the
MessagingBackend contract.

The methods below without a body are the ones every messenger must provide. The few
with one carry the defaults the reference documents for a bare messenger.
"""

from __future__ import annotations

import abc
from typing import Any, Final

STOP_CONTROL: Final = "control"
"""The flow-wide stop was published on the run's control subject (or the messenger
was told to end); every node winds down and publishes its end of stream."""

STOP_QUIESCE: Final = "quiesce"
"""This process was quiesced (SIGTERM, a scale-down, a rollout): it stops taking
input and publishes no end of stream, because its replacement continues the stream
(RUN-030)."""

STOP_REASONS: Final = (STOP_CONTROL, STOP_QUIESCE)

CHECKPOINT_METADATA_KEY: Final = "__videoflow_checkpoint__"
"""The reserved metadata key a task puts a node's pending checkpoint under when it
publishes that node's output (RuntimeContext.checkpoint): the messenger takes it off,
commits it with the output in one ledger write (RUN-022), and never puts it on the
wire."""

CLOCK_OFFSETS_METADATA_KEY: Final = "videoflow.clock_offsets"
"""The metadata key under which a time join's outputs say the clock corrections it
applied to their group (JoinPolicy.clock_offsets, clock_correction): {parent: seconds
added to its event time}, the parents corrected by a non-zero amount only. Replayed
with these as static clock_offsets, the same inputs make the same groups. On the
wire, in the output's metadata."""


class Messenger(abc.ABC):
    """What a node's task loop talks to: input groups in, outputs out, settlement of
    the inputs after the node is done with them."""

    # ------------------------------------------------------------------- inputs

    @abc.abstractmethod
    def receive_message(self) -> dict[str, Any]:
        """Block until the node has a complete input group, or every parent ended.

        Returns:
            {parent_name: entry}, exactly one entry per real parent. An entry is read
            by key: message, metadata, event_ts, is_stop_signal (that parent ended
            cleanly) and is_abort (it died; then also abort_origin and abort_error)
            -- a dict, or a record with those keys (the NATS messenger hands out
            the entries its assembler kept). A parent missing from a quorum
            emission has entry None.
        """

    @abc.abstractmethod
    def ack_inputs(self) -> None:
        """Acknowledge the group last returned by receive_message: the node processed
        it (and a processor's output is already published). A payload obligation is
        released only once the settlement is confirmed (PAY-004)."""

    @abc.abstractmethod
    def fail_inputs(self, exc: BaseException) -> None:
        """The node raised on the group last returned by receive_message: execute the
        delivery policy's verdict for exc (retry, dead-letter, or hand back without
        counting the attempt)."""

    @abc.abstractmethod
    def check_for_termination(self) -> bool:
        """Whether a stop was signalled (see stop_reason); a producer stops pulling
        new input on it even before its source ends."""

    def stop_reason(self) -> str | None:
        """Which stop check_for_termination reports, one of STOP_REASONS, or None while
        the flow runs. Default: the control stop whenever a termination was signalled
        — the only kind a bare messenger has."""
        return STOP_CONTROL if self.check_for_termination() else None

    # ------------------------------------------------------------------ outputs

    @abc.abstractmethod
    def publish_message(self, message: Any, metadata: dict[str, Any] | None = None) -> None:
        """Publish one data output of the node, confirmed by the broker before this
        returns. metadata may carry the node's pending checkpoint under
        CHECKPOINT_METADATA_KEY; it is committed with the output and never sent."""

    @abc.abstractmethod
    def publish_stop_signal(self) -> None:
        """Publish this node's end of stream: every downstream replica observes it
        exactly once, whatever the retention policy."""

    def set_output_event_timestamp(self, value: float) -> None:
        """Set the event time (epoch seconds) of the node's next output: when the
        real-world event it describes was captured. Default: no-op."""
        return None  # a bare messenger stamps nothing

    def set_output_partition_key(self, value: Any) -> None:
        """Set the partition key of the node's next output, so a partitioned child
        can route by a business key. Default: no-op."""
        return None  # a bare messenger routes nothing

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Release any broker resources the messenger holds. Default: no-op."""
        return None  # a bare messenger holds none
