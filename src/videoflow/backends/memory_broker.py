"""The shared in-process broker behind ``videoflow.backends.memory``.

One ``MemoryBroker`` plays the server: it holds the channels (streams), their durables
(subscriptions), every lease and the duplicate windows, and it is shared by every
``MemoryMessagingBackend`` that stands for one process of a run — so competing
receivers, a crash and a hand-back to a survivor can all be played in one test. It
knows nothing of tokens, prefetch or admission filters: those are each receiver's and
live in ``memory``.

Everything is measured on one injectable clock (``clock``, default ``time.monotonic``)
so a test advances time by hand. Every method takes the broker's lock; a receiver that
waits uses ``condition``, which a publish or a hand-back notifies.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from videoflow.backends.messaging_types import (
    DLQ_RETENTION_SECONDS,
    LIVE_LATEST,
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    ChannelObservation,
    ChannelSpec,
    Envelope,
    Rejected,
    SubscriptionId,
    SubscriptionObservation,
    SubscriptionSpec,
)
from videoflow.errors import IncompatibleProfile

DEFAULT_DUPLICATE_WINDOW_SECONDS = 120.0
"""How long a msg_id is remembered for deduplication — JetStream's window as this
project provisions it (messaging_types.DUPLICATE_WINDOW_SECONDS)."""

DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""The largest envelope the broker takes, in bytes (nats-server's default max_payload)."""

BrokerAnswer = Literal["ok", "stale", "gone"]
"""What a settlement at the broker did: ok (applied), stale (a newer attempt exists or
it was settled already), gone (the message left the channel)."""

PendingState = Literal["leased", "ready", "exhausted"]


@dataclass(slots=True)
class _Message:
    seq: int
    kind: str
    data: bytes
    traceparent: str | None = None  # the publish's traceparent header


@dataclass(slots=True)
class _Pending:
    """One delivered, unsettled message of a durable."""

    attempt: int
    state: PendingState
    due: float
    """leased: when the lease lapses; ready: not before when it may be redelivered."""


@dataclass(slots=True)
class _Durable:
    sub: SubscriptionId
    spec: SubscriptionSpec | None = None
    cursor: int = 0
    """The highest stream sequence delivered for the first time."""
    pending: dict[int, _Pending] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    marked: set[int] = field(default_factory=set)
    marked_anonymous: int = 0
    dropped: int = 0


@dataclass(slots=True)
class _Stream:
    spec: ChannelSpec
    generation: str
    retention: Literal["interest", "limits"]
    discard: Literal["new", "old"]
    max_msgs: int
    max_bytes: int | None
    # OrderedDict: the oldest is found in O(1) (next(iter())) however many were removed
    # before it, where a plain dict scans the dead slots at its front.
    messages: OrderedDict[int, _Message] = field(default_factory=OrderedDict)
    last_seq: int = 0
    size: int = 0
    durables: dict[SubscriptionId, _Durable] = field(default_factory=dict)
    # Oldest first (see messages): pruned from the front.
    dedup: OrderedDict[str, tuple[int, float]] = field(default_factory=OrderedDict)


@dataclass(slots=True)
class _DeadLetterLog:
    """A flow's dead-letter stream: LIMITS retention by age (DLQ_RETENTION_SECONDS),
    records kept with the run and node their subject names (vf.{flow}._dlq.{run}.{node})."""

    records: OrderedDict[int, tuple[str, str, bytes, float]] = field(default_factory=OrderedDict)
    last_seq: int = 0
    dedup: dict[str, tuple[int, float]] = field(default_factory=dict)


def _limits_for(spec: ChannelSpec) -> tuple[Literal["interest", "limits"],
                                             Literal["new", "old"], int]:
    if spec.profile == RELIABLE_WORK:
        return "interest", "new", spec.batch_max_msgs
    if spec.profile == LIVE_LATEST:
        return "limits", "old", spec.realtime_buffer
    raise IncompatibleProfile(
        f"the memory broker cannot promise {spec.profile!r} for {spec.channel.node!r}: "
        "only reliable_work and live_latest are channel-level profiles",
        channel=spec.channel.node, profile=spec.profile,
        findings=(f"profile: {spec.profile} is not a stream-level profile",),
    )


class MemoryBroker:
    """The in-process server every memory backend of one test (or one process) shares.

    Arguments:
        clock: the monotonic clock leases, retry delays and duplicate windows are
            measured on.
        duplicate_window: seconds a msg_id is remembered.
        max_payload: the largest envelope accepted, in bytes.
        condition: makes the condition receivers wait on for a change, from the
            broker's lock; threading.Condition by default (a simulation passes one
            that waits on its own clock, videoflow.testing).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        duplicate_window: float = DEFAULT_DUPLICATE_WINDOW_SECONDS,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        condition: Callable[[threading.RLock], threading.Condition] = threading.Condition,
    ) -> None:
        self.clock = clock
        self.duplicate_window = duplicate_window
        self.max_payload = max_payload
        self.lock = threading.RLock()
        self.condition = condition(self.lock)
        self._streams: dict[ChannelId, _Stream] = {}
        self._dead_letters: dict[str, _DeadLetterLog] = {}
        self._control: dict[tuple[str, str], list[Callable[[], None]]] = {}

    # ------------------------------------------------------------------ channels

    def ensure_stream(self, spec: ChannelSpec, generation: str) -> tuple[bool, tuple[str, ...]]:
        """Create or reconcile a channel; returns (created, mismatches).

        Raises:
            IncompatibleProfile: the profile is not a channel-level one, or the channel
                exists with another retention (immutable, as on JetStream).
        """
        retention, discard, max_msgs = _limits_for(spec)
        mismatches: list[str] = []
        if spec.replicas > 1:
            mismatches.append(f"replicas: 1 (the memory broker keeps one copy; "
                              f"requested {spec.replicas})")
        with self.lock:
            stream = self._streams.get(spec.channel)
            if stream is None:
                stream = _Stream(spec, generation, retention, discard, max_msgs, spec.max_bytes)
                self._streams[spec.channel] = stream
                created = True
            else:
                if stream.retention != retention:
                    raise IncompatibleProfile(
                        f"channel {spec.channel.node!r} exists with {stream.retention} "
                        f"retention; {spec.profile} needs {retention}",
                        channel=spec.channel.node, profile=spec.profile,
                        findings=(f"retention: {stream.retention} (requested {retention})",),
                    )
                # Limits are mutable: the request is laid over the existing channel.
                stream.spec, stream.discard = spec, discard
                stream.max_msgs, stream.max_bytes = max_msgs, spec.max_bytes
                if stream.retention == "limits":
                    for kind in ("data", "eos"):
                        self._enforce_limits(stream, kind)
                created = False
            # Required subscriptions exist before anything is published, so INTEREST
            # retention keeps what they have not yet read.
            for sub in spec.required:
                stream.durables.setdefault(sub, _Durable(sub))
            return created, tuple(mismatches)

    def delete_stream(self, channel: ChannelId, generation: str) -> Literal["removed", "gone",
                                                                          "foreign"]:
        """Delete a channel of the given generation (with its durables)."""
        with self.lock:
            stream = self._streams.get(channel)
            if stream is None:
                return "gone"
            if stream.generation != generation:
                return "foreign"
            del self._streams[channel]
            self.condition.notify_all()
            return "removed"

    def has_stream(self, channel: ChannelId) -> bool:
        with self.lock:
            return channel in self._streams

    # ----------------------------------------------------------------- durables

    def ensure_durable(self, spec: SubscriptionSpec) -> tuple[bool, tuple[str, ...]] | None:
        """Create or read back a durable; returns (created, mismatches), or None when its
        channel does not exist. A durable keeps the configuration it was created with;
        a request that differs is reported, never silently applied (MSG-017)."""
        with self.lock:
            stream = self._streams.get(spec.id.channel)
            if stream is None:
                return None
            durable = stream.durables.get(spec.id)
            created = durable is None
            if durable is None:
                durable = _Durable(spec.id)
                stream.durables[spec.id] = durable
            if durable.spec is None:
                durable.spec = spec
                return created, ()
            have, mismatches = durable.spec, []
            for name in ("ack_wait_seconds", "max_deliver", "credit", "byte_credit"):
                if getattr(have, name) != getattr(spec, name):
                    mismatches.append(f"{name}: {getattr(have, name)} "
                                      f"(requested {getattr(spec, name)})")
            return False, tuple(mismatches)

    def _durable(self, sub: SubscriptionId) -> tuple[_Stream, _Durable] | None:
        stream = self._streams.get(sub.channel)
        if stream is None or sub not in stream.durables:
            return None
        return stream, stream.durables[sub]

    # --------------------------------------------------------------- publishing

    # ------------------------------------------------------------ dead letters

    def ensure_dead_letters(self, flow: str) -> bool:
        """Create the flow's dead-letter stream if absent; returns whether it was made."""
        with self.lock:
            if flow in self._dead_letters:
                return False
            self._dead_letters[flow] = _DeadLetterLog()
            return True

    def _publish_dead_letter(self, envelope: Envelope, now: float) -> Accepted | Rejected:
        log = self._dead_letters.get(envelope.channel.flow)
        if log is None:
            return Rejected(f"no dead-letter stream captures flow {envelope.channel.flow!r}",
                            retryable=False)
        self._age_out(log, now)
        if envelope.msg_id is not None:
            known = log.dedup.get(envelope.msg_id)
            if known is not None and now - known[1] < self.duplicate_window:
                return Accepted(known[0], duplicate=True)
        log.last_seq += 1
        channel = envelope.channel
        log.records[log.last_seq] = (channel.run, channel.node, envelope.data, now)
        if envelope.msg_id is not None:
            log.dedup[envelope.msg_id] = (log.last_seq, now)
        return Accepted(log.last_seq)

    def _age_out(self, log: _DeadLetterLog, now: float) -> None:
        # STREAM-8: a week of dead letters; oldest first, so pruned from the front.
        aged = False
        while log.records:
            _, (_, _, _, at) = next(iter(log.records.items()))
            if now - at < DLQ_RETENTION_SECONDS:
                break
            log.records.popitem(last=False)
            aged = True
        if aged:  # their msg_ids go with them, in one pass
            log.dedup = {k: v for k, v in log.dedup.items() if v[0] in log.records}

    def dead_letters(self, flow: str, run: str | None = None,
                     node: str | None = None) -> list[tuple[int, bytes]]:
        """(sequence, record bytes) of a flow's dead letters, oldest first, optionally
        of one run or one node of it -- what `videoflow dlq list` filters by subject.

        Raises:
            KeyError: the flow has no dead-letter stream.
        """
        with self.lock:
            log = self._dead_letters[flow]
            self._age_out(log, self.clock())
            return [(seq, data) for seq, (r, n, data, _) in log.records.items()
                    if (run is None or r == run) and (node is None or n == node)]

    def publish(self, envelope: Envelope) -> Accepted | Rejected:
        """Store an envelope (or recognise a duplicate msg_id inside the window); a
        'dlq' envelope goes to its flow's dead-letter stream."""
        with self.lock:
            now = self.clock()
            if envelope.size > self.max_payload:
                return Rejected(f"maximum payload exceeded ({envelope.size} > "
                                f"{self.max_payload})", retryable=False)
            if envelope.kind == "dlq":
                return self._publish_dead_letter(envelope, now)
            if envelope.subject is not None:  # this broker holds the flow's channels only
                return Rejected(f"no stream captures {envelope.subject!r}", retryable=False)
            stream = self._streams.get(envelope.channel)
            if stream is None:
                return Rejected(f"no channel captures {envelope.channel!r}", retryable=False)
            self._prune_dedup(stream, now)
            if envelope.msg_id is not None and envelope.msg_id in stream.dedup:
                return Accepted(stream.dedup[envelope.msg_id][0], duplicate=True)
            if stream.max_bytes is not None and envelope.size > stream.max_bytes:
                return Rejected("message larger than the channel's max_bytes", retryable=False)
            if stream.discard == "new" and self._full(stream, envelope.size):
                return Rejected("channel full: maximum messages or bytes exceeded",
                                retryable=True)
            stream.last_seq += 1
            seq = stream.last_seq
            if envelope.msg_id is not None:
                stream.dedup[envelope.msg_id] = (seq, now)
            interested = [d for d in stream.durables.values() if d.sub.kind == envelope.kind]
            if stream.retention == "limits" or interested:
                # INTEREST: a message nobody is subscribed to is accepted and discarded.
                stream.messages[seq] = _Message(seq, envelope.kind, envelope.data,
                                                envelope.traceparent)
                stream.size += envelope.size
                if stream.retention == "limits":
                    self._enforce_limits(stream, envelope.kind)
            self.condition.notify_all()
            return Accepted(seq)

    def in_duplicate_window(self, channel: ChannelId, msg_id: str) -> bool:
        with self.lock:
            stream = self._streams.get(channel)
            if stream is None:
                return False
            self._prune_dedup(stream, self.clock())
            return msg_id in stream.dedup

    def _prune_dedup(self, stream: _Stream, now: float) -> None:
        # Ids are remembered in the order they were first published, so the expired
        # ones are at the front: pruning costs what it removes, not the window's size.
        # (A clock set back only keeps ids longer, never forgets one early.)
        dedup = stream.dedup
        while dedup and now - next(iter(dedup.values()))[1] >= self.duplicate_window:
            dedup.popitem(last=False)

    def _full(self, stream: _Stream, incoming: int) -> bool:
        if len(stream.messages) + 1 > stream.max_msgs:
            return True
        return stream.max_bytes is not None and stream.size + incoming > stream.max_bytes

    def _enforce_limits(self, stream: _Stream, kind: str) -> None:
        # DiscardPolicy.OLD: evict the oldest until the channel fits its limits. The
        # message bound is per subject, as the JetStream stream's max_msgs_per_subject:
        # data never evicts an end-of-stream marker.
        while sum(m.kind == kind for m in stream.messages.values()) > stream.max_msgs:
            oldest = next(seq for seq, m in stream.messages.items() if m.kind == kind)
            self._remove(stream, oldest, evicted=True)
        while stream.messages and stream.max_bytes is not None and (
                stream.size > stream.max_bytes):
            self._remove(stream, next(iter(stream.messages)), evicted=True)

    def _remove(self, stream: _Stream, seq: int, evicted: bool) -> None:
        message = stream.messages.pop(seq)
        stream.size -= len(message.data)
        for durable in stream.durables.values():
            if durable.sub.kind != message.kind:
                continue
            if evicted and seq not in durable.settled:
                durable.dropped += 1
            durable.pending.pop(seq, None)
            durable.settled.discard(seq)
            durable.marked.discard(seq)

    # ---------------------------------------------------------------- delivering

    def expire(self, sub: SubscriptionId) -> None:
        """Apply the clock to a durable's leases: a lapsed lease makes its message ready
        for redelivery, or exhausted once max_deliver attempts were made (MSG-012)."""
        with self.lock:
            found = self._durable(sub)
            if found is None or found[1].spec is None:
                return
            _, durable = found
            now = self.clock()
            for pending in durable.pending.values():
                if pending.state == "leased" and pending.due <= now:
                    self._hand_back(durable, pending, now)

    def _hand_back(self, durable: _Durable, pending: _Pending, not_before: float) -> None:
        assert durable.spec is not None
        max_deliver = durable.spec.max_deliver
        if max_deliver != -1 and pending.attempt >= max_deliver:
            pending.state = "exhausted"
        else:
            pending.state, pending.due = "ready", not_before
        self.condition.notify_all()

    def lapse(self, sub: SubscriptionId, seq: int) -> bool:
        """End the lease of a delivered message now, as if its ack_wait had passed, so
        the durable delivers it again (fault injection: the redelivery a lost ack or a
        slow node causes). Returns whether the message was leased."""
        with self.lock:
            found = self._durable(sub)
            pending = None if found is None else found[1].pending.get(seq)
            if found is None or pending is None or pending.state != "leased":
                return False
            self._hand_back(found[1], pending, self.clock())
            return True

    def fetch(self, sub: SubscriptionId) -> tuple[int, int, bytes, str | None] | None:
        """Lease the next deliverable message of a durable: (seq, attempt, data,
        traceparent), or None when nothing is deliverable now or the durable's credit
        (max_ack_pending) is spent. Redeliveries come before new messages, lowest
        sequence first."""
        with self.lock:
            self.expire(sub)
            found = self._durable(sub)
            if found is None or found[1].spec is None:
                return None
            stream, durable = found
            spec = durable.spec
            assert spec is not None
            leased = sum(1 for p in durable.pending.values() if p.state == "leased")
            if leased >= spec.credit:
                return None
            now = self.clock()
            ready = [s for s, p in durable.pending.items() if p.state == "ready" and p.due <= now]
            if ready:
                seq = min(ready)
                pending = durable.pending[seq]
                pending.attempt += 1
            else:
                found_seq = self._next_fresh(stream, durable)
                if found_seq is None:
                    return None
                seq = found_seq
                durable.cursor = seq
                pending = _Pending(attempt=1, state="leased", due=0.0)
                durable.pending[seq] = pending
            pending.state, pending.due = "leased", now + spec.ack_wait_seconds
            message = stream.messages[seq]
            return seq, pending.attempt, message.data, message.traceparent

    @staticmethod
    def _next_fresh(stream: _Stream, durable: _Durable) -> int | None:
        # Sequences only grow and removal keeps dict order, so the first key is the
        # channel's first sequence; scan forward from the cursor, not the whole channel.
        if not stream.messages:
            return None
        start = max(durable.cursor + 1, next(iter(stream.messages)))
        for seq in range(start, stream.last_seq + 1):
            message = stream.messages.get(seq)
            if message is not None and message.kind == durable.sub.kind \
                    and seq not in durable.settled:
                return seq
        return None

    def is_current(self, sub: SubscriptionId, seq: int, attempt: int) -> bool:
        """Whether attempt is still the latest, unsettled attempt of the message."""
        with self.lock:
            return self._current(sub, seq, attempt)[0] == "ok"

    # ---------------------------------------------------------------- settlement

    def _current(self, sub: SubscriptionId, seq: int, attempt: int
                 ) -> tuple[BrokerAnswer, _Stream | None, _Durable | None, _Pending | None]:
        found = self._durable(sub)
        if found is None:
            return "gone", None, None, None
        stream, durable = found
        if seq not in stream.messages:
            return "gone", stream, durable, None
        pending = durable.pending.get(seq)
        if pending is None or pending.attempt != attempt:
            return "stale", stream, durable, None
        return "ok", stream, durable, pending

    def ack(self, sub: SubscriptionId, seq: int, attempt: int, terminal: bool) -> BrokerAnswer:
        """Acknowledge (or terminate) one attempt; the message is settled for good."""
        with self.lock:
            answer, stream, durable, pending = self._current(sub, seq, attempt)
            if answer != "ok":
                return answer
            assert stream is not None and durable is not None
            del durable.pending[seq]
            durable.settled.add(seq)
            if seq in durable.marked:
                durable.marked.discard(seq)
            elif terminal and durable.marked_anonymous:
                durable.marked_anonymous -= 1
            if stream.retention == "interest" and all(
                seq in d.settled for d in stream.durables.values() if d.sub.kind == sub.kind
            ):
                self._remove(stream, seq, evicted=False)
            self.condition.notify_all()
            return "ok"

    def nak(self, sub: SubscriptionId, seq: int, attempt: int, delay: float) -> BrokerAnswer:
        """Hand one attempt back for redelivery no earlier than delay seconds from now."""
        with self.lock:
            answer, _, durable, pending = self._current(sub, seq, attempt)
            if answer != "ok":
                return answer
            assert durable is not None and pending is not None
            if pending.state == "leased":
                self._hand_back(durable, pending, self.clock() + delay)
            return "ok"

    def renew(self, sub: SubscriptionId, seq: int, attempt: int) -> BrokerAnswer:
        """Restart the lease of one attempt (a lapsed one not yet redelivered too)."""
        with self.lock:
            answer, _, durable, pending = self._current(sub, seq, attempt)
            if answer != "ok":
                return answer
            assert durable is not None and pending is not None and durable.spec is not None
            if pending.state == "exhausted":
                return "stale"
            pending.state = "leased"
            pending.due = self.clock() + durable.spec.ack_wait_seconds
            return "ok"

    def mark_exhausted(self, sub: SubscriptionId, seq: int | None) -> bool:
        """Count a retained message unresolved; False when the durable does not exist."""
        with self.lock:
            found = self._durable(sub)
            if found is None:
                return False
            stream, durable = found
            if seq is None:
                durable.marked_anonymous += 1
            elif seq in stream.messages and seq not in durable.settled:
                durable.marked.add(seq)
            return True

    # -------------------------------------------------------------- observations

    def observe_channel(self, channel: ChannelId) -> ChannelObservation | None:
        with self.lock:
            stream = self._streams.get(channel)
            if stream is None:
                return None
            first = next(iter(stream.messages)) if stream.messages else stream.last_seq + 1
            return ChannelObservation(first_seq=first, last_seq=stream.last_seq,
                                      messages=len(stream.messages),
                                      retention=stream.retention)

    def observe_durable(self, sub: SubscriptionId) -> SubscriptionObservation | None:
        """available: never delivered plus due for redelivery (a Retry's delay still
        running counts, since it will come back); leased: under a running lease;
        unresolved: exhausted by max_deliver, plus those the ledger marked (which the
        broker still redelivers, so they may also count as available or leased)."""
        with self.lock:
            self.expire(sub)
            found = self._durable(sub)
            if found is None:
                return None
            stream, durable = found
            fresh = sum(1 for s, m in stream.messages.items()
                        if s > durable.cursor and m.kind == sub.kind
                        and s not in durable.settled)
            states = [p.state for p in durable.pending.values()]
            exhausted = {s for s, p in durable.pending.items() if p.state == "exhausted"}
            unresolved = len(exhausted | durable.marked) + durable.marked_anonymous
            return SubscriptionObservation(
                available=fresh + states.count("ready"),
                leased=states.count("leased"),
                unresolved=unresolved,
                dropped=durable.dropped,
            )

    def add_dropped(self, sub: SubscriptionId) -> None:
        with self.lock:
            found = self._durable(sub)
            if found is not None:
                found[1].dropped += 1

    def ack_floor(self, sub: SubscriptionId) -> int | None:
        """The highest sequence at or below which every message of the durable's kind is
        settled (a message that left the channel counts as settled)."""
        with self.lock:
            found = self._durable(sub)
            if found is None:
                return None
            stream, durable = found
            open_seqs = [s for s, m in stream.messages.items()
                         if m.kind == sub.kind and s not in durable.settled]
            return min(open_seqs) - 1 if open_seqs else stream.last_seq

    # ------------------------------------------------------------------- control

    def subscribe_control(self, flow: str, run: str, notify: Callable[[], None]) -> None:
        with self.lock:
            self._control.setdefault((flow, run), []).append(notify)

    def unsubscribe_control(self, flow: str, run: str, notify: Callable[[], None]) -> None:
        with self.lock:
            callbacks = self._control.get((flow, run), [])
            if notify in callbacks:
                callbacks.remove(notify)

    def publish_stop(self, flow: str, run: str) -> int:
        """Publish the run's flow-wide stop; returns how many subscribers were told."""
        with self.lock:
            callbacks = list(self._control.get((flow, run), []))
        for notify in callbacks:
            notify()
        return len(callbacks)
