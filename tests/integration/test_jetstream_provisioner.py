"""The JetStream adapter's provisioning and binding (videoflow.backends.jetstream.provisioner)
against a real nats-server: a profile it cannot keep, rebinding with the next
generation (MSG-011), an EOS subscription's per-process durable. Never a mock broker."""

from __future__ import annotations

import time

import pytest
from jetstream_helpers import (
    FLOW,
    RUN,
    data_sub,
    provisioned,
    receive_n,
    send,
)

from videoflow.backends.jetstream.backend import (
    channel_spec_for,
    subscription_spec_for,
)
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    Completed,
    Envelope,
    IncompatibleProfile,
    SettleConfirmed,
    SettleStale,
    SubscriptionId,
)
from videoflow.core.constants import BATCH

pytestmark = pytest.mark.timeout(60)


def test_a_replica_count_the_server_cannot_keep_is_incompatible(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    spec = channel_spec_for(FLOW, RUN, "r3", BATCH, RELIABLE_WORK, replicas=3)
    with pytest.raises(IncompatibleProfile, match="replicas"):
        backend.ensure_channel(spec, "c")
    with pytest.raises(IncompatibleProfile, match="only reliable_work and live_latest"):
        backend.ensure_channel(channel_spec_for(FLOW, RUN, "ctl", BATCH, "durable_control"),
                               "c")



def test_a_rebind_raises_the_generation_and_fences_earlier_tokens(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    sub = provisioned(backend, "rebind")
    send(backend, "rebind", 1)
    (held,) = receive_n(backend, sub, 1)
    again = backend.ensure_subscription(subscription_spec_for(sub, 30.0, 5, 5), "op-2")
    assert again.generation == 1 and again.created is False
    assert isinstance(backend.settle(held.token, Completed(), "old"), SettleStale)
    assert backend.supersede(held.token) is False



def test_an_eos_subscription_binds_this_process_durable_and_sees_the_marker(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    provisioned(backend, "ended")
    eos = SubscriptionId("child", ChannelId(FLOW, RUN, "ended"), kind="eos")
    verified = backend.ensure_subscription(subscription_spec_for(eos, 30.0, 5, 1), "eos")
    assert verified.name == f"child--eos--ended--{backend.instance_id}"
    marker = Envelope(ChannelId(FLOW, RUN, "ended"), "eos", b"EOS", "eos-1")
    assert isinstance(backend.publish(marker, time.monotonic() + 5), Accepted)
    (seen,) = receive_n(backend, eos, 1)
    assert seen.data == b"EOS"
    assert backend.settle(seen.token, Completed(), "eos-ack") == SettleConfirmed()
    # The data durable filters to the data subject and never sees the marker.
    assert backend.receive(data_sub("ended"), 1, 0, time.monotonic() + 0.5) == []

