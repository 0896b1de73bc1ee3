"""PayloadStore obligations (BLOB-5, BLOB-7, BLOB-14, PAY-006, PAY-007/013).

The test bodies take a ``stores`` factory and a ``clock``; this module binds them to
the memory, filesystem and shared-memory stores, tests/integration/test_payload_nats.py imports the
same bodies and binds them to the NATS object store.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from videoflow.backends.filesystem_payload import FilesystemPayloadStore
from videoflow.backends.payload import (
    BATCH_TTL_SECONDS,
    REALTIME_TTL_SECONDS,
    MemoryPayloadStore,
    PayloadStore,
    default_ttl_seconds,
    inline_threshold,
    intent_id,
    should_offload,
)
from videoflow.backends.shm_payload import SharedMemoryPayloadStore
from videoflow.core.constants import BATCH, REALTIME
from videoflow.errors import PayloadMissing

READERS = ("fuse", "sink/p0", "sink/p1")


class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Stores:
    """Makes stores over one backing per test: ``new`` a fresh instance, ``reopen`` a
    second instance over the same backing (what a restarted worker would open)."""

    def __init__(self, make: Callable[..., PayloadStore]) -> None:
        self._make = make
        self.opened: list[PayloadStore] = []

    def new(self, **options: Any) -> PayloadStore:
        store = self._make(**options)
        self.opened.append(store)
        return store

    def reopen(self, **options: Any) -> PayloadStore:
        return self.new(**options)

    def close(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "filesystem", "shm"])
def stores(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Stores]:
    directory = tmp_path / "payloads"
    if request.param == "memory":
        made = Stores(lambda **o: MemoryPayloadStore(clock=clock, **o))
    elif request.param == "filesystem":
        made = Stores(lambda **o: FilesystemPayloadStore(directory, clock=clock, **o))
    else:
        made = Stores(lambda **o: SharedMemoryPayloadStore(directory, clock=clock, **o))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=["filesystem", "shm"])
def durable_stores(request: pytest.FixtureRequest, tmp_path: Path,
                   clock: FakeClock) -> Iterator[Stores]:
    """The stores whose records outlive an instance (the memory store dies with its
    instance by design, so it has no such promise to test; the shared-memory store's
    records outlive it on one host)."""
    directory = tmp_path / "payloads"
    kind = FilesystemPayloadStore if request.param == "filesystem" else SharedMemoryPayloadStore
    made = Stores(lambda **o: kind(directory, clock=clock, **o))
    try:
        yield made
    finally:
        made.close()


# --- bodies shared with the NATS integration suite ---------------------------------


def test_put_then_get_returns_the_same_bytes(stores: Stores) -> None:
    store = stores.new()
    data = bytes(range(256)) * 40
    ref = store.put(bytearray(data), READERS, "pub-1")
    assert store.get(ref) == data
    assert ref in store.refs()


def test_put_from_stores_a_payload_again_under_its_own_ref_and_obligations(
        stores: Stores) -> None:
    store = stores.new()
    data = bytes(range(256)) * 40
    source = store.put(data, ["pass"], "cam-1")
    again = store.put_from(source, ["sink"], "pass-1", channel="pass")
    assert again != source and store.get(again) == data
    assert store.obligations(again) == ("intent/pass-1", "sink")
    assert store.records()[again].channel == "pass"
    # The source goes (its reader and intent done); the copy, or the second link to
    # the same bytes, stays until its own reader is done.
    store.resolve_intent(source, "cam-1", accepted=True)
    assert store.release(source, "pass") is True
    assert source not in store.refs() and store.get(again) == data
    store.resolve_intent(again, "pass-1", accepted=True)
    assert store.release(again, "sink") is True
    assert store.refs() == ()
    with pytest.raises(PayloadMissing):
        store.put_from(source, ["sink"], "pass-2")


def test_put_acquires_each_reader_obligation_and_the_publisher_intent(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", READERS, "pub-1")
    assert store.obligations(ref) == tuple(sorted([*READERS, "intent/pub-1"]))


@pytest.mark.parametrize("order", list(itertools.permutations([*READERS, "intent/pub-1"]))[::5])
def test_release_in_any_order_reclaims_exactly_when_the_last_obligation_goes(
    stores: Stores, order: tuple[str, ...]
) -> None:
    store = stores.new()
    ref = store.put(b"frame", READERS, "pub-1")
    for released, obligation in enumerate(order, start=1):
        assert store.release(ref, obligation) is True
        if released < len(order):
            assert store.get(ref) == b"frame"  # not before the last
            assert store.obligations(ref) == tuple(sorted(set(order[released:])))
    with pytest.raises(PayloadMissing, match="unknown payload ref"):
        store.get(ref)
    assert ref not in store.refs()
    assert store.reclaimed == 1


def test_release_is_idempotent_and_reclaims_once(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", ["fuse"], "pub-1")
    assert store.release(ref, "fuse") is True
    assert store.release(ref, "fuse") is False
    assert store.obligations(ref) == ("intent/pub-1",)
    assert store.resolve_intent(ref, "pub-1", accepted=True) is True
    assert store.release(ref, "fuse") is False  # a release after reclamation is harmless
    assert store.resolve_intent(ref, "pub-1", accepted=True) is False
    assert store.reclaimed == 1


def test_a_batch_of_releases_answers_each_and_reclaims_the_ones_it_ends(
    stores: Stores,
) -> None:
    store = stores.new()
    kept = store.put(b"still read", ["fuse", "view"], "pub-1")
    ended = store.put(b"done", ["fuse"], "pub-2")
    store.resolve_intent(kept, "pub-1", accepted=True)
    store.resolve_intent(ended, "pub-2", accepted=True)
    assert store.release_many([kept, ended, ended], "fuse") == [True, True, False]
    assert store.obligations(kept) == ("view",)
    assert ended not in store.refs() and store.reclaimed == 1
    assert store.release_many([], "fuse") == []


def test_releasing_an_obligation_nobody_holds_changes_nothing(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", ["fuse"], "pub-1")
    assert store.release(ref, "stranger") is False
    assert store.obligations(ref) == ("fuse", "intent/pub-1")


@pytest.mark.parametrize(
    ("flow_type", "ttl"), [(REALTIME, REALTIME_TTL_SECONDS), (BATCH, BATCH_TTL_SECONDS)]
)
def test_ttl_lapse_reclaims_whatever_is_still_held_with_flow_type_defaults(
    stores: Stores, clock: FakeClock, flow_type: str, ttl: float
) -> None:
    store = stores.new(flow_type=flow_type)
    assert store.ttl_seconds == ttl == default_ttl_seconds(flow_type)
    ref = store.put(b"frame", READERS, "pub-1")
    clock.advance(ttl - 1)
    assert store.reclaim_expired() == 0
    assert store.get(ref) == b"frame"
    clock.advance(1)
    with pytest.raises(PayloadMissing, match="expired"):
        store.get(ref)  # lapsed, even before the sweep
    assert store.reclaim_expired() == 1
    assert store.reclaim_expired() == 0
    with pytest.raises(PayloadMissing, match="unknown payload ref"):
        store.obligations(ref)


def test_an_explicit_ttl_overrides_the_default(stores: Stores, clock: FakeClock) -> None:
    store = stores.new(ttl_seconds=10)
    short = store.put(b"a", ["fuse"], "pub-1")
    longer = store.put(b"b", ["fuse"], "pub-2", ttl_seconds=100)
    assert store.reclaim_expired(now=clock.now + 10) == 1
    assert store.refs() == (longer,)
    with pytest.raises(PayloadMissing):
        store.get(short)


def test_a_definitely_refused_publication_reclaims_at_once(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", READERS, "pub-1")
    assert store.resolve_intent(ref, "pub-1", accepted=False) is True
    with pytest.raises(PayloadMissing):
        store.get(ref)
    assert store.reclaimed == 1


def test_a_refused_publication_keeps_a_pin_that_someone_else_holds(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", READERS, "pub-1")
    assert store.acquire(ref, "dlq/fuse") is True
    assert store.acquire(ref, "dlq/fuse") is False
    assert store.resolve_intent(ref, "pub-1", accepted=False) is True
    assert store.obligations(ref) == ("dlq/fuse",)
    assert store.release(ref, "dlq/fuse") is True
    with pytest.raises(PayloadMissing):
        store.get(ref)


def test_an_accepted_publication_releases_only_the_intent(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", READERS, "pub-1")
    assert store.resolve_intent(ref, "pub-1", accepted=True) is True
    assert store.obligations(ref) == tuple(sorted(READERS))
    assert store.resolve_intent(ref, "other", accepted=False) is False  # not its intent
    assert store.obligations(ref) == tuple(sorted(READERS))


def test_a_pin_extends_the_ttl(stores: Stores, clock: FakeClock) -> None:
    store = stores.new(ttl_seconds=10)
    ref = store.put(b"frame", ["fuse"], "pub-1")
    store.acquire(ref, "dlq/fuse", ttl_seconds=1000)
    clock.advance(500)
    assert store.reclaim_expired() == 0
    assert store.get(ref) == b"frame"
    clock.advance(500)
    assert store.reclaim_expired() == 1


def test_cancel_removes_a_lost_release_but_never_a_pin(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", ["fuse"], "pub-1")
    store.acquire(ref, "archive/run")
    assert store.cancel(ref, "fuse") is True
    assert store.cancel(ref, "fuse") is False
    with pytest.raises(ValueError, match="never cancels a pin"):
        store.cancel(ref, "archive/run")
    assert store.cancel(ref, intent_id("pub-1")) is True
    assert store.obligations(ref) == ("archive/run",)


def test_unknown_refs_are_typed_errors_never_empty_answers(stores: Stores) -> None:
    store = stores.new()
    for ref in ["0" * 32, "../../etc/passwd", ""]:
        with pytest.raises(PayloadMissing, match="unknown payload ref") as caught:
            store.get(ref)
        assert isinstance(caught.value, KeyError)
        with pytest.raises(PayloadMissing, match="unknown payload ref"):
            store.obligations(ref)
        with pytest.raises(PayloadMissing, match="unknown payload ref"):
            store.acquire(ref, "dlq/x")
        assert store.release(ref, "fuse") is False


@pytest.mark.parametrize(
    ("readers", "publication", "match"),
    [
        (["fuse", "fuse"], "pub-1", "duplicate reader ids"),
        (["", "fuse"], "pub-1", "non-empty str"),
        (["intent/pub-1"], "pub-1", "intent namespace"),
        ("fuse", "pub-1", "not one str"),
        (["fuse"], "", "publication_id"),
    ],
)
def test_put_refuses_malformed_obligations(
    stores: Stores, readers: Any, publication: str, match: str
) -> None:
    store = stores.new()
    with pytest.raises(ValueError, match=match):
        store.put(b"frame", readers, publication)
    assert store.refs() == ()


def test_bytes_left_by_a_crash_mid_reclamation_are_swept(stores: Stores) -> None:
    store = stores.new()
    ref = store.put(b"frame", ["fuse"], "pub-1")
    kept = store.put(b"kept", ["fuse"], "pub-2")
    # A crash between the record's deletion and the blob's: the record goes alone.
    store._transact(ref, lambda _old: (None, None))
    assert store._list_blobs().count(ref) == 1
    assert store.reclaim_expired() == 0  # nothing expired; orphans are not counted
    assert ref not in store._list_blobs()
    assert store.get(kept) == b"kept"


def test_a_new_store_over_the_same_backing_keeps_bytes_and_obligations(
    durable_stores: Stores, clock: FakeClock
) -> None:
    stores = durable_stores
    first = stores.new(ttl_seconds=100)
    ref = first.put(b"frame", READERS, "pub-1")
    first.release(ref, "fuse")
    first.close()
    second = stores.reopen()
    assert second.get(ref) == b"frame"
    assert second.obligations(ref) == ("intent/pub-1", "sink/p0", "sink/p1")
    clock.advance(100)  # the expiry time survived too, not just the obligations
    assert second.reclaim_expired() == 1


def test_concurrent_releases_never_double_reclaim_or_lose_a_release(stores: Stores) -> None:
    store = stores.new()
    readers = [f"r{i}" for i in range(6)]
    refs = [store.put(b"x" * 10, readers, f"pub-{n}") for n in range(4)]
    kept = [store.put(b"y", readers, f"kept-{n}") for n in range(2)]
    jobs = [(ref, r) for ref in refs for r in [*readers, f"intent/pub-{refs.index(ref)}"]]
    jobs += [(ref, r) for ref in kept for r in readers[1:]]  # r0 is never released on these
    start = threading.Barrier(8)

    def release(job: tuple[str, str]) -> bool:
        return store.release(*job)

    def warm(_: int) -> None:
        start.wait()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(warm, range(8)))  # every worker exists before the releases start
        results = list(pool.map(release, jobs * 2))  # each release twice, racing itself
    assert sum(results) == len(jobs)  # every release happened exactly once
    assert store.reclaimed == len(refs)  # and every ref was reclaimed exactly once
    assert sorted(store.refs()) == sorted(kept)
    for ref in kept:
        assert store.obligations(ref) == (f"intent/kept-{kept.index(ref)}", "r0")


# --- helpers with no store -----------------------------------------------------------


def test_inline_threshold_keeps_a_margin_below_max_payload() -> None:
    assert inline_threshold(1_048_576) == 1_048_576 - 16 * 1024
    assert should_offload(inline_threshold(1_048_576) + 1, inline_threshold(1_048_576))
    assert not should_offload(inline_threshold(1_048_576), inline_threshold(1_048_576))
    with pytest.raises(ValueError, match="no room"):
        inline_threshold(1000)
    with pytest.raises(ValueError, match="must be an int"):
        inline_threshold(True)


def test_an_unknown_flow_type_has_no_ttl_default() -> None:
    with pytest.raises(ValueError, match="flow_type must be"):
        default_ttl_seconds("streaming")
    with pytest.raises(ValueError, match="finite number > 0"):
        MemoryPayloadStore(ttl_seconds=0)


def test_a_filesystem_record_that_does_not_parse_is_unobservable(tmp_path: Path) -> None:
    from videoflow.errors import UnobservableState

    store = FilesystemPayloadStore(tmp_path)
    ref = store.put(b"frame", ["fuse"], "pub-1")
    (tmp_path / "records" / f"{ref}.json").write_bytes(b"{not json")
    with pytest.raises(UnobservableState, match="unreadable") as caught:
        store.obligations(ref)
    assert caught.value.reason == "malformed"


def test_bytes_are_written_once_under_their_ref_and_cut_short_read_as_malformed(
    durable_stores: Stores,
) -> None:
    # Written straight under the new ref (no temporary file renamed into place): what
    # a crash cut short disagrees with its record's size and is never read as a payload.
    from videoflow.errors import UnobservableState

    store = durable_stores.new()
    refs = [store.put(bytes([i]) * 5000, ["fuse"], f"pub-{i}") for i in range(3)]
    blobs = Path(store.directory) / "blobs"  # type: ignore[attr-defined]
    assert sorted(p.name for p in blobs.iterdir()) == sorted(refs)
    assert store.get(refs[1]) == bytes([1]) * 5000
    with open(blobs / refs[2], "r+b") as cut:
        cut.truncate(1200)
    with pytest.raises(UnobservableState, match="1200 bytes") as caught:
        store.get(refs[2])
    assert caught.value.reason == "malformed"
