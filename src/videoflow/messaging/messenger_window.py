"""The publication window: a node's outputs in flight while it goes on to its next input.

A task hands group k's outputs to the messenger and is given group k+1 at once; k's
publications are confirmed in the background (MessagingBackend.publish_async) and the
window resolves them in the order they were made:

- every output of a group Accepted: the group's inputs are settled Completed, without
  waiting for the answer (Deliveries.complete_later) -- ack after process and after
  output, exactly as when each step was waited for; the output's own follow-ups (a
  by-ref payload's intent released, a replayable producer's source offset) run then;
- a retryable refusal (a full BATCH stream) or an unknown receipt: the publication
  ladder (publish_until_known) climbs on from that outcome, blocking the task, so a
  full stream is backpressure and nothing is dropped; in REALTIME a refusal is a
  counted drop (publish_discarded); once the broker answers about an
  unknown receipt, every other unknown one in the window is asked after at once
  (_ask_after_unknowns), not ladder after ladder;
- a definite refusal, or an unknown the ladder cannot resolve by its deadline: the
  group fails per the node's delivery policy (PublicationFailed); its inputs are never
  acknowledged. A producer's output has no inputs to fail: the error is raised to the
  task, which dies with an abort, as it did when each publish was waited for.

Bounded: at most max_groups groups and about max_bytes envelope bytes are in flight;
closing a group past either bound waits for the oldest. Outputs reach their stream in
the order the node made them (publish_async keeps a caller's order); only a publication
the ladder had to send again (a full stream, a lost receipt) can land after outputs that
were already in flight behind it.

drain() waits for everything in flight, and the messenger calls it before whatever must
not overtake an output: an end-of-stream or abort marker, a checkpoint's commit
(RUN-022), quiesce's hand-back (RUN-030) and the task's exit.

Packs (a processor's pack=True): the small outputs (send's packable) of the members of
one inbound pack (videoflow.messaging.packs) are held, not sent, until the messenger
hands out an input of another pack, or none (pack_inputs, drain); then they go as packs
(videoflow.wire.packs.pack_split) in one group with every member's inputs. What is
packed is fixed by the inbound pack, not by timing: the same inputs processed again
make the same packs under the same ids, which the broker's duplicate window drops as it
drops outputs sent alone. A member whose failure brings the pack back (pack_retried)
voids what is held: the pack is processed again whole. An output that may not be
packed sends what is held first, so outputs keep their order.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from videoflow import clock
from videoflow.backends.messaging import (
    Accepted,
    Envelope,
    MessagingBackend,
    PublicationUnknown,
    PublishOutcome,
    Receipt,
    Rejected,
)
from videoflow.backends.messaging_types import pack_envelope
from videoflow.core.constants import BATCH
from videoflow.core.credit import WINDOW_GROUPS
from videoflow.errors import VideoflowError
from videoflow.messaging.messenger_deliveries import Deliveries, Held
from videoflow.messaging.publication import (
    ATTEMPT_SECONDS,
    PublicationStats,
    due,
    publish_until_known,
)
from videoflow.wire.packs import pack_split

WINDOW_BYTES: Final = 64 * 1024 * 1024
"""About the most envelope bytes one replica keeps in flight unconfirmed."""

REASK_WIDTH: Final = 16
"""How many unknown outcomes the window asks after at once (_ask_after_unknowns)."""


class PublicationFailed(VideoflowError):
    """An output could not be published (refused for good, or still unknown at the
    deadline): the task fails the inputs it came from, which are then redelivered.

    Attributes:
        refused: the broker definitely refused it (not merely unknown).
    """

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


OnAccepted = Callable[[Accepted], None]
OnRefused = Callable[[], None]


@dataclass(slots=True)
class _Output:
    """One publication in flight."""

    envelope: Envelope
    flow_type: str
    receipt: Receipt[PublishOutcome]
    deadline: float  # monotonic: when the ladder stops trying
    on_accepted: OnAccepted | None
    on_refused: OnRefused | None
    members: int = 1  # the outputs it carries (a pack's)


@dataclass(slots=True)
class _Packing:
    """The members of one inbound pack handed out so far: their small outputs, held
    (with each one's on_accepted), and their inputs to settle with them."""

    key: object
    held: list[tuple[Envelope, OnAccepted | None]]
    handles: list[Held]
    group_key: str = ""
    voided: bool = False  # a member's failure brings the pack back: nothing held goes


@dataclass(slots=True)
class _Group:
    """The outputs of one input group (none for a sink), and its inputs to settle."""

    outputs: list[_Output]
    handles: Sequence[Held] = ()
    key: str = ""
    size: int = 0
    abandoned: bool = False  # its node failed: its inputs are the policy's already


class PublishWindow:
    """A node replica's outputs in flight (see the module docstring).

    Arguments:
        node_name: the node, for error messages.
        backend: the MessagingBackend the outputs are published on.
        deliveries: the node's Deliveries, which settle (or fail) each group's inputs.
        stats: publication outcomes by kind, counted as each output resolves.
        ack_wait: seconds each publication's ladder may take, from when it was sent.
        max_groups / max_bytes: the window's bounds.
        on_failed: called with each input group failed because an output of it was
            not published (the node's failure count).
    """

    def __init__(self, node_name: str, backend: MessagingBackend, deliveries: Deliveries,
                 stats: PublicationStats, ack_wait: float, *,
                 max_groups: int = WINDOW_GROUPS, max_bytes: int = WINDOW_BYTES,
                 on_failed: Callable[[PublicationFailed], None] | None = None) -> None:
        if max_groups < 1 or max_bytes < 1:
            raise ValueError(f"window bounds must be >= 1, got {max_groups}, {max_bytes}")
        self.node_name, self.backend, self.deliveries = node_name, backend, deliveries
        self.stats, self.ack_wait = stats, ack_wait
        self.max_groups, self.max_bytes = max_groups, max_bytes
        self.on_failed = on_failed
        self._current: list[_Output] = []
        self._groups: deque[_Group] = deque()
        self._bytes = 0
        self._packing: _Packing | None = None

    # ------------------------------------------------------------------ feeding

    def send(self, envelope: Envelope, flow_type: str, *,
             on_accepted: OnAccepted | None = None,
             on_refused: OnRefused | None = None, packable: bool = False) -> None:
        """Start publishing one output of the group being processed.

        Arguments:
            envelope: the output.
            flow_type: REALTIME or BATCH: whether a full stream drops it or waits.
            on_accepted: called with its Accepted once it is stored (in order).
            on_refused: called if the broker definitely refused it.
            packable: it may go in a pack with the outputs of the other members of
                its inputs' pack (see the module): a small data output of the node's
                channel, with nothing to do on a refusal.
        """
        packing = self._packing
        if packing is not None:
            if packable:
                if not packing.voided:  # else the pack comes again, and this with it
                    packing.held.append((envelope, on_accepted))
                return
            self._send_held(packing)
        now = clock.monotonic()
        deadline = now + self.ack_wait
        receipt = self.backend.publish_async(envelope, min(deadline, now + ATTEMPT_SECONDS))
        self._current.append(_Output(envelope, flow_type, receipt, deadline, on_accepted,
                                     on_refused))

    def close_group(self, handles: Sequence[Held] = (), key: str = "", *,
                    abandoned: bool = False) -> None:
        """The group being processed is done: settle its inputs once every output it
        published is accepted. Resolves what is already answered, and waits for the
        oldest groups while the window is over its bounds (backpressure).

        Arguments:
            handles: the group's inputs (none for a producer's output).
            key: the group's identity, naming its settlements.
            abandoned: the node failed on the group (abandon_group).
        """
        packing = self._packing
        if packing is not None and not abandoned:  # settled with its pack's outputs
            if not packing.handles:
                packing.group_key = key
            packing.handles.extend(handles)
            return
        outputs, self._current = self._current, []
        # One output is the usual group (every producer's): no generator for it.
        size = (outputs[0].envelope.size if len(outputs) == 1
                else sum(output.envelope.size for output in outputs))
        self._groups.append(_Group(outputs, handles, key, size, abandoned))
        self._bytes += size
        self.advance(wait=False)
        while self._groups and (len(self._groups) > self.max_groups
                                or self._bytes > self.max_bytes):
            self._resolve_oldest()

    def abandon_group(self) -> None:
        """The group being processed failed in the node: what it already published
        still resolves (a redelivery deduplicates against it), with no inputs to
        settle -- the delivery policy has them. A member of a pack's go with the
        pack's (pack_retried voids them)."""
        if self._current and self._packing is None:
            self.close_group(abandoned=True)

    # ------------------------------------------------------------------ packs

    def pack_inputs(self, key: object | None) -> None:
        """The group handed out next came in the inbound pack key (None: in none, or
        no group is coming): the outputs held for another pack go now, as packs, with
        its members' inputs; a key starts holding this pack's (see the module).

        Arguments:
            key: what names the inbound pack and its attempt, compared for equality.
        """
        packing = self._packing
        if packing is not None:
            if packing.key == key:
                return
            self._close_packing(packing)
        if key is not None:
            self._packing = _Packing(key, [], [])

    def pack_retried(self) -> None:
        """A member of the pack being held failed, and its pack comes again (a Retry):
        what it and the other members hold is voided, never sent -- processed again
        with the pack, it goes then, under the same ids."""
        if self._packing is not None:
            self._packing.voided = True
            self._packing.held.clear()

    def _close_packing(self, packing: _Packing) -> None:
        self._packing = None
        self._send_held(packing)
        if packing.handles:
            self.close_group(packing.handles, packing.group_key)
        elif self._current:  # every member failed: what they sent still resolves
            self.close_group(abandoned=True)

    def _send_held(self, packing: _Packing) -> None:
        """Send what packing holds, as packs in order (a run of one alone)."""
        held, packing.held = packing.held, []
        if not held:
            return
        now = clock.monotonic()
        deadline = now + self.ack_wait
        attempt = min(deadline, now + ATTEMPT_SECONDS)
        start = 0
        for count in pack_split([len(envelope.data) for envelope, _ in held]):
            run = held[start:start + count]
            start += count
            if count == 1:
                envelope, on_accepted = run[0]
            else:
                envelope = pack_envelope([member for member, _ in run])
                on_accepted = _each([callback for _, callback in run])
            receipt = self.backend.publish_async(envelope, attempt)
            self._current.append(_Output(envelope, BATCH, receipt, deadline, on_accepted,
                                         None, count))

    # ------------------------------------------------------------------ resolving

    @property
    def in_flight(self) -> int:
        """Groups whose outputs are not all resolved yet."""
        return len(self._groups)

    def advance(self, wait: bool = False) -> None:
        """Resolve the oldest groups whose outputs are all answered (all of them when
        wait), and read the settlements already answered.

        Raises:
            PublicationFailed: a producer's output was not published.
        """
        groups = self._groups
        while groups:
            if not wait:
                outputs = groups[0].outputs
                if not (outputs[0].receipt.done() if len(outputs) == 1
                        else all(output.receipt.done() for output in outputs)):
                    break
            self._resolve_oldest()
        self.deliveries.collect_settled(wait=False)

    def confirm_within(self, seconds: float) -> None:
        """Resolve the oldest groups whose outputs are all answered within seconds
        (advance, with a short wait): a slow node's last group is settled while the
        node works on its next, not once that one is done too.

        Raises:
            PublicationFailed: a producer's output was not published.
        """
        deadline = clock.monotonic() + seconds
        groups = self._groups
        while groups:
            for output in groups[0].outputs:
                try:
                    output.receipt.result(timeout=max(deadline - clock.monotonic(), 0.0))
                except concurrent.futures.TimeoutError:
                    self.deliveries.collect_settled(wait=False)
                    return
            self._resolve_oldest()
        self.deliveries.collect_settled(wait=False)

    def drain(self) -> None:
        """Wait until every output in flight is resolved and every settlement started
        is answered.

        Raises:
            PublicationFailed: a producer's output was not published.
        """
        if self._packing is not None:
            self._close_packing(self._packing)
        if self._current:  # a group never closed: its inputs were not settled either
            self.close_group(abandoned=True)
        self.advance(wait=True)
        self.deliveries.collect_settled(wait=True)

    def resolve_current(self) -> None:
        """Wait until the outputs the group being processed published so far are
        resolved (a checkpoint riding with them commits only then, RUN-022); the
        group stays open.

        Raises:
            PublicationFailed: one of them was not published.
        """
        outputs, self._current = self._current, []
        failure: PublicationFailed | None = None
        for output in outputs:
            error = self._resolve(output, outputs)
            if error is not None and failure is None:
                failure = error
        if failure is not None:
            raise failure

    def _resolve_oldest(self) -> None:
        group = self._groups.popleft()
        self._bytes -= group.size
        failure: PublicationFailed | None = None
        for output in group.outputs:
            error = self._resolve(output, group.outputs)
            if error is not None and failure is None:
                failure = error
        if failure is None:
            if group.handles:
                self.deliveries.complete_later(group.handles, group.key)
            return
        if group.abandoned:
            return  # its inputs are being retried already: a redelivery publishes again
        if not group.handles:
            raise failure  # a producer's output: no inputs to fail, the node dies
        if self.on_failed is not None:
            self.on_failed(failure)
        self.deliveries.fail(group.handles, failure)

    def _resolve(self, output: _Output, siblings: Sequence[_Output]) -> PublicationFailed | None:
        """Settle one output's fate: None once it is accepted or (REALTIME) dropped and
        counted, else the failure of its group (siblings: the outputs of its group,
        no longer in the window)."""
        wait = max(output.deadline - clock.monotonic(), 0.0) + ATTEMPT_SECONDS
        try:
            first = output.receipt.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            first = PublicationUnknown("the backend did not answer before the deadline")
        if first.__class__ is Accepted:  # the usual case, kept short
            self.stats.count_accepted(first, output.members)
            if output.on_accepted is not None:
                output.on_accepted(first)
            return None
        if (isinstance(first, PublicationUnknown)
                and due(self.backend, output.deadline) > clock.monotonic()):
            first = self.backend.observe_publication(output.envelope)
            if not isinstance(first, PublicationUnknown):
                self._ask_after_unknowns(output, siblings)
        published = publish_until_known(self.backend, output.envelope, output.flow_type,
                                        output.deadline, first=first)
        self.stats.count(published, output.members)
        outcome = published.outcome
        if published.dropped:
            self.deliveries.drops["publish_discarded"] += 1
            return None
        if isinstance(outcome, Accepted):
            if output.on_accepted is not None:
                output.on_accepted(outcome)
            return None
        refused = isinstance(outcome, Rejected)
        if refused and output.on_refused is not None:
            output.on_refused()
        envelope = output.envelope
        return PublicationFailed(f"{self.node_name}: {envelope.kind} {envelope.msg_id} was "
                                 f"not published: {outcome}", refused=refused)

    def _ask_after_unknowns(self, known: _Output, siblings: Sequence[_Output]) -> None:
        """The broker answered about `known` after its receipt came back unknown: every
        other output in the window whose receipt is unknown too (the same stall, the
        same lost connection) is asked after now, REASK_WIDTH at a time, and its ladder
        goes on from that answer. One ladder after another each waited its backoff and
        a round trip: a producer's window of a thousand outlived its deadlines."""
        held = (*siblings, *(o for group in self._groups for o in group.outputs), *self._current)
        unknown = [output for output in held
                   if output is not known and output.receipt.done()
                   and isinstance(output.receipt.result(), PublicationUnknown)]
        if not unknown:
            return

        def ask(output: _Output) -> PublishOutcome:
            # Past its deadline (by its turn, the broker may have stalled again): left
            # unknown, so the re-ask ends soon after the last deadline.
            if due(self.backend, output.deadline) <= clock.monotonic():
                return output.receipt.result()
            return self.backend.observe_publication(output.envelope)

        with concurrent.futures.ThreadPoolExecutor(
                min(REASK_WIDTH, len(unknown)), thread_name_prefix="videoflow-reask") as pool:
            answers = list(pool.map(ask, unknown))
        for output, answer in zip(unknown, answers, strict=True):
            output.receipt = Receipt(answer)


def _each(callbacks: list[OnAccepted | None]) -> OnAccepted | None:
    """One on_accepted for a pack: each member's, with the pack's Accepted."""
    called = [callback for callback in callbacks if callback is not None]
    if not called:
        return None

    def accepted(outcome: Accepted) -> None:
        for callback in called:
            callback(outcome)
    return accepted


__all__ = ["REASK_WIDTH", "WINDOW_BYTES", "WINDOW_GROUPS", "PublicationFailed", "PublishWindow"]
