"""Receiving across bindings on JetStream (videoflow.backends.jetstream.receiver) against a
real nats-server: receive_any, the byte budget and byte credit, admission, and
stop-receive (RUN-030). Never a mock broker."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from jetstream_helpers import (
    data_sub,
    provisioned,
    receive_n,
    send,
)

from videoflow.backends.messaging import (
    Completed,
    Delivery,
    Known,
    SettleConfirmed,
    SubscriptionId,
)
from videoflow.run.worker import _stop_signals

pytestmark = pytest.mark.timeout(60)


def test_stop_receiving_hands_parked_work_to_a_survivor_at_once(backends) -> None:  # type: ignore[no-untyped-def]
    leaving, survivor = backends(), backends()
    sub = provisioned(leaving, "quiet")
    send(leaving, "quiet", 4)
    (in_hand,) = receive_n(leaving, sub, 1)
    deadline = time.monotonic() + 5
    while leaving.prefetched(sub) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leaving.stop_receiving() == 3  # RUN-030
    assert leaving.stop_receiving() == 0
    provisioned(survivor, "quiet")
    got = receive_n(survivor, sub, 3, wait=5.0)
    assert sorted(d.stream_seq for d in got) == [2, 3, 4]
    assert leaving.settle(in_hand.token, Completed(), "kept") == SettleConfirmed()



def test_leaving_never_waits_out_an_open_pull_request_nor_strands_what_follows(backends) -> None:  # type: ignore[no-untyped-def]
    # A receiver with nothing to read keeps a pull request open for fetch_timeout.
    # Quiesce and shutdown withdraw its inbox instead of waiting for the request to
    # end (which held every node's exit for up to fetch_timeout), and the server then
    # hands nothing to the dropped request: what is published next goes to a
    # survivor at once, not after ack_wait (RUN-030).
    long_fetch = 20.0
    for leave in ("stop_receiving", "shutdown"):
        node = f"idle-{leave.replace('_', '-')}"
        leaving = backends(fetch_timeout=long_fetch)
        sub = provisioned(leaving, node, ack_wait=60.0)
        time.sleep(0.3)  # its pull loop has a request open on the server by now
        started = time.monotonic()
        getattr(leaving, leave)()
        assert time.monotonic() - started < long_fetch / 4, leave
        survivor = backends()
        provisioned(survivor, node, ack_wait=60.0)
        send(survivor, node, 2)
        got = receive_n(survivor, sub, 2, wait=5.0)
        assert sorted(d.stream_seq for d in got) == [1, 2], leave
        assert all(d.num_delivered == 1 for d in got), leave



def test_admission_skips_are_acked_and_reported_off_the_loop(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = data_sub("admit")
    skipped: list[tuple[int, bool]] = []
    assert backend.set_admission(
        sub, lambda d: d.data != b"m1",
        lambda d: skipped.append((d.stream_seq, threading.current_thread().daemon)))
    provisioned(backend, "admit")
    send(backend, "admit", 3)
    got = receive_n(backend, sub, 2)
    assert [d.data for d in got] == [b"m0", b"m2"]
    deadline = time.monotonic() + 5
    while not skipped and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.skipped(sub) == 1
    assert [seq for seq, _ in skipped] == [2]
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.dropped == 1



def test_a_waiting_receiver_parks_and_takes_on_its_own_thread(backends) -> None:  # type: ignore[no-untyped-def]
    # No thread hands a delivery over: the caller waiting in receive runs the loop, so
    # the admission filter (which runs where deliveries are parked) runs on it.
    # The message is sent once this thread waits in the loop: sent before (this thread
    # slow to get there, on a loaded host), it would be parked by the loop's keeper
    # thread, which runs a loop nobody waits on after 20 ms (KEEP_SECONDS).
    backend, sender = backends(), backends()
    sub = provisioned(backend, "inline")
    seen: list[int] = []
    backend.set_admission(sub, lambda delivery: seen.append(threading.get_ident()) or True)
    me, runner = threading.get_ident(), backend.connection.runner

    def send_while_waited_on() -> None:
        deadline = time.monotonic() + 5
        while runner._driver != me and time.monotonic() < deadline:
            time.sleep(0.001)
        send(sender, "inline", 1)

    other = threading.Thread(target=send_while_waited_on)
    other.start()
    (delivery,) = receive_n(backend, sub, 1)
    other.join(5)
    assert seen == [me]
    assert backend.settle(delivery.token, Completed(), "done") == SettleConfirmed()



def test_sigterm_while_the_task_waits_in_the_loop_quiesces_it(backends) -> None:  # type: ignore[no-untyped-def]
    # RUN-030 from the worker's SIGTERM handler, landing while the main thread runs the
    # loop inside a receive: the parked deliveries still go back at once.
    backend = backends()
    sub, idle = provisioned(backend, "leaving"), provisioned(backend, "idle")
    send(backend, "leaving", 3)
    deadline = time.monotonic() + 5
    while backend.prefetched(sub) < 3 and time.monotonic() < deadline:
        backend.receive_any([idle], 1, 0, time.monotonic() + 0.05)
    assert backend.prefetched(sub) == 3

    class Quiescing:  # what the handler calls: Task.quiesce
        handed: int | None = None

        def quiesce(self) -> None:
            self.handed = backend.stop_receiving()

    task = Quiescing()
    with _stop_signals(task, sigint_quiesces=False):  # type: ignore[arg-type]
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        assert backend.receive_any([idle], 1, 0, time.monotonic() + 1.5) == []
        timer.join()
    deadline = time.monotonic() + 5
    while task.handed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert task.handed == 3 and backend.prefetched(sub) == 0



def test_the_byte_budget_pauses_the_pull_loops(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(byte_budget=2)
    sub = provisioned(backend, "budget")
    send(backend, "budget", 4)
    deadline = time.monotonic() + 5
    while backend.budget_waits() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.budget_waits() >= 1  # RUN-025
    assert backend.prefetched(sub) < 4
    # Settling frees the budget and the rest flows, never more resident than the
    # budget plus the one message in flight when it filled (RUN-025's tolerance).
    seen: list[int] = []
    deadline = time.monotonic() + 10
    while len(seen) < 4 and time.monotonic() < deadline:
        got = receive_n(backend, sub, 4 - len(seen), wait=0.5)
        assert backend.resident_bytes() <= 2 + 2, backend.resident_bytes()
        for delivery in got:
            assert backend.settle(delivery.token, Completed(), f"b-{delivery.stream_seq}") == (
                SettleConfirmed())
        seen += [d.stream_seq for d in got]
    assert sorted(seen) == [1, 2, 3, 4]



def test_receive_any_gathers_from_several_subscriptions(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    left, right = provisioned(backend, "left"), provisioned(backend, "right")
    started = time.monotonic()
    assert backend.receive_any([left, right], 4, 0, time.monotonic() + 0.3) == []
    assert time.monotonic() - started >= 0.25
    send(backend, "left", 1)
    send(backend, "right", 1)
    got: list[tuple[SubscriptionId, Delivery]] = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        got += backend.receive_any([left, right], 4, 0, time.monotonic() + 1)
    assert sorted(s.channel.node for s, _ in got) == ["left", "right"]



def test_receive_respects_byte_credit_and_loses_nothing(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = provisioned(backend, "bytes")
    send(backend, "bytes", 3)  # 2 bytes each
    deadline = time.monotonic() + 5
    while backend.prefetched(sub) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    first = backend.receive(sub, 3, 3, time.monotonic() + 1)
    assert [d.stream_seq for d in first] == [1]  # a second would pass 3 bytes
    rest = receive_n(backend, sub, 2)
    assert [d.stream_seq for d in rest] == [2, 3]

