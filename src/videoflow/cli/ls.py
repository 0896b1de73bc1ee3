"""`videoflow ls [--flow FLOW]`: the flows and runs on a broker, with their state
(videoflow.ops.runs): the runs whose streams are there, and the latest that ended, with
their outcome (all of them with --flow)."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any, Final

from videoflow.backends.messaging import Known
from videoflow.cli.common import EXIT_OK, positive_seconds
from videoflow.cli.ops import broker_options, broker_url, guarded, table
from videoflow.ops.run_records import RUNNING
from videoflow.ops.runs import FlowSummary, RunSummary, list_flows

RECENT_ENDED: Final = 5
"""How many of a flow's ended runs ls shows, its latest, unless given --flow."""


def _utc(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%SZ")


def _state(run: RunSummary) -> str:
    if not isinstance(run.state, Known):
        return f"unknown ({run.state.reason})"
    if run.state.value != "ended" or run.record is None:
        return run.state.value
    # Its record says running, and its streams are gone: its engine died, and the run
    # was torn down after by a videoflow that did not end records (a teardown now ends
    # it as 'lost'), or its streams are not made yet.
    return "ended" if run.record.outcome == RUNNING else run.record.outcome


def _shown(flow: FlowSummary, every: bool) -> tuple[list[RunSummary], int]:
    """The runs of flow ls shows, and how many ended ones it leaves out: every run but
    the earlier ended ones beyond RECENT_ENDED (all of them when every)."""
    ended = [r for r in flow.runs if r.state == Known("ended")]
    hidden = set() if every else {r.run_id for r in ended[:-RECENT_ENDED]}
    return [r for r in flow.runs if r.run_id not in hidden], len(hidden)


@guarded
def cmd_ls(args: argparse.Namespace) -> int:
    with broker_url(args) as url:
        flows = list_flows(url, flow_id=args.flow, timeout=args.timeout)
    if args.json:
        print(json.dumps([{
            "flow": f.flow_id, "dead_letters": f.dead_letters,
            "runs": [{"run": r.run_id, "streams": r.streams, "messages": r.messages,
                      "state": (r.state.value if isinstance(r.state, Known)
                                else {"unknown": r.state.reason, "detail": r.state.detail}),
                      "outcome": r.record.outcome if r.record else None,
                      "started": _utc(r.record.started_at) if r.record else None,
                      "ended": _utc(r.record.ended_at) if r.record else None}
                     for r in f.runs]} for f in flows], indent=2))
        return EXIT_OK
    if not flows:
        print("no flows" + (f" named {args.flow!r}" if args.flow else ""))
        return EXIT_OK
    rows = [("FLOW", "RUN", "STATE", "STREAMS", "MESSAGES", "ENDED")]
    earlier = {}
    for f in flows:
        runs, earlier[f.flow_id] = _shown(f, args.flow is not None)
        for r in runs:
            ended = _utc(r.record.ended_at) if r.record else None
            rows.append((f.flow_id, r.run_id, _state(r), str(r.streams) if r.streams else "-",
                         str(r.messages) if r.streams else "-", ended or "-"))
        if not f.runs:
            rows.append((f.flow_id, "-", "no runs", "-", "-", "-"))
    print(table(rows))
    for flow, hidden in earlier.items():
        if hidden:
            print(f"{flow}: {hidden} earlier ended run{'s' if hidden != 1 else ''} "
                  f"(videoflow ls --flow {flow})")
    for f in flows:
        if f.dead_letters:
            print(f"{f.flow_id}: {f.dead_letters} dead letter"
                  f"{'s' if f.dead_letters != 1 else ''} (videoflow dlq list --flow "
                  f"{f.flow_id})")
    return EXIT_OK


def register(subparsers: Any) -> None:
    """Add ls to a top-level parser."""
    command = subparsers.add_parser("ls", help="the flows and runs on the broker: whether "
                                               "each run is running, or how it ended")
    broker_options(command)
    command.add_argument("--flow", default=None,
                         help=f"only this flow, with every run that ended (default: "
                              f"every flow, with its latest {RECENT_ENDED} that ended)")
    command.add_argument("--json", action="store_true", help="print JSON")
    command.add_argument("--timeout", type=positive_seconds, default=10.0,
                         help="overall bound in seconds, connect included "
                              "(default: %(default)s)")
    command.set_defaults(func=cmd_ls)


__all__ = ["cmd_ls", "register"]
