"""A pass-through's output in the shared-memory budget: put_from gives a new ref a
second name for bytes already held, which the budget counts once, while any name of
them is held, and counts free exactly once, when the last name goes (never earlier,
which would let the budget be overrun, and never not at all, which would starve every
later put)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from test_shm_payload import leave_a_reservation, recorded_count_downs

from videoflow.backends.shm_payload import PayloadBudgetExhausted, SharedMemoryPayloadStore
from videoflow.errors import PayloadMissing

BUDGET = 10_000
SIZE = 6_000  # more than half the budget: two charges of it cannot both fit


def _store(tmp_path: Path, wait: float = 0.2) -> SharedMemoryPayloadStore:
    # A short wait: a second charge for the same bytes fails the put at once.
    return SharedMemoryPayloadStore(tmp_path, budget_bytes=BUDGET, budget_wait_seconds=wait)


def _done(store: SharedMemoryPayloadStore, ref: str, reader: str, publication: str) -> None:
    """The publication accepted and its reader done: ref's last obligations go."""
    assert store.resolve_intent(ref, publication, accepted=True)
    assert store.release(ref, reader)


@pytest.mark.parametrize("source_first", [True, False], ids=["source-first", "passed-first"])
def test_a_pass_through_of_a_payload_costs_no_budget_and_frees_it_once_with_its_last_name(
    tmp_path: Path, source_first: bool,
) -> None:
    store = _store(tmp_path)
    source = store.put(b"f" * SIZE, ["pass"], "cam:1")
    passed = store.put_from(source, ["sink"], "pass:1")  # no room for a second charge
    assert store.used_bytes() == SIZE and store.budget_waits == 0
    assert store.get(passed) == b"f" * SIZE

    first, second = ((source, "pass", "cam:1"), (passed, "sink", "pass:1"))[
        slice(None) if source_first else slice(None, None, -1)]
    _done(store, *first)
    assert store.used_bytes() == SIZE  # the other name still holds the bytes
    assert store.get(second[0]) == b"f" * SIZE
    _done(store, *second)
    assert store.refs() == () and store.used_bytes() == 0

    whole = store.put(b"w" * BUDGET, ["sink"], "cam:2")  # the full budget is free again
    assert store.get(whole) == b"w" * BUDGET and store.used_bytes() == BUDGET


def test_a_chain_of_pass_throughs_is_counted_once_whichever_name_goes_last(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    held = store.put(b"h" * 3_000, ["view"], "cam:0")  # so an early count-down shows
    names = [(store.put(b"c" * SIZE, ["a"], "cam:1"), "a", "cam:1")]
    for i, reader in enumerate(("b", "c", "d")):
        names.append((store.put_from(names[-1][0], [reader], f"pass:{i}"), reader, f"pass:{i}"))
    assert store.used_bytes() == 3_000 + SIZE
    for name in (names[1], names[3], names[0]):
        _done(store, *name)
        assert store.used_bytes() == 3_000 + SIZE
    _done(store, *names[2])
    assert store.used_bytes() == 3_000
    assert store.records().keys() == {held}


def test_a_batch_releasing_every_name_of_the_bytes_counts_them_down_once(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    source = store.put(b"f" * SIZE, ["fuse"], "cam:1")
    passed = store.put_from(source, ["fuse"], "pass:1")
    for ref, publication in ((source, "cam:1"), (passed, "pass:1")):
        store.resolve_intent(ref, publication, accepted=True)
    count_downs = recorded_count_downs(store)
    assert store.release_many([source, passed], "fuse") == [True, True]
    assert count_downs == [SIZE] and store.used_bytes() == 0


def test_a_pass_through_that_fails_to_link_leaves_the_count_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _store(tmp_path)
    source = store.put(b"f" * SIZE, ["pass"], "cam:1")

    def no_space(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "no space left on device")

    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(OSError, match="no space left"):
        store.put_from(source, ["sink"], "pass:1")
    monkeypatch.undo()
    assert store.refs() == (source,) and store.used_bytes() == SIZE
    _done(store, source, "pass", "cam:1")
    assert store.used_bytes() == 0


def test_a_put_whose_write_fails_gives_its_reservation_back_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _store(tmp_path)
    held = store.put(b"h" * 3_000, ["view"], "cam:0")

    def no_space(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "no space left on device")

    monkeypatch.setattr(store, "_write_pieces", no_space)
    with pytest.raises(OSError, match="no space left"):
        store.put(b"f" * SIZE, ["sink"], "cam:1")
    assert store.refs() == (held,) and store.used_bytes() == 3_000


def test_a_pass_through_of_a_reclaimed_payload_is_missing_and_costs_nothing(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    source = store.put(b"f" * SIZE, ["pass"], "cam:1")
    _done(store, source, "pass", "cam:1")
    with pytest.raises(PayloadMissing, match="never put, or reclaimed"):
        store.put_from(source, ["sink"], "pass:1")
    assert store.refs() == () and store.used_bytes() == 0


def test_the_recount_counts_a_file_with_several_names_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    source = store.put(b"f" * SIZE, ["pass"], "cam:1")
    store.put_from(source, ["sink"], "pass:1")
    leave_a_reservation(store, 3500)  # left high by a crash: the next put recounts
    ref = store.put(b"n" * 4_000, ["sink"], "cam:2")  # fits the 6,000 really held
    assert store.get(ref) == b"n" * 4_000 and store.used_bytes() == BUDGET


def test_names_of_the_same_bytes_added_and_dropped_at_once_count_them_free_exactly_once(
    tmp_path: Path,
) -> None:
    # Every name's release races the others' and new names being linked: one drop, and
    # only one, must see itself the last. The held payload shows a count-down made
    # twice (the count never goes below 0, so without it a double would hide).
    store = _store(tmp_path, wait=5)
    held = store.put(b"h" * 3_000, ["view"], "cam:0")
    for round_ in range(20):
        source = store.put(b"f" * SIZE, ["pass"], f"cam:{round_}")
        store.resolve_intent(source, f"cam:{round_}", accepted=True)
        passed: list[str] = []
        start = threading.Barrier(9)
        errors: list[BaseException] = []

        def pass_through(i: int, source: str = source, start: threading.Barrier = start,
                         passed: list[str] = passed, errors: list[BaseException] = errors,
                         ) -> None:
            start.wait()
            try:
                ref = store.put_from(source, ["sink"], f"pass:{i}")
            except PayloadMissing:
                return  # the source went first: nothing linked
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                errors.append(error)
                return
            passed.append(ref)
            store.resolve_intent(ref, f"pass:{i}", accepted=True)
            store.release(ref, "sink")

        def release_source(source: str = source, start: threading.Barrier = start) -> None:
            start.wait()
            store.release(source, "pass")

        threads = [threading.Thread(target=pass_through, args=(i,)) for i in range(8)]
        threads.append(threading.Thread(target=release_source))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert store.records().keys() == {held}, f"round {round_}"
        assert store.used_bytes() == 3_000, f"round {round_}"
    assert os.listdir(tmp_path / "blobs") == [held]


def test_a_second_charge_for_shared_bytes_would_not_fit_this_budget(tmp_path: Path) -> None:
    # What the tests above rely on: two payloads of SIZE do not fit BUDGET.
    store = _store(tmp_path)
    store.put(b"a" * SIZE, ["fuse"], "cam:1")
    with pytest.raises(PayloadBudgetExhausted, match="no room for a payload of 6000 bytes"):
        store.put(b"b" * SIZE, ["fuse"], "cam:2")
