"""One harness per MessagingBackend adapter, so the conformance suite's test bodies run
unchanged against both: ``backend_kind`` is parametrised over 'memory' and 'jetstream'
and ``harness`` builds the receivers of one run for it.

- memory: every receiver shares one ``MemoryBroker`` on a hand-moved clock, so letting
  time pass for leases is ``clock.advance`` and costs no wall time.
- jetstream: a real embedded nats-server per test (``videoflow.broker.server.start``, an
  OS-chosen port; never a mock), and time passes for real — the lease tests use short
  ack_waits. Receivers are built with ``keepalive=False``: the memory adapter keeps no
  keepalive either, and a lease a keepalive renews never lapses, which is exactly what
  the redelivery test must see happen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from videoflow.backends.jetstream.backend import JetStreamMessagingBackend
from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    ChannelId,
    ChannelSpec,
    Delivery,
    MessagingBackend,
    SubscriptionId,
    SubscriptionSpec,
)
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH

FLOW: Final = "flow"
RUN: Final = "run"
CHANNEL: Final = ChannelId(FLOW, RUN, "source")
SUB: Final = SubscriptionId("sink", CHANNEL)

JETSTREAM_FETCH_TIMEOUT: Final = 0.5
"""One pull request's wait on JetStream: also how long a stop waits for the pull in
flight, so it bounds the cost of every quiesce, rebind and shutdown."""


class FakeClock:
    """A monotonic clock a test moves by hand (the memory broker's leases run on it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Harness:
    """The receivers of one run on one broker, and the time their leases run on.

    Attributes:
        kind: 'memory' or 'jetstream'.
        channel / sub: the run's channel and the subscription provision binds.
        quiet: seconds a receive waits when the test expects nothing — long enough on
            a real broker for a delivery in flight to land.
        wait: seconds a receive waits when the test expects something.
    """

    kind: str
    quiet: float
    wait: float
    channel: ChannelId = CHANNEL
    sub: SubscriptionId = SUB

    def __init__(self) -> None:
        self._made: list[MessagingBackend] = []

    def _new(self) -> MessagingBackend:
        raise NotImplementedError

    def receiver(self) -> MessagingBackend:
        """A started receiver (one process) of the run; shut down at teardown."""
        backend = self._new()
        backend.start()
        self._made.append(backend)
        return backend

    def let_pass(self, seconds: float, since: float | None = None) -> None:
        """Let seconds pass for leases and retry delays, counted from since (a
        time.monotonic() reading, e.g. when the delivery arrived) or else from now.
        Counting from the delivery keeps a slow step in between (a rebind, a quiesce)
        from pushing the next receive past the redelivery's own lease."""
        raise NotImplementedError

    def provision(
        self, backend: MessagingBackend, ack_wait: float, max_deliver: int = -1,
        credit: int = 16,
    ) -> SubscriptionSpec:
        """Create the run's channel (reliable_work) and bind SUB to it on backend.

        Returns:
            the subscription spec, for binding it again on another receiver.
        """
        backend.ensure_channel(ChannelSpec(CHANNEL, RELIABLE_WORK), "provision-channel")
        spec = SubscriptionSpec(SUB, ack_wait, max_deliver, credit)
        self.bind(backend, spec)
        return spec

    @staticmethod
    def bind(backend: MessagingBackend, spec: SubscriptionSpec, operation_id: str = "bind"
             ) -> None:
        verified = backend.ensure_subscription(spec, operation_id)
        assert verified.honoured, verified.mismatches

    @staticmethod
    def receive(backend: MessagingBackend, timeout: float, credit: int = 1,
                sub: SubscriptionId = SUB) -> list[Delivery]:
        """Up to credit deliveries, waiting at most timeout seconds for the first."""
        return backend.receive(sub, credit, 0, time.monotonic() + timeout)

    def receive_all(self, backend: MessagingBackend, count: int, timeout: float,
                    sub: SubscriptionId = SUB) -> list[Delivery]:
        """Receive until count deliveries arrived or timeout seconds passed (a real
        broker may hand them over in more than one batch)."""
        deadline = time.monotonic() + timeout
        got: list[Delivery] = []
        while len(got) < count and time.monotonic() < deadline:
            got += backend.receive(sub, count - len(got), 0, deadline)
        return got

    def close(self) -> None:
        for backend in self._made:
            if backend.connected:
                backend.shutdown(hand_back=False)


class MemoryHarness(Harness):
    kind = "memory"
    quiet = 0.05
    wait = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.broker = MemoryBroker(clock=self.clock)

    def _new(self) -> MessagingBackend:
        return MemoryMessagingBackend(self.broker, flow_id=FLOW, run_id=RUN)

    def let_pass(self, seconds: float, since: float | None = None) -> None:
        # The broker's clock moves only here, so seconds since anything is seconds.
        self.clock.advance(seconds)


class JetStreamHarness(Harness):
    kind = "jetstream"
    quiet = 0.3
    wait = 5.0

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def _new(self) -> MessagingBackend:
        return JetStreamMessagingBackend(
            self.url, FLOW, RUN, BATCH, fetch_timeout=JETSTREAM_FETCH_TIMEOUT,
            keepalive=False, connect_timeout=5.0)

    def let_pass(self, seconds: float, since: float | None = None) -> None:
        start = time.monotonic() if since is None else since
        time.sleep(max(0.0, start + seconds - time.monotonic()))


@pytest.fixture(params=["memory", "jetstream"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def harness(backend_kind: str, tmp_path: Path) -> Iterator[Harness]:
    if backend_kind == "memory":
        made: Harness = MemoryHarness()
        try:
            yield made
        finally:
            made.close()
        return
    with embedded.start(tmp_path / "jetstream-store") as server:
        made = JetStreamHarness(server.url)
        try:
            yield made
        finally:
            made.close()
