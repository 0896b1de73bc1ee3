"""A publication's receipt (backends.messaging.Receipt): set once by the adapter's
thread, read or waited for by the publisher's."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from videoflow.backends.messaging import Accepted, PublicationUnknown, Receipt


def test_an_answered_receipt_is_done_at_once() -> None:
    accepted = Accepted(stream_seq=3)
    receipt = Receipt(accepted)
    assert receipt.done()
    assert receipt.result(timeout=0) is accepted


def test_the_first_answer_is_the_answer() -> None:
    receipt = Receipt()
    first = Accepted(stream_seq=1)
    receipt.set_result(first)
    receipt.set_result(PublicationUnknown("late"))  # a timer firing after the reply
    assert receipt.result() is first


def test_waiting_past_the_timeout_raises_and_stays_open() -> None:
    receipt = Receipt()
    started = time.monotonic()
    with pytest.raises(concurrent.futures.TimeoutError):
        receipt.result(timeout=0.05)
    assert time.monotonic() - started >= 0.05
    assert not receipt.done()
    receipt.set_result(Accepted(stream_seq=2))  # a later answer still lands
    assert receipt.result(timeout=0) == Accepted(stream_seq=2)


def test_a_waiter_wakes_when_another_thread_answers() -> None:
    for _ in range(200):  # the answer racing the waiter's arrival, many times over
        receipt = Receipt()
        answer = Accepted(stream_seq=7)
        setter = threading.Thread(target=receipt.set_result, args=(answer,))
        setter.start()
        assert receipt.result(timeout=5) is answer
        setter.join()
