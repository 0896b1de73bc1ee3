"""Publication outcomes on JetStream (videoflow.backends.jetstream.outcomes) against a
real nats-server: one publish typed as the contract says (MSG-013/014), and the
idempotent re-publish that resolves an unknown one. Never a mock broker."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest
from jetstream_helpers import (
    Wired,
    batch_channel,
    envelope,
)

from videoflow.backends.jetstream.outcomes import (
    PublicationLedger,
    observe_by_republish,
    publish_once,
    publish_pipelined,
)
from videoflow.backends.jetstream.reply_inbox import ReplyMux
from videoflow.backends.messaging import (
    Accepted,
    PublicationUnknown,
    PublicationUnresolvable,
    PublishOutcome,
    Receipt,
    Rejected,
)
from videoflow.broker import server as embedded

pytestmark = pytest.mark.timeout(60)

Freeze = Callable[[embedded.EmbeddedServer], contextlib.AbstractContextManager[None]]
"""The conftest's freeze fixture: SIGSTOP a server for the with block."""


def test_publish_is_accepted_once_and_a_repeated_msg_id_is_a_duplicate(wired: Wired) -> None:
    _, subject = batch_channel(wired, "src")
    first = wired.run(publish_once(wired.js, subject, envelope("src", msg_id="m-1"), 5))
    again = wired.run(publish_once(wired.js, subject, envelope("src", msg_id="m-1"), 5))
    other = wired.run(publish_once(wired.js, subject, envelope("src", msg_id="m-2"), 5))
    assert first == Accepted(stream_seq=1, duplicate=False)
    assert again == Accepted(stream_seq=1, duplicate=True)
    assert other == Accepted(stream_seq=2, duplicate=False)



def test_a_subject_no_stream_captures_is_rejected_not_retryable(wired: Wired) -> None:
    outcome = wired.run(publish_once(wired.js, "vf.flow.run.nobody", envelope("nobody"), 5))
    assert isinstance(outcome, Rejected)
    assert outcome.retryable is False
    assert "no stream captures" in outcome.reason



def test_a_full_discard_new_stream_is_rejected_retryable(wired: Wired) -> None:
    _, subject = batch_channel(wired, "full", max_msgs=1)
    assert isinstance(wired.run(publish_once(wired.js, subject, envelope("full"), 5)), Accepted)
    outcome = wired.run(publish_once(wired.js, subject, envelope("full"), 5))
    assert isinstance(outcome, Rejected)
    assert outcome.retryable is True  # S8: 503 / 10077, acks free room
    assert "10077" in outcome.reason



def test_an_expired_deadline_sends_nothing(wired: Wired) -> None:
    stream, subject = batch_channel(wired, "late")
    outcome = wired.run(publish_once(wired.js, subject, envelope("late"), 0.0))
    assert isinstance(outcome, Rejected) and outcome.retryable is True
    info = wired.run(wired.js.stream_info(stream))
    assert info.state.messages == 0



def test_a_lost_puback_is_unknown_and_observe_publication_resolves_it(
    wired: Wired, nats_server: embedded.EmbeddedServer, freeze: Freeze
) -> None:
    stream, subject = batch_channel(wired, "frozen")
    ledger = PublicationLedger()
    sent = envelope("frozen", msg_id="m-frozen")
    with freeze(nats_server):  # only this test's own server
        ledger.sent(sent, horizon=120.0)
        outcome = wired.run(publish_once(wired.js, subject, sent, 0.5))
    assert isinstance(outcome, PublicationUnknown)  # MSG-014: never Rejected
    resolved = wired.run(observe_by_republish(wired.js, stream, subject, sent, ledger, 5))
    # S3: the frozen server stored it once it resumed; the re-publish is a duplicate.
    assert resolved == Accepted(stream_seq=1, duplicate=True)
    assert wired.run(wired.js.stream_info(stream)).state.messages == 1
    assert ledger.first_sent(sent) is None



def test_observe_publication_outside_the_window_or_without_msg_id_is_unresolvable(
    wired: Wired,
) -> None:
    stream, subject = batch_channel(wired, "old")
    now = [1000.0]
    ledger = PublicationLedger(clock=lambda: now[0])
    sent = envelope("old", msg_id="m-old")
    ledger.sent(sent, horizon=120.0)
    now[0] += 121.0  # past stream_config_for's 120 s duplicate_window
    outcome = wired.run(observe_by_republish(wired.js, stream, subject, sent, ledger, 5))
    assert isinstance(outcome, PublicationUnresolvable)
    bare = wired.run(observe_by_republish(wired.js, stream, subject, envelope("old"),
                                          ledger, 5))
    assert isinstance(bare, PublicationUnresolvable)
    assert wired.run(wired.js.stream_info(stream)).state.messages == 0



def _timers_at(deadline: float) -> list[asyncio.TimerHandle]:
    """The loop's live timers due at deadline (monotonic; within a second)."""
    scheduled = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    return [handle for handle in scheduled
            if not handle.cancelled() and abs(handle.when() - deadline) < 1.0]


def test_a_pipelined_batch_whose_pubacks_all_came_leaves_no_timer(wired: Wired) -> None:
    # A batch's deadline timer fired to find nothing open, a wake-up of the loop per
    # batch (at 1 kHz one per output): answered in full, it is cancelled.
    _, subject = batch_channel(wired, "piped")
    receipts: list[Receipt[PublishOutcome]] = [Receipt() for _ in range(3)]
    deadline = time.monotonic() + 30

    async def publish() -> tuple[int, int]:
        batch = [(subject, envelope("piped", msg_id=f"p-{i}"), deadline, receipt)
                 for i, receipt in enumerate(receipts)]
        await publish_pipelined(wired.client, ReplyMux(wired.client), batch, asyncio.Lock())
        armed = len(_timers_at(deadline))
        while not all(r.done() for r in receipts):
            await asyncio.sleep(0.01)
        return armed, len(_timers_at(deadline))

    armed, left = wired.run(publish())
    assert [r.result(0) for r in receipts] == [Accepted(stream_seq=i, duplicate=False)
                                               for i in (1, 2, 3)]
    assert (armed, left) == (1, 0)  # armed while the PubAcks were on their way


def test_a_pipelined_publish_whose_puback_never_came_is_unknown_at_its_deadline(
    wired: Wired, nats_server: embedded.EmbeddedServer, freeze: Freeze
) -> None:
    _, subject = batch_channel(wired, "unanswered")
    receipt: Receipt[PublishOutcome] = Receipt()

    async def publish() -> None:
        batch = [(subject, envelope("unanswered"), time.monotonic() + 0.5, receipt)]
        await publish_pipelined(wired.client, ReplyMux(wired.client), batch, asyncio.Lock())

    with freeze(nats_server):  # only this test's own server
        wired.run(publish())
        outcome = receipt.result(5)
    assert outcome == PublicationUnknown("no PubAck before the deadline")  # MSG-014

