"""`videoflow ls [--flow FLOW]`: the flows and runs on a broker, with their state
(videoflow.ops.runs)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from videoflow.backends.messaging import Known
from videoflow.cli.common import EXIT_OK, positive_seconds
from videoflow.cli.ops import broker_options, broker_url, guarded, table
from videoflow.ops.runs import list_flows


@guarded
def cmd_ls(args: argparse.Namespace) -> int:
    with broker_url(args) as url:
        flows = list_flows(url, flow_id=args.flow, timeout=args.timeout)
    if args.json:
        print(json.dumps([{
            "flow": f.flow_id, "dead_letters": f.dead_letters,
            "runs": [{"run": r.run_id, "streams": r.streams, "messages": r.messages,
                      "state": (r.state.value if isinstance(r.state, Known)
                                else {"unknown": r.state.reason, "detail": r.state.detail})}
                     for r in f.runs]} for f in flows], indent=2))
        return EXIT_OK
    if not flows:
        print("no flows" + (f" named {args.flow!r}" if args.flow else ""))
        return EXIT_OK
    rows = [("FLOW", "RUN", "STATE", "STREAMS", "MESSAGES")]
    for f in flows:
        for r in f.runs:
            state = r.state.value if isinstance(r.state, Known) else f"unknown ({r.state.reason})"
            rows.append((f.flow_id, r.run_id, state, str(r.streams), str(r.messages)))
        if not f.runs:
            rows.append((f.flow_id, "-", "no runs", "-", "-"))
    print(table(rows))
    for f in flows:
        if f.dead_letters:
            print(f"{f.flow_id}: {f.dead_letters} dead letter"
                  f"{'s' if f.dead_letters != 1 else ''} (videoflow dlq list --flow "
                  f"{f.flow_id})")
    return EXIT_OK


def register(subparsers: Any) -> None:
    """Add ls to a top-level parser."""
    command = subparsers.add_parser("ls", help="the flows and runs on the broker, and "
                                               "whether each run is running")
    broker_options(command)
    command.add_argument("--flow", default=None, help="only this flow")
    command.add_argument("--json", action="store_true", help="print JSON")
    command.add_argument("--timeout", type=positive_seconds, default=10.0,
                         help="overall bound in seconds, connect included "
                              "(default: %(default)s)")
    command.set_defaults(func=cmd_ls)


__all__ = ["cmd_ls", "register"]
