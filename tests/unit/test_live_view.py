"""The live view tells the truth: rates measured between the replicas' reports (steady
between them, never 0 because a redraw came first), narrow terminals without stacked
copies of the table, and what the run writes printed above the table, never under it.

The terminal view's output is played on a small terminal model (screen()), which
knows what rich writes: carriage return, line feed, cursor up, erase line, colours."""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import os
import re
import sys
import threading
from collections.abc import Iterator

import pytest

from videoflow.run import progress as progress_module
from videoflow.run.progress import STALE_SECONDS, LiveView, NodeProgress, OutputRelay, RelayEnd

_CONTROL = re.compile(r"\x1b\[(\??)([0-9;]*)([A-Za-z])|\r|\n|[^\x1b\r\n]")


def screen(output: str, width: int) -> list[str]:
    """The lines a terminal width columns wide shows once output is written to it
    (the whole scrollback, trailing blanks stripped)."""
    lines: list[list[str]] = [[]]
    row = col = 0
    for found in _CONTROL.finditer(output):
        text = found.group(0)
        if text == "\r":
            col = 0
        elif text == "\n":
            row, col = row + 1, 0
        elif found.group(3) == "A":
            row = max(0, row - int(found.group(2) or 1))
        elif found.group(3) == "K":
            lines[row] = [] if found.group(2) == "2" else lines[row][:col]
        elif found.group(3):
            continue  # colours, cursor shown or hidden
        else:
            if col == width:  # the terminal wraps a line longer than it is wide
                row, col = row + 1, 0
            while len(lines) <= row:
                lines.append([])
            while len(lines[row]) < col:
                lines[row].append(" ")
            if col < len(lines[row]):
                lines[row][col] = text
            else:
                lines[row].append(text)
            col += 1
        while len(lines) <= row:
            lines.append([])
    return ["".join(line).rstrip() for line in lines]


class Clock:
    """time.monotonic as the view reads it, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain_rate(out: io.StringIO, node: str) -> str:
    """The rate/s cell of node's row in the plain view's last table."""
    rows = [line.split() for line in out.getvalue().splitlines()]
    return [row for row in rows if row and row[0] == node][-1][2]


def test_rates_are_measured_between_reports_and_stay_steady_between_them() -> None:
    # A 30 fps camera in two replicas (20 + 10 a second), reporting every second on
    # their own clocks (not in step with the view), redrawn every 0.25 s: the rate
    # is 30 at every redraw once each replica reported twice, never 0, never 2.5x.
    out, clock = io.StringIO(), Clock()
    view = LiveView(out, tty=False, clock=clock)
    cam = NodeProgress("producer")
    shown: list[str] = []
    for step in range(48):  # 12 s of redraws
        t = step * 0.25
        for key, per_second, offset in (("cam[0]", 20, 0.1), ("cam[1]", 10, 0.6)):
            reports = int((t - offset) // 1.0) + 1 if t >= offset else 0
            if reports:  # its latest report, made at offset + k seconds of its clock
                at = 50.0 + offset + (reports - 1)
                cam.replicas[key] = {"emitted": round(per_second * (at - 50.0)),
                                     "at": at, "started": 7.0}
        clock.now = 1000.0 + t
        view.update("flow run", {"cam": cam}, force=True)
        shown.append(plain_rate(out, "cam"))
    # No rate before every replica's second report (a sum without one is too low).
    assert shown[:7] == ["-"] * 7
    settled = shown[7:]  # every replica reported twice by t = 1.75 s
    assert settled == ["30"] * len(settled)


@pytest.mark.parametrize("json_lines", [False, True])
def test_off_a_terminal_a_view_that_did_not_change_is_printed_once(json_lines: bool) -> None:
    # The last interval's table showed every node done, and the run's end forced the
    # same table out again (two or three times when the replicas took a while to exit).
    out, clock = io.StringIO(), Clock()
    view = LiveView(out, tty=False, clock=clock, json_lines=json_lines)
    cam = NodeProgress("producer")
    for second, emitted, outcome in ((0, 30, "running"), (1, 60, "ended"), (2, 60, "ended"),
                                     (3, 60, "ended")):
        cam.replicas["cam[0]"] = {"emitted": emitted, "at": 50.0 + min(second, 1),
                                  "started": 7.0, "outcome": outcome}
        clock.now = 1000.0 + second
        view.update("demo r1", {"cam": cam}, force=second == 3)
    printed = out.getvalue().splitlines()
    if json_lines:
        assert [json.loads(line)["nodes"][0]["done"] for line in printed] == [30, 60]
    else:
        assert [line.split()[:2] for line in printed if line.split()[:1] == ["cam"]] == [
            ["cam", "30"], ["cam", "60"]]


def test_a_join_that_ended_is_not_shown_behind() -> None:
    # Its last word said the IMU was 40 ms behind: after everything ended, the last
    # view still said so.
    fuse = NodeProgress("processor")
    fuse.replicas["fuse[0]"] = {"processed": 29, "at": 51.0, "started": 7.0,
                                "watermark_lag": {"imu": 0.04}, "outcome": "running"}
    assert fuse.behind_text() == "imu 40 ms"
    fuse.replicas["fuse[0]"] = {**fuse.replicas["fuse[0]"], "outcome": "ended",
                                "ended": 1.0e9}
    assert fuse.behind() is None and fuse.behind_text() == "-"
    out = io.StringIO()
    LiveView(out, tty=False, json_lines=True).update("demo r1", {"fuse": fuse})
    assert json.loads(out.getvalue())["nodes"][0]["behind"] is None


def test_off_a_terminal_with_json_logs_each_report_is_one_json_line_in_the_logs_shape(
) -> None:
    out, clock = io.StringIO(), Clock()
    view = LiveView(out, tty=False, clock=clock, json_lines=True)
    cam, fuse = NodeProgress("producer"), NodeProgress("processor")
    for second in range(3):
        cam.replicas["cam[0]"] = {"emitted": 30 * second, "at": 50.0 + second,
                                  "started": 7.0}
        fuse.replicas["fuse[0]"] = {"processed": 29 * second, "at": 50.2 + second,
                                    "started": 7.0, "drops": {"late": second},
                                    "watermark_lag": {"imu": 0.04}}
        fuse.pending["fuse[0]"] = 3 if second else "unread: TimeoutError"
        clock.now = 1000.0 + second
        view.update("demo r1", {"cam": cam, "fuse": fuse}, force=True)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 3
    assert {(line["logger"], line["level"], line["message"]) for line in lines} == {
        ("videoflow.run.progress", "INFO", "demo r1")}
    assert set(lines[0]) >= {"time", "pid", "nodes"}
    first, last = lines[0]["nodes"], lines[-1]["nodes"]
    assert first[1]["pending"] is None  # unknown is never 0: it says why
    assert first[1]["pending_unknown"] == "unread: TimeoutError"
    assert last == [
        {"node": "cam", "done": 60, "rate_per_second": 30.0, "pending": None, "dropped": 0,
         "dead_lettered": 0, "behind": None, "restarts": 0},
        {"node": "fuse", "done": 58, "rate_per_second": 29.0, "pending": 3, "dropped": 2,
         "dead_lettered": 0, "behind": {"parent": "imu", "ms": 40.0}, "restarts": 0}]


def test_a_rate_is_the_reports_own_count_over_their_own_clock() -> None:
    # Reports a little late or early on the view's clock: the replica's clock ('at')
    # says how long the count took, so the rate stays right.
    sink = NodeProgress("consumer")
    for at, count, heard in ((10.0, 0, 0.0), (11.3, 39, 1.0), (12.1, 63, 2.0)):
        sink.replicas["sink[0]"] = {"processed": count, "at": at, "started": 1.0}
        sink.mark(1000.0 + heard)
        if count:
            assert sink.rate(1000.0 + heard + 0.5) == pytest.approx(30.0)


def test_a_restarted_ended_or_silent_replica_gives_no_false_rate() -> None:
    node = NodeProgress("processor")
    node.replicas["n[0]"] = {"processed": 100, "at": 5.0, "started": 1.0}
    node.mark(0.0)
    node.replicas["n[0]"] = {"processed": 130, "at": 6.0, "started": 1.0}
    node.mark(1.0)
    assert node.rate(1.2) == pytest.approx(30.0)
    # Silent past STALE_SECONDS: its loop has not turned, so it completed nothing.
    assert node.rate(1.0 + STALE_SECONDS + 0.1) == 0.0
    # A new process of the same replica counts from 0: no negative rate, and none
    # until its second report.
    node.replicas["n[0]~1"] = dict(node.replicas["n[0]"], outcome="restarted")
    node.replicas["n[0]"] = {"processed": 3, "at": 9.0, "started": 2.0}
    node.mark(4.0)
    assert node.rate(4.1) is None
    node.replicas["n[0]"] = {"processed": 33, "at": 10.0, "started": 2.0}
    node.mark(5.0)
    assert node.rate(5.1) == pytest.approx(30.0)
    # Ended: nothing more will come from it.
    node.replicas["n[0]"] = {"processed": 40, "at": 10.5, "started": 2.0, "ended": 99.0,
                             "outcome": "ended"}
    node.mark(5.5)
    assert node.rate(5.6) == 0.0
    assert NodeProgress("consumer").rate(0.0) is None  # never heard from: unknown


def nodes_for_the_view() -> dict[str, NodeProgress]:
    fuse = NodeProgress("processor", restarts=2, pending={"fuse_all_cameras[0]": "timeout"},
                        replicas={"fuse_all_cameras[0]": {
                            "processed": 1234, "watermark_lag": {"cam1": 0.013}}})
    return {"cam": NodeProgress("producer", replicas={"cam[0]": {"emitted": 1300}}),
            "fuse_all_cameras": fuse,
            "sink": NodeProgress("consumer", replicas={"sink[0]": {"processed": 1200}},
                                 pending={"sink[0]": 4})}


@pytest.mark.parametrize("width", [44, 30, 120])
def test_a_narrow_terminal_shows_one_table_that_fits_and_never_wraps(width: int) -> None:
    out = io.StringIO()
    view = LiveView(out, tty=True, width=width)
    nodes = nodes_for_the_view()
    for _ in range(5):
        view.update("squares r20260101000000abcdef  2 restarts", nodes, force=True)
    view.close()
    shown = [line for line in screen(out.getvalue(), width) if line]
    visible = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert all(len(line) <= width for line in re.split(r"[\r\n]", visible))
    assert len(shown) == 6, shown  # title, header, rule, three rows: one copy
    assert shown[1].split()[0] == "node" and "rate/s" in shown[1]
    assert [line.split()[0] for line in shown[3:]] == [
        "cam", "fuse_all_cameras" if width >= 60 else shown[4].split()[0], "sink"]
    if width >= 44:  # the pending count and the join's lag stay, unknown as unknown
        assert "unknown" in shown[4] and "cam1 13 ms" in shown[4]
    if width >= 120:  # everything, restarts too
        assert shown[1].split() == ["node", "done", "rate/s", "pending", "dropped",
                                    "dead-let.", "behind", "restarts"]
        assert "unknown (timeout)" in shown[4] and shown[4].split()[-1] == "2"


@pytest.mark.parametrize("width", [25, 44, 60])
def test_on_a_narrow_terminal_dead_letters_there_are_stay_as_the_report_keeps_them(
        width: int) -> None:
    # At 25 columns the view kept rate/s and pending and dropped a dead-let. column
    # holding 114.
    nodes = nodes_for_the_view()
    nodes["sink"].replicas["sink[0]"] = {"processed": 1200, "dead_lettered": 114}
    out = io.StringIO()
    view = LiveView(out, tty=True, width=width)
    view.update("squares r20260101000000abcdef", nodes, force=True)
    view.close()
    shown = [line for line in screen(out.getvalue(), width) if line]
    assert "dead-let." in shown[1].split(), shown
    assert "114" in shown[-1].split(), shown
    assert "dropped" not in shown[1].split()  # nothing to say: it goes


def test_what_the_run_writes_is_printed_above_the_table_never_under_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    handler = logging.StreamHandler(sys.stderr)  # as logs.configure makes it
    logging.getLogger().addHandler(handler)
    try:
        view = LiveView(terminal, tty=True, width=44)
        nodes = nodes_for_the_view()
        view.update("flow run", nodes, force=True)
        view.print_lines("[scale/0] ", ["first line", "second line"])
        view.update("flow run", nodes, force=True)
        print("the engine prints", file=sys.stderr)  # the view's proxy, while it is live
        logging.getLogger("videoflow.test").error("the engine logs")
        view.print_lines("[sink/0] ", ["Traceback (most recent call last):",
                                       '  File "/tmp/a/very/long/path/to/the/user/flow.py", '
                                       'line 31, in close',
                                       "RuntimeError: sink cannot close"])
        view.close()
        assert handler.stream is terminal  # given back
        view.print_lines("[sink/0] ", ["after the end"])  # plain, once closed
    finally:
        logging.getLogger().removeHandler(handler)
    shown = screen(terminal.getvalue(), 44)
    header = [i for i, line in enumerate(shown) if line.startswith("node ")]
    assert len(header) == 1, shown
    text = "\n".join(shown)
    above = "\n".join(shown[:header[0]])
    for line in ("[scale/0] first line", "[scale/0] second line", "the engine prints",
                 "the engine logs", "[sink/0] RuntimeError: sink cannot close"):
        assert line in above, text
    # A line longer than the terminal is wrapped by it, whole, not cut.
    assert "flow.py\", line 31, in close" in above.replace("\n", ""), text
    assert [line for line in shown if line][-1] == "[sink/0] after the end"


def relay_child(end: RelayEnd) -> None:
    """A process whose stdout and stderr go to a relay: Python's, and the descriptors
    themselves (what a C library or a subprocess writes)."""
    end.adopt()
    print("printed")
    os.write(1, b"written to fd 1\n")
    os.write(2, b"written to fd 2\nno newline at the end")
    raise SystemExit(0)


def test_the_relay_reads_a_processs_own_descriptors_line_by_line() -> None:
    got: list[tuple[str, str]] = []
    lock = threading.Lock()

    def write(prefix: str, lines: list[str]) -> None:
        with lock:
            got.extend((prefix, line) for line in lines)

    relay = OutputRelay(write, (1, 2))
    end = relay.open("[n/0] ")
    process = multiprocessing.get_context("spawn").Process(target=relay_child, args=(end,))
    process.start()
    end.close()
    process.join(30)
    assert process.exitcode == 0
    assert relay.wait(10)
    assert got == [("[n/0] ", "printed"), ("[n/0] ", "written to fd 1"),
                   ("[n/0] ", "written to fd 2"), ("[n/0] ", "no newline at the end")]


@pytest.fixture
def no_terminal_fds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(progress_module.os, "isatty", lambda fd: False)
    yield


def test_off_a_terminal_there_is_no_relay(no_terminal_fds: None) -> None:
    # The replicas write where the engine does: a plain view, or descriptors that
    # are no terminal, relay nothing.
    assert LiveView(io.StringIO(), tty=False).relay() is None
    assert LiveView(io.StringIO(), tty=True).relay() is None


def test_a_running_replica_gone_silent_makes_its_nodes_pending_unknown_not_stale() -> None:
    # Stuck in its node's code, or on a broker that is away: the count it last reported
    # is not what waits now (the view showed it for minutes, unchanged).
    node = NodeProgress("processor")
    node.replicas["n[0]"] = {"processed": 4, "at": 5.0, "started": 1.0}
    node.pending["n[0]"] = 20
    node.mark(1.0)
    assert node.pending_count(1.5) == 20
    silent_at = 1.0 + STALE_SECONDS + 1.0
    assert node.pending_count(silent_at) == f"no word for {STALE_SECONDS + 1.0:.0f} s"
    assert node.pending_text(silent_at) == f"unknown (no word for {STALE_SECONDS + 1.0:.0f} s)"
    assert node.pending_count() == 20  # as reported, when no clock is given
    # Its next report brings the count back; a replica that ended is silent for good.
    node.replicas["n[0]"] = {"processed": 9, "at": 10.0, "started": 1.0}
    node.pending["n[0]"] = 15
    node.mark(silent_at)
    assert node.pending_count(silent_at + 0.5) == 15
    node.replicas["n[0]"] = {"processed": 9, "at": 11.0, "started": 1.0, "ended": True}
    node.mark(silent_at + 1.0)
    assert node.pending_count(silent_at + 60.0) == 15


def test_replicas_sharing_a_durable_count_its_backlog_once_and_own_durables_each() -> None:
    # Two replicas of one node read one durable: each reports the broker's count of it,
    # which the view showed twice (1,259 pending on a 600-message stream).
    def reading(at: float, available: int, leased: int, durable: str) -> dict:
        return {"processed": 1, "at": at, "started": 1.0, "subscriptions": {"cam": {
            "available": available, "leased": leased, "unresolved": 0,
            "durable": durable}}}

    node = NodeProgress("processor")
    node.replicas = {"n[0]": reading(5.0, 400, 6, "n--from--cam"),
                     "n[1]": reading(5.5, 390, 7, "n--from--cam")}
    # Their own totals add what each holds, which the broker counts as leased already.
    node.pending = {"n[0]": 409, "n[1]": 400}
    assert node.pending_count() == 397  # the later reading of the one durable
    # A partitioned node's replicas each read their own.
    node.replicas = {"n[0]": reading(5.0, 10, 1, "n--from--cam--p0"),
                     "n[1]": reading(5.5, 20, 2, "n--from--cam--p1")}
    assert node.pending_count() == 33
    # A replica that ended left nothing waiting; the other's reading stands.
    node.replicas = {"n[0]": {**reading(6.0, 0, 0, "n--from--cam"), "ended": True},
                     "n[1]": reading(5.5, 390, 7, "n--from--cam")}
    node.pending = {"n[0]": 0, "n[1]": 400}
    assert node.pending_count() == 397
    # Unresolved is what each replica heard of (its ledger marks, the advisories since
    # it subscribed): the most any knows, not the later reading's, which flickered.
    marked = reading(5.0, 390, 7, "n--from--cam")
    marked["subscriptions"]["cam"]["unresolved"] = 3
    node.replicas = {"n[0]": marked, "n[1]": reading(5.5, 390, 7, "n--from--cam")}
    node.pending = {"n[0]": 400, "n[1]": 397}
    assert node.pending_count() == 400
