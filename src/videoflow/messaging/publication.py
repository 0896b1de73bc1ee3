"""Publishing until the outcome is known: the ladder a messenger runs on every output.

A backend's publish answers once and honestly (MSG-013, MSG-014): Accepted, Rejected
(retryable or not) or PublicationUnknown. What to do next depends on the flow type, and
is decided here once:

- Accepted: done (duplicate means this msg_id was already stored: a redelivered input
  group's output, deduplicated by the broker's window).
- Rejected and retryable: a BATCH stream is full (DiscardPolicy.NEW). BATCH turns that
  into backpressure: wait and publish again until the deadline, never drop. REALTIME
  never blocks its producer: the message is dropped, and counted.
- Rejected and not retryable: nothing waiting can change (no stream captures the
  subject, the message is too large); returned as it is for the caller to report.
- PublicationUnknown: stored or not, nobody knows. Resolved by observe_publication
  (an idempotent re-publish of the same msg_id inside the duplicate window), again
  until the deadline; PublicationUnresolvable once the window has passed.

A broker outage moves the deadline (due): while the broker is away the ladder waits
for it, within the backend's outage budget, and resolves what the outage left unknown
once it is back.

Nothing here sleeps on the broker's loop or guesses: an outcome still unknown at the
deadline is returned unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from videoflow.backends.messaging import (
    Accepted,
    BrokerUnavailable,
    Envelope,
    MessagingBackend,
    PublicationUnknown,
    PublicationUnresolvable,
    PublishOutcome,
    Rejected,
)
from videoflow.core.constants import BATCH, REALTIME

FIRST_BACKOFF_SECONDS: Final = 0.01
"""The first wait before publishing again into a full stream or observing an unknown
send; it doubles up to MAX_BACKOFF_SECONDS."""

MAX_BACKOFF_SECONDS: Final = 0.5

ATTEMPT_SECONDS: Final = 2.0
"""How long one publish waits for its receipt before the ladder turns to observing it:
a receipt lost to a stalled broker is then asked after again, instead of the whole
deadline going to one wait."""

STAT_KEYS: Final = ("accepted", "duplicate", "unknown", "dropped", "rejected")
"""The kinds NATSMessenger.publication_stats counts."""


@dataclass(frozen=True, slots=True)
class Published:
    """How one publication ended.

    Attributes:
        outcome: the last answer: Accepted, Rejected, PublicationUnknown (still unknown
            at the deadline) or PublicationUnresolvable.
        dropped: REALTIME gave up on a retryable refusal instead of waiting (the
            freshest-wins promise); the caller counts it as publish_discarded.
        attempts: publishes and observations made, the first included.
    """

    outcome: PublishOutcome
    dropped: bool
    attempts: int

    @property
    def stat(self) -> str:
        """Which publication_stats key this publication counts under."""
        outcome = self.outcome
        if isinstance(outcome, Accepted):
            return "duplicate" if outcome.duplicate else "accepted"
        if self.dropped:
            return "dropped"
        if isinstance(outcome, Rejected):
            return "rejected"
        return "unknown"  # PublicationUnknown or PublicationUnresolvable


def publish_until_known(
    backend: MessagingBackend,
    envelope: Envelope,
    flow_type: str,
    deadline: float,
    attempt_seconds: float = ATTEMPT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    first: PublishOutcome | None = None,
) -> Published:
    """Publish envelope and climb the ladder in the module docstring until its outcome
    is known or the monotonic deadline passes.

    Arguments:
        backend: the transport.
        envelope: what to publish; without a msg_id an unknown send can never be
            resolved (it comes back PublicationUnresolvable from the first observation).
        flow_type: REALTIME or BATCH: whether a full stream drops or waits.
        deadline: monotonic time after which nothing more is tried.
        attempt_seconds: the most one publish waits for its receipt (ATTEMPT_SECONDS).
        clock / sleep: injectable for tests.
        first: the outcome of a publish already made (a pipelined publish_async whose
            receipt came back): the ladder climbs on from it instead of publishing
            first.

    Returns:
        How it ended (Published).

    Raises:
        ValueError: flow_type is neither REALTIME nor BATCH.
        BrokerUnavailable: the outcome is not known and the backend gave its broker up
            for good (MessagingBackend.given_up): waiting out the deadline could not
            change it.
    """
    if flow_type not in (REALTIME, BATCH):
        raise ValueError(f"flow_type must be {REALTIME!r} or {BATCH!r}, got {flow_type!r}")
    if first is None:
        outcome = backend.publish(envelope, min(deadline, clock() + attempt_seconds))
    else:
        outcome = first
    attempts, backoff = 1, FIRST_BACKOFF_SECONDS
    while True:
        if isinstance(outcome, (Accepted, PublicationUnresolvable)):
            return Published(outcome, dropped=False, attempts=attempts)
        if isinstance(outcome, Rejected):
            if not outcome.retryable:
                return Published(outcome, dropped=False, attempts=attempts)
            if flow_type == REALTIME:
                return Published(outcome, dropped=True, attempts=attempts)
        gone = backend.given_up()
        if gone is not None:
            raise BrokerUnavailable(gone)
        remaining = due(backend, deadline) - clock()
        if remaining <= 0:
            return Published(outcome, dropped=False, attempts=attempts)
        sleep(min(backoff, remaining))
        backoff = min(2 * backoff, MAX_BACKOFF_SECONDS)
        attempts += 1
        if isinstance(outcome, PublicationUnknown):
            outcome = backend.observe_publication(envelope)
        else:  # a retryable refusal in BATCH: the stream may have room now
            outcome = backend.publish(envelope, min(deadline, clock() + attempt_seconds))


def due(backend: MessagingBackend, deadline: float) -> float:
    """A publication's deadline as a broker outage extends it: the ladder goes on
    while the broker is away, within the backend's outage budget, and a little after
    it is back (MessagingBackend.pursue_until), instead of failing the group."""
    return max(deadline, backend.pursue_until())


class PublicationStats:
    """Publication outcomes by kind (NATSMessenger.publication_stats)."""

    def __init__(self) -> None:
        self._counts = dict.fromkeys(STAT_KEYS, 0)

    def count(self, published: Published, outputs: int = 1) -> None:
        """Count one publication, carrying outputs (a pack's members)."""
        self._counts[published.stat] += outputs

    def count_accepted(self, accepted: Accepted, outputs: int = 1) -> None:
        """count for a publication accepted at its first attempt, without building
        its Published (the usual case, once per output)."""
        self._counts["duplicate" if accepted.duplicate else "accepted"] += outputs

    def as_dict(self) -> dict[str, int]:
        return dict(self._counts)


__all__ = [
    "ATTEMPT_SECONDS",
    "FIRST_BACKOFF_SECONDS",
    "MAX_BACKOFF_SECONDS",
    "STAT_KEYS",
    "PublicationStats",
    "Published",
    "due",
    "publish_until_known",
]
