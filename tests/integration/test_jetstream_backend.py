"""The JetStream adapter as a whole (videoflow.backends.jetstream.backend, the facade over
its parts) against a real nats-server: its constructor, its lifecycle over its
connection (videoflow.backends.jetstream.connection) and bindings
(videoflow.backends.jetstream.bindings), a message through every part, observations and
close by ownership. Never a mock broker."""

from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path

import pytest
from jetstream_helpers import (
    FLOW,
    RUN,
    Wired,
    data_sub,
    envelope,
    provisioned,
    receive_n,
    send,
)

from videoflow.backends.jetstream.backend import (
    ACK_CONFIRM_SECONDS,
    FETCH_TIMEOUT_SECONDS,
    JetStreamMessagingBackend,
    channel_spec_for,
    subscription_spec_for,
)
from videoflow.backends.jetstream.configs import stream_config_for
from videoflow.backends.jetstream.streams import ensure_stream
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    ChannelId,
    Completed,
    Known,
    Rejected,
    SettleConfirmed,
    Unknown,
)
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.naming import (
    control_subject_for,
)
from videoflow.errors import BrokerUnavailable

pytestmark = pytest.mark.timeout(60)


def test_the_constructor_signature_is_the_reference_one() -> None:
    params = [
        (p.name, None if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(JetStreamMessagingBackend).parameters.values()
    ]
    assert params == [
        ("nats_url", None), ("flow_id", None), ("run_id", None), ("flow_type", None),
        ("prefetch", 4), ("fetch_timeout", 1.0), ("ack_confirm_seconds", 2.0),
        ("keepalive", True), ("connect_timeout", 30.0), ("byte_budget", None),
    ]
    assert (ACK_CONFIRM_SECONDS, FETCH_TIMEOUT_SECONDS) == (2.0, 1.0)



def test_start_capabilities_and_shutdown(backends, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    assert backend.connected
    caps = backend.capabilities()
    assert caps.backend == "jetstream" and caps.durable is True
    assert isinstance(caps.max_payload, Known) and caps.max_payload.value > 0
    assert caps.replicas == Unknown("unread")
    provisioned(backend, "caps")
    caps = backend.capabilities()
    assert (caps.replicas, caps.storage) == (Known(1), Known("file"))
    backend.shutdown()
    assert not backend.connected
    # Shut down: nothing is sent, nothing is claimed.
    late = backend.publish(envelope("caps"), time.monotonic() + 5)
    assert isinstance(late, Rejected) and late.retryable is True
    assert backend.observe_channel(ChannelId(FLOW, RUN, "caps")).reason == "unreachable"  # type: ignore[union-attr]
    assert backend.close([ChannelId(FLOW, RUN, "caps")], "g").complete is False
    assert backend.stop_receiving() == 0
    backend.shutdown()  # idempotent
    with embedded.start(tmp_path / "gone") as server:
        url = server.url
    refused = JetStreamMessagingBackend(url, FLOW, RUN, BATCH, connect_timeout=5.0)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="unreachable"):
        refused.start()
    assert time.monotonic() - started < 5.0
    assert not refused.connected



def test_publish_receive_settle_and_observe_end_to_end(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    spec = channel_spec_for(FLOW, RUN, "e2e", BATCH, RELIABLE_WORK)
    first = backend.ensure_channel(spec, "c-1")
    assert (first.created, first.name, first.mismatches) == (True, "vf-flow-run-e2e", ())
    assert backend.ensure_channel(spec, "c-2").created is False
    sub = data_sub("e2e")
    verified = backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, 5), "s-1")
    assert (verified.created, verified.generation, verified.name) == (
        True, 0, "child--from--e2e")
    assert backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, 5), "s-1") == (
        verified)
    send(backend, "e2e", 3)
    got = receive_n(backend, sub, 3)
    assert [(d.stream_seq, d.data) for d in got] == [(1, b"m0"), (2, b"m1"), (3, b"m2")]
    assert backend.resident_bytes() == 6
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known)
    assert (observed.value.available, observed.value.leased) == (0, 3)
    for i, delivery in enumerate(got):
        assert backend.settle(delivery.token, Completed(), f"done-{i}") == SettleConfirmed()
    assert backend.observe_ack_floor(sub) == Known(3)
    channel = backend.observe_channel(ChannelId(FLOW, RUN, "e2e"))
    assert isinstance(channel, Known) and channel.value.last_seq == 3
    assert channel.value.retention == "interest"
    assert backend.observe_channel(ChannelId(FLOW, RUN, "nothing")) == Unknown(
        "missing", "stream not found")
    assert backend.observe_subscription(data_sub("nothing")).reason == "missing"  # type: ignore[union-attr]



def test_shutdown_hands_back_what_was_handed_out(backends) -> None:  # type: ignore[no-untyped-def]
    leaving, survivor = backends(), backends()
    sub = provisioned(leaving, "bye")
    send(leaving, "bye", 1)
    (in_hand,) = receive_n(leaving, sub, 1)
    leaving.shutdown()
    provisioned(survivor, "bye")
    (redelivered,) = receive_n(survivor, sub, 1, wait=5.0)
    assert (redelivered.stream_seq, redelivered.num_delivered) == (1, 2)



def test_max_deliveries_advisory_and_mark_exhausted_count_as_unresolved(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends(keepalive=False)
    sub = provisioned(backend, "exhaust", ack_wait=1.0, max_deliver=1)
    send(backend, "exhaust", 1)
    (only,) = receive_n(backend, sub, 1)
    deadline = time.monotonic() + 10
    unresolved = 0
    while time.monotonic() < deadline:  # S11: fires on a later pull after the lapse
        observed = backend.observe_subscription(sub)
        assert isinstance(observed, Known)
        unresolved = observed.value.unresolved
        if unresolved:
            break
        time.sleep(0.2)
    assert unresolved == 1  # MSG-012: never "nothing pending"
    assert not observed.value.nothing_pending
    backend.mark_exhausted(sub, None)
    observed = backend.observe_subscription(sub)
    assert isinstance(observed, Known) and observed.value.unresolved == 2



def test_control_stop_and_close_by_ownership(backends, wired: Wired) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    heard = threading.Event()
    backend.subscribe_control(heard.set)
    wired.run(wired.client.publish(control_subject_for(FLOW, RUN), b""))
    assert heard.wait(5)
    config = stream_config_for(FLOW, RUN, "owned", BATCH, generation="g1")
    wired.run(ensure_stream(wired.js, config))
    owned = ChannelId(FLOW, RUN, "owned")
    assert backend.close([owned], "g2").removed == ()
    cleaned = backend.close([owned], "g1")
    assert (cleaned.removed, cleaned.complete) == (("vf-flow-run-owned",), True)
    assert backend.observe_channel(owned) == Unknown("missing", "stream not found")

