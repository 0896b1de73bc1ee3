"""The local engine's supervision pieces without a broker: how a process's end is
named, the in-hand slot a replica writes and the engine reads, the crash book and a
replica's reading of it, the engine's Ctrl-C/SIGTERM counting, and a child that ends
with its parent (PR_SET_PDEATHSIG, and the parent-pid watch alone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from videoflow.run.local import broker_keeper
from videoflow.run.supervision import (
    ORPHAN_GRACE_SECONDS,
    PARENT_SIGNAL,
    SLOT_ENTRIES,
    WATCH_SECONDS,
    CrashBook,
    CrashCounts,
    InHandSlot,
    StopSignals,
    create_slot,
    exit_description,
    read_in_hand,
)


def handle(parent: str, seq: int) -> SimpleNamespace:
    return SimpleNamespace(parent=parent, delivery=SimpleNamespace(stream_seq=seq))


def test_a_process_end_is_named_by_its_signal_or_its_exit_code() -> None:
    assert exit_description(-9) == "killed by SIGKILL"
    assert exit_description(-11) == "killed by SIGSEGV"
    assert exit_description(1) == "exit code 1"
    assert exit_description(0) == "exit code 0"
    assert exit_description(None) == "still running"


def test_the_slot_holds_the_group_in_hand_until_it_is_released(tmp_path: Path) -> None:
    path = tmp_path / "slot"
    create_slot(path)
    parents = ["cam", "imu"]
    slot = InHandSlot(path, parents)
    try:
        assert read_in_hand(path, parents) == []
        slot.hold([handle("cam", 7), handle("imu", 123456789012)])
        # What the engine reads after a death, from the file, not from the writer.
        assert read_in_hand(path, parents) == [("cam", 7), ("imu", 123456789012)]
        slot.hold([handle("imu", 9)])  # the next group replaces it whole
        assert read_in_hand(path, parents) == [("imu", 9)]
        slot.release()
        assert read_in_hand(path, parents) == []
        slot.release()  # twice is nothing
        slot.hold([handle("stranger", 1), handle("cam", 3)])  # not a parent: skipped
        assert read_in_hand(path, parents) == [("cam", 3)]
    finally:
        slot.close()


def test_the_slot_keeps_the_first_members_of_a_group_too_large_for_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "slot"
    create_slot(path)
    slot = InHandSlot(path, ["imu"])
    try:
        slot.hold([handle("imu", seq) for seq in range(1, 200)])
        assert read_in_hand(path, ["imu"]) == [("imu", s) for s in range(1, SLOT_ENTRIES + 1)]
    finally:
        slot.close()


def test_a_cleared_or_missing_slot_holds_nothing(tmp_path: Path) -> None:
    path = tmp_path / "slot"
    assert read_in_hand(path, ["a"]) == []  # never created
    create_slot(path)
    slot = InHandSlot(path, ["a"])
    slot.hold([handle("a", 5)])
    slot.close()
    create_slot(path)  # the engine clears it before the next process starts
    assert read_in_hand(path, ["a"]) == []


def test_the_crash_book_counts_deaths_per_delivery_and_replicas_read_them(
    tmp_path: Path,
) -> None:
    book = CrashBook(tmp_path)
    counts = CrashCounts(book.path("scale"))
    assert counts.deaths("numbers", 8) == []  # no file yet
    book.count("scale", [("numbers", 8), ("numbers", 9)], "killed by SIGKILL")
    assert counts.deaths("numbers", 8) == ["killed by SIGKILL"]
    book.count("scale", [("numbers", 8)], "exit code 1")
    # The reader sees the rewritten file, and only its own node's.
    assert counts.deaths("numbers", 8) == ["killed by SIGKILL", "exit code 1"]
    assert counts.deaths("numbers", 9) == ["killed by SIGKILL"]
    assert counts.deaths("other", 8) == []
    book.count("sink", [("scale", 8)], "exit code 3")
    assert CrashCounts(book.path("sink")).deaths("scale", 8) == ["exit code 3"]
    assert book.deaths("scale", "numbers", 8) == ["killed by SIGKILL", "exit code 1"]
    assert counts.deaths("scale", 8) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "scale.crashes.json", "sink.crashes.json"]  # nothing half-written left


def test_stop_signals_raise_before_supervision_count_during_it_and_raise_at_the_third() -> None:
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    signals = StopSignals().install()
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        signals.supervising = True
        assert signals.first is None  # the one before supervising stopped nothing
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        assert signals.received == 2
        assert signals.first == signal.SIGTERM  # what stopped the run: exit 128 + 15
        # Once supervision is done, the third in all abandons whatever still waits.
        signals.finished = True
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        assert signals.received == 3
    finally:
        signals.restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def orphan(tmp_path: Path, *, pdeathsig: bool, ignore_signal: bool) -> tuple[int, float]:
    """Start a parent that starts a child calling die_with_parent (ignoring
    PARENT_SIGNAL when asked), then kill the parent with SIGKILL. Returns the child's
    pid and when the parent died."""
    child = textwrap.dedent(f"""
        import os, signal, sys, time
        from videoflow.run.supervision import die_with_parent
        parent = os.getppid()
        if {ignore_signal!r}:
            signal.signal({int(PARENT_SIGNAL)}, signal.SIG_IGN)
        die_with_parent(parent, pdeathsig={pdeathsig!r})
        print(os.getpid(), flush=True)
        time.sleep(120)
    """)
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {child!r}], stdout=subprocess.PIPE,
                                 text=True)
        print(child.stdout.readline().strip(), flush=True)
        time.sleep(120)
    """)
    process = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None
    pid = int(process.stdout.readline())
    process.kill()
    process.wait()
    return pid, time.monotonic()


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return not alive(pid)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_the_kernel_signals_a_child_whose_parent_died(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import ctypes, os
        from videoflow.run.supervision import die_with_parent
        armed = die_with_parent(os.getppid())
        value = ctypes.c_int(0)
        ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
        print(armed, value.value)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert done.stdout.split() == ["True", str(int(PARENT_SIGNAL))], done.stderr
    pid, _ = orphan(tmp_path, pdeathsig=True, ignore_signal=False)
    try:
        # Signalled at once, not a watch period later.
        assert gone_within(pid, WATCH_SECONDS * 0.8)
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
@pytest.mark.parametrize("ignore_signal", [False, True])
def test_the_parent_watch_alone_ends_an_orphan(tmp_path: Path, ignore_signal: bool) -> None:
    """Where there is no PR_SET_PDEATHSIG the watch notices the parent gone, signals
    the child, and ends it after the grace even if it ignores the signal."""
    pid, died = orphan(tmp_path, pdeathsig=False, ignore_signal=ignore_signal)
    try:
        bound = WATCH_SECONDS + (ORPHAN_GRACE_SECONDS if ignore_signal else 0.0) + 2.0
        assert gone_within(pid, bound)
        if ignore_signal:  # the grace ran out: it did not end before
            assert time.monotonic() - died >= ORPHAN_GRACE_SECONDS
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("deaths, dead_lettered", [(1, False), (2, True)])
def test_a_redelivery_in_hand_at_crash_limit_deaths_is_dead_lettered_not_processed(
    tmp_path: Path, deaths: int, dead_lettered: bool,
) -> None:
    """Through the messenger, on the memory adapter: the slot holds each group while
    the node has it, and a redelivered input the book charged crash_limit deaths to
    is dead-lettered as crashed_worker; below the limit it is processed again."""
    from messenger_flows import Flow, run_node, run_producer

    from videoflow.core.policies import WorkerFatal
    from videoflow.messaging.dead_letters import decode_dead_letter

    flow = Flow({"cam": [], "work": ["cam"], "sink": ["work"]})
    cam, work = flow.messenger("cam"), flow.messenger("work")
    flow.messenger("sink")
    slot_path, book = tmp_path / "work.0.in-hand", CrashBook(tmp_path)
    create_slot(slot_path)
    slot = InHandSlot(slot_path, ["cam"])
    work.deliveries.watch_crashes(slot, CrashCounts(book.path("work")), 2)
    run_producer(cam, [10, 20, 30])
    seen: list[tuple[int, list[tuple[str, int]]]] = []

    def process(inputs: dict[str, object]) -> object:
        value = inputs["cam"]["message"]  # type: ignore[index]
        seen.append((value, read_in_hand(slot_path, ["cam"])))
        if value == 20 and len([v for v, _ in seen if v == 20]) == 1:
            # The engine's part: this input was in hand at `deaths` process deaths.
            for _ in range(deaths):
                book.count("work", read_in_hand(slot_path, ["cam"]), "killed by SIGKILL")
            raise WorkerFatal("hand it back")  # redelivered, num_delivered 2
        return value

    try:
        run_node(work, process)
        assert read_in_hand(slot_path, ["cam"]) == []  # nothing in hand at the end
    finally:
        for messenger in flow.made:
            messenger.close()
        slot.close()
    # Each group was in the slot, and only it, while the node had it.
    assert [(v, held) for v, held in seen] == [
        (10, [("cam", 1)]), (20, [("cam", 2)]), (30, [("cam", 3)]),
        *([] if dead_lettered else [(20, [("cam", 2)])])]
    letters = [decode_dead_letter(data) for _, data in flow.broker.dead_letters("flow")]
    if not dead_lettered:
        assert letters == [] and work.dead_lettered == 0
        return
    (letter,) = letters
    assert (letter.node, letter.parent, letter.stream_seq, letter.reason, letter.attempts) == (
        "work", "cam", 2, "crashed_worker", 2)
    assert letter.error_type.endswith("WorkerCrashed")
    assert "2 processes of work died while this input was in hand (killed by SIGKILL, " \
           "killed by SIGKILL)" in letter.error_message
    assert work.dead_lettered == 1


@pytest.mark.skipif(os.name != "posix", reason="dead engines are found by pid on POSIX")
def test_a_dead_engines_supervision_directory_is_swept_and_a_live_ones_kept() -> None:
    from videoflow.run.supervision import supervision_directory

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    ours = supervision_directory()
    try:
        dead = ours.parent / f"videoflow-supervision-{int(ended.stdout)}-x"
        dead.mkdir()
        (dead / "n.0.in-hand").write_bytes(b"\0")
        alive_one = supervision_directory()  # sweeps as it makes its own
        try:
            assert not dead.exists()
            assert ours.is_dir() and ours.name.startswith(f"videoflow-supervision-{os.getpid()}-")
        finally:
            alive_one.rmdir()
    finally:
        ours.rmdir()


def test_a_report_pipe_torn_by_a_dead_process_is_dropped_and_the_others_still_read() -> None:
    """Each replica process reports on a pipe of its own: one that died in the middle
    of a report leaves a torn message, which ends that pipe only."""
    import multiprocessing
    import struct

    from videoflow.run.processes import _drain
    from videoflow.run.progress import NodeProgress

    torn_reader, torn_writer = multiprocessing.Pipe(duplex=False)
    reader, writer = multiprocessing.Pipe(duplex=False)
    # A header announcing 1000 bytes, 10 of them written, then the writer is gone.
    os.write(torn_writer.fileno(), struct.pack("!i", 1000) + b"0123456789")
    torn_writer.close()
    writer.send(("progress", "n[1]", ({"processed": 4}, 2)))
    writer.send(("final", "n[1]", {"processed": 5, "outcome": "ended"}))
    replicas = {key: SimpleNamespace(reports=pipe, final=None,
                                     job=SimpleNamespace(spec=SimpleNamespace(name="n")))
                for key, pipe in (("n[0]", torn_reader), ("n[1]", reader))}
    run = SimpleNamespace(replicas=replicas, progress={"n": NodeProgress("processor")},
                          bound=set())
    started = time.monotonic()
    _drain(run, timeout=0.0)  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0
    assert replicas["n[0]"].reports is None  # the torn pipe, closed
    assert replicas["n[1]"].final == {"processed": 5, "outcome": "ended"}
    assert run.progress["n"].pending == {"n[1]": 0}
    writer.close()
    _drain(run, timeout=0.0)  # type: ignore[arg-type]
    assert replicas["n[1]"].reports is None  # its writer gone: the pipe's end


class _Broker:
    """An EmbeddedServer as the keeper sees it: a process that may have ended, and a
    restart that starts another."""

    def __init__(self) -> None:
        self.process = SimpleNamespace(pid=100, returncode=None, poll=lambda: None)
        self.url, self.log_path, self.restarts = "nats://127.0.0.1:4222", "/tmp/x.log", 0

    def end(self, code: int) -> None:
        self.process = SimpleNamespace(pid=self.process.pid, returncode=code,
                                       poll=lambda: code)

    def restart(self) -> int:
        self.restarts += 1
        self.process = SimpleNamespace(pid=100 + self.restarts, returncode=None,
                                       poll=lambda: None)
        return 0


def test_the_runs_broker_is_started_again_when_it_ends_but_not_a_fourth_time_in_a_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    broker = _Broker()
    keep = broker_keeper(broker)  # type: ignore[arg-type]
    keep()
    assert broker.restarts == 0  # running: nothing done
    broker.end(-9)
    keep()
    assert broker.restarts == 1
    assert capsys.readouterr().err.strip() == (
        "videoflow: the embedded nats-server (pid 100) ended (killed by SIGKILL); started "
        "again on its store at nats://127.0.0.1:4222")
    broker.end(-40)  # a real-time signal has no name: said by number, no crash
    keep()
    assert "ended (killed by signal 40); started again" in capsys.readouterr().err
    broker.end(1)
    keep()
    assert broker.restarts == 3
    broker.end(1)  # the fourth end within the minute: it dies as soon as it is up
    keep()
    keep()
    assert broker.restarts == 3
    said = capsys.readouterr().err
    assert "ended (exit code 1), its 4th end in 60 s: not started again" in said, said
