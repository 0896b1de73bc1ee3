"""Shares of the shared-memory budget (videoflow.backends.shm_shares): every writer (a
node's replica) gets an equal share; a put within its writer's share never waits on
another writer's bytes, a writer over its share waits alone, a dormant writer costs
one payload's floor, a dead writer's bytes stay in its share until freed, and the
budget stays a hard bound. What must hold across processes is tested with writers in
processes of their own."""

from __future__ import annotations

import mmap
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_shm_payload import leave_a_reservation

from videoflow.backends import shm_payload
from videoflow.backends.payload import PayloadRecord
from videoflow.backends.shm_payload import (
    BUDGET_WAIT_SECONDS,
    PayloadBudgetExhausted,
    SharedMemoryPayloadStore,
)
from videoflow.backends.shm_shares import WriterState
from videoflow.core.compiler import compile_flow
from videoflow.core.constants import REALTIME
from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
from videoflow.errors import UnobservableState
from videoflow.flow import Flow
from videoflow.run.local import _shared_payloads
from videoflow.wire.offload import gather_message

pytestmark = pytest.mark.timeout(60)

REF = "0" * 32

CHILD = r"""
import sys
from videoflow.backends.shm_payload import PayloadBudgetExhausted, SharedMemoryPayloadStore

folder, node, replica = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = SharedMemoryPayloadStore(folder, writer=(node, replica))
for n, line in enumerate(sys.stdin):
    publication = f"{node}:{replica}:{n}"
    try:
        ref = store.put(b"w" * int(line), [], publication)
    except PayloadBudgetExhausted as error:
        print("exhausted", error, flush=True)
    else:
        print(ref, publication, store.budget_waits, flush=True)
"""
"""A writer in a process of its own: one put per line of stdin (its size), answering
'<ref> <publication> <budget_waits>' once admitted (its payload held until that
publication's intent is resolved), or 'exhausted <message>'."""


class WriterProcess:
    """A writer of the store in a process of its own, driven one put at a time."""

    def __init__(self, folder: Path, node: str, replica: int = 0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(folder), node, str(replica)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line.rstrip("\n"))

    def send(self, size: int) -> None:
        """Ask for a put of size bytes, without waiting for its answer."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{size}\n")
        self.process.stdin.flush()

    def answer(self, timeout: float = 10.0) -> tuple[str, str, int]:
        """The next put's (ref, publication, budget_waits so far).

        Raises:
            queue.Empty: no answer within timeout (the put still waits).
        """
        ref, publication, waits = self.answers.get(timeout=timeout).split(" ", 2)
        assert ref != "exhausted", waits
        return ref, publication, int(waits)

    def put(self, size: int) -> tuple[str, str]:
        self.send(size)
        ref, publication, _waits = self.answer()
        return ref, publication

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def writer_process() -> Iterator[Callable[..., WriterProcess]]:
    started: list[WriterProcess] = []

    def start(folder: Path, node: str, replica: int = 0) -> WriterProcess:
        started.append(WriterProcess(folder, node, replica))
        return started[-1]

    yield start
    for writer in started:
        writer.kill()


def free(store: SharedMemoryPayloadStore, ref: str, publication: str) -> None:
    """A payload put with no reader, its publication accepted: reclaimed."""
    assert store.resolve_intent(ref, publication, accepted=True)


def states(store: SharedMemoryPayloadStore) -> dict[str, WriterState]:
    return {state.node: state for state in store.writer_states()}


def eventually(condition: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def fill(store: SharedMemoryPayloadStore) -> list[tuple[str, str]]:
    """Put payloads of 1,000 bytes, then of 500, until store's writer must wait.

    Returns:
        the (ref, publication) of each.
    """
    held, wait = [], store.budget_wait_seconds
    store.budget_wait_seconds = 0.05
    for size in (1000, 500):
        while True:
            publication = f"{store.writer[0]}:{len(held)}"
            try:
                held.append((store.put(b"p" * size, [], publication), publication))
            except PayloadBudgetExhausted:
                break
    store.budget_wait_seconds = wait
    return held


def blob_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in (folder / "blobs").iterdir())


def test_a_writer_over_its_share_waits_alone_while_another_within_its_share_is_admitted(
    tmp_path: Path, writer_process: Callable[..., WriterProcess],
) -> None:
    SharedMemoryPayloadStore(tmp_path, budget_bytes=12_000, budget_wait_seconds=10)
    other = SharedMemoryPayloadStore(tmp_path, writer=("b", 0))
    other.put(b"b" * 1000, [], "b:0")
    leader = writer_process(tmp_path, "a")
    held = [leader.put(2000) for _ in range(3)]  # both active: its share of 6,000 is full
    leader.send(2000)
    with pytest.raises(queue.Empty):
        leader.answer(timeout=0.3)  # over its share: it waits, though 5,000 are free
    assert other.waiting_nodes() == {"a"}

    for i in range(1, 6):  # the other writer's whole share, at once
        other.put(b"b" * 1000, [], f"b:{i}")
    assert other.budget_waits == 0
    assert other.used_bytes() == blob_bytes(tmp_path) == 12_000  # the budget, not more

    free(other, *held[0])
    _ref, _publication, waits = leader.answer()  # its own bytes made it room
    assert waits == 1 and other.used_bytes() == blob_bytes(tmp_path) == 12_000
    assert other.waiting_nodes() == frozenset()


def test_a_late_writer_puts_its_first_payload_at_once_into_a_budget_its_peers_filled(
    tmp_path: Path,
) -> None:
    # Issue 39 in miniature: two leaders fill the budget with payloads a join holds
    # for the third writer's, which then must be able to write.
    a, b, c = (SharedMemoryPayloadStore(tmp_path, budget_bytes=11_000, budget_wait_seconds=5,
                                        writer=(node, 0)) for node in "abc")
    a.declare_writers([("a", 0), ("b", 0), ("c", 0)])
    a.put(b"p" * 1000, [], "a:first")
    b.put(b"p" * 1000, [], "b:first")  # both active
    held = {"a": fill(a), "b": fill(b)}  # c's floor is 1,000: each leader's share 5,000
    leader = a.writer_state()
    assert leader is not None and leader.node == "a" and leader.alive
    assert (leader.held_bytes, leader.share_bytes, leader.waiting_seconds) == (5000, 5000, None)
    assert states(a)["b"].held_bytes == 5000
    assert states(a)["c"].share_bytes is None  # dormant: a floor, not a share

    c.put(b"c" * 1000, [], "c:0")  # its floor: at once
    assert c.budget_waits == 0 and c.used_bytes() == 11_000

    admitted: list[str] = []
    late = threading.Thread(target=lambda: admitted.append(c.put(b"c" * 1000, [], "c:1")))
    late.start()
    time.sleep(0.3)
    assert not admitted and c.waiting_nodes() == {"c"}  # full of the leaders' bytes
    assert states(c)["a"].share_bytes == 11_000 // 3  # the leaders are over theirs now
    free(a, *held["a"].pop())
    late.join(timeout=5)
    assert admitted and c.budget_waits == 1

    free(b, *held["b"].pop())  # room in the budget, but a holds 4,000 of its 3,666
    a.budget_wait_seconds = 0.3
    with pytest.raises(PayloadBudgetExhausted, match="holds 4000 bytes of its share of 3666"):
        a.put(b"p" * 1000, [], "a:9")
    c.put(b"c" * 1000, [], "c:2")  # c is within its share: the room is its
    assert c.used_bytes() == 11_000


def test_a_waiting_writer_shows_its_wait_to_every_process_until_it_is_admitted(
    tmp_path: Path, writer_process: Callable[..., WriterProcess],
) -> None:
    observer = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=10)
    camera = writer_process(tmp_path, "cam")
    held = camera.put(6000)
    camera.send(6000)
    eventually(lambda: observer.waiting_nodes() == {"cam"})
    time.sleep(0.2)
    waiting = states(observer)["cam"]
    assert (waiting.alive, waiting.held_bytes, waiting.share_bytes) == (True, 6000, 10_000)
    assert waiting.waiting_seconds is not None and waiting.waiting_seconds >= 0.2
    assert waiting.waited_seconds == 0.0

    free(observer, *held)
    _ref, _publication, waits = camera.answer()
    assert waits == 1
    admitted = states(observer)["cam"]
    assert admitted.waiting_seconds is None and admitted.waited_seconds >= 0.2
    assert observer.waiting_nodes() == frozenset()


def test_a_killed_writer_keeps_its_share_while_its_bytes_are_held_then_leaves_the_table(
    tmp_path: Path, writer_process: Callable[..., WriterProcess],
) -> None:
    survivor = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=10,
                                        writer=("b", 0))
    survivor.put(b"b" * 1000, [], "b:0")
    doomed = writer_process(tmp_path, "a")
    held = [doomed.put(2000), doomed.put(2000)]
    doomed.send(2000)  # over its share of 5,000: waits
    eventually(lambda: survivor.waiting_nodes() == {"a"})
    doomed.kill()
    assert survivor.waiting_nodes() == frozenset()  # dead: it waits for nothing
    dead = states(survivor)["a"]
    assert (dead.alive, dead.held_bytes, dead.share_bytes, dead.waiting_seconds) == (
        False, 4000, 5000, None)

    survivor.budget_wait_seconds = 0.3
    with pytest.raises(PayloadBudgetExhausted, match="holds 1000 bytes of its share of 5000"):
        survivor.put(b"b" * 4500, [], "b:1")  # what the dead writer holds is not its

    for payload in held:
        free(survivor, *payload)
    assert set(states(survivor)) == {"b"} and states(survivor)["b"].share_bytes == 10_000
    survivor.put(b"b" * 8000, [], "b:2")
    assert survivor.used_bytes() == 9000


def test_a_declared_writer_that_died_holding_nothing_keeps_a_floor_for_its_restart(
    tmp_path: Path, writer_process: Callable[..., WriterProcess],
) -> None:
    sink = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=10,
                                    writer=("sink", 0))
    sink.declare_writers([("cam", 0)])
    first = writer_process(tmp_path, "cam")
    free(sink, *first.put(2000))
    first.kill()
    sink.put(b"s" * 1000, [], "s:0")
    dormant = states(sink)["cam"]
    assert (dormant.active, dormant.share_bytes, dormant.held_bytes) == (False, None, 0)
    assert states(sink)["sink"].share_bytes == 10_000 - 2000  # one payload's floor

    restarted = writer_process(tmp_path, "cam")
    restarted.put(2000)
    again = [s for s in sink.writer_states() if s.node == "cam"]
    assert [(s.alive, s.active, s.held_bytes, s.share_bytes) for s in again] == [
        (True, True, 2000, 5000)]


def test_a_declared_writer_that_never_puts_costs_the_others_one_payload_s_floor(
    tmp_path: Path,
) -> None:
    a, b = (SharedMemoryPayloadStore(tmp_path, budget_bytes=100_000, writer=(node, 0))
            for node in "ab")
    a.declare_writers([("a", 0), ("b", 0), ("imu", 0)])
    assert {s.share_bytes for s in a.writer_states()} == {None}  # all dormant
    a.put(b"a" * 1000, [], "a:0")
    assert a.writer_state() is not None and a.writer_state().share_bytes == 98_000
    b.put(b"b" * 1000, [], "b:0")
    assert states(a)["a"].share_bytes == states(a)["b"].share_bytes == 49_500
    b.put(b"b" * 5000, [], "b:1")  # a larger payload: a larger floor
    imu = states(a)["imu"]
    assert (imu.share_bytes, imu.active, imu.held_bytes, imu.alive) == (None, False, 0, None)
    assert states(a)["a"].share_bytes == (100_000 - 5000) // 2


def test_a_writer_whose_share_is_smaller_than_its_payload_holds_one_at_a_time(
    tmp_path: Path,
) -> None:
    a, b, c = (SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=0.2,
                                        writer=(node, 0)) for node in "abc")
    for store in (a, b, c):  # all three active, holding nothing: shares of 3,333
        free(store, store.put(b"x" * 1000, [], f"{store.writer[0]}:0"), f"{store.writer[0]}:0")
    a.put(b"a" * 3000, [], "a:1")
    c.put(b"c" * 4000, [], "c:1")  # over its share, but it holds nothing
    with pytest.raises(PayloadBudgetExhausted, match="holds 4000 bytes of its share of 3333"):
        c.put(b"c" * 1000, [], "c:2")  # a second one it may not


def test_a_dormant_writer_s_floor_never_keeps_a_payload_out_of_an_empty_store(
    tmp_path: Path,
) -> None:
    # A budget of less than two frames holds one at a time: a writer that never puts
    # (a pass-through) cannot reserve the room of a second.
    camera = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=0.2,
                                      writer=("cam", 0))
    camera.declare_writers([("cam", 0), ("pass", 0)])
    first = camera.put(b"c" * 7000, [], "c:0")
    assert states(camera)["cam"].share_bytes == 7000  # the floor left it room for one
    with pytest.raises(PayloadBudgetExhausted, match="holds 7000 bytes of its share of 7000"):
        camera.put(b"c" * 7000, [], "c:1")
    free(camera, first, "c:0")
    camera.put(b"c" * 7000, [], "c:2")


@pytest.mark.parametrize("last", ["source", "passed"])
def test_a_pass_through_s_bytes_are_counted_free_against_the_writer_that_paid_for_them(
    tmp_path: Path, last: str,
) -> None:
    camera = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, writer=("cam", 0))
    passer = SharedMemoryPayloadStore(tmp_path, writer=("pass", 0))
    source = camera.put(b"f" * 3000, ["pass"], "cam:1")
    passer.put(b"o" * 1000, ["sink"], "pass:0")  # bytes of the pass-through's own
    passed = passer.put_from(source, ["sink"], "pass:1")
    assert passer.records()[passed].writer == ("cam", 0)
    assert (states(passer)["cam"].held_bytes, states(passer)["pass"].held_bytes) == (3000, 1000)

    names = [(source, "pass", "cam:1"), (passed, "sink", "pass:1")]
    if last == "source":
        names.reverse()
    for n, (ref, reader, publication) in enumerate(names):
        passer.resolve_intent(ref, publication, accepted=True)
        passer.release(ref, reader)  # the pass-through's process drops each name
        assert states(passer)["cam"].held_bytes == (3000 if n == 0 else 0)
        assert states(passer)["pass"].held_bytes == 1000


def test_a_recount_gives_each_writer_the_bytes_its_records_name(tmp_path: Path) -> None:
    a, b = (SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=5,
                                     writer=(node, 0)) for node in "ab")
    a.put(b"a" * 1000, [], "a:0")
    b.put(b"b" * 1000, [], "b:0")
    b.put_from(a.put(b"a" * 1000, ["pass"], "a:1"), [], "b:1")  # a's, under two names
    (tmp_path / "blobs" / REF).write_bytes(b"x" * 500)  # a crash's, no record
    leave_a_reservation(a, 3000)  # a's count says its share of 5,000 is full
    a.put(b"a" * 1000, [], "a:2")  # the recount finds it holds 2,000: no wait
    assert a.budget_waits == 0
    assert {n: s.held_bytes for n, s in states(a).items()} == {"a": 3000, "b": 1000}
    assert a.used_bytes() == 4500  # the file without a record counts, for no writer


def test_a_recount_leaves_the_reservations_another_live_writer_has_in_flight(
    tmp_path: Path,
) -> None:
    # Taken off, they let that writer past its share by a payload, into the floors
    # (a 1080p camera 8 s late found its floor eaten by the leaders, and waited).
    a, b = (SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=0.3,
                                     writer=(node, 0)) for node in "ab")
    a.put(b"a" * 1000, [], "a:0")
    b.put(b"b" * 1000, [], "b:0")
    a._admit(3000, None)  # admitted, its file not written yet
    with pytest.raises(PayloadBudgetExhausted, match="share of 5000"):
        b.put(b"b" * 4500, [], "b:1")  # over its share: its wait recounts
    assert states(a)["a"].held_bytes == 4000


def test_a_recount_counts_a_payload_as_its_put_charged_it_so_it_is_freed_to_zero(
    tmp_path: Path,
) -> None:
    # A gathered frame's file starts with padding (its data aligned as the producer's
    # was): counting the file's size would leave the writer holding it forever.
    store = SharedMemoryPayloadStore(tmp_path, budget_bytes=400_000, budget_wait_seconds=0.2,
                                     writer=("cam", 0))
    page = mmap.mmap(-1, 1 << 20)
    frame = np.frombuffer(page, dtype=np.uint8)[1000:301_000]
    ref = store.put(gather_message({"frame": frame}), [], "cam:0")
    size = store.records()[ref].size
    assert (tmp_path / "blobs" / ref).stat().st_size > size
    with pytest.raises(PayloadBudgetExhausted):
        store.put(b"c" * 200_000, [], "cam:1")  # over its share: it recounts
    assert store.used_bytes() == size
    free(store, ref, "cam:0")
    assert store.used_bytes() == 0 and store.writer_state().held_bytes == 0  # type: ignore[union-attr]


def recount(store: SharedMemoryPayloadStore) -> None:
    """What a put that does not fit does first: a recount of what store's writer holds,
    now (not held back by REFRESH_SECONDS)."""
    with store._locked():
        table = store._shares.load()
        store._shares.refresh_soon()
        assert store._shares.refresh(table)
        store._shares.store(table)


@pytest.mark.parametrize("between", ["the record and the file", "the file and the count"])
def test_a_recount_inside_a_release_does_not_count_the_released_bytes_free_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, between: str,
) -> None:
    # A camera recounts while the fusion node releases its frames: the recount no
    # longer finds the released bytes, and the release's count-down took them off
    # again. The camera then held a frame more than its count said, and the store
    # a frame more than its budget (test_lagging_camera, once in CI: 39,996,336
    # bytes held under a budget of 39,768,215).
    cam = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=5,
                                   writer=("cam", 0))
    fuse = SharedMemoryPayloadStore(tmp_path, writer=("fuse", 0))
    released = cam.put(b"a" * 1000, ["fuse"], "cam:0")
    kept = cam.put(b"b" * 2000, ["fuse"], "cam:1")
    free(cam, released, "cam:0")  # resolved: only fuse's obligation holds each
    free(cam, kept, "cam:1")
    step = "_drop_blob" if between == "the record and the file" else "_count_down"
    original = getattr(fuse, step)

    def recount_first(*args: Any) -> None:
        recount(cam)
        original(*args)

    monkeypatch.setattr(fuse, step, recount_first)
    assert fuse.release_many([released], "fuse") == [True]
    assert not (tmp_path / "blobs" / released).exists()
    # The count may stay high until the next recount (the recount may have seen the
    # bytes, or not); it never goes below what the files hold.
    assert states(cam)["cam"].held_bytes == 2000
    recount(cam)
    assert states(cam)["cam"].held_bytes == 2000 and cam.used_bytes() == 2000


def test_a_recount_inside_a_failed_put_s_unreservation_does_not_count_it_free_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cam = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=5,
                                   writer=("cam", 0))
    cam.put(b"a" * 1000, [], "cam:0")
    cam._admit(2000, None)  # a put whose write then fails
    original = cam._count_down

    def recount_first(*args: Any) -> None:
        recount(cam)
        original(*args)

    monkeypatch.setattr(cam, "_count_down", recount_first)
    cam._unadmit(2000)
    assert states(cam)["cam"].held_bytes == 1000


def test_a_record_keeps_the_writer_it_is_charged_to_and_an_older_one_reads_with_none(
) -> None:
    record = PayloadRecord(frozenset({"fuse"}), frozenset({"fuse"}), "cam:1", 1.0, 10,
                           writer=("cam", 3))
    assert PayloadRecord.from_json(record.to_json(), REF) == record
    older = replace(record, writer=None)
    assert b"writer" not in older.to_json()
    assert PayloadRecord.from_json(older.to_json(), REF) == older
    with pytest.raises(UnobservableState, match="unreadable") as caught:
        PayloadRecord.from_json(older.to_json()[:-1] + b',"writer":["cam"]}', REF)
    assert caught.value.reason == "malformed"


def test_the_wait_for_room_is_kept_in_the_folder_for_the_processes_that_open_it_after(
    tmp_path: Path,
) -> None:
    assert SharedMemoryPayloadStore(tmp_path).budget_wait_seconds == BUDGET_WAIT_SECONDS
    SharedMemoryPayloadStore(tmp_path, budget_wait_seconds=2.5)
    assert SharedMemoryPayloadStore(tmp_path).budget_wait_seconds == 2.5
    read = subprocess.run(
        [sys.executable, "-c", "import sys; from videoflow.backends.shm_payload import "
         "SharedMemoryPayloadStore as S; print(S(sys.argv[1]).budget_wait_seconds)",
         str(tmp_path)], capture_output=True, text=True, check=True)
    assert read.stdout.strip() == "2.5"
    for wrong in (-1.0, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="budget_wait_seconds must be a finite number"):
            SharedMemoryPayloadStore(tmp_path, budget_wait_seconds=wrong)  # type: ignore[arg-type]


def test_a_put_that_finds_no_room_in_time_names_its_writer_its_share_and_what_it_holds(
    tmp_path: Path,
) -> None:
    camera = SharedMemoryPayloadStore(tmp_path, budget_bytes=10_000, budget_wait_seconds=0.2,
                                      writer=("cam", 2))
    SharedMemoryPayloadStore(tmp_path, writer=("fuse", 0)).put(b"f" * 1000, [], "f:0")
    camera.put(b"c" * 4000, [], "c:0")
    with pytest.raises(PayloadBudgetExhausted,
                       match=r"writer cam\[2\] holds 4000 bytes of its share of 5000") as caught:
        camera.put(b"c" * 2000, [], "c:1")
    assert (caught.value.share, caught.value.held, caught.value.used) == (5000, 4000, 5000)
    state = camera.writer_state()
    assert state is not None and state.waiting_seconds is None
    assert state.waited_seconds >= 0.2  # the failed wait is counted, and over
    with pytest.raises(ValueError, match="a writer is a"):
        SharedMemoryPayloadStore(tmp_path, writer=("cam", -1))


class Camera(ProducerNode):
    def next(self) -> Any:
        raise StopIteration


class Fusion(ProcessorNode):
    def process(self, *inputs: Any) -> Any:
        return inputs


class Sink(ConsumerNode):
    def consume(self, *inputs: Any) -> None:
        return None


def test_the_engine_declares_every_publishing_replica_and_waits_out_its_longest_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cameras = [Camera(name=name) for name in ("a", "b", "c")]
    timed = Fusion(name="timed", nb_tasks=2, partition_by="key",
                   join_policy={"timeout_ms": 7000})(*cameras[:2])
    endless = Fusion(name="endless", join_policy={"timeout_ms": None})(cameras[1], cameras[2])
    flow = Flow(cameras, [Sink(name="sink")(timed), Sink(name="sink2")(endless)], REALTIME,
                name="f")
    monkeypatch.setattr(shm_payload, "shm_root", lambda: tmp_path)
    store = _shared_payloads("shm", compile_flow(flow), "r1", 10_000_000)
    assert store is not None
    assert {(s.node, s.replica, s.active) for s in store.writer_states()} == {
        ("a", 0, False), ("b", 0, False), ("c", 0, False), ("timed", 0, False),
        ("timed", 1, False), ("endless", 0, False)}  # the sinks write nothing
    # The join that never gives up adds nothing; the one that does, its timeout.
    assert store.budget_wait_seconds == BUDGET_WAIT_SECONDS + 7.0
    assert SharedMemoryPayloadStore(store.directory).budget_wait_seconds == (
        BUDGET_WAIT_SECONDS + 7.0)  # what a replica opening the folder waits
