"""Publication on JetStream (videoflow.backends.jetstream.publisher) against a real
nats-server: pipelined publications and their outcomes, a frozen server, the
publication ladder, dead letters. Never a mock broker."""

from __future__ import annotations

import threading
import time

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
    channel_spec_for,
    subscription_spec_for,
)
from videoflow.backends.messaging import (
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    Known,
    PublicationUnknown,
    PublicationUnresolvable,
    Rejected,
    SettleConfirmed,
)
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.naming import (
    dlq_stream_name,
    dlq_subject_for,
)
from videoflow.messaging.dead_letters import dead_letter, dead_letter_for, decode_dead_letter
from videoflow.messaging.publication import Published, publish_until_known

pytestmark = pytest.mark.timeout(60)


def test_publish_and_observe_publication_through_the_backend(backends) -> None:  # type: ignore[no-untyped-def]
    backend = backends()
    provisioned(backend, "pub")
    sent = envelope("pub", msg_id="only-once")
    assert backend.publish(sent, time.monotonic() + 5) == Accepted(1)
    assert backend.observe_publication(sent) == Accepted(1, duplicate=True)
    assert isinstance(backend.observe_publication(envelope("pub")), PublicationUnresolvable)
    refused = backend.publish(envelope("unprovisioned"), time.monotonic() + 5)
    assert isinstance(refused, Rejected) and refused.retryable is False



def test_pipelined_publications_keep_their_order_and_each_its_own_outcome(backends) -> None:  # type: ignore[no-untyped-def]
    # The faults of nats-py's publish_async (S1: a refusal never resolves its future;
    # S2: no timeout) must not come back through publish_async here: on a stream that
    # fills up midway, each publication gets its own Accepted or Rejected, in order.
    backend = backends()
    spec = channel_spec_for(FLOW, RUN, "pipe", BATCH, RELIABLE_WORK, required=[data_sub("pipe")],
                            batch_max_msgs=150)
    backend.ensure_channel(spec, "chan")
    backend.ensure_subscription(subscription_spec_for(data_sub("pipe"), 30.0, 5, 5), "op")
    deadline = time.monotonic() + 10
    futures = [backend.publish_async(envelope("pipe", b"m%d" % i, msg_id=f"pipe-{i}"), deadline)
               for i in range(200)]
    outcomes = [f.result(timeout=15) for f in futures]
    accepted = [o for o in outcomes if isinstance(o, Accepted)]
    assert [o.stream_seq for o in accepted] == list(range(1, 151))  # in submission order
    assert outcomes[:150] == accepted
    assert all(isinstance(o, Rejected) and o.retryable and "10077" in o.reason
               for o in outcomes[150:]), outcomes[150:]
    # A msg_id sent again inside the duplicate window is the duplicate of its original.
    again = backend.publish_async(envelope("pipe", b"m3", msg_id="pipe-3"), deadline)
    assert again.result(timeout=5) == Accepted(stream_seq=4, duplicate=True)
    # A passed deadline sends nothing.
    late = backend.publish_async(envelope("pipe", b"late", msg_id="late"), time.monotonic())
    assert isinstance(late.result(timeout=5), Rejected) and late.result().retryable
    nowhere = backend.publish_async(envelope("nobody"), deadline).result(timeout=5)
    assert isinstance(nowhere, Rejected) and not nowhere.retryable  # MSG-013



def test_pipelined_publications_to_a_frozen_server_are_unknown_then_observed(
    backends, nats_server: embedded.EmbeddedServer, freeze  # type: ignore[no-untyped-def]
) -> None:
    backend = backends()
    provisioned(backend, "frozen-pub")
    sent = [envelope("frozen-pub", b"f%d" % i, msg_id=f"frozen-pub-{i}") for i in range(5)]
    with freeze(nats_server):  # only this test's own server
        deadline = time.monotonic() + 0.5
        outcomes = [f.result(timeout=5) for f in
                    [backend.publish_async(env, deadline) for env in sent]]
    assert all(isinstance(o, PublicationUnknown) for o in outcomes), outcomes  # MSG-014
    observed = [backend.observe_publication(env) for env in sent]
    # S3: the frozen server stored them once it resumed; each re-publish is a duplicate.
    assert observed == [Accepted(stream_seq=i + 1, duplicate=True) for i in range(5)]



def test_the_publication_ladder_resolves_a_receipt_lost_to_a_frozen_server(
    backends, nats_server: embedded.EmbeddedServer, freeze  # type: ignore[no-untyped-def]
) -> None:
    backend = backends()
    provisioned(backend, "ladder")
    sent = envelope("ladder", b"x", msg_id="ladder-1")
    result: list[Published] = []
    with freeze(nats_server):  # only this test's own server
        worker = threading.Thread(target=lambda: result.append(publish_until_known(
            backend, sent, BATCH, time.monotonic() + 20, attempt_seconds=0.5)))
        worker.start()
        time.sleep(1.0)  # the first attempt's receipt is lost: unknown, then observed
    worker.join(20)
    (published,) = result
    # S3: the frozen server stored it once it resumed; the observation says so.
    assert published.outcome == Accepted(stream_seq=1, duplicate=True), published
    assert published.attempts >= 2 and published.stat == "duplicate"
    channel = backend.observe_channel(ChannelId(FLOW, RUN, "ladder"))
    assert isinstance(channel, Known) and channel.value.messages == 1



def test_dead_letters_land_in_the_flow_scoped_stream_on_the_node_s_subject(
    backends, wired: Wired  # type: ignore[no-untyped-def]
) -> None:
    backend = backends()
    sub = provisioned(backend, "dl-source")
    send(backend, "dl-source", 1)
    (delivery,) = receive_n(backend, sub, 1)
    backend.ensure_dead_letters("dlq")
    record = dead_letter_for(FLOW, RUN, "child", "dl-source", delivery.stream_seq,
                             delivery.num_delivered, "poison", delivery.data,
                             ValueError("bad"), time.time())
    done = dead_letter(backend, delivery.token, record, time.monotonic() + 5)
    assert isinstance(done.published.outcome, Accepted) and done.settled == SettleConfirmed()
    stored = wired.run(wired.js.get_msg(dlq_stream_name(FLOW), done.published.outcome.stream_seq))
    assert stored.subject == dlq_subject_for(FLOW, RUN, "child")
    assert decode_dead_letter(stored.data) == record
    info = wired.run(wired.js.stream_info(dlq_stream_name(FLOW)))
    assert (info.config.retention, info.config.max_age) == ("limits", 7 * 24 * 3600.0)
    # Teardown of the run never takes the flow's dead letters with it (STREAM-8).
    backend.close([ChannelId(FLOW, RUN, "dl-source")], "any")
    assert wired.run(wired.js.stream_info(dlq_stream_name(FLOW))).state.messages == 1

