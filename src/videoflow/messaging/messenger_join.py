"""A join node's assembly as the NATS messenger runs it (the messenger's part).

Join holds the node's assembler (videoflow.messaging.grouping), which only does
arithmetic, and does with the broker what the assembler lets go of: a held delivery
its redelivery superseded is retired with no settlement (the redelivery holds the
attempt); a collect sample no group took is done; any other discard is a drop,
dead-lettered or terminated as the join policy's ``missing`` says. It also tells a
time join's silence backstop which parents still have input waiting (heard), and
samples the parents' watermark lags for the run's report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from videoflow.backends.messaging import Completed, Known, MessagingBackend, SubscriptionId
from videoflow.core.policies import JoinPolicy
from videoflow.errors import JoinIncomplete
from videoflow.messaging.grouping import (
    SUPERSEDED,
    ReadyGroup,
    make_assembler,
)
from videoflow.messaging.messenger_deliveries import Deliveries, Held

LAG_SAMPLE_SECONDS: Final = 0.05
"""How often a time join samples its parents' watermark lags (watermark_lags)."""

_GAVE_UP: Final = {
    "expired": "its group was given up below quorum: the parents it lacked passed it in "
               "event time, or were silent for timeout_ms",
    "evicted": "its group was evicted: the join held max_pending groups already",
    "late": "it came behind its own parent's watermark, and no group could take it",
    "flushed": "its group was still incomplete when every parent's stream ended",
}
"""Why a join gave up on a member, by the assembler's reason (its dead letter's error)."""


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

    Attributes:
        assembler: the node's GroupAssembler.
        collect: the parents joined by collect window, not as members.
        watermark_lags / watermark_lag_max: a time join's parents' watermark lags
            behind the most advanced one, seconds: the latest sample and the most
            seen, per parent heard from (RunReport).
    """

    def __init__(self, node_name: str, parent_names: list[str], policy: JoinPolicy,
                 backend: MessagingBackend, deliveries: Deliveries,
                 data_subs: Mapping[str, SubscriptionId], *, clock: Callable[[], float],
                 epoch: Callable[[], float]) -> None:
        # On the messenger's clocks: the backstops on the monotonic one the caller
        # chose, a missing event time on its epoch clock.
        self.assembler = make_assembler(node_name, parent_names, policy, clock=clock,
                                        epoch=epoch)
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
        self._heard_at = -math.inf
        self._lags_at = -math.inf
        self.watermark_lags: dict[str, float] = {}
        self.watermark_lag_max: dict[str, float] = {}

    def pop_ready(self) -> ReadyGroup | None:
        """The next complete group, if any, after the backstop heard which parents
        have input waiting and the lags were sampled (each at most as often as set);
        what the assembler let go of meanwhile is settled."""
        now = self.clock()
        if self._hear_every is not None and not now - self._heard_at < self._hear_every:
            self._hear_backlogs(now)
        if self._time and not now - self._lags_at < LAG_SAMPLE_SECONDS:
            self._sample_lags(now)
        group = self.assembler.pop_ready(now)
        self.settle_released()
        return group

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
        for parent, sub in self.data_subs.items():
            waiting = self.backend.backlog(sub)
            if isinstance(waiting, Known) and waiting.value > 0:
                self.assembler.heard(parent, now)
        self.settle_released()

    def settle_released(self) -> None:
        """Settle what the assembler let go of (it only does arithmetic): a delivery
        its redelivery superseded is retired here, with no broker settlement (the
        redelivery holds the attempt); a discarded one as the join's rules say."""
        if not self.assembler.released:
            return
        for handle, reason in self.assembler.take_released():
            if reason == SUPERSEDED:
                self.deliveries.let_go(handle.delivery)
                self.backend.supersede(handle.delivery.token)
            else:
                self._discarded(handle, reason)

    def _discarded(self, handle: Held, reason: str) -> None:
        if handle.parent in self.collect and reason in ("expired", "flushed"):
            # A sample no group took, released once no group could: done, not lost.
            self.deliveries.settle_later(handle.delivery, Completed())
            return
        # A late one came behind its parent's watermark and no group could take it.
        self.deliveries.drops["join_late" if reason == "late" else "join_evicted"] += 1
        if self.missing == "dead_letter":
            self.deliveries.let_go(handle.delivery)
            self.deliveries.dead_letter(handle, JoinIncomplete(_GAVE_UP.get(reason, reason)),
                                        f"join {reason}", "join_incomplete")
        else:
            self.deliveries.terminate(handle.parent, handle.delivery, f"join {reason}")

    def status(self) -> dict[str, Any]:
        """What the join is doing (NATSMessenger.join_status)."""
        assembler = self.assembler
        return {
            "waiting_groups": assembler.pending_count(),
            "oldest_wait_seconds": assembler.oldest_wait_seconds(self.clock()),
            "waiting_for": assembler.waiting_for(),
            "watermark_lag_seconds": assembler.watermark_lags(),
            "gives_up": self.gives_up,
        }


__all__ = ["LAG_SAMPLE_SECONDS", "Join"]
