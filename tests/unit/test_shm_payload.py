"""The shared-memory payload store's own promises: zero-copy reads, a budget that is
backpressure and never a drop, a vanished segment as a typed error, the end of a run
and the sweep of what crashed runs left. The obligation rules it shares with every
store are tested in test_payload_store.py."""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from shm_helpers import base_of

from videoflow.backends.payload import BATCH_TTL_SECONDS
from videoflow.backends.shm_payload import (
    OFFLOAD_ABOVE_BYTES,
    PAGE_BYTES,
    PayloadBudgetExhausted,
    SharedMemoryPayloadStore,
    shm_root,
    sweep_expired,
)
from videoflow.backends.shm_shares import Freed
from videoflow.errors import PayloadMissing, UnobservableState
from videoflow.wire.offload import GatheredMessage, decode_message, encode_message, gather_message

FRAME = np.arange(480 * 640, dtype=np.uint32).astype(np.uint8).reshape(480, 640)



def recorded_count_downs(store: SharedMemoryPayloadStore) -> list[int]:
    """The bytes store counts down from its shared count of bytes held, per count-down
    (one acquisition of the folder's lock, whatever writers it covers), in order, from
    now on (the count itself still goes down)."""
    count_downs: list[int] = []
    count_down = store._count_down

    def counted(freed: Sequence[Freed]) -> None:
        count_downs.append(sum(f.size for f in freed))
        count_down(freed)

    store._count_down = counted  # type: ignore[method-assign]
    return count_downs


def leave_a_reservation(store: SharedMemoryPayloadStore, size: int) -> None:
    """What a crash between a put's reservation and its record leaves: size bytes
    counted held by store's writer, in no file, reserved by another instance of the
    writer (the process of it that died), so not among store's own in flight."""
    SharedMemoryPayloadStore(store.directory, writer=store.writer)._admit(size, None)

def test_a_frame_read_back_is_a_read_only_view_of_the_shared_pages(tmp_path: Path) -> None:
    store = SharedMemoryPayloadStore(tmp_path)
    ref = store.put(encode_message({"frame": FRAME, "k": 3}), ["fuse"], "cam:1:3")
    message = decode_message(store.view(ref))
    frame = message["frame"]
    assert message["k"] == 3 and np.array_equal(frame, FRAME)
    assert isinstance(base_of(frame), mmap.mmap)  # no copy: the mapping itself
    assert not frame.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        frame[0, 0] = 1


def test_a_view_outlives_its_payload_but_a_payload_gone_before_it_was_read_is_missing(
    tmp_path: Path,
) -> None:
    store = SharedMemoryPayloadStore(tmp_path)
    held = store.put(encode_message(FRAME), ["fuse"], "p1")
    lost = store.put(encode_message(FRAME), ["fuse"], "p2")
    frame = decode_message(store.view(held))
    for obligation in ("fuse", "intent/p1"):
        store.release(held, obligation)
    assert held not in store.refs()
    assert np.array_equal(frame, FRAME)  # the reader's mapping keeps the pages
    (tmp_path / "blobs" / lost).unlink()  # a manual delete, a host's cleanup
    with pytest.raises(PayloadMissing, match="no bytes") as caught:
        store.view(lost)
    assert caught.value.ref == lost


def test_the_budget_counts_what_is_held_and_frees_it_with_the_last_obligation(
    tmp_path: Path,
) -> None:
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000)
    first = store.put(b"a" * 4000, ["fuse"], "p1")
    store.put(b"b" * 3000, ["fuse"], "p2")
    assert store.used_bytes() == 7000
    store.release(first, "fuse")
    assert store.used_bytes() == 7000  # the intent still holds it
    store.resolve_intent(first, "p1", accepted=True)
    assert store.used_bytes() == 3000


def test_a_batch_of_releases_counts_the_budget_down_once(tmp_path: Path) -> None:
    # A reader done with a group's frames: each payload whose last obligation goes is
    # reclaimed, and the shared count (behind the store-wide lock every put takes)
    # goes down once, by their sum.
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000)
    refs = [store.put(bytes([i]) * 1000, ["fuse"], f"p{i}") for i in range(4)]
    for i, ref in enumerate(refs):
        store.resolve_intent(ref, f"p{i}", accepted=True)
    held = store.put(b"h" * 2000, ["fuse", "view"], "p9")
    store.resolve_intent(held, "p9", accepted=True)
    assert store.used_bytes() == 6000
    count_downs = recorded_count_downs(store)
    assert store.release_many([*refs, held], "fuse") == [True] * 5
    assert count_downs == [4000] and store.used_bytes() == 2000  # "view" still holds one
    assert store.release(held, "view") and count_downs == [4000, 2000]
    assert store.used_bytes() == 0


def test_a_full_budget_holds_the_put_back_until_a_reader_releases(tmp_path: Path) -> None:
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=10)
    held = store.put(b"a" * 6000, ["fuse"], "p1")
    store.resolve_intent(held, "p1", accepted=True)
    released_at: list[float] = []

    def reader() -> None:
        time.sleep(0.3)
        released_at.append(time.monotonic())
        store.release(held, "fuse")

    thread = threading.Thread(target=reader)
    thread.start()
    ref = store.put(b"b" * 6000, ["fuse"], "p2")  # does not fit until the release
    put_at = time.monotonic()
    thread.join()
    assert released_at and put_at >= released_at[0]
    assert store.get(ref) == b"b" * 6000
    assert store.budget_waits == 1 and store.used_bytes() == 6000


def test_a_budget_that_never_makes_room_fails_the_put_with_its_figures(tmp_path: Path) -> None:
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=0.2)
    store.put(b"a" * 6000, ["fuse"], "p1")
    with pytest.raises(PayloadBudgetExhausted, match="within 0.2 s") as caught:
        store.put(b"b" * 6000, ["fuse"], "p2")
    assert (caught.value.size, caught.value.budget, caught.value.used) == (6000, 10_000, 6000)
    with pytest.raises(PayloadBudgetExhausted, match="larger than the shared-memory budget"):
        store.put(b"c" * 10_001, ["fuse"], "p3")
    assert len(store.refs()) == 1  # neither failed put left anything behind


def test_a_count_left_too_high_by_a_crash_is_corrected_from_what_is_mapped(
    tmp_path: Path,
) -> None:
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=1)
    store.put(b"a" * 3000, ["fuse"], "p1")
    leave_a_reservation(store, 6500)  # a reservation whose put never finished
    ref = store.put(b"b" * 6000, ["fuse"], "p2")  # fits the 3,000 really held
    assert store.get(ref) == b"b" * 6000
    assert store.used_bytes() == 9000


def test_the_recount_skips_a_file_another_process_moved_away_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=1)
    store.put(b"a" * 3000, ["fuse"], "p1")
    # A writer's temporary file, renamed into place between the listing and the stat
    # (the 8-camera demo met it with its budget full).
    moved = tmp_path / "blobs" / ".p2.tmp"
    moved.write_bytes(b"b" * 2000)
    real_scandir = os.scandir

    @contextlib.contextmanager
    def listing_then_rename(path: Any) -> Iterator[list[os.DirEntry[str]]]:
        with real_scandir(path) as entries:
            listed = list(entries)
        moved.unlink()
        yield listed

    monkeypatch.setattr(os, "scandir", listing_then_rename)
    leave_a_reservation(store, 6500)  # so the next put recounts
    ref = store.put(b"c" * 6000, ["fuse"], "p3")
    assert store.get(ref) == b"c" * 6000 and store.used_bytes() == 9000


def test_every_process_of_a_folder_keeps_the_budget_it_was_made_with(tmp_path: Path) -> None:
    SharedMemoryPayloadStore(tmp_path, budget_bytes=123_456)
    assert SharedMemoryPayloadStore(tmp_path).budget_bytes == 123_456
    with pytest.raises(ValueError, match="budget_bytes must be an int > 0"):
        SharedMemoryPayloadStore(tmp_path, budget_bytes=0)


def test_it_takes_what_the_broker_would_copy_and_keeps_its_own_outbox(tmp_path: Path) -> None:
    store = SharedMemoryPayloadStore(tmp_path)
    assert store.offload_above == OFFLOAD_ABOVE_BYTES == 64 * 1024
    assert store.keeps_outbox
    ref = store.put(b"frame", ["fuse"], "cam:1:7", channel="cam")
    assert store.records()[ref].stream_seq is None  # unresolved: its intent is owed
    assert store.resolve_intent(ref, "cam:1:7", accepted=True, stream_seq=42)
    record = store.records()[ref]
    assert (record.channel, record.stream_seq, record.obligations) == ("cam", 42,
                                                                      frozenset({"fuse"}))


def test_the_end_of_a_run_reclaims_all_but_pinned_payloads(tmp_path: Path) -> None:
    folder = tmp_path / "flow" / "run"
    store = SharedMemoryPayloadStore(folder)
    store.put(b"owed", ["fuse"], "p1")  # a reader that died owing its release
    pinned = store.put(b"dead letter", ["fuse"], "p2")
    store.acquire(pinned, "dlq/fuse:cam:7")
    assert store.clear() == 1
    assert store.refs() == (pinned,) and store.get(pinned) == b"dead letter"
    store.release(pinned, "dlq/fuse:cam:7")
    assert store.clear() == 1 and not folder.exists()  # empty: the folder goes too
    assert not folder.parent.exists()  # and the flow's, with no other run in it


def test_the_end_of_a_run_whose_folder_another_process_half_removed_leaves_none(
        tmp_path: Path) -> None:
    # A teardown's clear removed the folder while another run's sweep opened it, whose
    # store made the folder again, without its records yet: the run's own clear, next,
    # met a folder with no records (CI: FileNotFoundError at the end of a run).
    folder = tmp_path / "flow" / "run"
    store = SharedMemoryPayloadStore(folder)
    store.put(b"frame", ["fuse"], "p1")
    SharedMemoryPayloadStore(folder).clear()
    folder.mkdir(parents=True)  # made again, half: no records
    assert store.clear() == 0
    assert not folder.exists() and not folder.parent.exists()


def test_a_kept_run_s_folder_goes_at_its_end_only_when_it_holds_no_payload(
        tmp_path: Path) -> None:
    # A run that fails or is stopped keeps its streams, and the payloads they refer
    # to; one that wrote none left its folder empty in /dev/shm for a day.
    empty = SharedMemoryPayloadStore(tmp_path / "flow" / "empty")
    holding = SharedMemoryPayloadStore(tmp_path / "flow" / "holding")
    ref = holding.put(b"owed to a kept stream", ["fuse"], "p1")
    assert holding.remove_if_empty() is False and holding.get(ref) == b"owed to a kept stream"
    assert empty.remove_if_empty() is True and not empty.directory.exists()
    assert (tmp_path / "flow").is_dir()  # the other run's flow folder stays
    assert empty.remove_if_empty() is False  # gone already: nothing to do
    assert holding.clear() == 1 and not (tmp_path / "flow").exists()


def test_the_sweep_reclaims_what_crashed_runs_left_past_its_ttl(tmp_path: Path) -> None:
    now = [1_000_000.0]
    stale = SharedMemoryPayloadStore(tmp_path / "flow" / "old", clock=lambda: now[0],
                                     ttl_seconds=10)
    stale.put(b"left by a crash", ["fuse"], "p1")
    live = SharedMemoryPayloadStore(tmp_path / "flow" / "new")
    kept = live.put(b"still owed", ["fuse"], "p2")
    assert sweep_expired(tmp_path) == 1  # the stale record expired long ago (real clock)
    assert not (tmp_path / "flow" / "old").exists()
    assert live.get(kept) == b"still owed"
    assert (tmp_path / "flow").is_dir()  # the live run's flow folder stays


def test_the_sweep_leaves_a_live_run_s_empty_folder_and_removes_one_long_untouched(
        tmp_path: Path) -> None:
    # Another run starting on the host sweeps: a run that holds no payload right now
    # keeps its folder (it was taken away under it, and its end failed to list it).
    live = SharedMemoryPayloadStore(tmp_path / "flow" / "live")
    abandoned = SharedMemoryPayloadStore(tmp_path / "flow" / "abandoned")
    for store in (live, abandoned):  # as a store that has had payloads has one
        (store.directory / ".lock").touch()
    long_ago = time.time() - BATCH_TTL_SECONDS - 60
    os.utime(abandoned.directory / "records", (long_ago, long_ago))
    assert sweep_expired(tmp_path) == 0
    assert live.directory.is_dir() and not abandoned.directory.exists()
    assert live.get(live.put(b"still usable", ["fuse"], "p1")) == b"still usable"


def test_the_root_is_this_users_folder_in_shared_memory_where_there_is_one() -> None:
    root = shm_root()
    assert root.name.startswith("videoflow")
    if Path("/dev/shm").is_dir():
        assert root.parent == Path("/dev/shm")


def test_a_waiting_put_lets_its_publisher_resolve_what_it_holds(tmp_path: Path) -> None:
    # The room is held by this publisher's own unresolved intent: only the publisher
    # can free it, so a put that merely slept would wait out its deadline.
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=5)
    held = store.put(b"a" * 6000, [], "p1")
    calls: list[int] = []

    def resolve() -> None:
        calls.append(1)
        store.resolve_intent(held, "p1", accepted=True)

    ref = store.put(b"b" * 6000, ["fuse"], "p2", while_waiting=resolve)
    assert calls and held not in store.refs() and store.get(ref) == b"b" * 6000


BIG = np.random.default_rng(3).integers(0, 256, (720, 1280, 3), dtype=np.uint8)


def test_a_gathered_frame_is_written_from_the_producers_array_and_read_aligned_as_it_was(
    tmp_path: Path,
) -> None:
    store = SharedMemoryPayloadStore(tmp_path)
    message = {"k": 7, "frame": BIG, "small": np.arange(3)}
    gathered = gather_message(message)
    assert isinstance(gathered, GatheredMessage) and store.writes_gathered

    ref = store.put(gathered, ["fuse"], "cam:7")

    frame = decode_message(store.view(ref))["frame"]
    assert np.array_equal(frame, BIG) and isinstance(base_of(frame), mmap.mmap)
    # The same offset in its page as the producer's array had.
    assert frame.ctypes.data % PAGE_BYTES == BIG.ctypes.data % PAGE_BYTES
    assert store.get(ref) == encode_message(message)  # the padding is not the payload's
    assert store.used_bytes() == len(encode_message(message))
    again = store.put(gathered, ["fuse"], "cam:8")  # into the same spare-less folder
    assert store.get(again) == encode_message(message)


def test_a_passed_through_gathered_frame_reads_the_same(tmp_path: Path) -> None:
    store = SharedMemoryPayloadStore(tmp_path)
    source = store.put(gather_message({"frame": BIG}), ["pass"], "cam:1")
    passed = store.put_from(source, ["sink"], "pass:1")
    assert np.array_equal(decode_message(store.view(passed))["frame"], BIG)


def test_a_file_longer_than_its_record_by_a_page_or_more_is_malformed(
    tmp_path: Path,
) -> None:
    store = SharedMemoryPayloadStore(tmp_path)
    ref = store.put(encode_message(FRAME), ["fuse"], "p1")
    blob = tmp_path / "blobs" / ref
    blob.write_bytes(bytes(PAGE_BYTES) + blob.read_bytes())
    with pytest.raises(UnobservableState, match="its record says") as caught:
        store.view(ref)
    assert caught.value.reason == "malformed"
    with pytest.raises(UnobservableState, match="its record says"):
        store.get(ref)
