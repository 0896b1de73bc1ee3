"""A join node's assembly as the NATS messenger runs it (the messenger's part).

Join holds the node's assembler (videoflow.messaging.grouping), which only does
arithmetic, and does with the broker what the assembler lets go of. The assembler's
resolver only queues; settle_released, after a receive batch or a call, settles: a held
delivery its redelivery superseded is retired with no settlement (the redelivery holds
the attempt); a collect sample no group took is done; any other discard is a drop,
dead-lettered or terminated as the join policy's ``missing`` says. It also tells a
time join's silence backstop which parents still have input waiting, or a producer
waiting for payload room (heard), holds back the parents that run ahead in event time
(videoflow.messaging.join_alignment), and samples the parents' watermark lags for the
run's report.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from videoflow.backends.messaging import Completed, Known, MessagingBackend, SubscriptionId
from videoflow.core.policies import JoinPolicy
from videoflow.errors import JoinIncomplete
from videoflow.messaging.clock_estimates import ClockEstimator
from videoflow.messaging.clock_learning import ClockLearning
from videoflow.messaging.grouping import (
    SUPERSEDED,
    ReadyGroup,
    make_assembler,
)
from videoflow.messaging.join_alignment import Alignment, Deferred
from videoflow.messaging.messenger_deliveries import Deliveries, Held
from videoflow.messaging.packs import member_of

LAG_SAMPLE_SECONDS: Final = 0.05
"""How often a time join samples its parents' watermark lags (watermark_lags)."""

SILENT_SHOWN_SECONDS: Final = 1.0
"""How long a parent a group waits for must have sent nothing before the join's status
calls it silent rather than behind."""

BUDGET: Final = "budget"
SILENT: Final = "silent"
BEHIND: Final = "behind"
"""Why a group waits for a parent (status()['waiting_why']): its producer waits for
room in its payload share; nothing came from it for SILENT_SHOWN_SECONDS (the backstop
gives it up at timeout_ms); or its input is on its way."""

_GAVE_UP: Final = {
    "expired": "its group was given up below quorum: the parents it lacked passed it in "
               "event time, or were silent for timeout_ms",
    "evicted": "its group was evicted: the join held max_pending groups already",
    "late": "it came behind its own parent's watermark, and no group could take it",
    "flushed": "its group was still incomplete when every parent's stream ended",
}
"""Why a join gave up on a member, by the assembler's reason (its dead letter's error)."""

CUT_OFF_SECONDS: Final = 0.5
"""How often, at most, a join with disorder_ms asks whether the parents its oldest group
lacks have deliveries cut off on their way, and how long that group must have waited
first (Join._fetch_cut_off)."""


class Join:
    """A join node's assembler and what becomes of what it lets go.

    Arguments:
        node_name / parent_names: the node and its parents.
        policy: the node's effective join policy.
        backend / deliveries: the messenger's backend and delivery part.
        data_subs: each parent's data subscription (its backlog is what the silence
            backstop hears).
        clock / epoch: monotonic seconds for timeouts and the backstop; epoch
            seconds for an input that carries no event time.
        budget_waiting: the nodes whose producers wait for room in their payload share
            right now (SharedMemoryPayloadStore.waiting_nodes); None: none ever do.
        payload_shares: per node, the bytes its writers hold against their payload
            shares ({node: {'held_bytes', 'share_bytes', 'waiting_seconds'}}); None
            where payloads have no budget.

    Attributes:
        assembler: the node's GroupAssembler.
        collect: the parents joined by collect window, not as members.
        watermark_lags / watermark_lag_max: a time join's parents' watermark lags
            behind the most advanced one, seconds: the latest sample and the most
            seen, per parent heard from (RunReport).
        alignment: a time join's Alignment (which parents it holds back); None in
            trace mode.
        clocks: a time join's ClockEstimator (its sync parents' clock offsets, from
            what it fuses and what it gives up on); None in trace mode.
    """

    def __init__(self, node_name: str, parent_names: list[str], policy: JoinPolicy,
                 backend: MessagingBackend, deliveries: Deliveries,
                 data_subs: Mapping[str, SubscriptionId], *, clock: Callable[[], float],
                 epoch: Callable[[], float],
                 budget_waiting: Callable[[], frozenset[str]] | None = None,
                 payload_shares: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
                 ) -> None:
        # What the assembler let go of, queued for settle_released. The resolver only
        # queues (a list's own extend: no Python frame), so no broker call (a
        # supersede, a dead letter) happens inside an assembler call, and what a
        # receive batch's adds let go of is settled together after the batch.
        self._released: list[tuple[Held, str]] = []
        # On the messenger's clocks: the backstops on the monotonic one the caller
        # chose, a missing event time on its epoch clock. Made again by regroup.
        self._make_assembler = lambda: make_assembler(
            node_name, parent_names, policy, clock=clock, epoch=epoch,
            resolver=self._released.extend)
        self.assembler = self._make_assembler()
        self.backend, self.deliveries, self.data_subs = backend, deliveries, data_subs
        self.clock = clock
        self.missing = policy.missing
        self.gives_up = policy.missing != "wait" and policy.timeout_ms is not None
        self.collect = frozenset(parent_names) - frozenset(policy.sync_parents(parent_names))
        self._time = policy.mode == "time"
        # A time join's silence backstop is told which parents still have input
        # waiting (hear_backlogs), at most every eighth of its timeout.
        self._hear_every = (policy.timeout_ms / 8000.0 if self._time
                            and policy.timeout_ms is not None else None)
        self._timeout_s = None if policy.timeout_ms is None else policy.timeout_ms / 1000.0
        self._disorder = policy.disorder_ms / 1000.0 if self._time else 0.0
        self._cut_off_checked = -math.inf
        # Per parent: when its leases were last seen not here (_fetch_cut_off), and
        # when they were last made to lapse.
        self._suspected: dict[str, float] = {}
        self._lapsed: dict[str, float] = {}
        # Per parent, since when (monotonic) the broker has said some of its leases are
        # not here (_leased_elsewhere); and the silent parents it said had none, not
        # asked about again until they speak (nothing new can be cut off meanwhile).
        self._unreceived_since: dict[str, float] = {}
        self._none_elsewhere: set[str] = set()
        self._heard_at = -math.inf
        self._lags_at = -math.inf
        self.watermark_lags: dict[str, float] = {}
        self.watermark_lag_max: dict[str, float] = {}
        self.budget_waiting, self.payload_shares = budget_waiting, payload_shares
        drift = policy.drift_seconds()
        self.alignment = None if drift is None else Alignment(
            parent_names, policy.sync_parents(parent_names), drift,
            None if policy.timeout_ms is None else policy.timeout_ms / 1000.0,
            policy.max_pending)
        self.max_pending = policy.max_pending
        self.clocks = ClockEstimator(
            policy.sync_parents(parent_names), (policy.tolerance_ms or 0.0) / 1000.0,
            collect_parents=self.collect) if self._time else None
        # Inputs a receive took past their parent's bound, set aside in order (defer).
        self.deferred: dict[str, deque[Deferred]] = {}
        # clock_correction='running': what the join holds while it learns its parents'
        # clocks, before its first group goes out (the messenger's to start and end).
        self.learning: ClockLearning | None = None

    def regroup(self) -> list[Held]:
        """While learning: everything the join holds -- the groups it formed, what it
        gave up on, what its assembler still buffers -- taken out, for the messenger
        to add again under new corrections; the assembler starts afresh, and so do the
        clock estimator's samples."""
        learning = self.learning
        assert learning is not None
        flushed = self.assembler.flush()
        self.settle_released()  # the rest of what it held: into learning.discards
        held = [h for g in (*learning.groups, *flushed) for h in g.handles]
        held += [h for h, _ in learning.discards]
        learning.groups.clear()
        learning.discards.clear()
        self.assembler = self._make_assembler()
        if self.clocks is not None:
            self.clocks.restart()
        return held

    def defers(self, parent: str, event_ts: float) -> bool:
        """Whether an input of parent's at event_ts must be set aside rather than
        joined: past its bound (Alignment.bounds), or behind others set aside (order
        kept)."""
        alignment = self.alignment
        return alignment is not None and (
            bool(self.deferred.get(parent)) or event_ts > alignment.bounds[parent])

    def defer(self, parent: str, item: Deferred) -> None:
        """Set an input aside until the bound passes it (the messenger holds it; its
        payload is not read yet)."""
        self.deferred.setdefault(parent, deque()).append(item)

    def due(self) -> list[Deferred]:
        """The inputs set aside that the bounds now admit, oldest first per parent
        (align updates the bounds)."""
        alignment = self.alignment
        if alignment is None or not self.deferred:
            return []
        due: list[Deferred] = []
        for parent, queue in list(self.deferred.items()):
            bound = alignment.bounds[parent]
            while queue and queue[0].event_ts <= bound:
                due.append(queue.popleft())
            if not queue:
                del self.deferred[parent]
        return due

    def deferred_count(self) -> int:
        """How many inputs are set aside."""
        return sum(len(queue) for queue in self.deferred.values())

    def arrived(self, parents: Iterable[str]) -> None:
        """Input of these parents just arrived (the batch a receive took)."""
        if self.alignment is not None:
            now = self.clock()
            for parent in parents:
                self.alignment.heard(parent, now)
                self._unreceived_since.pop(parent, None)
                self._none_elsewhere.discard(parent)

    def align(self) -> tuple[frozenset[str], int]:
        """Who the join holds back now, and how many inputs it may take next without
        passing max_pending by seeding groups (Alignment.update); nothing held back
        in trace mode.

        Returns:
            (the parents whose input to leave on the broker, the input credit: see
            Alignment.update).
        """
        alignment = self.alignment
        if alignment is None:
            return frozenset(), self.max_pending
        deferred = self.deferred
        gone = frozenset(
            p for p in self.data_subs if self.deliveries.ended(p) and not deferred.get(p)
            and self.backend.backlog(self.data_subs[p]) == Known(0))
        marks = dict(self.assembler.watermarks())
        for parent, queue in deferred.items():
            # Where its next input is: of all live parents the one furthest back is then
            # always due or taken from, so two setting aside never wait for each other.
            marks[parent] = queue[0].event_ts
        credit = alignment.update(marks, self.assembler.pending_count(), self.clock(),
                                  gone, frozenset(deferred))
        return alignment.excluded, credit

    def pop_ready(self) -> ReadyGroup | None:
        """The next complete group, if any, after the backstop heard which parents
        have input waiting and the lags were sampled (each at most as often as set);
        what the assembler let go of meanwhile is settled."""
        now = self.clock()
        if self._hear_every is not None and not now - self._heard_at < self._hear_every:
            self._hear_backlogs(now)
        if self._time and not now - self._lags_at < LAG_SAMPLE_SECONDS:
            self._sample_lags(now)
        if self._disorder:
            self._fetch_cut_off(now)
        group = self.assembler.pop_ready(now)
        self.settle_released()
        return group

    def _fetch_cut_off(self, now: float) -> None:
        """A time join that takes its parents out of order (disorder_ms) waits for a
        member that may have been cut off on its way: handed out on a path a broker
        failover cut, it would come back only once ack_wait lapses, long after its
        parent's later input gave its group up. So, at most every CUT_OFF_SECONDS,
        while the oldest group has waited that long: the parents it lacks, and the
        collect parents, whose durables lease deliveries this node neither holds nor
        has parked, twice in a row (once may be deliveries on their way), have their
        leases made to lapse
        (MessagingBackend.lapse_leases), at most once per ack_wait each. What this
        node held comes again as a newer attempt and supersedes itself."""
        if now - self._cut_off_checked < CUT_OFF_SECONDS:
            return
        self._cut_off_checked = now
        if self.assembler.oldest_wait_seconds(now) < CUT_OFF_SECONDS:
            self._suspected.clear()
            return
        # The collect parents too: no group waits on a sample, so nothing else asks,
        # and one cut off with the frames would miss its window.
        lacking = {p: self.data_subs[p] for p in (*self.assembler.waiting_for(),
                                                  *sorted(self.collect))
                   if p in self.data_subs}
        if not lacking:
            return
        for parent, count in self.deliveries.unreceived(lacking).items():
            if count == 0:
                self._suspected.pop(parent, None)
            elif parent not in self._suspected:
                self._suspected[parent] = now
            elif now - self._lapsed.get(parent, -math.inf) >= self.deliveries.ack_wait:
                self._lapsed[parent] = now
                del self._suspected[parent]
                self.backend.lapse_leases(self.data_subs[parent])

    def flush(self) -> list[ReadyGroup]:
        """Every parent ended: the groups the policy still emits; the rest is settled
        as discarded."""
        groups = self.assembler.flush(self.clock())
        self.settle_released()
        return groups

    def _sample_lags(self, now: float) -> None:
        self._lags_at = now
        lags = {p: lag for p, lag in self.assembler.watermark_lags().items() if lag is not None}
        self.watermark_lags = lags
        most = self.watermark_lag_max
        for parent, lag in lags.items():
            if lag > most.get(parent, -1.0):
                most[parent] = lag

    def _hear_backlogs(self, now: float) -> None:
        """Tell the assembler which parents have input waiting for this node (parked,
        or still on the broker: MessagingBackend.backlog), before it sweeps: such a
        parent is not silent, however long this node was away (its own code, a stall,
        a late start), so the backstop gives up on nothing its parents sent while the
        node is only behind. Refreshed at most every eighth of the timeout: a parent
        heard that recently is not silent anyway. On a partitioned durable the broker's
        count includes other replicas' messages, skipped as they arrive."""
        self._heard_at = now
        held = self._budget_held()
        quiet = []
        for parent, sub in self.data_subs.items():
            waiting = self.backend.backlog(sub)
            if (parent in held or parent in self.deferred
                    or isinstance(waiting, Known) and waiting.value > 0):
                self._hear(parent, now)
            else:
                quiet.append(parent)
        for parent in self._leased_elsewhere(quiet, now):
            self._hear(parent, now)
        self.settle_released()

    def _hear(self, parent: str, now: float) -> None:
        self.assembler.heard(parent, now)
        if self.alignment is not None:
            self.alignment.heard(parent, now)

    def _leased_elsewhere(self, quiet: list[str], now: float) -> list[str]:
        """Of the quiet parents that have been silent for half the timeout, those whose
        durables have deliveries leased that this node does not hold: a delivery handed
        to it on a path a broker failover cut comes back only once ack_wait lapses,
        and until then its parent is not silent. Heard so for at most ack_wait (and a
        timeout) from when the broker first said so: a lease held by a competing
        replica delays the backstop by no more. One round trip, only for a parent
        near its backstop, and once per silence for one that has none elsewhere."""
        alignment, timeout = self.alignment, self._timeout_s
        if alignment is None or timeout is None:
            return []
        near = {p: self.data_subs[p] for p in quiet if p not in self._none_elsewhere
                and alignment.silent_for(p, now) >= timeout / 2}
        if not near:
            return []
        limit = self.deliveries.ack_wait + timeout
        out = []
        for parent, count in self.deliveries.unreceived(near).items():
            if count == 0:
                # Asked once per silence: a round trip each time the backstop is heard
                # delayed the join's groups (CI: 26 ms against 22 for a gap's median).
                self._unreceived_since.pop(parent, None)
                self._none_elsewhere.add(parent)
                continue
            since = self._unreceived_since.setdefault(parent, now)
            if now - since < limit:
                out.append(parent)
        return out

    def _budget_held(self) -> frozenset[str]:
        """The parents whose producers wait for room in their payload share: held back
        by the budget, not silent (the backstop gives none of them up)."""
        if self.budget_waiting is None:
            return frozenset()
        return self.budget_waiting() & frozenset(self.data_subs)

    def settle_released(self) -> None:
        """Settle what the assembler let go of (it only does arithmetic): a delivery
        its redelivery superseded is retired here, with no broker settlement (the
        redelivery holds the attempt); a discarded one as the join's rules say."""
        released = self._released
        if not released:
            return
        taken = released.copy()
        released.clear()  # the same list: the resolver is bound to it
        for handle, reason in taken:
            if reason == SUPERSEDED:
                self.deliveries.let_go(handle.delivery)
                if not member_of(handle.delivery.token):  # a pack's comes again whole
                    self.backend.supersede(handle.delivery.token)
            else:
                self._discarded(handle, reason)

    def fused(self, group: ReadyGroup, now: float | None = None) -> None:
        """A group is handed to the node: the clock estimator takes its time, and its
        sync members' times when it wants them (at most SAMPLE_HZ groups a second, on
        the real clock -- a cost per second, not per group -- or on now, monotonic)."""
        clocks = self.clocks
        if clocks is None or group.event_ts is None:
            return
        if clocks.fused(group.event_ts, time.monotonic() if now is None else now):
            collect = self.collect
            clocks.members({h.parent: (t, getattr(h, "arrived", 0.0),
                                       getattr(h, "clock_epoch", 0))
                            for h in group.handles if h.parent not in collect
                            and (t := getattr(h, "event_ts", None)) is not None})
            for h in group.handles:  # the samples this group is the last to use
                if h.parent in collect and (t := getattr(h, "event_ts", None)) is not None:
                    clocks.collected(h.parent, t, getattr(h, "arrived", 0.0))

    def dispose(self, handle: Held, reason: str) -> None:
        """What the join gave up on while it learned: settled now, as its rules say."""
        self._discarded(handle, reason)

    def _discarded(self, handle: Held, reason: str) -> None:
        learning = self.learning
        if learning is not None:  # measured as it would be, and kept for the regrouping
            event_ts = getattr(handle, "event_ts", None)
            if self.clocks is not None and event_ts is not None and (
                    handle.parent not in self.collect):
                arrived = getattr(handle, "arrived", 0.0)
                self.clocks.missed(handle.parent, event_ts, arrived, arrived,
                                   getattr(handle, "clock_epoch", 0))
            learning.discards.append((handle, reason))
            return
        if handle.parent in self.collect and reason in ("expired", "flushed"):
            # A sample no group took, released once no group could: done, not lost.
            self.deliveries.settle_later(handle.delivery, Completed())
            return
        event_ts = getattr(handle, "event_ts", None)
        if self.clocks is not None and event_ts is not None:  # a near miss, or further off
            self.clocks.missed(handle.parent, event_ts, getattr(handle, "arrived", 0.0),
                               time.monotonic(), getattr(handle, "clock_epoch", 0))
        # A late one came behind its parent's watermark and no group could take it.
        self.deliveries.drops["join_late" if reason == "late" else "join_evicted"] += 1
        if self.missing == "dead_letter":
            self.deliveries.let_go(handle.delivery)
            self.deliveries.dead_letter(handle, JoinIncomplete(_GAVE_UP.get(reason, reason)),
                                        f"join {reason}", "join_incomplete")
        else:
            self.deliveries.terminate(handle.parent, handle.delivery, f"join {reason}")

    def waiting_why(self, waiting_for: Iterable[str]) -> dict[str, str]:
        """Why the oldest group waits for each of these parents: BUDGET, SILENT or
        BEHIND (see their docstring)."""
        held = self._budget_held()
        alignment, now = self.alignment, self.clock()
        why: dict[str, str] = {}
        for parent in waiting_for:
            if parent in held:
                why[parent] = BUDGET
            elif alignment is not None and (
                    alignment.silent_for(parent, now) >= SILENT_SHOWN_SECONDS):
                why[parent] = SILENT
            else:
                why[parent] = BEHIND
        return why

    def held_back_seconds(self) -> dict[str, float]:
        """Per parent, how long alignment has held it back so far ({} in trace mode)."""
        alignment = self.alignment
        return {} if alignment is None else alignment.held_back_seconds(self.clock())

    def status(self) -> dict[str, Any]:
        """What the join is doing (NATSMessenger.join_status)."""
        assembler = self.assembler
        waiting_for = assembler.waiting_for()
        status = {
            "waiting_groups": assembler.pending_count(),
            "oldest_wait_seconds": assembler.oldest_wait_seconds(self.clock()),
            "waiting_for": waiting_for,
            "waiting_why": self.waiting_why(waiting_for),
            "watermark_lag_seconds": assembler.watermark_lags(),
            "gives_up": self.gives_up,
            "held_back": {} if self.alignment is None else dict(self.alignment.held),
            "held_back_seconds": self.held_back_seconds(),
        }
        if self.clocks is not None:
            estimates = self.clocks.estimates()
            status["clock_offsets"] = {p: e.to_dict() for p, e in estimates.items()}
            status["clock_advice"] = self.clocks.advice(estimates)
        if self.payload_shares is not None:
            shares = self.payload_shares()
            status["payload_shares"] = {p: dict(shares[p]) for p in self.data_subs
                                        if p in shares}
        return status


__all__ = ["BEHIND", "BUDGET", "LAG_SAMPLE_SECONDS", "SILENT", "SILENT_SHOWN_SECONDS", "Join"]
