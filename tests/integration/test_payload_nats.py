"""NatsObjectPayloadStore on a real nats-server: the unit suite's bodies, a 25 MB frame
travelling by ref, and the inline threshold derived from the server's max_payload."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nats
import nats.errors
import pytest

from videoflow.backends.jetstream.objects import chunk_bytes
from videoflow.backends.jetstream.payloads import NatsObjectPayloadStore
from videoflow.backends.payload import inline_threshold, should_offload
from videoflow.broker import server as embedded
from videoflow.errors import BrokerUnavailable, PayloadMissing
from videoflow.wire.serialization import encode_envelope

# The bodies live in the unit suite so both bind the same promises; pytest collects
# the imported functions here and resolves their fixtures from this module.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_payload_store import (  # noqa: E402
    FakeClock,
    Stores,
    test_a_definitely_refused_publication_reclaims_at_once,
    test_a_new_store_over_the_same_backing_keeps_bytes_and_obligations,
    test_a_pin_extends_the_ttl,
    test_a_refused_publication_keeps_a_pin_that_someone_else_holds,
    test_an_accepted_publication_releases_only_the_intent,
    test_an_explicit_ttl_overrides_the_default,
    test_bytes_left_by_a_crash_mid_reclamation_are_swept,
    test_cancel_removes_a_lost_release_but_never_a_pin,
    test_concurrent_releases_never_double_reclaim_or_lose_a_release,
    test_put_acquires_each_reader_obligation_and_the_publisher_intent,
    test_put_refuses_malformed_obligations,
    test_put_then_get_returns_the_same_bytes,
    test_release_in_any_order_reclaims_exactly_when_the_last_obligation_goes,
    test_release_is_idempotent_and_reclaims_once,
    test_releasing_an_obligation_nobody_holds_changes_nothing,
    test_ttl_lapse_reclaims_whatever_is_still_held_with_flow_type_defaults,
    test_unknown_refs_are_typed_errors_never_empty_answers,
)

pytestmark = pytest.mark.timeout(60)

SHARED_BODIES = (
    test_bytes_left_by_a_crash_mid_reclamation_are_swept,
    test_a_definitely_refused_publication_reclaims_at_once,
    test_a_new_store_over_the_same_backing_keeps_bytes_and_obligations,
    test_a_pin_extends_the_ttl,
    test_a_refused_publication_keeps_a_pin_that_someone_else_holds,
    test_an_accepted_publication_releases_only_the_intent,
    test_an_explicit_ttl_overrides_the_default,
    test_cancel_removes_a_lost_release_but_never_a_pin,
    test_concurrent_releases_never_double_reclaim_or_lose_a_release,
    test_put_acquires_each_reader_obligation_and_the_publisher_intent,
    test_put_refuses_malformed_obligations,
    test_put_then_get_returns_the_same_bytes,
    test_release_in_any_order_reclaims_exactly_when_the_last_obligation_goes,
    test_release_is_idempotent_and_reclaims_once,
    test_releasing_an_obligation_nobody_holds_changes_nothing,
    test_ttl_lapse_reclaims_whatever_is_still_held_with_flow_type_defaults,
    test_unknown_refs_are_typed_errors_never_empty_answers,
)

_buckets = itertools.count()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def stores(nats_server: embedded.EmbeddedServer, clock: FakeClock) -> Iterator[Stores]:
    bucket = f"payloads-{next(_buckets)}"
    made = Stores(lambda **o: NatsObjectPayloadStore(nats_server.url, bucket, clock=clock, **o))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def durable_stores(stores: Stores) -> Stores:
    return stores  # the object store and its KV records outlive any one instance


def test_a_25_mb_frame_travels_by_ref_and_is_gone_after_both_readers(stores: Stores) -> None:
    store = stores.new()
    assert isinstance(store, NatsObjectPayloadStore)
    frame = bytes(range(256)) * (25 * 1024 * 1024 // 256)
    assert should_offload(len(frame), inline_threshold(store.max_payload))
    ref = store.put(frame, ["fuse", "archive-reader"], "cam-0:1:7")
    assert store.get(ref) == frame
    assert store.resolve_intent(ref, "cam-0:1:7", accepted=True) is True
    assert store.release(ref, "fuse") is True
    assert store.get(ref) == frame  # one reader still owes its release
    assert store.release(ref, "archive-reader") is True
    with pytest.raises(PayloadMissing, match="unknown payload ref"):
        store.get(ref)
    assert store.reclaimed == 1


@pytest.mark.asyncio
async def test_the_inline_threshold_follows_the_servers_max_payload(
    stores: Stores, nats_client: nats.NATS
) -> None:
    store = stores.new()
    assert isinstance(store, NatsObjectPayloadStore)
    assert store.max_payload == nats_client.max_payload  # read from the server's INFO
    threshold = inline_threshold(nats_client.max_payload)
    largest_inline = encode_envelope(
        b"\x00" * threshold, trace_id="cam-0:1:7", seq=7, metadata={"camera": "cam-0"}
    )
    await nats_client.publish("payload.inline", largest_inline)  # fits, with the margin
    await nats_client.flush()
    too_large = encode_envelope(b"\x00" * nats_client.max_payload, trace_id="t", seq=1)
    with pytest.raises(nats.errors.MaxPayloadError):
        await nats_client.publish("payload.inline", too_large)


def test_two_workers_on_one_bucket_never_double_reclaim_or_lose_a_release(
    stores: Stores,
) -> None:
    # Two instances are two workers: only the KV compare-and-swap keeps them honest.
    workers = [stores.new(), stores.new()]
    readers = [f"r{i}" for i in range(8)]
    refs = [workers[0].put(b"x", readers, f"pub-{n}") for n in range(5)]
    jobs = [(ref, r) for n, ref in enumerate(refs) for r in [*readers, f"intent/pub-{n}"]]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(lambda i: workers[i % 2].release(*jobs[i // 2]), range(2 * len(jobs)))
        )
    assert sum(results) == len(jobs)
    assert workers[0].reclaimed + workers[1].reclaimed == len(refs)
    assert workers[1].refs() == ()


def test_an_unreachable_broker_is_a_typed_refusal(closed_port_url: str) -> None:
    with pytest.raises(BrokerUnavailable, match="could not open"):
        NatsObjectPayloadStore(closed_port_url, timeout=3.0)



def test_a_put_cut_off_by_a_broker_restart_leaves_only_the_stored_objects_chunks(
    tmp_path: Path, clock: FakeClock,
) -> None:
    # The broker dies mid-put, after some chunks are stored, and is away longer than
    # a call may take, so the cut-off attempt's own clean-up cannot reach it. The
    # attempt made once it is back succeeds; the first attempt's chunks, which no meta
    # message names and no sweep would ever find, must not stay in the bucket.
    store_dir = tmp_path / "store"
    servers = [embedded.start(store_dir)]
    url, bucket = servers[0].url, "payloads-restart"
    store = NatsObjectPayloadStore(url, bucket, clock=clock, timeout=1.0, outage_budget=30.0)
    frame = bytes(range(256)) * (24 * 1024 * 1024 // 256)

    async def chunk_subjects() -> dict[str, int]:
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info(
                f"OBJ_{bucket}", subjects_filter=f"$O.{bucket}.C.>")
            return dict(info.state.subjects or {})
        finally:
            await nc.close()

    try:
        with ThreadPoolExecutor(1) as pool:
            putting = pool.submit(store.put, frame, ["reader"], "cam-0:1:1")
            while sum(asyncio.run(chunk_subjects()).values()) < 3:
                assert not putting.done(), "the put ended before the broker could be cut"
            assert servers[0].process is not None
            servers[0].process.kill()
            servers[0].process.wait()
            time.sleep(2.5)  # past the store's 1 s calls: the clean-up cannot land
            servers.append(embedded.start(
                store_dir, extra_args=("-p", url.rsplit(":", 1)[1])))
            ref = putting.result(timeout=60)
        assert store.get(ref) == frame
        held = asyncio.run(chunk_subjects())
        assert len(held) == 1, held  # the stored object's chunks, and only those
        assert sum(held.values()) == -(-len(frame) // chunk_bytes(store.max_payload))
    finally:
        store.close()
        for server in servers:
            server.stop()
