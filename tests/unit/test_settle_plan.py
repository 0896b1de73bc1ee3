"""How a batch of settlements goes on the wire (jetstream.delivery_leases.plan_sends): every run
ends in exactly one request, and nothing is left without a reply to confirm it. And how
a delivery's position is read from its reply subject (jetstream.subscription_receiver)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from videoflow.backends.jetstream.delivery_leases import plan_sends
from videoflow.backends.jetstream.subscription_receiver import delivery_position


def test_completed_ones_ride_on_the_next_request() -> None:
    runs = plan_sends([(0, "a", b"+ACK", False), (1, "b", b"+ACK", False),
                       (2, "c", b"-NAK", True), (3, "d", b"+ACK", False),
                       (4, "e", b"+ACK", False)])
    assert [[(s.slot, s.request) for s in run] for run in runs] == [
        [(0, False), (1, False), (2, True)], [(3, False), (4, True)]]


def test_a_single_settlement_is_a_request() -> None:
    (run,) = plan_sends([(7, "a", b"+ACK", False)])
    assert [(s.slot, s.subject, s.payload, s.request) for s in run] == [
        (7, "a", b"+ACK", True)]


def test_nothing_to_send_plans_nothing() -> None:
    assert plan_sends([]) == []


@given(st.lists(st.booleans(), max_size=40))
def test_every_run_ends_in_its_only_request_and_order_is_kept(must: list[bool]) -> None:
    settlements = [(i, f"s{i}", b"x", m) for i, m in enumerate(must)]
    runs = plan_sends(settlements)
    flat = [send for run in runs for send in run]
    assert [s.slot for s in flat] == list(range(len(must)))
    for run in runs:
        assert run[-1].request and not any(s.request for s in run[:-1])
    # Whatever must be a request is one.
    assert all(s.request for s in flat if must[s.slot])


@pytest.mark.parametrize("reply", [
    "$JS.ACK.vf-f-r-n.child--from--n.3.1234.77.1700000000000000000.5",
    "$JS.ACK._.ACCHASH.vf-f-r-n.child--from--n.3.1234.77.1700000000000000000.5.rand",
    "$JS.ACK.hub.ACCHASH.vf-f-r-n.child--from--n.3.1234.77.1700000000000000000.5",
])
def test_delivery_position_reads_what_nats_py_metadata_reads(reply: str) -> None:
    msg = Msg(None, subject="s", reply=reply, data=b"")  # type: ignore[arg-type]
    meta = Msg(None, subject="s", reply=reply, data=b"").metadata  # type: ignore[arg-type]
    assert delivery_position(msg) == (
        meta.sequence.stream, meta.num_delivered, meta.num_pending) == (1234, 3, 5)


@pytest.mark.parametrize("reply", [
    "$JS.ACK.vf-f-r-n.child--from--n.0.1234.77.1700000000000000000.5",  # delivered 0
    "$JS.ACK.vf-f-r-n.child--from--n.3.0.77.1700000000000000000.5",  # stream seq 0
])
def test_a_delivery_without_a_sequence_or_count_is_refused(reply: str) -> None:
    # Deliveries are built from these without DeliveryToken's checks (trusted_delivery).
    with pytest.raises(ValueError, match="without a stream sequence and count"):
        delivery_position(Msg(None, subject="s", reply=reply, data=b""))  # type: ignore[arg-type]


@pytest.mark.parametrize("reply", ["", "inbox.1", "$JS.ACK.s.c.x.1.1.1.1", "$JS.ACK.a.b.c"])
def test_a_reply_that_is_not_a_jetstream_ack_fails_as_nats_py_metadata_fails(
    reply: str,
) -> None:
    def failure(read: Callable[[Msg], object]) -> type[BaseException]:
        with pytest.raises((NotJSMessageError, ValueError)) as raised:
            read(Msg(None, subject="s", reply=reply, data=b""))  # type: ignore[arg-type]
        return raised.type

    assert failure(delivery_position) is failure(lambda msg: msg.metadata)
