"""The demo's flow and its run: the options checked, the flow built from the demo's
nodes, run to its end and checked against what the seed predicts (DemoResult). And
fuse_bag: the demo's fusion over a recorded ROS bag instead of the simulation
(``videoflow replay BAG --topics ... --into videoflow.cli.demo_flow:fuse_bag``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from videoflow.cli.demo_nodes import (
    START_DELAY_S,
    Camera,
    Fusion,
    GroupLog,
    Imu,
    Verify,
)
from videoflow.cli.demo_truth import (
    IMU_WINDOW_MS,
    TOLERANCE_MS,
    Expected,
    expected,
    imu_range,
    imu_window_ms,
    quorum_for,
    timing_for,
)
from videoflow.core.constants import BATCH
from videoflow.core.report import RunReport
from videoflow.flow import Flow
from videoflow.io.rerun_sink import RerunSink
from videoflow.io.start_gate import StartGate
from videoflow.run.progress import LiveView

DEFAULT_SEED = 7
MAX_CAMERAS = 16
"""Each camera is a process of its own; beyond this a laptop is mostly switching."""

MAX_FPS = 240.0
"""Above 60 fps the skews and the tolerance shrink with the frame period (Timing)."""

MAX_IMU_HZ = 2000.0

TIMEOUT_MS = 300.0
"""The join's silence backstop: a camera or the IMU that sent nothing this long has
stopped (raised with --lag: fusion_timeout_ms)."""

MAX_LAG_S = 60.0

MAX_CLOCK_OFFSET_S = 1.0
"""The most --clock-offset skews a camera: the join's drift bound (1 s of event time)."""

CLOCK_CORRECTIONS = ("none", "static", "running")
"""--clock-correction: none; the offset given to the join (JoinPolicy.clock_offsets);
or the join left to find it and follow it (clock_correction='running')."""

LAG_MARGIN_S = 1.0
"""What fusion_timeout_ms adds beyond the lag and the start delay: how much later than the
fusion node the last node's process may come up (spawned one after another, each
importing numpy, on a busy 2-core machine)."""

MIN_IMU_COMPLETENESS = 99.0
"""The share (%) of the IMU samples that exist within the groups' windows that the
windows must hold."""

LAG_WARNING_MS = 100.0  # cameras this far behind real time may make the figures drift

PAYLOAD_WAIT_SHOWN_S = 0.05
"""Cameras that waited this long for payload room account for their lag themselves."""

REPLAY_PACED_TIMEOUT_MS = 1_000.0
"""fuse_bag's join timeout when every source is paced from one anchor: the topics
arrive as recorded, each at least every frame period, so a source is silent this
long only when its process stalls, or opens this long after the anchor."""

REPLAY_FAST_TIMEOUT_MS = 10_000.0
"""fuse_bag's join timeout otherwise: each source then runs through its topic on its
own (as fast as the flow takes it, or paced from its own start), and one may be
seconds behind another; a frame a camera dropped is found missing by the camera's
next frame, not by the timeout."""


def check_options(cameras: int, fps: float, duration: float, frame_size: tuple[int, int],
                  imu_hz: float, drop_rate: float, seed: int = DEFAULT_SEED,
                  lag: tuple[int, float] | None = None,
                  clock_offset: tuple[int, float] | None = None,
                  correction: str = "none") -> None:
    """Check the demo's options (build_flow's and the command's).

    Raises:
        ValueError: naming the first option out of range, as its command-line flag.
    """
    if not 1 <= cameras <= MAX_CAMERAS:
        raise ValueError(f"--cameras must be 1 to {MAX_CAMERAS}, got {cameras}")
    if not 0 < fps <= MAX_FPS:
        raise ValueError(f"--fps must be above 0 and at most {MAX_FPS:g}, got {fps:g}")
    if not 0 < duration <= 3600:
        raise ValueError(f"--duration must be above 0 and at most 3600 s, got {duration:g}")
    if int(duration * fps) < 1:
        raise ValueError(f"--duration {duration:g} s at {fps:g} fps captures no frame")
    width, height = frame_size
    if not (1 <= width <= 4096 and 1 <= height <= 4096):
        raise ValueError(f"--frame-size must be 1x1 to 4096x4096, got {width}x{height}")
    if not 0 < imu_hz <= MAX_IMU_HZ:
        raise ValueError(f"--imu-hz must be above 0 and at most {MAX_IMU_HZ:g}, "
                         f"got {imu_hz:g}")
    if not 0 <= drop_rate < 1:
        raise ValueError(f"--drop-rate must be at least 0 and below 1, got {drop_rate:g}")
    if seed < 0:
        raise ValueError(f"--seed must be at least 0, got {seed}")
    if lag is not None:
        camera, seconds = lag
        if not 0 <= camera < cameras:
            raise ValueError(f"--lag names cam{camera}, but the cameras are cam0 to "
                             f"cam{cameras - 1}")
        if not 0 < seconds <= MAX_LAG_S:
            raise ValueError(f"--lag must be above 0 and at most {MAX_LAG_S:g} s, "
                             f"got {seconds:g}")
    if clock_offset is not None:
        camera, seconds = clock_offset
        if not 0 <= camera < cameras:
            raise ValueError(f"--clock-offset names cam{camera}, but the cameras are cam0 "
                             f"to cam{cameras - 1}")
        if not 0 < abs(seconds) <= MAX_CLOCK_OFFSET_S:
            raise ValueError(f"--clock-offset must be non-zero and within "
                             f"±{MAX_CLOCK_OFFSET_S:g} s, got {seconds:g}")
    if correction not in CLOCK_CORRECTIONS:
        raise ValueError(f"--clock-correction must be one of {', '.join(CLOCK_CORRECTIONS)}, "
                         f"got {correction!r}")
    if correction != "none" and clock_offset is None:
        raise ValueError("--clock-correction corrects a --clock-offset: give one")


def fusion_timeout_ms(lag: tuple[int, float] | None,
                      start_delay: float = START_DELAY_S) -> float:
    """The join's timeout: TIMEOUT_MS, raised when a camera's frames arrive seconds late
    so that the lagging camera, silent from the start until its first frame arrives, is
    not taken for stopped.

    The join counts a parent it has not heard from as silent from its own first
    receive (its alignment) or from the first group's creation (its backstop). The
    first comes before the first capture by the start delay and by however much later
    the last node's process came up than the fusion node's (LAG_MARGIN_S); the
    lagging camera speaks seconds after the first capture. TIMEOUT_MS stays on top, the
    allowance for a busy machine that it is without a lag.

    Arguments:
        lag: (camera index, seconds), as build_flow's; None for none.
        start_delay: seconds from the last node's process up to the first capture.

    Returns:
        TIMEOUT_MS without a lag, else TIMEOUT_MS + 1000 * (seconds + start_delay +
        LAG_MARGIN_S).
    """
    if lag is None:
        return TIMEOUT_MS
    return TIMEOUT_MS + 1000.0 * (lag[1] + start_delay + LAG_MARGIN_S)


def build_flow(cameras: int = 4, fps: float = 30.0, duration: float = 10.0,
               frame_size: tuple[int, int] = (64, 48), imu_hz: float = 400.0,
               drop_rate: float = 0.02, seed: int = DEFAULT_SEED,
               summary_path: str | None = None,
               start_delay: float = START_DELAY_S, backlog: bool = False,
               fusion_delay: float = 0.0, lag: tuple[int, float] | None = None,
               clock_offset: tuple[int, float] | None = None,
               correction: str = "none", rerun: str | None = None) -> Flow:
    """The demo flow: cameras and an IMU -> fusion -> verify; with rerun, also cameras
    and IMU -> a RerunSink of the same join.

    Arguments:
        cameras / fps / duration / frame_size (width, height) / imu_hz / drop_rate /
            seed: the simulation (see videoflow.cli.demo's docstring).
        summary_path: where the verify sink writes its counts at its end; None picks a
            file in a fresh temporary directory (flow.consumers[0].path).
        start_delay: seconds from the last node's process up to the first capture
            (StartGate).
        backlog: the producers publish as fast as they can rather than in real time,
            with the same stamps (the replay case).
        fusion_delay: seconds from the first capture until the fusion node takes its
            first input (a node that starts late, then catches up).
        lag: (camera index, seconds): that camera's frames are each published that
            long after their capture, in real time even with backlog; the join's
            timeout is raised (fusion_timeout_ms) so that it is not taken for stopped.
        clock_offset: (camera index, seconds): that camera's clock reads that much
            ahead (behind, below 0), every stamp of it off by as much.
        correction: 'static' gives the join the offset to take off that camera's
            stamps (JoinPolicy.clock_offsets); 'running' leaves the join to find it
            (clock_correction='running', its default steps and limit); 'none' leaves
            them as they are.
        rerun: a Rerun target (RerunSink's: FILE.rrd, 'spawn', a viewer's URL): a
            node named 'rerun' joins the same inputs under the same policy and logs
            each group there.

    Returns:
        the Flow, named 'demo', of type BATCH (nothing published is lost).

    Raises:
        ValueError: an option out of range (check_options).
    """
    check_options(cameras, fps, duration, frame_size, imu_hz, drop_rate, seed, lag,
                  clock_offset, correction)
    if summary_path is None:
        summary_path = os.path.join(tempfile.mkdtemp(prefix="videoflow-demo-"), "summary.json")
    instants = int(duration * fps)
    names = (*(f"cam{i}" for i in range(cameras)), "imu", "fusion", "verify")
    gate = StartGate(os.path.dirname(os.path.abspath(summary_path)), names, start_delay)
    cams = [Camera(i, gate, fps, instants, frame_size, drop_rate, seed, backlog,
                   lag[1] if lag is not None and lag[0] == i else 0.0,
                   clock_offset[1] if clock_offset is not None and clock_offset[0] == i
                   else 0.0)
            for i in range(cameras)]
    offsets = {} if clock_offset is None or correction != "static" else {
        f"cam{clock_offset[0]}": -clock_offset[1]}
    samples = imu_range(imu_hz, instants / fps, fps)
    window_ms = imu_window_ms(imu_hz)
    imu = Imu(gate, imu_hz, samples, backlog)
    join = {"mode": "time", "tolerance_ms": timing_for(fps).tolerance_ms,
            "quorum": quorum_for(cameras), "missing": "drop",
            "timeout_ms": fusion_timeout_ms(lag, start_delay),
            "max_pending": 1024, "collect": {"imu": window_ms}, "clock_offsets": offsets,
            "clock_correction": "running" if correction == "running" else "static"}
    fusion = Fusion(gate, imu_hz, samples, window_ms, fusion_delay, name="fusion",
                    join_policy=join)(*cams, imu)
    sinks = [Verify(summary_path, cameras, gate)(fusion)]
    if rerun is not None:
        # Shown: each frame and its lag, the IMU's gyro; not the stamps and indices.
        sinks.append(RerunSink(rerun, name="rerun", join_policy=join,
                               leave_out=("camera", "k", "t"))(*cams, imu))
    return Flow([*cams, imu], sinks, flow_type=BATCH, name="demo")


@dataclass
class DemoResult:
    """A demo run, checked.

    Attributes:
        report: the RunReport.
        cameras / quorum / fps / duration / imu_hz: what ran.
        groups / quorum_groups / correct / incorrect / frames: the verify sink's counts
            (frames: camera frames inside emitted groups).
        correctness: correct groups as a percentage of the groups; None for no group.
        imu_per_group: (min, mean, max) IMU samples per group; imu_span_ms: the earliest
            and latest sample relative to its group's frames' mean stamp. A window
            closes at the first sample beyond it or, as a backstop, once the IMU has
            been silent for the join's timeout.
        camera_lag_ms: the most a frame was published behind its capture instant (a
            replica that started after the first instant, a busy machine), the lagging
            camera's behind its capture plus the lag; None for a backlog, which runs
            ahead of real time by design (but for a lagging camera, which is paced
            among it). A camera or IMU that falls silent for the join's timeout
            (timeout_ms) is given up on, so a machine
            too busy to keep them sending can turn complete groups into quorum groups
            or close IMU windows short, and the figures then differ from the expected
            ones.
        expected: what the seed says the join must produce.
        drops: drops by reason per node that dropped anything (RunReport).
        imu_in_window / imu_expected: over every group, the IMU samples its window
            held, and the samples that exist within it (imu_tally).
        imu_completeness: imu_in_window as a percentage of imu_expected; None when no
            window could be counted.
        backlog: the producers ran ahead of real time.
        fusion_delay: seconds the fusion node started after the first capture.
        lag: (camera name, seconds) of the camera whose frames were published that
            late; None for none.
        timeout_ms: the join's silence backstop (TIMEOUT_MS, raised with a lag).
        clock_offset: (camera name, seconds) of the camera whose clock read that much
            ahead; None for none.
        correction: how the join corrected it (CLOCK_CORRECTIONS).
    """

    report: RunReport
    cameras: int
    quorum: int
    fps: float
    duration: float
    imu_hz: float
    groups: int = 0
    quorum_groups: int = 0
    correct: int = 0
    incorrect: int = 0
    frames: int = 0
    correctness: float | None = None
    imu_per_group: tuple[int, float, int] | None = None
    imu_span_ms: tuple[float, float] | None = None
    camera_lag_ms: float | None = None
    expected: Expected | None = None
    drops: dict[str, dict[str, int]] = field(default_factory=dict)
    imu_in_window: int = 0
    imu_expected: int = 0
    imu_completeness: float | None = None
    backlog: bool = False
    fusion_delay: float = 0.0
    lag: tuple[str, float] | None = None
    timeout_ms: float = TIMEOUT_MS
    clock_offset: tuple[str, float] | None = None
    correction: str = "none"

    @property
    def payload_waited_seconds(self) -> dict[str, float]:
        """Per camera that wrote to shared memory, how long it waited for room in its
        payload share (NodeReport.payload_waited_seconds)."""
        nodes = self.report.nodes
        return {name: waited for name in (f"cam{i}" for i in range(self.cameras))
                if name in nodes
                and (waited := nodes[name].payload_waited_seconds) is not None}

    @property
    def join_latency_p50_ms(self) -> float | None:
        fusion = self.report.nodes.get("fusion")
        return None if fusion is None else fusion.join_latency_p50_ms

    @property
    def join_latency_p99_ms(self) -> float | None:
        fusion = self.report.nodes.get("fusion")
        return None if fusion is None else fusion.join_latency_p99_ms

    @property
    def failures(self) -> list[str]:
        """What failed, one line per check: the run completed, every group holds one
        capture instant, the groups and quorum groups are the ones the seed predicts
        (correct groups alone say nothing of the ones the join gave up on), and the
        windows hold at least MIN_IMU_COMPLETENESS % of the IMU samples that exist
        within them. Empty when every check holds."""
        failed = []
        e = self.expected
        if self.report.outcome != "completed":
            failed.append(f"the run did not complete: outcome {self.report.outcome}")
        if self.correctness is None:
            failed.append("correctness unknown: no group was fused")
        elif self.correctness != 100.0:
            failed.append(f"correctness {self.correctness:.1f} %: {self.incorrect} of "
                          f"{self.groups} groups merge capture instants or lost pixels")
        if e is None:
            failed.append("no expected figures to check the groups against")
        else:
            if self.groups != e.groups:
                failed.append(f"groups fused {self.groups}, expected {e.groups}")
            if self.quorum_groups != e.quorum_groups:
                failed.append(f"quorum groups {self.quorum_groups}, expected "
                              f"{e.quorum_groups}")
        if self.imu_completeness is None:
            failed.append("IMU completeness unknown: no group window could be counted")
        elif self.imu_completeness < MIN_IMU_COMPLETENESS:
            failed.append(f"IMU completeness {self.imu_completeness:.2f} % is below "
                          f"{MIN_IMU_COMPLETENESS:g} %: the windows held {self.imu_in_window}"
                          f" of the {self.imu_expected} samples within them")
        return failed

    @property
    def ok(self) -> bool:
        """Every check holds (failures is empty)."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        timing = timing_for(self.fps)
        return {
            "ok": self.ok, "failures": self.failures, "outcome": self.report.outcome,
            "cameras": self.cameras, "quorum": self.quorum, "fps": self.fps,
            "duration": self.duration, "imu_hz": self.imu_hz, "backlog": self.backlog,
            "fusion_delay": self.fusion_delay,
            "lag": None if self.lag is None else {"camera": self.lag[0],
                                                  "seconds": self.lag[1]},
            "timeout_ms": self.timeout_ms,
            "skewed_camera": None if self.clock_offset is None else {
                "camera": self.clock_offset[0], "seconds": self.clock_offset[1]},
            "clock_correction": self.correction,
            "tolerance_ms": timing.tolerance_ms, "clock_offset_ms": timing.offset_ms,
            "jitter_ms": timing.jitter_ms, "imu_window_ms": imu_window_ms(self.imu_hz),
            "groups": self.groups,
            "quorum_groups": self.quorum_groups, "correct": self.correct,
            "incorrect": self.incorrect, "frames": self.frames,
            "correctness": self.correctness,
            "imu_completeness": self.imu_completeness,
            "imu_in_window": self.imu_in_window, "imu_expected": self.imu_expected,
            "join_latency_p50_ms": self.join_latency_p50_ms,
            "join_latency_p99_ms": self.join_latency_p99_ms,
            "imu_per_group": self.imu_per_group, "imu_span_ms": self.imu_span_ms,
            "camera_lag_ms": self.camera_lag_ms,
            "expected": None if self.expected is None else vars(self.expected),
            "drops": self.drops, "report": self.report.to_dict(),
        }

    def _clock_row(self) -> list[tuple[str, str, str]]:
        """The skewed camera's row, when there is one."""
        if self.clock_offset is None:
            return []
        camera, seconds = self.clock_offset
        ahead = f"{camera} {abs(seconds) * 1000.0:.1f} ms {'ahead' if seconds > 0 else 'behind'}"
        if self.correction == "static":
            note = (f"corrected: the join takes it off {camera}'s stamps (clock_offsets="
                    f"{{'{camera}': {-seconds:g}}})")
        elif self.correction == "running":
            fusion = self.report.nodes.get("fusion")
            found = None if fusion is None else fusion.clock_corrections_ms.get(camera)
            steps = 0 if fusion is None else fusion.clock_changes.get(camera, 0)
            note = ("the join's running correction: " + (
                f"{found:+.1f} ms at the end, found in {steps} steps" if found
                else "found none"))
        else:
            note = (f"not corrected: beyond the {timing_for(self.fps).tolerance_ms:g} ms "
                    f"tolerance, {camera}'s frames meet no group (set clock_offsets="
                    f"{{'{camera}': {-seconds:g}}})")
        return [("clock", ahead, note)]

    def format(self, width: int | None = None) -> str:
        """The figures, then the RunReport table (fitted to width, a terminal's, as
        RunReport.format fits it), then the verdict with each failed check."""
        e = self.expected
        p50, p99 = self.join_latency_p50_ms, self.join_latency_p99_ms
        imu = "-"
        if self.imu_per_group is not None:
            low, mean, high = self.imu_per_group
            imu = f"{mean:.1f} samples (min {low}, max {high})"
        if self.imu_span_ms is not None:
            imu += (f", {self.imu_span_ms[0]:+.1f} to {self.imu_span_ms[1]:+.1f} ms around "
                    "the frames' mean stamp")
        if self.backlog and self.lag is None:
            lag, lag_note = "-", "a backlog: the producers ran ahead of real time"
        else:
            lag = "-" if self.camera_lag_ms is None else f"{self.camera_lag_ms:.1f} ms"
            if self.lag is None:
                lag_note = "most a frame was sent behind real time"
            else:
                # The lag asked for is the lagging camera's schedule, not lag.
                camera, seconds = self.lag
                lag_note = (f"most a frame of {camera} was sent behind its capture + "
                            f"{seconds:g} s; the other producers ran ahead as a backlog"
                            if self.backlog else "most a frame was sent behind real time, "
                            f"{camera}'s behind its capture + {seconds:g} s")
            waited = max(self.payload_waited_seconds.values(), default=0.0)
            if (self.camera_lag_ms or 0) <= LAG_WARNING_MS:
                pass
            elif waited >= PAYLOAD_WAIT_SHOWN_S:
                # Back-pressure, not a busy CPU: a camera waiting for room is heard.
                lag_note += (f"; the cameras waited up to {waited:.1f} s for room in their "
                             "shared-memory payload shares, full of frames the join had "
                             "not fused yet")
            else:
                lag_note += (
                    f"; above {LAG_WARNING_MS:g} ms the machine is short of CPU for real "
                    f"time, and a camera silent for the {self.timeout_ms:g} ms timeout is "
                    "given up on: lighten the machine")
        drops = "; ".join(f"{node}: " + ", ".join(f"{r} {n}" for r, n in by.items())
                          for node, by in self.drops.items()) or "none"
        rows = [
            ("groups fused", f"{self.groups}", "" if e is None else f"expected {e.groups}"),
            ("quorum groups", f"{self.quorum_groups}",
             f"{self.quorum} of {self.cameras} cameras"
             + ("" if e is None else f"; expected {e.quorum_groups}")),
            ("correctness", "-" if self.correctness is None else f"{self.correctness:.1f} %",
             f"{self.correct} of {self.groups} groups hold frames of one capture instant"),
            ("IMU complete", "-" if self.imu_completeness is None
             else f"{self.imu_completeness:.2f} %",
             f"{self.imu_in_window} of the {self.imu_expected} samples within the groups' "
             f"windows; at least {MIN_IMU_COMPLETENESS:g} % required"),
            ("join latency", "-" if p50 is None or p99 is None
             else f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
             "a quorum group waits until its missing camera's next frame" + (
                 "" if self.lag is None else f"; every group waits for {self.lag[0]}'s, "
                 f"which comes up to {self.lag[1]:g} s after the others'")),
            ("IMU per group", imu, ""),
            *self._clock_row(),
            ("camera lag", lag, lag_note),
            ("drops", drops, "" if e is None
             else f"expected: fusion join_evicted {e.evicted}, frames of instants below "
                  "the quorum"),
        ]
        cameras = f"{self.cameras} camera" + ("s" if self.cameras != 1 else "")
        head = (f"demo: {cameras} at {self.fps:g} fps and an IMU at "
                f"{self.imu_hz:g} Hz for {self.duration:g} s"
                + (" published as a backlog" if self.backlog else "")
                + (f", the fusion starting {self.fusion_delay:g} s late"
                   if self.fusion_delay else "")
                + ("" if self.lag is None else f", {self.lag[0]} {self.lag[1]:g} s late")
                + f", fused by event time (tolerance {timing_for(self.fps).tolerance_ms:g} ms,"
                f" IMU window ±{imu_window_ms(self.imu_hz):g} ms)")
        lines = [head] + [f"  {label:<14} {value}" + (f"  ({note})" if note else "")
                          for label, value, note in rows]
        failures = self.failures
        verdict = ["demo OK"] if not failures else [
            "demo FAILED:", *(f"  {failure}" for failure in failures)]
        return "\n".join([*lines, "", self.report.format(width), "", *verdict])


def run_demo(cameras: int = 4, fps: float = 30.0, duration: float = 10.0,
             frame_size: tuple[int, int] = (64, 48), imu_hz: float = 400.0,
             drop_rate: float = 0.02, seed: int = DEFAULT_SEED, nats_url: str | None = None,
             start_delay: float = START_DELAY_S,
             view: LiveView | bool | None = None, backlog: bool = False,
             fusion_delay: float = 0.0, metrics_port: int | None = None,
             lag: tuple[int, float] | None = None,
             clock_offset: tuple[int, float] | None = None,
             correction: str = "none", rerun: str | None = None) -> DemoResult:
    """Build the demo flow, run it to its end and check it.

    Arguments:
        cameras ... seed / start_delay / backlog / fusion_delay / lag / clock_offset /
            correction / rerun: as build_flow.
        nats_url: the broker; None takes VIDEOFLOW_NATS_URL, else starts the embedded
            nats-server.
        view: as run_flow (None: a live view on a terminal).
        metrics_port: as run_flow (None: VIDEOFLOW_METRICS_PORT, else none).

    Returns:
        the DemoResult.

    Raises:
        ValueError: an option out of range.
        BrokerUnavailable / TimeoutError: as run_flow.
    """
    with tempfile.TemporaryDirectory(prefix="videoflow-demo-") as directory:
        summary_path = Path(directory) / "summary.json"
        flow = build_flow(cameras, fps, duration, frame_size, imu_hz, drop_rate, seed,
                          str(summary_path), start_delay, backlog, fusion_delay, lag,
                          clock_offset, correction, rerun)
        report = flow.run(nats_url, view=view, metrics_port=metrics_port)
        counts = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    instants = int(duration * fps)
    result = DemoResult(report, cameras, quorum_for(cameras), fps, instants / fps, imu_hz,
                        expected=expected(cameras, instants, drop_rate, seed),
                        backlog=backlog, fusion_delay=fusion_delay,
                        lag=None if lag is None else (f"cam{lag[0]}", lag[1]),
                        timeout_ms=fusion_timeout_ms(lag, start_delay),
                        clock_offset=None if clock_offset is None else (
                            f"cam{clock_offset[0]}", clock_offset[1]),
                        correction=correction)
    for name in ("groups", "quorum_groups", "correct", "incorrect", "frames",
                 "imu_in_window", "imu_expected"):
        setattr(result, name, int(counts.get(name, 0)))
    if result.groups:
        result.correctness = 100.0 * result.correct / result.groups
        imu = counts["imu_counts"]
        result.imu_per_group = (min(imu), sum(imu) / len(imu), max(imu))
        span = counts.get("imu_span_ms")
        result.imu_span_ms = None if span is None else (span[0], span[1])
        result.camera_lag_ms = counts.get("lag_ms")
    if result.imu_expected:
        result.imu_completeness = 100.0 * result.imu_in_window / result.imu_expected
    result.drops = {name: {reason: n for reason, n in node.dropped.items() if n}
                    for name, node in report.nodes.items() if node.dropped_total}
    return result


def fuse_bag(sources: Mapping[str, Any], groups_path: str | None = None, *,
             tolerance_ms: float = TOLERANCE_MS, window_ms: float = IMU_WINDOW_MS) -> Flow:
    """The demo's fusion over a recorded bag: its image topics are the cameras, its
    IMU topic the IMU, joined by event time as the demo joins its cameras (all but
    one camera make a group, the IMU taken in a window around each) into the demo's
    Fusion, whose summaries go to a GroupLog. As ``--into`` of ``videoflow replay``,
    which hands it {topic: RosbagSource}.

    The join gives up on a silent source after REPLAY_PACED_TIMEOUT_MS when every
    source is paced from one anchor (``videoflow replay --speed``), else after
    REPLAY_FAST_TIMEOUT_MS.

    Arguments:
        sources: {topic: RosbagSource}, in the order the cameras are fused.
        groups_path: where GroupLog writes each group's summary (a JSON line); None
            keeps none.
        tolerance_ms: how far apart one instant's frames may be stamped (the demo's,
            for cameras up to 60 fps).
        window_ms: the IMU window's half-width around a group's time.

    Returns:
        the Flow, named 'demo-replay', of type BATCH.

    Raises:
        ValueError: no image topic, not exactly one IMU topic, or a topic of another
            type; a source the bag has no topic for.
    """
    from videoflow.io.ros_messages import COMPRESSED_IMAGE, IMAGE, IMU

    kinds = {topic: source.message_type() for topic, source in sources.items()}
    cameras = [sources[t] for t, kind in kinds.items() if kind in (IMAGE, COMPRESSED_IMAGE)]
    imus = [sources[t] for t, kind in kinds.items() if kind == IMU]
    others = [f"{t} ({kind})" for t, kind in kinds.items()
              if kind not in (IMAGE, COMPRESSED_IMAGE, IMU)]
    if others or not cameras or len(imus) != 1:
        raise ValueError(f"fuse_bag fuses image topics and one IMU topic; got "
                         f"{len(cameras)} image and {len(imus)} IMU topic(s)"
                         + (f", and {', '.join(others)}" if others else ""))
    imu = imus[0]
    anchors = {source.anchor for source in sources.values()}  # an anchor has a speed
    paced = len(anchors) == 1 and None not in anchors
    fusion = Fusion(None, None, None, window_ms, name="fusion", join_policy={
        "mode": "time", "tolerance_ms": tolerance_ms, "quorum": quorum_for(len(cameras)),
        "timeout_ms": REPLAY_PACED_TIMEOUT_MS if paced else REPLAY_FAST_TIMEOUT_MS,
        "missing": "drop", "max_pending": 1024, "collect": {imu.name: window_ms}})(
        *cameras, imu)
    sink = GroupLog(groups_path, name="groups")(fusion)
    return Flow([*cameras, imu], [sink], flow_type=BATCH, name="demo-replay")
