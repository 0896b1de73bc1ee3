"""Packs on the reading side: each member of a pack (videoflow.wire.packs) is an input of
its own, and the broker message is settled once, when every member is.

The messenger expands a pack delivery where it receives it (Packs.expand) into one
Delivery per member, whose token (PackMemberToken) names the pack's message and the
member: the assembler, the node, the dead letters and the ledger see members as they
see envelopes alone. A member's settlement goes no further than here (Packs.settle)
until the pack's last one is in; then the pack's message is settled:

- Completed when every member was completed or given up on against a record
  (terminated against the terminal log, or dead-lettered: DELIV-15 holds per member);
- Retry, with the longest delay asked for, when any member asked for one: the whole
  pack comes again, and the members completed meanwhile are processed again (their
  outputs carry the same ids, which the broker's duplicate window drops).

Only this process's settlements count: a redelivery of the pack (ack_wait lapsed, a
rebind) replaces the attempt whose members are still out, whose settlements are then
stale, as the broker would answer for its token (MSG-011).

The backend never sees a member token: what the broker holds, renews and redelivers is
the pack's message, and its backlog, prefetch and byte credit count messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from videoflow.backends.messaging import (
    Completed,
    Delivery,
    DeliveryToken,
    Retry,
    SettleOutcome,
    SubscriptionId,
)
from videoflow.errors import WireError
from videoflow.wire.packs import PACK_PREFIX, decode_pack, is_pack


@dataclass(frozen=True, slots=True)
class PackMemberToken(DeliveryToken):
    """The token of one member of a pack: its pack's message (subscription, stream_seq,
    attempt, generation) and its place in the pack (1 for the first)."""

    member: int = 1

    def __hash__(self) -> int:
        return hash((self.stream_seq, self.attempt, self.generation, self.member))


def member_of(token: DeliveryToken) -> int:
    """Which member of a pack the token names; 0 for a message that is no pack's."""
    return token.member if isinstance(token, PackMemberToken) else 0


def delivery_key(parent: str, delivery: Delivery) -> str:
    """A delivery's identity within its node's run: ``{parent}:{stream_seq}``, with
    ``.{member}`` after it for a member of a pack (the ledger's attempts, the terminal
    log)."""
    member = member_of(delivery.token)
    seq = delivery.stream_seq
    return f"{parent}:{seq}.{member}" if member else f"{parent}:{seq}"


class _Open:
    """A pack whose members are out: how many are not settled yet, and what they asked
    for."""

    __slots__ = ("delivery", "left", "retry", "settled", "waiting")

    def __init__(self, delivery: Delivery, members: int) -> None:
        self.delivery = delivery
        self.left = members
        self.retry: Retry | None = None
        self.settled: set[int] = set()
        self.waiting: list[Any] = []  # the caller's handles of completed members


@dataclass(frozen=True, slots=True)
class SettledPack:
    """A pack whose last member was just settled.

    Attributes:
        delivery: the pack's message, as the backend handed it out.
        outcome: its settlement (see the module).
        waiting: what the caller parked with its members' completions (Packs.wait).
    """

    delivery: Delivery
    outcome: SettleOutcome
    waiting: list[Any]


class Packs:
    """The packs one messenger has members of out (see the module)."""

    def __init__(self) -> None:
        self._open: dict[tuple[SubscriptionId, int], _Open] = {}

    def __bool__(self) -> bool:
        """Whether members of some pack are out."""
        return bool(self._open)

    def expand(self, got: list[tuple[SubscriptionId, Delivery]]
               ) -> list[tuple[SubscriptionId, Delivery]]:
        """What a receive returned, each pack replaced by its members in order. A pack
        that does not decode is left as it is: read as an envelope, it is undecodable.
        """
        for _, delivery in got:  # a loop, not any(): this runs on every receive
            if delivery.data.startswith(PACK_PREFIX):
                break
        else:
            return got
        out: list[tuple[SubscriptionId, Delivery]] = []
        for sub, delivery in got:
            if sub.kind != "data" or not is_pack(delivery.data):
                out.append((sub, delivery))
                continue
            try:
                pack = decode_pack(delivery.data)
            except WireError:
                out.append((sub, delivery))
                continue
            token = delivery.token
            # A redelivery replaces an earlier attempt's members still out.
            self._open[(sub, token.stream_seq)] = _Open(delivery, len(pack.members))
            for member, (data, traceparent) in enumerate(
                    zip(pack.members, pack.traceparents, strict=True), 1):
                out.append((sub, Delivery(
                    PackMemberToken(token.subscription, token.stream_seq, token.attempt,
                                    token.generation, member),
                    data, delivery.num_delivered, delivery.stream_seq, traceparent)))
        return out

    def settle(self, token: PackMemberToken, outcome: SettleOutcome,
               waiting: object | None = None) -> SettledPack | None:
        """Take one member's settlement.

        Arguments:
            token: the member's.
            outcome: its settlement: Completed, Retry, or Terminal (given up on
                against a record).
            waiting: the caller's handle of a completed member, handed back with the
                pack (SettledPack.waiting).

        Returns:
            the pack, once this was its last member not settled; None before, and for
            a member of an attempt a redelivery replaced, or one settled already.
        """
        key = (token.subscription, token.stream_seq)
        pack = self._open.get(key)
        if pack is None or pack.delivery.token.attempt != token.attempt or \
                pack.delivery.token.generation != token.generation or \
                token.member in pack.settled:
            return None
        pack.settled.add(token.member)
        if isinstance(outcome, Retry) and (pack.retry is None or
                                           outcome.delay > pack.retry.delay):
            pack.retry = outcome
        if waiting is not None:
            pack.waiting.append(waiting)
        pack.left -= 1
        if pack.left:
            return None
        del self._open[key]
        return SettledPack(pack.delivery, pack.retry or Completed(), pack.waiting)


__all__ = ["PackMemberToken", "Packs", "SettledPack", "delivery_key", "member_of"]
