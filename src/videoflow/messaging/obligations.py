"""The runtime's own obligation ledger (RFC 0006 BLOB-14 step 4).

What a worker derives, at start and periodically, from durable records it already
keeps (its parents' outboxes in the run ledger) and from the broker's own facts
(channel retention, ack floors) — no test-built ledger, no counter. For every
publication in the outbox of a judged channel:

- a publication the channel evicted (its sequence is below the channel's first
  retained sequence) owes nothing to any reader (PAY-012);
- otherwise a reader owes its obligation while its ack floor on that channel is below
  the sequence; a floor at or past it means the reader settled the message, and a
  release that never happened (a crash after a confirmed ack) is what reconciliation
  cancels (PAY-006);
- ``intent/<publication_id>`` is owed while the publication is unresolved; a
  definitely refused publication owes nothing at all (PAY-007, PAY-013).

Anything that could not be observed — a floor, a channel — is required: an
unobservable release is not a release. The ledger is authoritative only for the
reader ids it knows and for the intents of the publications it judged; an archive's
or a dead-letter pin's obligation (``archive/*``, ``dlq/*``) is never cancelled by it.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from videoflow.backends.messaging import (
    ChannelId,
    ChannelObservation,
    Known,
    MessagingBackend,
    SubscriptionId,
    Unknown,
)
from videoflow.backends.payload import INTENT_PREFIX, PINNED_PREFIXES, PayloadStore, intent_id
from videoflow.core.runtime import FlowRuntime
from videoflow.core.runtime_records import Publication
from videoflow.errors import PayloadMissing

__all__ = [
    "ObligationLedger",
    "RuntimeObligationLedger",
    "StoreObligationLedger",
    "reconcile",
    "subscription_for",
]

_PARTITIONED: Final = re.compile(r"^(?P<child>.+)/p(?P<replica>0|[1-9][0-9]*)$")
"""A partitioned replica's reader id, '<child>/p<i>' (compiler.NodeSpec.blob_reader_ids)."""


class ObligationLedger(abc.ABC):
    """Which payload obligations are still owed, as reconciliation reads them."""

    @abc.abstractmethod
    def required_obligations(self) -> Mapping[str, tuple[str, ...]]:
        """ref key -> obligation ids still required.

        Every ref the ledger judged is a key, with an empty tuple when nothing it is
        authoritative for is owed any more; a ref that is not a key was not judged,
        which is not the same as "nothing owed".
        """

    @abc.abstractmethod
    def authoritative(self, obligation_id: str) -> bool:
        """Whether this ledger may cancel obligation_id when it does not require it."""


def subscription_for(reader_id: str, channel: ChannelId) -> SubscriptionId:
    """The data subscription a reader obligation id stands for on channel.

    Arguments:
        reader_id: '<child>' for a competing child (its shared durable) or
            '<child>/p<i>' for replica i of a partitioned child (that replica's durable).
        channel: the publishing node's channel.

    Returns:
        SubscriptionId(child, channel, 'data', None or i).
    """
    match = _PARTITIONED.match(reader_id)
    if match is None:
        return SubscriptionId(reader_id, channel)
    return SubscriptionId(match["child"], channel, replica=int(match["replica"]))


@dataclass(frozen=True)
class _Judged:
    """One pass over the outboxes: what is required, per ref, and what is known."""

    required: dict[str, tuple[str, ...]]
    readers: frozenset[str]
    intents: frozenset[str]


class RuntimeObligationLedger(ObligationLedger):
    """The obligation ledger a worker derives from its run ledger and its broker.

    Each required_obligations call reads the outboxes and the broker afresh (one
    channel observation per channel, one floor observation per reader and channel,
    made only when the channel did not already settle the question); authoritative
    answers from the reader ids and intents of the latest such pass (one is made if
    none was).

    Arguments:
        runtime: the node's ledger (its store is shared with its parents' outboxes).
        backend: the transport, for channel retention and ack floors.
        channels: the publishing nodes whose obligations to judge — this node's
            parents, and itself for its own intents.
    """

    def __init__(self, runtime: FlowRuntime, backend: MessagingBackend,
                 channels: Sequence[str]) -> None:
        if isinstance(channels, str):  # a lone name would otherwise become its characters
            raise ValueError(f"channels must be a sequence of node names, got {channels!r}")
        self.runtime, self.backend = runtime, backend
        self.channels = tuple(dict.fromkeys(channels))
        for node in self.channels:
            if not isinstance(node, str) or not node:
                raise ValueError(f"a channel is a non-empty node name, got {node!r}")
        self._last: _Judged | None = None

    def required_obligations(self) -> Mapping[str, tuple[str, ...]]:
        """ref key -> obligation ids still required (see ObligationLedger).

        Raises:
            BrokerUnavailable: an outbox could not be read — nothing can be judged.
        """
        self._last = self._judge()
        return dict(self._last.required)

    def authoritative(self, obligation_id: str) -> bool:
        """True for a reader id some judged publication's put acquired and for the
        intent of a judged publication; never for ``archive/*`` or ``dlq/*``, nor for an id
        the ledger does not know (it might be anyone's)."""
        if obligation_id.startswith(PINNED_PREFIXES):
            return False
        judged = self._last if self._last is not None else self._judge()
        self._last = judged
        return obligation_id in judged.readers or obligation_id in judged.intents

    # -- judging ------------------------------------------------------------------

    def _judge(self) -> _Judged:
        return _judge(self.backend, self.runtime.flow_id, self.runtime.run_id,
                      {node: self.runtime.outbox(node) for node in self.channels})


class StoreObligationLedger(RuntimeObligationLedger):
    """The obligation ledger of a store that keeps its own outbox (keeps_outbox: the
    shared-memory store): the publications are the store's records, each naming its
    channel and, once accepted, its stream sequence; the rules are the same.

    Arguments:
        store: the payload store.
        runtime: the node's ledger, for the flow and run ids only.
        backend / channels: as RuntimeObligationLedger.
    """

    def __init__(self, store: PayloadStore, runtime: FlowRuntime, backend: MessagingBackend,
                 channels: Sequence[str]) -> None:
        super().__init__(runtime, backend, channels)
        self.store = store

    def _judge(self) -> _Judged:
        outboxes: dict[str, list[Publication]] = {node: [] for node in self.channels}
        for ref, record in self.store.records().items():
            if record.channel in outboxes:
                outboxes[record.channel].append(Publication(
                    record.publication_id, (ref,), tuple(sorted(record.readers)),
                    status="unresolved" if record.stream_seq is None else "accepted",
                    stream_seq=record.stream_seq))
        return _judge(self.backend, self.runtime.flow_id, self.runtime.run_id, outboxes)


def _judge(backend: MessagingBackend, flow_id: str, run_id: str,
           outboxes: Mapping[str, Sequence[Publication]]) -> _Judged:
    """One pass over the publications of each channel (publishing node)."""
    required: dict[str, set[str]] = {}
    readers: set[str] = set()
    intents: set[str] = set()
    for node, publications in outboxes.items():
        judge = _ChannelJudge(backend, ChannelId(flow_id, run_id, node))
        for publication in publications:
            owed = judge.owed(publication)
            intents.add(intent_id(publication.publication_id))
            readers.update(o for o in publication.obligations
                           if not o.startswith(PINNED_PREFIXES + (INTENT_PREFIX,)))
            for ref in publication.payload_refs:
                required.setdefault(ref, set()).update(owed)
    return _Judged(
        required={ref: tuple(sorted(owed)) for ref, owed in required.items()},
        readers=frozenset(readers),
        intents=frozenset(intents),
    )


class _ChannelJudge:
    """The broker's facts about one channel, each observed at most once per pass."""

    def __init__(self, backend: MessagingBackend, channel: ChannelId) -> None:
        self.backend, self.channel = backend, channel
        self._observed: Known[ChannelObservation] | Unknown | None = None
        self._floors: dict[str, Known[int] | Unknown] = {}

    def owed(self, publication: Publication) -> set[str]:
        """The obligation ids publication still owes."""
        if publication.status == "refused":
            return set()  # PAY-013: definitely not stored, nothing is owed for it
        owed: set[str] = set()
        if publication.status == "unresolved" or publication.stream_seq is None:
            # PAY-007: the intent is owed; and with no sequence to compare, no
            # reader's release can be established either.
            owed.add(intent_id(publication.publication_id))
            owed.update(publication.obligations)
            return owed
        seq = publication.stream_seq
        if self._evicted(seq):
            return owed  # PAY-012: it will never reach a reader that has not taken it
        for obligation in publication.obligations:
            if obligation.startswith(PINNED_PREFIXES) or not self._settled(obligation, seq):
                owed.add(obligation)
        return owed

    def _evicted(self, seq: int) -> bool:
        if self._observed is None:
            self._observed = self.backend.observe_channel(self.channel)
        # An Unknown channel proves nothing was evicted (an unobservable release is
        # not a release).
        return isinstance(self._observed, Known) and seq < self._observed.value.first_seq

    def _settled(self, reader_id: str, seq: int) -> bool:
        floor = self._floors.get(reader_id)
        if floor is None:
            floor = self.backend.observe_ack_floor(subscription_for(reader_id, self.channel))
            self._floors[reader_id] = floor
        # PAY-006: a floor at or past seq means the reader settled it; an Unknown
        # floor releases nothing.
        return isinstance(floor, Known) and floor.value >= seq


def reconcile(store: PayloadStore, ledger: ObligationLedger) -> int:
    """Cancel, on store, every obligation ledger is authoritative for and does not
    require: the releases lost in a crash (PAY-006) and the intents whose resolution
    was lost. Only refs the ledger judged are touched, and nothing it could not
    observe is cancelled, since it stays required.

    Arguments:
        store: the payload store holding the refs.
        ledger: the obligation ledger to act on.

    Returns:
        how many obligations this call cancelled (a ref whose last obligation goes is
        reclaimed by the store).

    Raises:
        BrokerUnavailable: the ledger's records or the store could not be read.
    """
    cancelled = 0
    for ref, still_required in ledger.required_obligations().items():
        try:
            held = store.obligations(ref)
        except PayloadMissing:
            continue  # already reclaimed or expired: nothing left to cancel
        for obligation in held:
            if obligation in still_required or obligation.startswith(PINNED_PREFIXES):
                continue
            if ledger.authoritative(obligation) and store.cancel(ref, obligation):
                cancelled += 1
    return cancelled
