"""The shared-memory store's spare files (videoflow.backends.shm_spares): a released
frame's file is written over by the next put instead of new pages being allocated,
but never while any process can still read it, and spares count in the budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from videoflow.backends import shm_spares
from videoflow.backends.shm_payload import SharedMemoryPayloadStore
from videoflow.backends.shm_spares import SPARE_MIN_BYTES
from videoflow.wire.offload import decode_message, encode_message, gather_message

FRAME = np.arange(480 * 640, dtype=np.uint32).astype(np.uint8).reshape(480, 640)
OTHER = FRAME[::-1].copy()


@pytest.fixture
def store(tmp_path: Path) -> SharedMemoryPayloadStore:
    made = SharedMemoryPayloadStore(tmp_path)
    if not made._spares.enabled:
        pytest.fail(f"leases do not see readers on {tmp_path}'s filesystem: no spares")
    return made


def _released(store: SharedMemoryPayloadStore, data: bytes, name: str) -> tuple[str, int]:
    """Put data, read by nobody, and release it; its ref and its file's inode."""
    ref = store.put(data, ["fuse"], name)
    inode = os.stat(store.directory / "blobs" / ref).st_ino
    store.release(ref, "fuse")
    store.resolve_intent(ref, name, accepted=True)
    assert ref not in store.refs()
    return ref, inode


def _spares(store: SharedMemoryPayloadStore) -> list[str]:
    return sorted(os.listdir(store.directory / "spares"))


def _held_bytes(store: SharedMemoryPayloadStore) -> int:
    return sum(f.stat().st_size for folder in ("blobs", "spares")
               for f in (store.directory / folder).iterdir())


def test_a_released_frame_file_is_written_over_by_the_next_put(
    store: SharedMemoryPayloadStore,
) -> None:
    _ref, inode = _released(store, encode_message({"frame": FRAME}), "p1")
    assert len(_spares(store)) == 1

    ref = store.put(encode_message({"frame": OTHER}), ["fuse"], "p2")

    assert os.stat(store.directory / "blobs" / ref).st_ino == inode  # the same pages
    assert _spares(store) == []
    assert np.array_equal(decode_message(store.view(ref))["frame"], OTHER)
    assert store.used_bytes() == len(encode_message({"frame": OTHER}))


def test_a_smaller_payload_shrinks_a_larger_spare_and_a_small_release_keeps_nothing(
    store: SharedMemoryPayloadStore,
) -> None:
    _released(store, b"a" * (2 * SPARE_MIN_BYTES), "p1")
    ref = store.put(b"b" * SPARE_MIN_BYTES, ["fuse"], "p2")
    assert store.get(ref) == b"b" * SPARE_MIN_BYTES  # no tail of the old bytes
    _released(store, b"c" * (SPARE_MIN_BYTES - 1), "p3")
    assert _spares(store) == []


def test_a_view_kept_past_its_release_stops_its_file_being_written_over(
    store: SharedMemoryPayloadStore,
) -> None:
    ref = store.put(encode_message({"frame": FRAME}), ["fuse"], "p1")
    kept = decode_message(store.view(ref))["frame"]  # a node keeps the frame
    inode = os.stat(store.directory / "blobs" / ref).st_ino
    store.release(ref, "fuse")
    store.resolve_intent(ref, "p1", accepted=True)

    again = store.put(encode_message({"frame": OTHER}), ["fuse"], "p2")

    assert os.stat(store.directory / "blobs" / again).st_ino != inode
    assert np.array_equal(kept, FRAME)  # the kept view still reads its own frame
    assert np.array_equal(decode_message(store.view(again))["frame"], OTHER)
    assert _spares(store) == []  # the mapped spare was removed, not kept


def test_a_frame_mapped_in_another_process_is_never_written_over(
    store: SharedMemoryPayloadStore,
) -> None:
    data = encode_message({"frame": FRAME})
    ref = store.put(data, ["fuse"], "p1")
    path = store.directory / "blobs" / ref
    # A reader in another process maps the file and closes its descriptor, as view()
    # does, then checks the bytes again once told to.
    reader = subprocess.Popen(
        [sys.executable, "-c",
         "import mmap, os, sys, hashlib\n"
         f"fd = os.open({str(path)!r}, os.O_RDONLY)\n"
         "m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ); os.close(fd)\n"
         "before = hashlib.sha256(m).hexdigest(); print('mapped', flush=True)\n"
         "sys.stdin.readline()\n"
         "print(before == hashlib.sha256(m).hexdigest(), flush=True)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdin is not None
        assert reader.stdout.readline().strip() == "mapped"
        store.release(ref, "fuse")
        store.resolve_intent(ref, "p1", accepted=True)
        again = store.put(encode_message({"frame": OTHER}), ["fuse"], "p2")
        reader.stdin.write("check\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "True"  # its bytes never changed
    finally:
        reader.kill()
        reader.wait()
    assert np.array_equal(decode_message(store.view(again))["frame"], OTHER)


def test_a_file_a_pass_through_still_names_is_not_kept(
    store: SharedMemoryPayloadStore,
) -> None:
    data = encode_message({"frame": FRAME})
    source = store.put(data, ["pass"], "cam:1")
    passed = store.put_from(source, ["sink"], "pass:1")  # a second name, the same bytes
    store.release(source, "pass")
    store.resolve_intent(source, "cam:1", accepted=True)
    assert _spares(store) == []  # the sink's ref still names the file

    store.put(encode_message({"frame": OTHER}), ["sink"], "cam:2")

    assert np.array_equal(decode_message(store.view(passed))["frame"], FRAME)


def test_spares_count_in_the_budget_and_are_discarded_before_a_put_waits(
    tmp_path: Path,
) -> None:
    size = len(encode_message({"frame": FRAME}))
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=3 * size, budget_wait_seconds=1)
    refs = [store.put(encode_message({"frame": FRAME}), ["fuse"], f"p{k}") for k in range(3)]
    for k, ref in enumerate(refs):
        store.release(ref, "fuse")
        store.resolve_intent(ref, f"p{k}", accepted=True)
    assert len(_spares(store)) == 3 and store.used_bytes() == 0
    assert _held_bytes(store) == 3 * size

    big = store.put(b"x" * (2 * size), ["fuse"], "big")  # room made from the spares

    assert store.get(big) == b"x" * (2 * size)
    assert store.budget_waits == 0
    assert _held_bytes(store) <= 3 * size


def test_a_spare_claimed_by_a_process_that_died_is_removed(
    store: SharedMemoryPayloadStore,
) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    orphan = store.directory / "spares" / f".claimed.{int(dead.stdout)}.0"
    orphan.write_bytes(b"o" * SPARE_MIN_BYTES)

    store.put(encode_message({"frame": FRAME}), ["fuse"], "p1")

    assert not orphan.exists()


def test_the_end_of_a_run_removes_its_spares(store: SharedMemoryPayloadStore) -> None:
    _released(store, encode_message({"frame": FRAME}), "p1")
    store.clear()
    assert not store.directory.exists()


def test_without_leases_that_see_readers_every_release_unlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shm_spares, "_F_SETLEASE", None)
    store = SharedMemoryPayloadStore(tmp_path)
    assert not store._spares.enabled
    _ref, inode = _released(store, encode_message({"frame": FRAME}), "p1")
    ref = store.put(encode_message({"frame": OTHER}), ["fuse"], "p2")
    assert _spares(store) == []
    assert np.array_equal(decode_message(store.view(ref))["frame"], OTHER)


def test_a_gathered_frame_is_written_over_a_spare_with_its_padding(
    store: SharedMemoryPayloadStore,
) -> None:
    big = np.random.default_rng(5).integers(0, 256, (600, 800, 3), dtype=np.uint8)
    _ref, inode = _released(store, encode_message({"frame": FRAME, "pad": b"x" * 5000}), "p1")

    ref = store.put(gather_message({"frame": big}), ["fuse"], "p2")

    assert os.stat(store.directory / "blobs" / ref).st_ino == inode
    assert store.get(ref) == encode_message({"frame": big})
    assert np.array_equal(decode_message(store.view(ref))["frame"], big)
