"""The operator subcommands of `videoflow`: status, dlq (list, show, replay, purge),
teardown and buckets (list, remove) — argparse wiring and output formatting over
videoflow.ops.

register(subparsers) adds them to the top-level parser's subparsers; each sets func on
its namespace, a function(args) -> exit code. Output is a plain table, or JSON with
--json. A value that could not be read prints as `unknown (<reason>)` (JSON:
{"unknown": reason, "detail": ...}), never as 0. Every failure is one line on stderr,
`videoflow: error: ...`, and a non-zero exit code — never a traceback.

The broker is --nats-url, else VIDEOFLOW_NATS_URL, else the URL of the nats context
named (--context; main resolves these three), else the embedded nats-server on the
store a `videoflow run` without a broker URL keeps (--store-dir, else
VIDEOFLOW_STORE_DIR, else the per-user default): started for the length of the command,
or, while a run holds that store, that run's own server (ops.embedded_broker).

Exit codes: 0 done; 1 the operation failed or is incomplete (broker unavailable, a
missing dead letter, a replay with failures, a teardown that left streams, no store to
start the embedded broker on, a bucket removal refused while runs use the buckets); 2 a
usage error (argparse's own code), a purge or bucket removal without --yes included.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import msgspec

from videoflow import ops
from videoflow.backends.messaging import CleanupObservation, Known, Unknown
from videoflow.broker.server import ENV_STORE_DIR
from videoflow.cli.common import (
    ENV_NATS_URL,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    positive_seconds,
    whole_number,
)
from videoflow.cli.decoded import input_summary, when
from videoflow.errors import VideoflowError, WireError
from videoflow.logs import say
from videoflow.ops.run_records import RunRecord, run_record
from videoflow.ops.runs import latest_run, run_state
from videoflow.wire.serialization import decode_envelope

Handler = Callable[[argparse.Namespace], int]


# --------------------------------------------------------------------------------------
# Errors and values
# --------------------------------------------------------------------------------------


class UsageError(Exception):
    """Arguments that make no sense together: exit code 2."""


def _error(message: str) -> None:
    text = " ".join(str(message).split())  # one line, whatever the message holds
    say(f"error: {text}", "ERROR")


def guarded(handler: Handler) -> Handler:
    """handler, with every failure turned into one stderr line and an exit code."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except BrokenPipeError:
            raise  # the reader stopped reading: main ends the command quietly
        except UsageError as error:
            _error(str(error))
            return EXIT_USAGE
        except VideoflowError as error:  # BrokerUnavailable, DeadLetterNotFound, ...
            _error(str(error))
            return EXIT_FAILED
        except ValueError as error:  # a bad name, timeout or sequence
            _error(str(error))
            return EXIT_USAGE
        except Exception as error:  # never a traceback for an operator
            _error(f"{type(error).__name__}: {error}")
            return EXIT_FAILED

    return run


def given_url(args: argparse.Namespace) -> str | None:
    """--nats-url, else VIDEOFLOW_NATS_URL, else None (the embedded broker)."""
    url = args.nats_url or os.environ.get(ENV_NATS_URL)
    return str(url) if url else None


@contextlib.contextmanager
def broker_url(args: argparse.Namespace) -> Iterator[str]:
    """The URL the command talks to: the one given, else the embedded broker on the
    store (--store-dir, else the environment's, else the per-user default) for the
    length of the with block."""
    url = given_url(args)
    if url is not None:
        yield url
        return
    with ops.embedded_broker(args.store_dir) as embedded_url:
        yield embedded_url


def _text(value: object) -> str:
    """A value for a table: Known unwrapped, Unknown as `unknown (<reason>)`."""
    if isinstance(value, Known):
        return str(value.value)
    if isinstance(value, Unknown):
        return f"unknown ({value.reason})"
    return str(value)


def _json_value(value: object) -> Any:
    if isinstance(value, Known):
        return value.value
    if isinstance(value, Unknown):
        return {"unknown": value.reason, "detail": value.detail}
    return value


def _dump(document: Any, out: TextIO | None = None) -> None:
    print(json.dumps(document, indent=2, sort_keys=False), file=out or sys.stdout)


def table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# --------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------


def _status_json(status: ops.RunStatus) -> dict[str, Any]:
    streams: Any
    if isinstance(status.streams, Unknown):
        streams = _json_value(status.streams)
    else:
        streams = []
        for stream in status.streams:
            durables: Any = _json_value(stream.durables) if isinstance(
                stream.durables, Unknown) else [
                {
                    "name": d.name, "kind": d.kind, "filter_subject": d.filter_subject,
                    "pending": _json_value(d.pending),
                    "ack_pending": _json_value(d.ack_pending),
                    "redelivered": _json_value(d.redelivered),
                    "unresolved": _json_value(d.unresolved),
                }
                for d in stream.durables
            ]
            streams.append({
                "name": stream.name, "node": stream.node, "retention": stream.retention,
                "messages": _json_value(stream.messages), "bytes": _json_value(stream.bytes),
                "first_seq": _json_value(stream.first_seq),
                "last_seq": _json_value(stream.last_seq), "durables": durables,
            })
    return {
        "flow": status.flow_id, "run": status.run_id,
        "exists": _json_value(status.exists), "streams": streams,
        "dlq_stream": status.dlq_stream, "dlq_count": _json_value(status.dlq_count),
    }


def _status_text(status: ops.RunStatus, record: Sequence[str] = (), latest: bool = False) -> str:
    note = f" (its latest run; videoflow ls --flow {status.flow_id} lists them)"
    lines = [f"run {status.run_id!r} of flow {status.flow_id!r}{note if latest else ''}", *record]
    if isinstance(status.streams, Unknown):
        lines.append(f"streams: {_text(status.streams)} {status.streams.detail}".rstrip())
    elif not status.streams and not record:  # else the record said where they went
        lines.append("no streams (never provisioned, or torn down)")
    elif status.streams:
        lines.append(table(
            [("STREAM", "NODE", "RETENTION", "MESSAGES", "BYTES", "FIRST", "LAST")]
            + [(s.name, s.node, s.retention, _text(s.messages), _text(s.bytes),
                _text(s.first_seq), _text(s.last_seq)) for s in status.streams]))
        for stream in status.streams:
            if isinstance(stream.durables, Unknown):
                lines.append(f"  {stream.name} durables: {_text(stream.durables)}")
                continue
            if not stream.durables:
                lines.append(f"  {stream.name}: no durables")
                continue
            lines.append(f"  durables on {stream.name}:")
            lines.append(table(
                [("DURABLE", "KIND", "PENDING", "ACK_PENDING", "REDELIVERED", "UNRESOLVED")]
                + [(d.name, d.kind or "-", _text(d.pending), _text(d.ack_pending),
                    _text(d.redelivered), _text(d.unresolved)) for d in stream.durables],
                indent="    "))
    lines.append(f"dead letters of this run ({status.dlq_stream}): {_text(status.dlq_count)}")
    return "\n".join(lines)


@guarded
def cmd_status(args: argparse.Namespace) -> int:
    with broker_url(args) as url:
        latest = args.run is None
        run = latest_run(url, args.flow, timeout=args.timeout) if latest else args.run
        if run is None:
            raise CommandError(f"flow {args.flow!r} has no run on this broker (videoflow "
                               "ls lists the flows)", EXIT_FAILED)
        status = ops.run_status(url, args.flow, run, timeout=args.timeout)
        record = run_record(url, args.flow, run, timeout=args.timeout)
    if args.json:
        _dump({**_status_json(status), "latest": latest, "record": _json_value(
            record if isinstance(record, Unknown) else msgspec.to_builtins(record))})
    else:
        said = (record.describe(status.exists == Known(True)) if isinstance(record, RunRecord)
                else [f"its record: {_text(record)} {record.detail}"] if record else [])
        print(_status_text(status, said, latest))
    return EXIT_FAILED if isinstance(status.streams, Unknown) else EXIT_OK


# --------------------------------------------------------------------------------------
# dlq
# --------------------------------------------------------------------------------------


def _input(envelope: bytes) -> dict[str, Any]:
    """What a dead letter's kept envelope says of its input, for `dlq show`."""
    try:
        return input_summary(decode_envelope(envelope))
    except WireError as error:
        return {"undecodable": str(error)}


def _entry_json(entry: ops.DeadLetterEntry, envelope: bool = False) -> dict[str, Any]:
    document: dict[str, Any] = {"seq": entry.seq, "subject": entry.subject,
                                "decodable": entry.decodable}
    record = entry.record
    if record is None:
        document["error"] = entry.error
        return document
    document.update({
        "flow": record.flow_id, "run": record.run_id, "node": record.node,
        "parent": record.parent, "stream_seq": record.stream_seq,
        "attempts": record.attempts, "reason": record.reason,
        "error_type": record.error_type, "error_message": record.error_message,
        "dead_lettered_at": record.dead_lettered_at,
        "envelope_bytes": len(record.envelope),
    })
    if envelope:
        document["traceback"] = record.traceback
        document["dead_lettered_at_utc"] = when(record.dead_lettered_at)
        document["input"] = _input(record.envelope)
        document["envelope_base64"] = base64.b64encode(record.envelope).decode("ascii")
    return document


def _error_text(entry: ops.DeadLetterEntry) -> str:
    record = entry.record
    if record is None:
        return ""
    text = f"{record.error_type}: {record.error_message}" if record.error_type \
        else record.error_message
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


@guarded
def cmd_dlq_list(args: argparse.Namespace) -> int:
    with broker_url(args) as url:
        # One more than the page, to say whether a next page exists.
        entries = ops.dlq_list(url, args.flow, run_id=args.run, node=args.node,
                               limit=None if args.limit is None else args.limit + 1,
                               timeout=args.timeout, after=args.after)
    more = args.limit is not None and len(entries) > args.limit
    entries = entries[:args.limit]
    if args.json:
        _dump([_entry_json(e) for e in entries])
        return EXIT_OK
    if not entries:
        print("no dead letters")
        return EXIT_OK
    rows = [("SEQ", "RUN", "NODE", "PARENT", "PARENT_SEQ", "ATTEMPTS", "REASON", "ERROR")]
    for e in entries:
        r = e.record
        if r is None:
            rows.append((str(e.seq), "?", "?", "?", "?", "?", "undecodable",
                         " ".join(e.error.split())[:60]))
        else:
            rows.append((str(e.seq), r.run_id, r.node, r.parent, str(r.stream_seq),
                         str(r.attempts), r.reason, _error_text(e)))
    print(table(rows))
    if more:
        print(f"(the first {args.limit}; the next page: --after {entries[-1].seq})")
    return EXIT_OK


@guarded
def cmd_dlq_show(args: argparse.Namespace) -> int:
    with broker_url(args) as url:
        entry = ops.dlq_show(url, args.flow, args.seq, timeout=args.timeout)
    if args.json:
        _dump(_entry_json(entry, envelope=True))
        return EXIT_OK
    record = entry.record
    lines = [f"seq:           {entry.seq}", f"subject:       {entry.subject}"]
    if record is None:
        lines.append(f"undecodable:   {entry.error}")
    else:
        lines += [
            f"flow:          {record.flow_id}",
            f"run:           {record.run_id}",
            f"node:          {record.node}",
            f"parent:        {record.parent} (seq {record.stream_seq} of its stream)",
            f"attempts:      {record.attempts}",
            f"reason:        {record.reason}",
            f"error type:    {record.error_type or '-'}",
            f"error:         {record.error_message or '-'}",
            f"dead-lettered: {when(record.dead_lettered_at)}",
            f"envelope:      {len(record.envelope)} bytes",
        ]
        got = _input(record.envelope)
        if "undecodable" in got:
            lines.append(f"input:         undecodable: {got['undecodable']}")
        else:
            lines += [
                f"input trace:   {got['trace_id']} (seq {got['seq']})",
                f"input from:    {got['producer'] or '-'} (replica {got['replica']})",
                f"event time:    {got['event_time']}",
                "input:         " + (got["message"] if got["blob_ref"] is None else
                                     f"by ref {got['blob_ref']} (in the payload store)"),
            ]
        # Where it was raised: the file and line to look at, innermost frame last.
        if record.traceback:
            lines.append("traceback:")
            lines += ["  " + line for line in record.traceback.rstrip("\n").splitlines()]
        else:
            lines.append("traceback:     -")
    print("\n".join(lines))
    return EXIT_OK


def _selection(args: argparse.Namespace) -> list[int] | None:
    """The seqs named, or None for a filter selection (--all and/or --run/--node)."""
    filtered = args.run is not None or args.node is not None
    if args.seqs and (filtered or args.all):
        raise UsageError("give DLQ sequences or --all/--run/--node, not both")
    if not args.seqs and not (filtered or args.all):
        raise UsageError("name the dead letters: SEQ ..., --run/--node, or --all")
    return list(args.seqs) if args.seqs else None


@guarded
def cmd_dlq_replay(args: argparse.Namespace) -> int:
    seqs = _selection(args)
    with broker_url(args) as url:
        report = ops.dlq_replay(url, args.flow, seqs, run_id=args.run, node=args.node,
                                into_run=args.into_run, timeout=args.timeout)
    if args.json:
        _dump({
            "results": [{"seq": r.seq, "outcome": r.outcome, "subject": r.subject,
                         "stream_seq": r.stream_seq, "reason": r.reason}
                        for r in report.results],
            "replayed": len(report.replayed), "duplicates": len(report.duplicates),
            "failed": len(report.failed),
        })
    elif not report.results:
        print("no dead letters to replay")
    else:
        print(table([("SEQ", "OUTCOME", "SUBJECT", "STREAM_SEQ", "REASON")] + [
            (str(r.seq), r.outcome, r.subject or "-",
             "-" if r.stream_seq is None else str(r.stream_seq), r.reason or "-")
            for r in report.results]))
        print(f"replayed {len(report.replayed)}, duplicate {len(report.duplicates)}, "
              f"failed {len(report.failed)}")
    return EXIT_FAILED if report.failed else EXIT_OK


@guarded
def cmd_dlq_purge(args: argparse.Namespace) -> int:
    seqs = _selection(args)
    if not args.yes:
        _error("dlq purge deletes dead letters for good; add --yes to confirm")
        return EXIT_USAGE
    with broker_url(args) as url:
        removed = ops.dlq_purge(url, args.flow, run_id=args.run, node=args.node,
                                seqs=seqs, timeout=args.timeout)
    if args.json:
        _dump({"purged": removed})
    else:
        print(f"purged {removed} dead letter{'' if removed == 1 else 's'}")
    return EXIT_OK


# --------------------------------------------------------------------------------------
# teardown
# --------------------------------------------------------------------------------------


def _refuse_a_running_run(url: str, flow: str, run: str, timeout: float) -> None:
    """Teardown deletes the streams a running run's replicas read and write: they
    would be left waiting on what is gone. Refused while a replica reads the run (as
    `videoflow ls` tells it), or while that cannot be told; --force tears down anyway.

    Raises:
        CommandError: the run is running, or its state could not be read (exit 1).
    """
    state = run_state(url, flow, run, timeout=timeout)
    if state is None:
        return  # nothing of it here: teardown says so
    if state == Known("running"):
        raise CommandError(f"run {run!r} of flow {flow!r} is running (a replica reads its "
                         "streams): stop it first (Ctrl-C, or SIGTERM to its `videoflow "
                         "run`), or pass --force to tear it down under it", EXIT_FAILED)
    if isinstance(state, Unknown):
        raise CommandError(f"cannot tell whether run {run!r} of flow {flow!r} is running "
                         f"({state.reason}: {state.detail}); pass --force to tear it "
                         "down anyway", EXIT_FAILED)


def _cleanup_json(flow: str, run: str, cleanup: CleanupObservation) -> dict[str, Any]:
    return {"flow": flow, "run": run, "removed": list(cleanup.removed),
            "remaining": list(cleanup.remaining), "complete": cleanup.complete}


@guarded
def cmd_teardown(args: argparse.Namespace) -> int:
    with broker_url(args) as url:
        if not args.force:
            _refuse_a_running_run(url, args.flow, args.run, args.timeout)
        cleanup = ops.teardown(url, args.flow, args.run, timeout=args.timeout)
    if args.json:
        _dump(_cleanup_json(args.flow, args.run, cleanup))
    else:
        if cleanup.removed:
            print("removed: " + ", ".join(cleanup.removed))
        elif cleanup.complete:
            print(f"run {args.run!r} of flow {args.flow!r} has no streams on this broker: "
                  "nothing to remove (torn down already, or not that name: videoflow ls "
                  "lists the runs)")
        if cleanup.remaining:
            print("remaining: " + ", ".join(cleanup.remaining))
        if not cleanup.complete:
            _error("teardown is incomplete (the inventory could not be read, or a delete "
                   "failed); re-running it is safe")
        elif cleanup.removed:
            print("the flow's dead-letter stream is kept (videoflow dlq purge removes "
                  "records)")
    return EXIT_OK if cleanup.complete else EXIT_FAILED


# --------------------------------------------------------------------------------------
# buckets
# --------------------------------------------------------------------------------------


@guarded
def cmd_buckets_list(args: argparse.Namespace) -> int:
    with broker_url(args) as url:
        found = ops.buckets_list(url, args.flow, timeout=args.timeout)
    if args.json:
        _dump([{"name": b.name, "kind": b.kind, "flow": b.flow, "stream": b.stream,
                "messages": _json_value(b.messages), "bytes": _json_value(b.bytes)}
               for b in found])
    elif not found:
        print("no flow buckets" + ("" if args.flow is None else f" of flow {args.flow!r}"))
    else:
        print(table([("BUCKET", "KIND", "FLOW", "MESSAGES", "BYTES")] + [
            (b.name, b.kind, b.flow, _text(b.messages), _text(b.bytes)) for b in found]))
    return EXIT_OK


@guarded
def cmd_buckets_remove(args: argparse.Namespace) -> int:
    if not args.yes:
        _error("buckets remove deletes a flow's ledger and payloads for good; add --yes "
               "to confirm")
        return EXIT_USAGE
    with broker_url(args) as url:
        removal = ops.buckets_remove(url, args.flow, run_id=args.run, timeout=args.timeout)
    if args.json:
        _dump({"flow": removal.flow_id, "run": removal.run_id,
               "removed": list(removal.removed), "purged_records": removal.purged_records})
    elif removal.run_id is not None:
        print(f"purged {removal.purged_records} ledger record"
              f"{'' if removal.purged_records == 1 else 's'} of run {removal.run_id!r} of "
              f"flow {removal.flow_id!r} (its payloads stay until the flow's buckets are "
              "removed)")
    elif removal.removed:
        print("removed: " + ", ".join(removal.removed))
    else:
        print(f"flow {removal.flow_id!r} has no buckets to remove")
    return EXIT_OK


# --------------------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------------------


def broker_options(parser: argparse.ArgumentParser, following: bool = False) -> None:
    """--nats-url and --store-dir: the broker an operator command talks to; following:
    the runs on the store it follows (tap, hz)."""
    parser.add_argument(
        "--nats-url", default=None,
        help=f"the broker (default: ${ENV_NATS_URL}, else the --context's URL, else "
             + ("the runs on the store of `videoflow run` without a URL, followed one "
                "after the other" if following else
                "the embedded broker on the store a `videoflow run` without a URL keeps")
             + "; see --store-dir)")
    parser.add_argument(
        "--store-dir", default=None, metavar="DIR",
        help=("the store whose runs to follow" if following else
              "the embedded broker's store")
             + f", when no broker URL is given (default: ${ENV_STORE_DIR}, else the "
             "per-user data directory)")


def _common(parser: argparse.ArgumentParser, *, run: str | None) -> None:
    """--nats-url, --store-dir, --flow, --json, --timeout, and --run when run is
    'required' or 'optional'."""
    broker_options(parser)
    parser.add_argument("--flow", required=True, help="the flow id")
    if run == "required":
        parser.add_argument("--run", required=True, help="the run id")
    elif run == "optional":
        parser.add_argument("--run", default=None, help="only this run")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--timeout", type=positive_seconds, default=ops.DEFAULT_TIMEOUT_SECONDS,
                        help="overall bound in seconds, connect included (default: "
                             "%(default)s)")


def _selection_args(parser: argparse.ArgumentParser) -> None:
    _common(parser, run="optional")
    parser.add_argument("--node", default=None, help="only dead letters of this node")
    parser.add_argument("seqs", nargs="*", type=whole_number(1), metavar="SEQ",
                        help="DLQ sequences (as dlq list shows them)")
    parser.add_argument("--all", action="store_true",
                        help="every dead letter matching --run/--node (the whole flow "
                             "without them)")


def register(subparsers: Any) -> None:
    """Add status, dlq (list, show, replay, purge), teardown and buckets (list, remove)
    to a top-level parser.

    Arguments:
        subparsers: what ArgumentParser.add_subparsers returned. Every command sets
            func on its namespace: a function(args) -> exit code.
    """
    status = subparsers.add_parser(
        "status", help="streams, durables and dead letters of one run",
        description="Every stream the run owns (messages, bytes, first/last seq), every "
                    "durable on it (pending, ack pending, redelivered) and the run's "
                    "dead-letter count, and when it started and how it ended (the "
                    "record it leaves). Unreadable values print as unknown (<reason>).")
    _common(status, run=None)
    status.add_argument("--run", default=None,
                        help="the run id (default: the flow's latest run)")
    status.set_defaults(func=cmd_status)

    dlq = subparsers.add_parser("dlq", help="inspect, replay or purge dead letters",
                                description="The flow's dead-letter stream (vf-{flow}-dlq).")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")

    listing = dlq_sub.add_parser("list", help="list dead letters, oldest first")
    _common(listing, run="optional")
    listing.add_argument("--node", default=None, help="only dead letters of this node")
    listing.add_argument("--limit", type=whole_number(1), default=None,
                         help="at most this many (the oldest): a page")
    listing.add_argument("--after", type=whole_number(0), default=0, metavar="SEQ",
                         help="only dead letters after this DLQ sequence: the next page")
    listing.set_defaults(func=cmd_dlq_list)

    show = dlq_sub.add_parser("show", help="one dead letter in full")
    _common(show, run=None)
    show.add_argument("seq", type=whole_number(1), metavar="SEQ", help="its DLQ sequence")
    show.set_defaults(func=cmd_dlq_show)

    replay = dlq_sub.add_parser(
        "replay", help="publish dead letters' envelopes again on their parent's stream",
        description="Re-publishes each record's original envelope on the data subject of "
                    "the parent that delivered it, in the record's run (or in the run "
                    "--into-run names). Every child of that parent receives it. A run "
                    "that has ended was torn down, so nothing reads its streams: replay "
                    "into a live run of the flow instead. Replaying twice within the "
                    "stream's duplicate window stores it once. Records are kept (see "
                    "purge).")
    _selection_args(replay)
    replay.add_argument(
        "--into-run", default=None, metavar="RUN",
        help="publish onto the parent's stream of this run of the flow (one whose "
             "workers are running) instead of the record's own run")
    replay.set_defaults(func=cmd_dlq_replay)

    purge = dlq_sub.add_parser("purge", help="delete dead letters for good (needs --yes)")
    _selection_args(purge)
    purge.add_argument("--yes", action="store_true", help="confirm the deletion")
    purge.set_defaults(func=cmd_dlq_purge)

    teardown = subparsers.add_parser(
        "teardown", help="delete a run's streams and durables (never the dead letters)")
    _common(teardown, run="required")
    teardown.add_argument("--force", action="store_true",
                          help="tear down a run even while a replica reads it (it is "
                               "refused otherwise)")
    teardown.set_defaults(func=cmd_teardown)

    buckets = subparsers.add_parser(
        "buckets", help="list or remove the buckets flows leave on the broker",
        description="A flow's ledger (KV vf-ledger-{flow}) and by-ref payloads (object "
                    "store vf-payloads-{flow}, KV vf-payloads-{flow}-obligations) outlive "
                    "its runs.")
    buckets_sub = buckets.add_subparsers(dest="buckets_command", required=True,
                                         metavar="COMMAND")
    listing = buckets_sub.add_parser("list", help="every flow's buckets, or one flow's")
    broker_options(listing)
    listing.add_argument("--flow", default=None, help="only this flow's buckets")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--timeout", type=positive_seconds,
                         default=ops.DEFAULT_TIMEOUT_SECONDS,
                         help="overall bound in seconds, connect included (default: "
                              "%(default)s)")
    listing.set_defaults(func=cmd_buckets_list)

    remove = buckets_sub.add_parser(
        "remove", help="delete a flow's buckets, or a run's ledger records (needs --yes)",
        description="Without --run, deletes the flow's ledger, payload store and payload "
                    "records (refused while a run of the flow has streams; dead letters "
                    "carrying a payload ref can no longer be replayed). With --run, "
                    "purges only that run's ledger records.")
    _common(remove, run="optional")
    remove.add_argument("--yes", action="store_true", help="confirm the deletion")
    remove.set_defaults(func=cmd_buckets_remove)


__all__ = [
    "broker_options",
    "cmd_buckets_list",
    "cmd_buckets_remove",
    "cmd_dlq_list",
    "cmd_dlq_purge",
    "cmd_dlq_replay",
    "cmd_dlq_show",
    "cmd_status",
    "cmd_teardown",
    "register",
]
