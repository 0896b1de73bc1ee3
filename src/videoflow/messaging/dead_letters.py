"""Dead-letter records: what a node writes to its flow's dead-letter stream (STREAM-8)
before it terminates a delivery it gave up on (DELIV-15), and what `videoflow dlq`
reads back.

A record carries the input exactly as it arrived (the envelope bytes, so a replay
republishes what the parent sent) and enough provenance to find and explain it: which
node gave up, on which parent's message, after how many attempts, and why. Records are
msgpack (msgspec), versioned by a leading tag so later fields can be added: each goes
last with a default, so a record written before it reads as that default (the
traceback, added to version 1 so, is '' in older records). A reader older than a field
lists a record carrying it as undecodable, with its sequence, rather than guess.

Its msg_id is a function of the delivery's identity (run, node, parent, stream
sequence), so a dead-letter publish retried after an unknown outcome is one record in
the stream's duplicate window, never two, while another run's dead letters are never
taken for duplicates; the Terminal settlement names that id as its record_ref.
"""

from __future__ import annotations

import traceback as tracebacks
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from videoflow.backends.messaging import (
    Accepted,
    ChannelId,
    DeliveryToken,
    Envelope,
    MessagingBackend,
    SettleResult,
    Terminal,
)
from videoflow.core.constants import BATCH
from videoflow.errors import VideoflowError, WireError
from videoflow.messaging.publication import ATTEMPT_SECONDS, Published, publish_until_known

RECORD_VERSION: Final = 1

Reason = Literal["poison", "retries_exhausted", "undecodable", "best_effort_failed",
                 "join_incomplete", "crashed_worker"]
REASONS: Final = ("poison", "retries_exhausted", "undecodable", "best_effort_failed",
                  "join_incomplete", "crashed_worker")
"""Why a delivery was dead-lettered: the node declared it poison, its retry budget
ran out, its bytes were not an envelope, a best-effort node failed it once, it was
one half of a join group given up on under a missing='dead_letter' policy, or its
delivery coincided with the run's crash_limit deaths of the node's processes (the
local engine's count: videoflow.run.supervision)."""


class WorkerCrashed(VideoflowError):
    """What a 'crashed_worker' dead letter carries as its error: the input was in hand
    each time a process of the node died without a word (os._exit, a segfault, the
    OOM killer), so it is given up on rather than handed to yet another process."""


class DeadLetter(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag=RECORD_VERSION,
                 tag_field="version"):
    """One dead-lettered input.

    Attributes:
        flow_id / run_id: the run it happened in.
        node: the node that gave up on it.
        parent: the parent node whose stream delivered it.
        stream_seq: its sequence on the parent's stream.
        attempts: how many times it was delivered, the last included.
        reason: one of REASONS.
        error_type: the exception's qualified class name ('' when there was none).
        error_message: str() of the exception (truncated to 4 KiB).
        dead_lettered_at: wall-clock time of the decision (epoch seconds).
        envelope: the delivery's bytes as received.
        traceback: where the exception was raised, as Python prints it, its last
            MAX_TRACEBACK characters (the innermost frames); '' when there was no
            exception, or it was never raised (a record written before this field
            existed reads '' too).
    """

    flow_id: str
    run_id: str
    node: str
    parent: str
    stream_seq: int
    attempts: int
    reason: Reason
    error_type: str
    error_message: str
    dead_lettered_at: float
    envelope: bytes
    traceback: str = ""


_MAX_MESSAGE: Final = 4096
MAX_TRACEBACK: Final = 4096
"""The most of a traceback a dead letter keeps, in characters: the end of it, where
the frames that raised are (a node's own frames are a handful; a deep stack's outer
frames are cut)."""
_CUT: Final = "(earlier lines cut)\n"
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(DeadLetter)


def dead_letter_for(
    flow_id: str,
    run_id: str,
    node: str,
    parent: str,
    stream_seq: int,
    attempts: int,
    reason: Reason,
    envelope: bytes,
    error: BaseException | None,
    at: float,
) -> DeadLetter:
    """Builds the record for a delivery given up on.

    Arguments:
        error: the exception the node raised, or None (undecodable bytes).
        at: the wall-clock time of the decision.
        (the rest as DeadLetter's attributes)

    Raises:
        ValueError: an unknown reason, or a sequence or attempt count below 1.
    """
    if reason not in REASONS:
        raise ValueError(f"reason must be one of {REASONS}, got {reason!r}")
    if stream_seq < 1 or attempts < 1:
        raise ValueError(f"stream_seq and attempts must be >= 1, got {stream_seq}, {attempts}")
    error_type = "" if error is None else f"{type(error).__module__}.{type(error).__qualname__}"
    message = "" if error is None else str(error)[:_MAX_MESSAGE]
    return DeadLetter(flow_id, run_id, node, parent, stream_seq, attempts, reason, error_type,
                      message, at, bytes(envelope), traceback_of(error))


def traceback_of(error: BaseException | None, most: int = MAX_TRACEBACK) -> str:
    """error's traceback as Python prints it (its causes included), kept to its last
    `most` characters, cut at a line; '' for None or an exception never raised (one
    made to be recorded, as WorkerCrashed is: it has no frames to show)."""
    if error is None or error.__traceback__ is None:
        return ""
    text = "".join(tracebacks.format_exception(type(error), error, error.__traceback__))
    if len(text) <= most:
        return text
    tail = text[len(text) - (most - len(_CUT)):]
    # From the first whole line on; a single line longer than that is kept cut.
    newline = tail.find("\n")
    return _CUT + (tail[newline + 1:] if 0 <= newline < len(tail) - 1 else tail)


def dead_letter_record_id(run_id: str, node: str, parent: str, stream_seq: int,
                          member: int = 0) -> str:
    """The dead letter's broker msg_id, and the record_ref its Terminal settlement
    carries (DELIV-15).

    One per delivery identity within a run, so a dead-letter publish retried after an
    unknown outcome is stored once. The run is part of it because the flow's
    dead-letter stream outlives runs and a parent's stream sequences start at 1 again
    in every run: without it, a second run within the stream's duplicate window (2 min)
    would have its dead letters dropped as duplicates of the first run's.

    Arguments:
        run_id: the run the delivery belongs to.
        node: the node that gave up on it.
        parent: the parent whose stream delivered it.
        stream_seq: its sequence on that stream.
        member: its place in the pack it came in (videoflow.wire.packs), 1 for the
            first; 0 when it came alone.

    Returns:
        ``dlq:{run}:{node}:{parent}:{stream_seq}``, and ``.{member}`` after it for a
        member of a pack.
    """
    record = f"dlq:{run_id}:{node}:{parent}:{stream_seq}"
    return f"{record}.{member}" if member else record


def dead_letter_msg_id(node: str, parent: str, stream_seq: int) -> str:
    """The delivery's identity within its run, ``dlq:{node}:{parent}:{stream_seq}``:
    what names a payload's dead-letter pin (a pin is held on one payload ref, which
    belongs to one run). Not unique across runs, so never the broker msg_id of a
    dead letter: that is dead_letter_record_id."""
    return f"dlq:{node}:{parent}:{stream_seq}"


def encode_dead_letter(record: DeadLetter) -> bytes:
    """The record's bytes for the dead-letter stream."""
    return _encoder.encode(record)


def decode_dead_letter(data: bytes | bytearray | memoryview) -> DeadLetter:
    """Reads a record back.

    Raises:
        WireError: data is not a dead-letter record of a known version.
    """
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, TypeError) as error:
        raise WireError(f"not a dead-letter record: {error}") from error


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """What dead_letter did.

    Attributes:
        published: how the dead letter's publication ended.
        settled: the Terminal settlement's result, or None when the dead letter was
            not accepted: then the delivery was left alive for a later attempt
            (DELIV-15), and the caller records the pending handoff.
    """

    published: Published
    settled: SettleResult | None


def dead_letter(
    backend: MessagingBackend,
    token: DeliveryToken,
    record: DeadLetter,
    deadline: float,
    attempt_seconds: float = ATTEMPT_SECONDS,
    traceparent: str | None = None,
    member: int = 0,
    settle: Callable[[DeliveryToken, Terminal, str], SettleResult] | None = None,
) -> DeadLettered:
    """Publish record to the flow's dead-letter stream and, only once it is accepted
    there, terminate the delivery against it (DELIV-15: Terminal(record_ref), the
    record's msg_id).

    A dead letter is never dropped for being late: it is published as BATCH publishes
    (a full stream is waited for until the deadline), and an unknown outcome is
    resolved by observation. Anything short of Accepted leaves the delivery alive.

    Arguments:
        backend: the transport (its flow's dead-letter stream must exist:
            ensure_dead_letters).
        token: the delivery to terminate.
        record: its dead letter (dead_letter_for).
        deadline: monotonic time after which nothing more is tried.
        attempt_seconds: the most one publish waits for its receipt.
        traceparent: the input's W3C trace context (its delivery's header), which the
            record carries as its own header: the dead letter is found in its trace.
        member: the input's place in its pack (dead_letter_record_id); 0 alone.
        settle: how the delivery is terminated once the record is accepted;
            backend.settle when None (a pack's member is settled with its pack).
    """
    msg_id = dead_letter_record_id(record.run_id, record.node, record.parent,
                                   record.stream_seq, member)
    envelope = Envelope(ChannelId(record.flow_id, record.run_id, record.node), "dlq",
                        encode_dead_letter(record), msg_id, traceparent)
    published = publish_until_known(backend, envelope, BATCH, deadline,
                                    attempt_seconds=attempt_seconds)
    if not isinstance(published.outcome, Accepted):
        return DeadLettered(published, None)
    return DeadLettered(published, (settle or backend.settle)(
        token, Terminal(msg_id), f"terminate:{msg_id}"))


__all__ = [
    "MAX_TRACEBACK",
    "REASONS",
    "RECORD_VERSION",
    "DeadLetter",
    "DeadLettered",
    "WorkerCrashed",
    "dead_letter",
    "dead_letter_for",
    "dead_letter_msg_id",
    "dead_letter_record_id",
    "decode_dead_letter",
    "encode_dead_letter",
    "traceback_of",
]
