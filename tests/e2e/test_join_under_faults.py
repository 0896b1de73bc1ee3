"""A time join of live cameras when one of them fails mid-run, end to end: a real
nats-server, every camera and the fusion a process of its own, the cameras paced in
real time (helpers/join_fault_nodes.py).

Four cameras capture at 30 fps (a 33.3 ms period; their clocks 0 to 3 ms apart,
the tolerance 8 ms, so a frame can only join its own instant's group), and the
fusion joins them with quorum 3, timeout_ms 300, missing='drop'. One camera fails at
instant K:

- killed (SIGKILL, from inside its process): the engine starts the replica again
  (run_flow's max_restarts, 3 by default; with 0 the replica is lost and the run
  fails: the lost replica makes the engine stop the whole flow, so no quorum
  groups go on). The replacement takes REBOOT s in open() (a device coming up) and
  is either a live camera, capturing from the next instant to come, R, never
  re-sending the instants it missed, or one that starts over from instant 0 (as
  videoflow.cli.demo's Camera would), replaying every instant since the start at once:
  those frames are behind what the join already fused, and each is a counted drop
  (join_late behind the camera's own watermark, join_evicted at or beyond it),
  never a second group of an instant.
- silent: it stops publishing at K, stays alive, and ends after the others.

What the join must make of it, checked against the ground truth the cameras log
(which camera captured which instant): every instant before K a whole group; every
instant the camera missed a quorum group lacking exactly that camera -- none lost,
none merged with a neighbour, none twice; every instant after R whole again. The
failed camera's last frame is at K-1, so the group of K lacks it and its watermark
never passes K: only the silence backstop (timeout_ms without a message from it)
gives it up, and it gives the camera up for every later group at once, so the groups
of the first timeout of the gap wait for it (none longer than one timeout) and the
later ones are emitted as soon as the live cameras' frames are in.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from join_fault_nodes import Camera, Fuse, StartGate

from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.report import RunReport
from videoflow.flow import Flow

CAMERAS = 4
FPS = 30.0
PERIOD_MS = 1000.0 / FPS
INSTANTS = 150  # 5 s of capture
FAILS_AT = 30  # K: 1 s in
FAILED = 2  # the camera that fails
TOLERANCE_MS = 8.0
TIMEOUT_MS = 300.0
START_DELAY = 1.0  # from the last process up to the first capture
REBOOT = 0.7  # a killed camera's replacement takes this long in open()


def build(tmp_path: Path, fault: str, **options: Any) -> tuple[Flow, Path]:
    """The cameras -> fusion flow, camera FAILED failing at FAILS_AT with fault (and
    the Camera options given). Returns the flow and the directory its nodes log to."""
    logs = tmp_path / "logs"
    logs.mkdir()
    names = (*(f"cam{i}" for i in range(CAMERAS)), "fusion")
    gate = StartGate(str(logs), names, START_DELAY)
    cams = [Camera(i, gate, FPS, INSTANTS, offset_ms=float(i), log_dir=str(logs),
                   **({"fault": fault, "at": FAILS_AT, "marker": str(tmp_path / "died"),
                       **options} if i == FAILED else {}))
            for i in range(CAMERAS)]
    fusion = Fuse(gate, FPS, str(logs), name="fusion", join_policy={
        "mode": "time", "tolerance_ms": TOLERANCE_MS, "quorum": CAMERAS - 1,
        "timeout_ms": TIMEOUT_MS, "missing": "drop"})(*cams)
    return Flow(cams, [fusion], BATCH, name=f"join{fault}"), logs


def captured(logs: Path, camera: int) -> list[tuple[int, int]]:
    """(pid, instant) of every frame the camera captured, in order."""
    return [(pid, k) for pid, k, _waited in captures(logs, camera)]


def captures(logs: Path, camera: int) -> list[tuple[int, int, bool]]:
    """(pid, instant, waited) of every frame the camera captured, in order: waited is
    False for an instant already past when the camera came to it (a replay)."""
    rows = (line.split() for line in (logs / f"cam{camera}.log").read_text().splitlines())
    return [(int(pid), int(k), waited == "1") for pid, k, waited, _lag in rows]


def groups(logs: Path) -> list[dict[str, Any]]:
    """Every group the fusion was handed, in order."""
    path = logs / "groups.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def by_instant(fused: list[dict[str, Any]]) -> dict[int, list[int | None]]:
    """The fused groups by their instant, each group's members' instants: checks that
    no group merges two instants, that none came twice (by instant, and by key)."""
    keys = Counter(g["key"] for g in fused)
    assert [k for k, n in keys.items() if n > 1] == [], "a group handed twice"
    out: dict[int, list[int | None]] = {}
    for g in fused:
        present = {k for k in g["instants"] if k is not None}
        assert len(present) == 1, f"a group merging instants {sorted(present)}"
        (k,) = present
        assert k not in out, f"instant {k} fused twice: {out[k]} and {g['instants']}"
        out[k] = g["instants"]
    return out


def whole(k: int) -> list[int | None]:
    return [k] * CAMERAS


def lacking_failed(k: int) -> list[int | None]:
    return [None if c == FAILED else k for c in range(CAMERAS)]


def drops(report: RunReport) -> dict[str, dict[str, int]]:
    """Per node, its drops by reason (only the reasons that happened)."""
    return {name: {r: n for r, n in node.dropped.items() if n}
            for name, node in report.nodes.items()
            if any(node.dropped.values()) or node.dead_lettered}


def assert_gap_within_one_timeout(fused: list[dict[str, Any]], gap: range) -> None:
    """The quorum groups of the gap wait for the backstop, and for no more than one
    timeout between them all.

    The failed camera's last frame was captured at K-1, so the backstop gives it up
    at the earliest TIMEOUT_MS after that: group K cannot be handed over before
    (TIMEOUT_MS - PERIOD_MS after its capture), and is handed over within a timeout
    plus the messenger's polling and a scheduling margin. The groups of the instants
    captured meanwhile are held behind it (time order) and go with it, so none waits
    longer than group K; the camera, given up, is given up for every later group at
    once, so the groups captured after that wait for nothing but the live cameras'
    frames: none waits for the backstop again.

    "At once" is measured against the same run's whole groups before the failure
    (after the first ten, the start-up's): on a host whose load holds every frame up
    (CI's two workers each running a flow of many processes on two cores), every
    group of the run takes longer from capture to hand-over, those of the gap too."""
    latency = {g["instants"][0]: g["latency_ms"] for g in fused}
    wait = {g["instants"][0]: g["wait_ms"] for g in fused}
    print(f"gap {gap[0]}..{gap[-1]}: latency/wait ms (capture / first arrival to "
          "hand-over): " + ", ".join(f"{k}: {latency[k]:.0f}/{wait[k]:.0f}" for k in gap))
    first = latency[gap[0]]
    assert TIMEOUT_MS - PERIOD_MS - 2.0 <= first <= TIMEOUT_MS + 100.0, first
    assert max(latency[k] for k in gap) <= first + 50.0, [latency[k] for k in gap]
    settled = [latency[k] for k in gap
               if k >= gap[0] + (TIMEOUT_MS + 100.0) / PERIOD_MS]
    assert settled, "the gap is too short to show the groups after the backstop"
    # Waiting for the backstop again would take TIMEOUT_MS - PERIOD_MS at the least
    # (as group K's did); a group that waited less did not. The median says the rest
    # go at once, whatever one group's scheduling on a loaded machine (105 ms seen):
    # within 20 ms, or half a frame period past the whole groups' median of the same
    # run where the host held those up longer (a median of 21 ms seen in CI, with
    # every group of the gap 6-30 ms from capture to hand-over).
    assert max(settled) < TIMEOUT_MS - PERIOD_MS - 2.0, settled
    before = sorted(latency[k] for k in range(10, gap[0]))
    at_once = max(20.0, before[len(before) // 2] + PERIOD_MS / 2)
    assert sorted(settled)[len(settled) // 2] <= at_once, (sorted(settled), before)


@pytest.mark.timeout(60)
def test_a_killed_camera_is_restarted_and_the_instants_it_missed_fuse_as_quorum_groups(
    nats_server: embedded.EmbeddedServer, tmp_path: Path,
) -> None:
    flow, logs = build(tmp_path, "kill", reboot=REBOOT)
    report = flow.run(nats_server.url, view=False)

    assert report.outcome == "completed", report.format()
    died = json.loads((tmp_path / "died").read_text())
    assert died["k"] == FAILS_AT
    # The engine started the killed replica again, once; every other one ran through.
    assert {name: (n.restarts, n.outcomes) for name, n in report.nodes.items()} == {
        **{f"cam{c}": (0, {f"cam{c}[0]": "ended"}) for c in range(CAMERAS) if c != FAILED},
        f"cam{FAILED}": (1, {f"cam{FAILED}[0]": "ended", f"cam{FAILED}[0]~1": "restarted"}),
        "fusion": (0, {"fusion[0]": "ended"})}

    # Ground truth: the live cameras captured every instant; the killed one 0 .. K-1,
    # and its replacement, a live camera, from the next instant to come (R) to the end.
    for c in range(CAMERAS):
        if c != FAILED:
            assert [k for _, k in captured(logs, c)] == list(range(INSTANTS))
    frames = captured(logs, FAILED)
    first_pid = frames[0][0]
    assert first_pid == died["pid"]
    assert [k for pid, k in frames if pid == first_pid] == list(range(FAILS_AT))
    again = [k for pid, k in frames if pid != first_pid]
    assert again, "the replacement captured nothing before the end"
    resumed = again[0]
    assert again == list(range(resumed, INSTANTS)) and resumed > FAILS_AT

    fused = groups(logs)
    got = by_instant(fused)
    # The replacement's first frame races the live cameras' frames of its instant:
    # the camera, silent for longer than the timeout, is given up at once, so if its
    # frame is fed after theirs, the group of R is a quorum group already handed over
    # and the frame seeds a group of its own, discarded below quorum (join_evicted).
    # Either way, exactly one of the two.
    late_first = got.get(resumed) == lacking_failed(resumed)
    assert got == {
        **{k: whole(k) for k in range(FAILS_AT)},
        **{k: lacking_failed(k) for k in range(FAILS_AT, resumed + late_first)},
        **{k: whole(k) for k in range(resumed + late_first, INSTANTS)}}, (
        f"resumed at {resumed}")
    assert drops(report) == ({"fusion": {"join_evicted": 1}} if late_first else {})
    assert report.nodes["fusion"].processed == INSTANTS
    assert report.nodes["fusion"].received == {
        **{f"cam{c}": INSTANTS for c in range(CAMERAS) if c != FAILED},
        f"cam{FAILED}": FAILS_AT + INSTANTS - resumed}
    assert_gap_within_one_timeout(fused, range(FAILS_AT, resumed))


@pytest.mark.timeout(60)
def test_a_camera_gone_silent_is_given_up_by_the_backstop_and_the_rest_fuse_as_quorum_groups(
    nats_server: embedded.EmbeddedServer, tmp_path: Path,
) -> None:
    """The camera stops publishing at K and stays alive (no end of stream, no restart:
    only its silence tells), then ends a second after the others."""
    flow, logs = build(tmp_path, "silent", linger=1.0)
    report = flow.run(nats_server.url, view=False)

    assert report.outcome == "completed", report.format()
    assert {name: (n.restarts, n.outcomes) for name, n in report.nodes.items()} == {
        name: (0, {f"{name}[0]": "ended"}) for name in report.nodes}
    for c in range(CAMERAS):
        expected = range(FAILS_AT) if c == FAILED else range(INSTANTS)
        assert [k for _, k in captured(logs, c)] == list(expected)

    fused = groups(logs)
    assert by_instant(fused) == {
        **{k: whole(k) for k in range(FAILS_AT)},
        **{k: lacking_failed(k) for k in range(FAILS_AT, INSTANTS)}}
    assert drops(report) == {}
    assert report.nodes["fusion"].processed == INSTANTS
    assert report.nodes["fusion"].received == {
        f"cam{c}": FAILS_AT if c == FAILED else INSTANTS for c in range(CAMERAS)}
    assert_gap_within_one_timeout(fused, range(FAILS_AT, INSTANTS))


@pytest.mark.timeout(60)
def test_a_killed_camera_replaying_from_its_first_instant_adds_no_group_and_counts_each_frame(
    nats_server: embedded.EmbeddedServer, tmp_path: Path,
) -> None:
    """The replacement starts over from instant 0 (as the demo's Camera would): it
    sends every instant since the start at once, with its original stamp, then
    captures in real time again. Its frames of 0 .. K-2 are behind the camera's own
    watermark (K-1): each seeds a late group, which no watermark resolves, given up at
    its deadline below quorum ('late'); its frame of K-1, level with the watermark,
    and of the instants it missed, already fused as quorum groups, each seed a group
    the live cameras' watermarks have passed, discarded below quorum at once
    ('evicted'). None of them makes a second group of an instant, nor changes one
    fused before."""
    flow, logs = build(tmp_path, "kill", reboot=REBOOT, replay=True)
    report = flow.run(nats_server.url, view=False)

    assert report.outcome == "completed", report.format()
    assert report.nodes[f"cam{FAILED}"].restarts == 1
    died = json.loads((tmp_path / "died").read_text())
    frames = captures(logs, FAILED)
    first_pid = died["pid"]
    assert [k for pid, k, _ in frames if pid == first_pid] == list(range(FAILS_AT))
    again = [(k, waited) for pid, k, waited in frames if pid != first_pid]
    assert [k for k, _ in again] == list(range(INSTANTS))
    on_time = next(k for k, waited in again if waited)  # its first frame in real time
    assert on_time > FAILS_AT

    fused = groups(logs)
    got = by_instant(fused)
    # The first instant whole again: at the latest one after the replacement's first
    # frame in real time (fed after the live cameras' frames of it). It can come
    # earlier: a replayed frame of an instant whose group is still waiting in the
    # join completes it, and how many instants are still waiting when the burst
    # comes hangs on the machine's load (under the parallel suite, 9 of them). How
    # long the gap may last is assert_gap_within_one_timeout's, below.
    back = next(k for k in range(FAILS_AT, INSTANTS) if got.get(k) == whole(k))
    assert back <= on_time + 1, (back, on_time)
    assert got == {
        **{k: whole(k) for k in range(FAILS_AT)},
        **{k: lacking_failed(k) for k in range(FAILS_AT, back)},
        **{k: whole(k) for k in range(back, INSTANTS)}}
    # The groups fused before the kill hold the dead process's frames, those after
    # the gap the replacement's.
    pids = {g["instants"][0]: g["pids"][FAILED] for g in fused}
    assert {pids[k] for k in range(FAILS_AT)} == {first_pid}
    assert first_pid not in {pids[k] for k in range(back, INSTANTS)}
    # Every replayed frame that made no group is counted, by reason.
    assert drops(report) == {"fusion": {"join_late": FAILS_AT - 1,
                                        "join_evicted": back - (FAILS_AT - 1)}}
    assert report.nodes["fusion"].processed == INSTANTS
    assert report.nodes["fusion"].received[f"cam{FAILED}"] == FAILS_AT + INSTANTS
    assert_gap_within_one_timeout(fused, range(FAILS_AT, back))
