"""How a batch of settlements goes on the wire (jetstream_settle.plan_sends): every run
ends in exactly one request, and nothing is left without a reply to confirm it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from videoflow.messaging.jetstream_settle import plan_sends


def test_completed_ones_ride_on_the_next_request() -> None:
    runs = plan_sends([(0, "a", b"+ACK", False), (1, "b", b"+ACK", False),
                       (2, "c", b"-NAK", True), (3, "d", b"+ACK", False),
                       (4, "e", b"+ACK", False)])
    assert [[(s.index, s.request) for s in run] for run in runs] == [
        [(0, False), (1, False), (2, True)], [(3, False), (4, True)]]


def test_a_single_settlement_is_a_request() -> None:
    (run,) = plan_sends([(7, "a", b"+ACK", False)])
    assert [(s.index, s.subject, s.payload, s.request) for s in run] == [
        (7, "a", b"+ACK", True)]


def test_nothing_to_send_plans_nothing() -> None:
    assert plan_sends([]) == []


@given(st.lists(st.booleans(), max_size=40))
def test_every_run_ends_in_its_only_request_and_order_is_kept(must: list[bool]) -> None:
    settlements = [(i, f"s{i}", b"x", m) for i, m in enumerate(must)]
    runs = plan_sends(settlements)
    flat = [send for run in runs for send in run]
    assert [s.index for s in flat] == list(range(len(must)))
    for run in runs:
        assert run[-1].request and not any(s.request for s in run[:-1])
    # Whatever must be a request is one.
    assert all(s.request for s in flat if must[s.index])
