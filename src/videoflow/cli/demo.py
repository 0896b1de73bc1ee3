"""``videoflow demo``: simulated cameras and an IMU fused by event time, checked end to end.

The flow the library is built for, runnable with nothing but ``pip install``: it
starts the embedded nats-server (or uses --nats-url) and captures for 10 s, from
half a second after every node's process is up (about 20 s in all, start-up and
wind-down included)::

    videoflow demo                          # the live view, then the figures
    videoflow demo --cameras 6 --json       # machine output
    videoflow demo --backlog                # the replay case: producers ahead of the join
    videoflow demo --fusion-delay 10        # the join starts 10 s late and catches up
    videoflow demo --lag cam2:3             # cam2's frames arrive 3 s after capture
    videoflow demo --clock-offset cam2:0.020 --clock-correction static
                                            # cam2's clock reads 20 ms ahead, corrected
    videoflow demo --clock-offset cam2:0.020 --clock-correction running
                                            # the same, found and corrected by the join
    videoflow demo --rerun groups.rrd       # each group in the Rerun viewer's file

    cam0 ─┐
    cam1 ─┤
    cam2 ─┼─> fusion (time join: tolerance 8 ms, quorum 3 of 4, IMU window ±20 ms) ─> verify
    cam3 ─┤
    imu  ─┘

- Each camera is a producer of its own process capturing at 30 fps in real time:
  it sleeps until each capture instant k, then stamps the frame with its own clock,
  t0 + k/fps + offset + jitter (a constant offset within ±1.5 ms, jitter within
  ±1 ms), and skips 2% of the instants (a dropped frame). Offsets, jitter and drops
  come from a seeded generator, so the drops of a run are known before it starts.
  With --backlog the producers skip the sleeping and publish as fast as they can;
  the stamps are the same.
- The IMU samples at 400 Hz on the true clock, at t0 + j/hz, from before the first
  group's window to after the last one's; a group takes every sample within 20 ms of
  its time (a collect parent). The window is a whole number of sample periods long
  (imu_window_ms), 20 ms exactly at 400, 1000 and 2000 Hz.
- With --fusion-delay the fusion node takes its first input that long after the
  first capture: what the cameras and the IMU sent meanwhile waits on the broker,
  and the join, going by event time, loses none of it.
- With --lag CAMERA:SECONDS one camera captures and stamps as the others do, but each
  of its frames reaches the flow SECONDS after its capture (a slow network path, a
  driver's buffer): its first frame comes that long after the others', and it stays
  that far behind to the end. It is paced in real time even with --backlog, the live
  camera the backlog runs ahead of. The join holds back the cameras and the IMU that
  run more than its drift bound (1 s of event time) ahead of it, leaving their input
  on the broker; and its timeout is raised to 300 ms + the lag + the start delay + 1 s
  (fusion_timeout_ms), so that the lagging camera, silent until its first frame, is
  not taken for stopped. What is fused does not change, only when it arrives.
- With --clock-offset CAMERA:SECONDS one camera's clock reads that much ahead (behind,
  below 0): every stamp of it is off by as much. Beyond the tolerance its frames meet
  no group, and the recall checks fail: every group is a quorum group. With
  --clock-correction static the join is given the offset (JoinPolicy.clock_offsets)
  and takes it off that camera's stamps before it matches them; with running it finds
  the offset itself and corrects it 2 ms a step, holding its first groups until it
  has (clock_correction='running').
- The fusion node sees one camera frame per parent, None for a camera missing from a
  quorum group (emitted with 3 of 4 present once the missing camera's next frame
  shows its frame is not coming; after 300 ms of silence, for a camera that stopped),
  and the IMU window as a list. It counts the IMU samples that exist within the
  group's window and sends on a small summary, not the frames.
- The verify sink checks every fused group against the ground truth each frame
  carries (its capture instant k): a group is correct when all its frames belong to
  one capture instant, never a merge of two. It writes its counts to a JSON file.

The join puts a frame in the group whose time (the stamp of the frame that seeded
it) is nearest to its stamp and within the tolerance. One instant's stamps differ by
at most the spread, 2 × (offset + jitter) = 5 ms, and two instants' by at least the
frame period less the spread, so with spread ≤ tolerance < period - spread a frame
always joins its own instant's group and never a neighbour's. Up to 60 fps the
figures above hold (8 ms < 16.7 - 5 ms at 60 fps); above it the period leaves no
room for them, so the offsets, jitter and tolerance shrink with the period, keeping
their proportions at 60 fps (Timing): at the cap, 240 fps, ±0.375 ms, ±0.25 ms and a
2 ms tolerance against a 4.17 ms period. The quorum is all cameras but one (at least
one): one missing frame still yields a group, two do not. An instant with fewer
frames than the quorum is dropped by the join and counted (``join_evicted``, one per
frame); the demo predicts those counts from the seed.

Exit code 0 when the run completed and its recall checks hold: every group is
correct, the groups and quorum groups fused are the ones the seed predicts, and the
windows hold at least 99 % of the IMU samples that exist within them (DemoResult.
failures names each check that failed); 1 otherwise, 2 for bad options.

This module holds the command. The flow and its run are in videoflow.cli.demo_flow,
the nodes in videoflow.cli.demo_nodes, the timing and ground truth in
videoflow.cli.demo_truth; the names in __all__ stay importable from here.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from typing import Any

from videoflow.cli.common import (
    EXIT_FAILED,
    CommandError,
    metrics_option,
    nats_url_option,
    stdout_for_the_document,
)
from videoflow.cli.demo_flow import (
    CLOCK_CORRECTIONS,
    DEFAULT_SEED,
    MAX_CAMERAS,
    MAX_CLOCK_OFFSET_S,
    MAX_FPS,
    MAX_IMU_HZ,
    MAX_LAG_S,
    MIN_IMU_COMPLETENESS,
    TIMEOUT_MS,
    DemoResult,
    build_flow,
    check_options,
    fusion_timeout_ms,
    run_demo,
)
from videoflow.cli.demo_nodes import START_DELAY_S
from videoflow.cli.demo_truth import (
    REFERENCE_FPS,
    Expected,
    Timing,
    camera_schedule,
    expected,
    imu_range,
    imu_tally,
    imu_window_ms,
    in_window,
    quorum_for,
    timing_for,
)
from videoflow.errors import MissingDependency
from videoflow.io.rerun_log import check_target, require_rerun
from videoflow.io.start_gate import StartGate
from videoflow.run.metrics import MetricsUnavailable
from videoflow.run.progress import LiveView


def _frame_size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    if not sep or not width.strip().isdigit() or not height.strip().isdigit():
        raise ValueError(f"--frame-size is WIDTHxHEIGHT, e.g. 64x48, got {text!r}")
    return int(width), int(height)


def parse_lag(text: str, flag: str = "--lag") -> tuple[int, float]:
    """--lag CAMERA:SECONDS (cam2:3, 2:3) as (camera index, seconds); check_options
    checks that the camera exists and the seconds are in range. flag: the option read
    (--clock-offset takes the same form).

    Raises:
        ValueError: text is not CAMERA:SECONDS, naming the flag.
    """
    camera, sep, seconds = text.strip().partition(":")
    index = camera.strip().lower().removeprefix("cam")
    try:
        lag = float(seconds)
    except ValueError:
        lag = math.nan
    if not sep or not index.isdigit() or not math.isfinite(lag):
        raise ValueError(f"{flag} is CAMERA:SECONDS, e.g. cam2:3 or 2:3, got {text!r}")
    return int(index), lag


def _command(args: argparse.Namespace) -> int:

    try:
        size = _frame_size(args.frame_size)
        lag = None if args.lag is None else parse_lag(args.lag)
        skew = (None if args.clock_offset is None
                else parse_lag(args.clock_offset, "--clock-offset"))
        check_options(args.cameras, args.fps, args.duration, size, args.imu_hz,
                      args.drop_rate, args.seed, lag, skew, args.clock_correction)
        if not 0 <= args.start_delay <= 60:
            raise ValueError(f"--start-delay must be 0 to 60 s, got {args.start_delay:g}")
        if not 0 <= args.fusion_delay <= 60:
            raise ValueError(f"--fusion-delay must be 0 to 60 s, got {args.fusion_delay:g}")
        if args.rerun is not None:
            check_target(args.rerun)
            require_rerun()  # before anything starts: the extra is named
    except (ValueError, MissingDependency) as error:
        raise CommandError(str(error)) from error
    try:
        with stdout_for_the_document(args.json):
            result = run_demo(args.cameras, args.fps, args.duration, size, args.imu_hz,
                              args.drop_rate, args.seed, args.nats_url, args.start_delay,
                              view=False if args.json else LiveView(),
                              backlog=args.backlog, fusion_delay=args.fusion_delay,
                              metrics_port=args.metrics_port, lag=lag,
                              clock_offset=skew, correction=args.clock_correction,
                              rerun=args.rerun)
    except MetricsUnavailable as error:
        raise CommandError(str(error), EXIT_FAILED) from error
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.format(
        shutil.get_terminal_size().columns if sys.stdout.isatty() else None))
    return 0 if result.ok else EXIT_FAILED


def register(subparsers: Any) -> None:
    """Add ``demo`` to the top-level parser's subparsers (func: a function(args) ->
    exit code)."""

    demo = subparsers.add_parser(
        "demo", help="fuse simulated cameras and an IMU by event time, and check it",
        description="Simulated cameras (clock offsets, jitter, dropped frames) and an IMU "
                    "fused by a time join on the embedded nats-server; every group is "
                    "checked against the ground truth. Exit code 0 when every group "
                    "holds one capture instant, the groups and quorum groups are the "
                    "ones the simulation predicts and the IMU windows hold at least "
                    f"{MIN_IMU_COMPLETENESS:g} % of their samples.")
    demo.add_argument("--cameras", type=int, default=4,
                      help=f"cameras, 1 to {MAX_CAMERAS}; the quorum is all but one "
                           "(default: 4)")
    demo.add_argument("--fps", type=float, default=30.0,
                      help=f"frames per second, at most {MAX_FPS:g}; above "
                           f"{REFERENCE_FPS:g} the clock skews and the join's tolerance "
                           "shrink with the frame period (default: 30)")
    demo.add_argument("--duration", type=float, default=10.0, metavar="SECONDS",
                      help="seconds of capture (default: 10)")
    demo.add_argument("--frame-size", default="64x48", metavar="WxH",
                      help="frame width x height in pixels (default: 64x48)")
    demo.add_argument("--imu-hz", type=float, default=400.0,
                      help=f"IMU samples per second, at most {MAX_IMU_HZ:g} "
                           "(default: 400)")
    demo.add_argument("--drop-rate", type=float, default=0.02,
                      help="share of frames each camera drops (default: 0.02)")
    demo.add_argument("--start-delay", type=float, default=START_DELAY_S, metavar="SECONDS",
                      help="seconds from the last node process up to the first capture "
                           f"(default: {START_DELAY_S:g})")
    demo.add_argument("--seed", type=int, default=DEFAULT_SEED,
                      help=f"seeds offsets, jitter and drops (default: {DEFAULT_SEED})")
    demo.add_argument("--backlog", action="store_true",
                      help="the cameras and the IMU publish as fast as they can rather "
                           "than in real time, with the same stamps: the replay case, "
                           "producers running ahead of the join")
    demo.add_argument("--fusion-delay", type=float, default=0.0, metavar="SECONDS",
                      help="the fusion node takes its first input this long after the "
                           "first capture, then catches up on what waited for it "
                           "(default: 0)")
    demo.add_argument("--lag", metavar="CAMERA:SECONDS",
                      help="one camera (cam2 or 2) publishes each frame SECONDS (above 0, "
                           f"at most {MAX_LAG_S:g}) after its capture, its stamps "
                           "unchanged: it starts that much later and stays that far "
                           "behind. It is paced in real time even with --backlog (a live "
                           "camera the others run ahead of). The join's timeout is raised "
                           "by the lag, the start delay and a second, so the lagging "
                           "camera is not taken for stopped")
    demo.add_argument("--clock-offset", metavar="CAMERA:SECONDS",
                      help="one camera's clock (cam2 or 2) reads SECONDS ahead (behind, "
                           f"below 0; non-zero, within ±{MAX_CLOCK_OFFSET_S:g}): every "
                           "stamp of it is off by as much")
    demo.add_argument("--clock-correction", choices=CLOCK_CORRECTIONS, default="none",
                      help="what the join does about --clock-offset: 'static' takes the "
                           "offset off that camera's stamps (JoinPolicy.clock_offsets); "
                           "'running' finds it and corrects it itself "
                           "(clock_correction='running'); 'none' leaves them (default: "
                           "none)")
    demo.add_argument("--rerun", metavar="TARGET",
                      help="also show each fused group in the Rerun viewer: a file "
                           "(FILE.rrd, open it with `rerun FILE.rrd`), 'spawn' (starts "
                           "a viewer) or a viewer's URL (rerun+http://HOST:PORT/proxy); "
                           "needs the rerun extra")
    nats_url_option(demo, required_default=False)
    metrics_option(demo)
    demo.add_argument("--json", action="store_true",
                      help="print the result as JSON (no live view)")
    demo.set_defaults(func=_command)


__all__ = ["TIMEOUT_MS", "DemoResult", "Expected", "StartGate", "Timing", "build_flow",
           "camera_schedule", "expected", "fusion_timeout_ms", "imu_range", "imu_tally",
           "imu_window_ms", "in_window", "parse_lag", "quorum_for", "register", "run_demo",
           "timing_for"]
