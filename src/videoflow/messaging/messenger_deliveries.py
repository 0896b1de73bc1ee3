"""Deliveries: what becomes of the deliveries a node's messenger takes, and when its
parents have ended.

Every delivery the messenger holds unsettled (in the assembler, or in the group handed
out) is its own share of its durable's leases, until it is settled: completed, handed
back to be retried, dead-lettered, or terminated. A delivery is given up on only against
a durable record (DELIV-15): the dead letter when one was accepted, else an entry in the
node's terminal log. What counts as a drop is counted by reason (DROP_REASONS). Under
the local engine, the group handed to the node is recorded where the engine reads it
after a process death, and a redelivered input that coincided with the run's
crash_limit deaths is dead-lettered as crashed_worker instead of handed out again
(watch_crashes).

End of stream: a node publishes one marker per replica on its channel's EOS subject,
carrying its replica count in metadata ({"replicas": n}), so a child knows how many
markers end that parent. A parent has ended once all its replicas' markers arrived, and
is drained once nothing more of its data is coming: its durable reports nothing
available and nothing leased -- a lease held by a replica that died comes back when it
lapses -- (or, when that cannot be observed, no data of it arrived for
eos_quiescence_ms) and nothing of it is parked here. Its data published before each
marker was confirmed before the marker was sent, so it is in the stream.
"""

from __future__ import annotations

import concurrent.futures
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from videoflow import clock
from videoflow.backends.messaging import (
    Completed,
    Delivery,
    DeliveryToken,
    Known,
    MessagingBackend,
    Receipt,
    Retry,
    SettleConfirmed,
    SettleOutcome,
    SettleResult,
    SettleUnknown,
    SubscriptionId,
    Terminal,
)
from videoflow.core.credit import SETTLE_BATCH  # gathered at most before send_completed
from videoflow.core.policies import WORKER_FATAL, DeliveryPolicy, classify_error
from videoflow.core.runtime import FlowRuntime
from videoflow.messaging.dead_letters import (
    Reason,
    WorkerCrashed,
    dead_letter,
    dead_letter_for,
)
from videoflow.messaging.grouping import EndEntry
from videoflow.messaging.messenger_payloads import MessengerPayloads
from videoflow.messaging.packs import PackMemberToken, Packs, delivery_key, member_of
from videoflow.messaging.tracing import settled
from videoflow.wire.serialization import encode_envelope

DROP_REASONS: Final = ("exhausted", "undecodable", "join_evicted", "join_late",
                        "publish_discarded", "superseded")


PASSING_REASONS: Final = ("timeout", "unreachable", "api")
"""Unknown reasons of an observation the broker may answer if asked again: drained
waits for its answer instead of falling back to eos_quiescence."""


def end_marker(node_name: str, flow_id: str, run_id: str, replica_id: int, nb_tasks: int,
               is_abort: bool, error: Any, origin: str | None = None) -> bytes:
    """The envelope of one replica's end of stream: clean, or an abort carrying why.

    Arguments:
        node_name / flow_id / run_id: the node and its run.
        replica_id / nb_tasks: this replica and the node's replica count, which the
            marker carries so a child knows how many markers end this node.
        is_abort: an abnormal end.
        error: an exception, or an error record ({'type', 'message'}); None for a
            clean end.
        origin: the node that died first, when relaying a parent's abort; this node
            when None.

    Returns:
        The encoded envelope.
    """
    if error is None or isinstance(error, dict):
        record = error
    else:
        record = {"type": type(error).__name__, "message": str(error)}
    return encode_envelope(
        None, trace_id=f"{node_name}:end", seq=replica_id,
        metadata={"replicas": nb_tasks}, is_stop_signal=not is_abort,
        producer_name=node_name, flow_id=flow_id, run_id=run_id,
        replica_id=replica_id, is_abort=is_abort,
        abort_origin=(origin or node_name) if is_abort else None,
        abort_error=record)


def end_entry(aborted: dict[str, Any] | None) -> EndEntry:
    """The entry receive_message returns for a parent that ended.

    Arguments:
        aborted: the abort marker it sent, or None for a clean end.

    Returns:
        A stop entry (is_stop_signal True), or an abort entry carrying the abort's
        origin and error: its error record as written ({"type", "message"}, or None),
        or, from a writer that sent something else, {"type": "malformed", "message":
        what it sent} -- the task reads the record's keys, and relays it.
    """
    if aborted is None:
        return EndEntry(True)
    error, origin = aborted["abort_error"], aborted["abort_origin"]
    if error is not None and not (isinstance(error, dict) and all(
            isinstance(error.get(key, ""), str) for key in ("type", "message"))):
        error = {"type": "malformed", "message": repr(error)[:500]}
    return EndEntry(False, True, origin, error)


COMPLETED_KEPT: Final = 8192
"""A join's acknowledged inputs remembered for completed_before: several seconds of
inputs at any rate the join keeps up with, the span a failover's redeliveries come in."""


def _completed_key(parent: str, delivery: Delivery) -> tuple[str, int, int]:
    return parent, delivery.stream_seq, member_of(delivery.token)


class Held(Protocol):
    """What the messenger holds for one delivery (its assembler handle)."""

    parent: str
    sub: SubscriptionId
    delivery: Delivery
    blob_ref: str | None


@dataclass(slots=True)
class _ParentEnd:
    """The end-of-stream markers one parent's replicas sent."""

    expected: int = 1
    markers: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_data: float = 0.0


SETTLE_LINGER_SECONDS: Final = 0.01
"""How long a gathered Completed settlement may wait for others before it is sent
(send_completed_due). A node that idles between inputs resolves one group per wait:
sent at every wait, each ack was a confirming round trip of its own. At 700 inputs/s
through a linear BATCH flow on the 2-core bench host, gathering for 10 ms took the
sink from 530 to 460 us of CPU per input and the server from 880 to 700-730, and the
p50 latency per hop from 2.6-2.7 ms to 1.2-1.8 ms. An input is already processed and
its outputs confirmed: its ack waiting a little longer only delays its release from the
broker's credit."""

_COMPLETED: Final = Completed()


class Deliveries:
    """One node's deliveries: which it holds, how each is settled or given up, what
    was dropped, and each parent's end (see the module docstring).

    Arguments:
        node_name / flow_id / run_id: the node and its run.
        parent_names: its real parents, by name.
        backend: the MessagingBackend it settles on and observes.
        runtime: the node's FlowRuntime ledger (attempts, terminal log, handoffs).
        payloads: the messenger's by-ref payload side (released on a confirmed
            settlement, pinned for a dead letter).
        delivery_policy: the node's effective delivery policy (its action_for).
        ledger_budget: the retry budget is counted in the ledger, not by the broker.
        ack_wait: the durables' lease, in seconds: a dead letter's deadline.
        eos_quiescence: how long, in seconds, a parent's data must stay quiet after its
            last end marker before it counts as drained, when the broker cannot say.
        clock: wall-clock seconds, for dead letters' timestamps.
    """

    def __init__(self, node_name: str, flow_id: str, run_id: str, parent_names: list[str],
                 backend: MessagingBackend, runtime: FlowRuntime,
                 payloads: MessengerPayloads, *, delivery_policy: DeliveryPolicy,
                 ledger_budget: bool, ack_wait: int, eos_quiescence: float,
                 clock: Callable[[], float]) -> None:
        self.node_name, self.flow_id, self.run_id = node_name, flow_id, run_id
        self.parent_names = list(parent_names)
        self.backend = backend
        self.runtime = runtime
        self.payloads = payloads
        self.delivery_policy = delivery_policy
        self.ledger_budget = ledger_budget
        self.ack_wait = ack_wait
        self.eos_quiescence = eos_quiescence
        self.clock = clock
        self.drops = dict.fromkeys(DROP_REASONS, 0)
        self._dropped_before: dict[str, int] = {}  # what take_drops handed over
        self.dead_lettered = 0  # inputs this process dead-lettered (records accepted)
        self.unconfirmed_acks = 0  # acks the broker did not confirm (redelivered later)
        self._counted: set[str] = set()  # inputs whose failures this process counted
        self._to_settle: list[tuple[Delivery, SettleOutcome]] = []
        self._to_terminate: list[tuple[Delivery, tuple[str, str, str]]] = []
        # Completed settlements not sent yet, and in flight, oldest first
        # (complete_later, send_completed), each with the handles it settles: one, or
        # the completed members of a pack.
        self._unsent: list[tuple[list[Held], tuple[DeliveryToken, SettleOutcome, str]]] = []
        self._unsent_since = 0.0  # monotonic: when the oldest unsent one was gathered
        self._settling: deque[tuple[list[Held], Receipt[SettleResult]]] = deque()
        # Packs whose members are out: settled once their last member is.
        self.packs = Packs()
        # Settle spans (tracing), by the token of their group's last handle: ended once
        # that handle's settlement is answered, the group's others before it.
        self._settle_spans: dict[DeliveryToken, Any] = {}
        self._ends: dict[str, _ParentEnd] = {p: _ParentEnd() for p in self.parent_names}
        # Deliveries of each parent the messenger holds unsettled (in the assembler or
        # in the group handed out): its own share of the durable's leases.
        self._held: dict[str, set[DeliveryToken]] = {p: set() for p in self.parent_names}
        # A join's inputs whose groups went out and were acknowledged here, latest
        # last (completed_before); None for a node with one parent.
        self._completed: OrderedDict[tuple[str, int, int], None] | None = (
            OrderedDict() if len(self.parent_names) > 1 else None)
        # The local engine's crash bookkeeping (watch_crashes); None elsewhere.
        self._in_hand: Any = None
        self._crashes: Any = None
        self._crash_limit = 0

    # ------------------------------------------------------------------ holding

    def data_arrived(self, parent: str) -> None:
        """A delivery of parent's data arrived (decodable or not): it is not quiet."""
        self._ends[parent].last_data = clock.monotonic()

    def hold(self, parent: str, token: DeliveryToken) -> None:
        """The messenger holds this delivery of parent's unsettled."""
        self._held[parent].add(token)

    def let_go(self, delivery: Delivery) -> None:
        """The messenger no longer holds this delivery (settled, or about to be)."""
        self._held[delivery.token.subscription.channel.node].discard(delivery.token)

    def _held_messages(self, parent: str) -> int:
        """How many of the broker's messages of parent this messenger holds: the
        broker leases messages, and a pack's members held are one of them."""
        tokens = self._held[parent]
        return len({t.stream_seq for t in tokens}) if self.packs else len(tokens)

    def unreceived(self, subs: Mapping[str, SubscriptionId]) -> dict[str, int]:
        """Per parent, the deliveries its durable has leased out that this messenger
        neither holds nor has parked: leased to another replica, or handed to this one
        on a path a broker failover cut (they come back once ack_wait lapses). One
        round trip for every parent; a parent the broker did not answer for is left
        out.

        Arguments:
            subs: the parents' data subscriptions.
        """
        parents = list(subs)
        seen = self.backend.observe_subscriptions([subs[p] for p in parents])
        out: dict[str, int] = {}
        for parent, observed in zip(parents, seen, strict=True):
            if isinstance(observed, Known):
                mine = self._held_messages(parent) + self.backend.prefetched(subs[parent])
                out[parent] = max(0, observed.value.leased - mine)
        return out

    # ------------------------------------------------------------------ crashes

    def watch_crashes(self, in_hand: Any, crashes: Any, limit: int | None) -> None:
        """Take part in the local engine's crash bookkeeping (videoflow.run.supervision):
        record the group in hand in in_hand, and dead-letter a redelivered input whose
        delivery coincided with limit deaths of this node's processes as crashed_worker.

        Arguments:
            in_hand: an InHandSlot (hold(handles), release()).
            crashes: a CrashCounts (deaths(parent, stream_seq) -> how each ended).
            limit: the deaths after which an input is given up on; None: never.
        """
        self._in_hand, self._crashes = in_hand, crashes
        self._crash_limit = limit or 0

    def hand_out(self, handles: Sequence[Held]) -> None:
        """The node gets this group now: until hand_back, a death of this process
        counts against each of its deliveries."""
        if self._in_hand is not None:
            self._in_hand.hold(handles)

    def hand_back(self) -> None:
        """The group handed out is done with (acknowledged or failed)."""
        if self._in_hand is not None:
            self._in_hand.release()

    def crash_looped(self, handle: Held) -> bool:
        """Dead-letter this delivery as crashed_worker, instead of handing it to the
        node, if the engine counted crash_limit process deaths while it was in hand
        (only a redelivery can have any: the first delivery is always processed).

        Returns:
            whether it was given up on (its dead letter accepted or, when not, left
            alive for a later attempt as dead_letter does): the caller holds it no more.
        """
        delivery = handle.delivery
        if self._crashes is None or not self._crash_limit or delivery.num_delivered < 2:
            return False
        deaths = self._crashes.deaths(handle.parent, delivery.stream_seq)
        if len(deaths) < self._crash_limit:
            return False
        error = WorkerCrashed(
            f"{len(deaths)} processes of {self.node_name} died while this input was in "
            f"hand ({', '.join(deaths)}); not processed again")
        self.dead_letter(handle, error, "crashed_worker", "crashed_worker")
        return True

    # ------------------------------------------------------------------ settling

    def complete_later(self, handles: Sequence[Held], key: str) -> None:
        """Start settling every handle of one group Completed without waiting: the
        answers are read by collect_settled, which alone releases a payload
        obligation, and only on a confirmed settlement (PAY-004).

        Arguments:
            handles: the group's handles.
            key: the group's identity ({trace_id}:{seq}), naming the settlements.
        """
        if not self._unsent:
            self._unsent_since = clock.monotonic()
        completed = self._completed
        for index, handle in enumerate(handles):
            self.let_go(handle.delivery)
            if completed is not None:
                completed[_completed_key(handle.parent, handle.delivery)] = None
            if self._counted:  # only after failures: no key is built on the usual path
                counted = delivery_key(handle.parent, handle.delivery)
                if counted in self._counted:  # it failed before: its count is done with
                    self._counted.discard(counted)
                    self.runtime.clear_attempts(counted)
            token = handle.delivery.token
            if isinstance(token, PackMemberToken):
                retried = self._settle_member(token, _COMPLETED, f"ack:{key}:{index}", handle)
                if retried is not None:
                    self._to_settle.append(retried)  # sent with the next settle_pending
                continue
            self._unsent.append(([handle], (token, _COMPLETED, f"ack:{key}:{index}")))
        if completed is not None:
            while len(completed) > COMPLETED_KEPT:  # the oldest, one at a time: O(1) each
                completed.popitem(last=False)
        if len(self._unsent) >= SETTLE_BATCH or any(h.blob_ref is not None for h in handles):
            # A payload held by ref is released only once its ack is confirmed: a
            # frame's memory is worth a round trip of its own.
            self.send_completed()

    def completed_before(self, parent: str, delivery: Delivery) -> bool:
        """Whether a join already acknowledged this delivery of parent's (its group went
        out, its outputs were accepted): a redelivery of it (the broker never got the
        ack: a failover, a lapse of the durable's leases) is done, and must not be
        grouped again, where it could make a second group of its instant with a member
        that was missing from the first."""
        completed = self._completed
        return completed is not None and _completed_key(parent, delivery) in completed

    def trace_settlement(self, handles: Sequence[Held], span: Any) -> None:
        """Track one acknowledged group's settle span (videoflow.messaging.tracing):
        ended once every handle's Completed settlement is answered (collect_settled),
        or when the group fails after all (fail)."""
        if handles and span is not None:
            self._settle_spans[handles[-1].delivery.token] = span

    def send_completed_due(self, away: float = 0.0) -> None:
        """send_completed once the oldest gathered settlement has waited
        SETTLE_LINGER_SECONDS, or would have by the time the caller is back (complete_later
        sends at SETTLE_BATCH on its own, and collect_settled(wait=True) sends them all
        before any drain).

        Arguments:
            away: how long, in seconds, the caller expects to be away before it calls
                again (a node's time on its next group): what would be overdue by then
                goes now, so a slow node's settlements never wait on its next group.
        """
        left = self.linger_left()
        if left is not None and left <= away:
            self.send_completed()

    def linger_left(self) -> float | None:
        """Seconds until send_completed_due sends what is gathered (0 when overdue);
        None when nothing is gathered."""
        if not self._unsent:
            return None
        return max(0.0, self._unsent_since + SETTLE_LINGER_SECONDS - clock.monotonic())

    def send_completed(self) -> None:
        """Send the Completed settlements complete_later gathered, as one batch: the
        groups of a burst resolve one by one, and one batch costs one confirming round
        trip where one settlement each cost one each. The messenger sends them from its
        receive loop once due (send_completed_due), so none waits much longer than
        SETTLE_LINGER_SECONDS."""
        if not self._unsent:
            return
        unsent, self._unsent = self._unsent, []
        receipts = self.backend.settle_many_async([settlement for _, settlement in unsent])
        self._settling.extend(zip([handles for handles, _ in unsent], receipts, strict=True))

    @property
    def settling(self) -> int:
        """Completed settlements started and not yet answered."""
        return len(self._settling) + len(self._unsent)

    def collect_settled(self, wait: bool) -> None:
        """Read the answers of the Completed settlements started so far, oldest first:
        count the unconfirmed ones (redelivered later) and release the payload
        obligation of each confirmed one (PAY-004).

        Arguments:
            wait: wait for every answer (the backend bounds each); otherwise stop at
                the first one not yet in.
        """
        if wait:
            self.send_completed()
        settling = self._settling
        done: list[str] = []
        try:
            while settling:
                handles, future = settling[0]
                if not future.done() and not wait:
                    return
                settling.popleft()
                try:
                    result = future.result(timeout=self.ack_wait)
                except concurrent.futures.TimeoutError:
                    result = SettleUnknown("the backend did not answer the settlement")
                if self._settle_spans:
                    status = ("unknown" if isinstance(result, SettleUnknown)
                              else type(result).__name__.removeprefix("Settle").lower())
                    for handle in handles:
                        settled(self._settle_spans.pop(handle.delivery.token, None), status)
                if isinstance(result, SettleUnknown):
                    self.unconfirmed_acks += 1
                elif isinstance(result, SettleConfirmed):
                    for handle in handles:
                        if handle.blob_ref is not None:
                            done.append(handle.blob_ref)
        finally:
            if done:  # the payloads of every confirmed settlement, released together
                self.payloads.read_done_many(done)

    def fail(self, handles: Sequence[Held], exc: BaseException) -> bool:
        """Execute the delivery policy's verdict for exc on every handle of one group:
        retry after the backoff, hand back without counting (worker-fatal),
        dead-letter then terminate (poison, or the retry budget spent), or terminate
        against the terminal log and count it (best effort).

        Returns:
            whether any handle comes again (retried or handed back).
        """
        again = False
        if self._settle_spans and handles:  # an acknowledged group whose output failed
            settled(self._settle_spans.pop(handles[-1].delivery.token, None), "failed")
        for handle in handles:
            delivery = handle.delivery
            self.let_go(delivery)
            action = self.delivery_policy.action_for(exc, self._attempts(handle, exc))
            if action.kind == "retry":
                self.settle_later(delivery, Retry(action.delay))
                again = True
            elif action.kind == "nak_uncounted":
                self.settle_later(delivery, Retry(0.0))
                again = True
            elif action.kind == "dead_letter":
                self.dead_letter(handle, exc, action.reason)
            else:  # drop
                self.drops["exhausted"] += 1
                self.terminate(handle.parent, delivery, action.reason or "dropped")
        self.settle_pending()
        return again

    def _attempts(self, handle: Held, exc: BaseException) -> int:
        """The attempt number the delivery policy judges: the broker's delivery count,
        or -- under the ledger's budget -- the attempts counted in the ledger, where a
        worker-fatal failure is never counted (the message is fine; this worker is
        not)."""
        if not self.ledger_budget:
            return handle.delivery.num_delivered
        key = delivery_key(handle.parent, handle.delivery)
        if classify_error(exc) == WORKER_FATAL:
            return max(self.runtime.attempts(key), 1)
        self._counted.add(key)
        return self.runtime.count_attempt(key)

    def dead_letter(self, handle: Held, exc: BaseException | None, reason: str,
                    kind: Reason | None = None) -> None:
        """Give a delivery up against a dead letter (DELIV-15); if the dead letter was
        not accepted, the delivery stays alive for a later attempt.

        Arguments:
            handle: the delivery's handle.
            exc: the failure, if any.
            reason: why ('poison…' makes a poison dead letter).
            kind: the dead letter's kind; from reason when None.
        """
        delivery = handle.delivery
        if kind is None:
            kind = "poison" if reason.startswith("poison") else "retries_exhausted"
        record = dead_letter_for(
            self.flow_id, self.run_id, self.node_name, handle.parent, delivery.stream_seq,
            delivery.num_delivered, kind, delivery.data, exc, self.clock())
        # BLOB-14 step 3: the dead letter carries the ref, so its payload is pinned
        # for as long as dead letters are kept, before the dead letter exists.
        pinned = handle.blob_ref is not None and self.payloads.pin_for_dead_letter(
            handle.blob_ref, handle.parent, delivery.stream_seq)
        member = member_of(delivery.token)
        done = dead_letter(self.backend, delivery.token, record,
                           clock.monotonic() + self.ack_wait,
                           traceparent=delivery.traceparent, member=member,
                           settle=self._member_given_up if member else None)
        if done.settled is not None:
            self.dead_lettered += 1
        if pinned and isinstance(done.settled, SettleConfirmed):
            assert handle.blob_ref is not None
            self.payloads.read_done(handle.blob_ref)  # PAY-004: its settlement confirmed
        if done.settled is None:
            # The dead letter was not accepted: the delivery stays alive for a later
            # attempt, and the ledger and the broker's observation both say so.
            key = delivery_key(handle.parent, delivery)
            self.runtime.add_pending_handoff(key, handle.parent, reason)
            self.backend.mark_exhausted(handle.sub, delivery.stream_seq)
            self.drops["exhausted"] += 1

    def terminate(self, parent: str, delivery: Delivery, reason: str) -> None:
        """Give a delivery up against a terminal-log record (DELIV-15), settled with
        the next settle_pending, which logs every termination queued by then in one
        batch first."""
        key = delivery_key(parent, delivery)
        self._to_terminate.append((delivery, (key, f"terminal:{self.node_name}:{key}", reason)))

    def settle_later(self, delivery: Delivery, outcome: SettleOutcome) -> None:
        """Queue a settlement for the next settle_pending."""
        self._to_settle.append((delivery, outcome))

    def settle_pending(self) -> None:
        """Settle everything queued, in one batch; a termination only once its
        terminal-log entry is written (DELIV-15).

        Raises:
            SupersededOwner / LedgerError / BrokerUnavailable: the terminal log could
                not be written (FlowRuntime.log_terminals); everything stays queued.
        """
        if self._to_terminate:
            entries = self.runtime.log_terminals([entry for _, entry in self._to_terminate])
            self._to_settle.extend(
                (delivery, Terminal(entry.record_ref))
                for (delivery, _), entry in zip(self._to_terminate, entries, strict=True))
            self._to_terminate = []
        pending, self._to_settle = self._to_settle, []
        for delivery, _ in pending:
            self.let_go(delivery)
        if self.packs:  # a member's settlement waits for its pack's last
            pending = self._members_settled(pending)
        if pending:
            self.backend.settle_many(
                [(d.token, outcome, f"{type(outcome).__name__}:{d.token.stream_seq}:"
                  f"{d.token.attempt}:{d.token.subscription.channel.node}")
                 for d, outcome in pending])

    def _members_settled(self, pending: list[tuple[Delivery, SettleOutcome]]
                         ) -> list[tuple[Delivery, SettleOutcome]]:
        """What of pending goes to the broker now: the settlements of messages alone,
        and of the packs whose last member this settles (a Completed one gathered with
        the rest, complete_later's way)."""
        out: list[tuple[Delivery, SettleOutcome]] = []
        for delivery, outcome in pending:
            token = delivery.token
            if not isinstance(token, PackMemberToken):
                out.append((delivery, outcome))
                continue
            retried = self._settle_member(
                token, outcome, f"{type(outcome).__name__}:{delivery.stream_seq}")
            if retried is not None:
                out.append(retried)
        return out

    def _settle_member(self, token: PackMemberToken, outcome: SettleOutcome, name: str,
                       handle: Held | None = None) -> tuple[Delivery, SettleOutcome] | None:
        """Take one pack member's settlement (handle: a completed one's, whose payload
        is let go with its pack's confirmed ack). Once it was the pack's last, the pack
        is settled: Completed gathered with the other acknowledgements, the completed
        members' handles with it; a Retry returned for the caller to send (the
        completed members come again with the pack)."""
        done = self.packs.settle(token, outcome, handle)
        if done is None:
            return None
        if isinstance(done.outcome, Completed):
            if not self._unsent:
                self._unsent_since = clock.monotonic()
            self._unsent.append((done.waiting, (done.delivery.token, _COMPLETED, name)))
            return None
        return done.delivery, done.outcome

    def _member_given_up(self, token: DeliveryToken, outcome: SettleOutcome, name: str
                         ) -> SettleResult:
        """A pack member's Terminal settlement, against its dead letter: recorded in its
        pack, whose message is settled with its last member. Confirmed: the member is
        done with here."""
        assert isinstance(token, PackMemberToken)
        retried = self._settle_member(token, outcome, name)
        if retried is not None:
            self._to_settle.append(retried)
        return SettleConfirmed()

    def take_drops(self) -> dict[str, int]:
        """Inputs given up on since the last call, by reason (DROP_REASONS)."""
        drops, self.drops = self.drops, dict.fromkeys(DROP_REASONS, 0)
        for reason, n in drops.items():
            self._dropped_before[reason] = self._dropped_before.get(reason, 0) + n
        return drops

    def dropped(self) -> dict[str, int]:
        """Inputs given up on so far, by reason, whoever took them (take_drops)."""
        return {reason: self._dropped_before.get(reason, 0) + n
                for reason, n in self.drops.items()}

    # ------------------------------------------------------------------ end of stream

    def on_marker(self, parent: str, marker: dict[str, Any]) -> None:
        """Count one decoded end marker of parent's: the first from each replica counts,
        and the replica count it carries sets how many end the parent."""
        end = self._ends[parent]
        replicas = (marker.get("metadata") or {}).get("replicas", 1)
        end.expected = replicas if isinstance(replicas, int) and replicas >= 1 else 1
        end.markers.setdefault(marker["replica_id"], marker)

    def ended(self, parent: str) -> bool:
        """Whether every replica of parent sent its end marker (its data may still be
        on its way: drained says when it is all here)."""
        end = self._ends[parent]
        return bool(end.markers) and len(end.markers) >= end.expected

    def drained(self, parent: str, sub: SubscriptionId) -> bool:
        """Whether parent ended and nothing more of its data is coming (see the module
        docstring).

        Arguments:
            parent: the parent.
            sub: this node's data subscription on it.
        """
        if not self.ended(parent):
            return False
        end = self._ends[parent]
        if self.backend.prefetched(sub):
            return False
        observed = self.backend.observe_subscription(sub)
        if isinstance(observed, Known):
            # Nothing waiting, and nothing leased but what this messenger holds itself
            # (halves in the assembler): a lease held by a replica that died comes back
            # when it lapses, and someone must still be here to take it.
            held = self._held_messages(parent)
            return observed.value.available == 0 and observed.value.leased <= held
        if observed.reason in PASSING_REASONS:
            # The broker is there but did not answer now (away, frozen, a cluster
            # electing the consumer's leader): ask again, never take quiet for drained,
            # or the node ends with its parent's data still on the broker.
            return False
        return clock.monotonic() - end.last_data >= self.eos_quiescence

    def stop_entries(self) -> dict[str, EndEntry]:
        """Per parent, its end entry: an abort entry if any of its replicas aborted,
        else a stop entry."""
        entries: dict[str, EndEntry] = {}
        for parent in self.parent_names:
            markers = self._ends[parent].markers
            entries[parent] = end_entry(
                next((m for m in markers.values() if m["is_abort"]), None))
        return entries


__all__ = ["DROP_REASONS", "SETTLE_BATCH", "SETTLE_LINGER_SECONDS", "Deliveries", "Held",
           "end_entry", "end_marker"]
