"""`videoflow tap FLOW NODE` and `videoflow hz FLOW NODE`: what flows on an edge, live
(videoflow.ops.tap), as `ros2 topic echo` and `ros2 topic hz` show a topic.

    videoflow tap FLOW NODE [--run RUN] [--count N] [--seconds S] [--json]
                            [--rerun FILE.rrd|spawn|URL]
    videoflow hz FLOW NODE [--run RUN] [--window S] [--seconds S] [--json]

Both end at --count / --seconds or on Ctrl-C, which is how a tap is usually ended: it
then says what it saw and exits 0. Given no broker URL, they follow the runs on the
embedded broker's store: they wait for a `videoflow run` there, watch it until its
broker stops, and wait for the next (RunBrokers), saying so on stderr.

`tap --rerun` also logs each message to the Rerun viewer (videoflow.io.rerun_log),
under the node's name at its event time; one that went by ref is noted, not fetched
(the tap reads no payload store).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

from videoflow import logs
from videoflow.cli.common import EXIT_OK, positive_seconds, whole_number
from videoflow.cli.decoded import input_summary
from videoflow.cli.ops import broker_options, given_url, guarded
from videoflow.io.rerun_log import RerunLog, open_recording
from videoflow.ops.embedded import RunBrokers
from videoflow.ops.tap import Rate, Tapped, tap


def _line(message: Tapped) -> str:
    if message.envelope is None:
        return f"{message.run_id}  undecodable: {message.error}"
    got = input_summary(message.envelope)
    shown = got["message"] if got["blob_ref"] is None else f"by ref {got['blob_ref']}"
    return (f"{message.run_id}  seq {got['seq']}  event {got['event_time']}  "
            f"from {got['producer'] or '-'}#{got['replica']}  {shown}")


def _document(message: Tapped) -> dict[str, Any]:
    document: dict[str, Any] = {"run": message.run_id, "subject": message.subject,
                                "received_at": message.received_at}
    if message.envelope is None:
        document["undecodable"] = message.error
    else:
        document.update(input_summary(message.envelope))
    return document


@guarded
def cmd_tap(args: argparse.Namespace) -> int:
    shown = None if args.rerun is None else _rerun(args)

    def seen(message: Tapped) -> None:
        print(json.dumps(_document(message)) if args.json else _line(message), flush=True)
        if shown is not None:
            _show(shown, message)

    started, got = time.monotonic(), 0
    try:
        got = tap(_broker(args), args.flow, args.node, seen, run_id=args.run,
                  count=args.count, seconds=args.seconds, timeout=args.timeout,
                  ready=_listening, status=_status)
    except KeyboardInterrupt:
        got = -1  # the count is in the lines already printed
    finally:
        if shown is not None:
            shown.recording.flush()
            shown.recording.disconnect()
    if got >= 0:
        _status(f"tap: {got} message{'s' if got != 1 else ''} in "
                f"{time.monotonic() - started:.1f} s")
    return EXIT_OK


@guarded
def cmd_hz(args: argparse.Namespace) -> int:
    rate = Rate()

    def tick(away: bool) -> None:
        figures = rate.read(args.window, away)
        if args.json:
            print(json.dumps(figures), flush=True)
            return
        gap, lag = figures["gap_ms"], figures["event_lag_ms"]
        per_second = figures["rate_per_second"]
        print((f"rate {per_second:.2f}/s" if per_second is not None
               else f"rate unknown ({figures['unknown']})")
              + f"  ({figures['messages']} in {args.window:g} s)"
              + (f"  gap min {gap['min']:.1f} mean {gap['mean']:.1f} max {gap['max']:.1f} "
                 f"std {gap['std']:.1f} ms" if gap else "")
              + (f"  event lag p50 {lag['p50']:.1f} max {lag['max']:.1f} ms" if lag else "")
              + (f"  undecodable {figures['undecodable']}" if figures["undecodable"] else ""),
              flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        tap(_broker(args), args.flow, args.node, rate.add, run_id=args.run,
            seconds=args.seconds, timeout=args.timeout, every=args.window, tick=tick,
            ready=_listening, status=_status)
    return EXIT_OK


def _rerun(args: argparse.Namespace) -> RerunLog:
    """The tap's Rerun log, made before anything is tapped.

    Raises:
        ValueError: a bad target (exit 2).
        MissingDependency: rerun-sdk is not installed; the message names the extra.
    """
    return RerunLog(open_recording(args.rerun, f"videoflow {args.flow}", args.run),
                    args.node)


def _show(shown: RerunLog, message: Tapped) -> None:
    envelope = message.envelope
    if envelope is None:
        shown.note(None, f"undecodable: {message.error}")
    elif envelope["blob_ref"] is not None:
        shown.note(envelope["event_ts"], f"seq {envelope['seq']} went by ref "
                   f"({envelope['blob_ref']}): not fetched", level="INFO")
    else:
        shown.message(envelope["event_ts"], envelope["message"])


def _broker(args: argparse.Namespace) -> str | RunBrokers:
    """The broker given, else the runs on the embedded broker's store, followed: a
    tap that started a server on the store would keep runs from starting there."""
    return given_url(args) or RunBrokers(args.store_dir)


def _listening(subject: str) -> None:
    _status(f"listening on {subject}")


def _status(line: str) -> None:
    """A line for the user on stderr (stdout is the messages'): as it is, or with JSON
    logs, a record in their shape."""
    if logs.in_json():
        logs.say(line)
    else:
        print(line, file=sys.stderr, flush=True)


def register(subparsers: Any) -> None:
    """Add tap and hz to a top-level parser (each sets func on its namespace)."""
    for name, help_text in (
            ("tap", "print the messages a node publishes, decoded, as they go"),
            ("hz", "a node's output rate, gaps and event-time lag, each window")):
        command = subparsers.add_parser(name, help=help_text)
        broker_options(command, following=True)
        command.add_argument("flow", help="the flow id")
        command.add_argument("node", help="the node whose outputs to watch")
        command.add_argument("--run", default=None, help="only this run (default: any)")
        command.add_argument("--seconds", type=positive_seconds, default=None,
                             help="stop after this long (default: at Ctrl-C)")
        command.add_argument("--json", action="store_true", help="one JSON object a line")
        command.add_argument("--timeout", type=positive_seconds, default=10.0,
                             help="bound of the connect, seconds (default: %(default)s)")
        if name == "tap":
            command.add_argument("--count", type=whole_number(1), default=None,
                                 help="stop after this many messages")
            command.add_argument("--rerun", metavar="TARGET", default=None,
                                 help="also log each message to Rerun: FILE.rrd, 'spawn' "
                                      "(starts a viewer) or a viewer's URL "
                                      "(rerun+http://HOST:PORT/proxy); needs the rerun "
                                      "extra")
            command.set_defaults(func=cmd_tap)
        else:
            command.add_argument("--window", type=positive_seconds, default=1.0,
                                 help="seconds each line covers (default: %(default)s)")
            command.set_defaults(func=cmd_hz)


__all__ = ["cmd_hz", "cmd_tap", "register"]
