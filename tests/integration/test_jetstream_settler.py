"""Settlement across bindings on JetStream (videoflow.backends.jetstream.settler) against a
real nats-server: pipelined settlements from many threads, at shutdown, leases kept
alive, exhausted marks a Terminal clears. Never a mock broker."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from jetstream_helpers import (
    provisioned,
    receive_n,
    send,
)

from videoflow.backends.messaging import (
    Completed,
    Delivery,
    Known,
    SettleConfirmed,
    SettleResult,
    SettleStale,
    SettleUnknown,
    Terminal,
)

pytestmark = pytest.mark.timeout(60)


def test_a_lease_is_kept_alive_while_the_caller_runs_code_of_its_own(backends) -> None:  # type: ignore[no-untyped-def]
    # A node's long call: the caller touches nothing for three ack_waits. The keeper
    # runs the loop meanwhile, so the keepalive renews the lease (ack_wait / 3) and the
    # message is neither redelivered nor its token made stale (MSG-011).
    backend = backends()
    sub = provisioned(backend, "longcall", ack_wait=1.0)
    send(backend, "longcall", 1)
    (delivery,) = receive_n(backend, sub, 1)
    time.sleep(3.0)
    assert backend.settle(delivery.token, Completed(), "done") == SettleConfirmed()
    assert receive_n(backend, sub, 1, wait=1.5) == []



def test_a_settled_terminal_clears_a_ledger_mark(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = provisioned(backend, "marked")
    send(backend, "marked", 1)
    (delivery,) = receive_n(backend, sub, 1)
    backend.mark_exhausted(sub, delivery.stream_seq)
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.unresolved == 1
    assert backend.settle(delivery.token, Terminal("dlq:1"), "t") == SettleConfirmed()
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.unresolved == 0



def test_settle_async_from_many_threads_confirms_every_delivery(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(prefetch=120)
    sub = provisioned(backend, "async", credit=120)
    send(backend, "async", 120)
    got = receive_n(backend, sub, 120)
    assert len(got) == 120

    def settle_share(share: list[Delivery]) -> list[SettleResult]:
        futures = [backend.settle_async(d.token, Completed(), f"a-{d.stream_seq}")
                   for d in share]
        return [f.result(timeout=10) for f in futures]

    with ThreadPoolExecutor(4) as pool:
        results = [r for part in pool.map(settle_share, [got[i::4] for i in range(4)])
                   for r in part]
    assert results == [SettleConfirmed()] * 120
    assert backend.observe_ack_floor(sub) == Known(120)
    repeated = backend.settle_many([(got[0].token, Completed(), "a-1"),
                                    (got[1].token, Completed(), "other-id")])
    assert repeated[0] == SettleConfirmed() and isinstance(repeated[1], SettleStale)
    with pytest.raises(TypeError, match="not a settle outcome"):
        backend.settle_async(got[0].token, "done", "x")  # type: ignore[arg-type]



def test_settlements_queued_at_shutdown_resolve_unknown_never_hang(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(prefetch=8)
    sub = provisioned(backend, "late-settle", credit=8)
    send(backend, "late-settle", 8)
    got = receive_n(backend, sub, 8)
    assert len(got) == 8
    futures = [backend.settle_async(d.token, Completed(), f"l-{d.stream_seq}") for d in got]
    backend.shutdown(hand_back=False)
    results = [f.result(timeout=10) for f in futures]
    # Each is either confirmed (it went out before the close) or unknown -- never stale,
    # never missing, never an exception.
    assert all(isinstance(r, (SettleConfirmed, SettleUnknown)) for r in results), results
    late = backend.settle_async(got[0].token, Completed(), "after")
    assert isinstance(late.result(timeout=1), SettleStale)

