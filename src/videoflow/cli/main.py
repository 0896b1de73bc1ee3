"""The ``videoflow`` command.

    videoflow run MODULE:FLOW [--nats-url URL[,URL...] | --store-dir DIR | --ephemeral]
                  [--stop-after S] [--json] [--replicas N] [--outage-budget S]
                  [--resume RUN] [--fail-on-dead-letters]
    videoflow demo [--cameras N] [--fps F] [--duration S] [--frame-size WxH] [--nats-url URL]
    videoflow provision MODULE:FLOW --out FILE [--run RUN] [--replicas N] [--nats-url URL]
    videoflow worker --spec FILE --node NAME [--replica I] [--nats-url URL]
    videoflow teardown --flow FLOW --run RUN [--nats-url URL | --store-dir DIR]
    videoflow status --flow FLOW --run RUN [--nats-url URL | --store-dir DIR] [--json]
    videoflow dlq list|show|replay|purge --flow FLOW ...
    videoflow buckets list|remove [--flow FLOW] ...
    videoflow ls [--flow FLOW] [--json]
    videoflow tap|hz FLOW NODE [--run RUN] [--seconds S] [--json] ...

A flow is named by ``module:attribute`` (the module imported from the current
directory or sys.path; the attribute a Flow, or a function returning one), the unit
both the local engine and workers on other hosts load. Bad arguments and an
unreachable broker get one line on stderr and a non-zero exit, never a traceback.
`run` exits as run_exit_code says (README: the table of exit codes).

Without a broker URL, `run` starts the embedded nats-server on a persistent store (the
per-user data directory, or --store-dir / VIDEOFLOW_STORE_DIR; --ephemeral for a
throwaway one), so the operator commands, also given no URL, find the run's dead
letters on the same store afterwards.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from videoflow import logs
from videoflow.broker.link import redact_url
from videoflow.cli import demo, edges, ls, ops
from videoflow.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_DEAD_LETTERS,
    EXIT_FAILED,
    EXIT_SIGNALLED,
    EXIT_UNFINISHED,
    EXIT_USAGE,
    LOG_FORMAT_HELP,
    VERBOSE_HELP,
    CommandError,
    CommandParser,
    VideoflowParser,
    asks_json,
    budget_seconds,
    connection_arguments,
    hand_down_connection,
    metrics_option,
    nats_url_option,
    positive_number,
    positive_seconds,
    replicas_option,
    resolve_nats_url,
    stdout_for_the_document,
    whole_number,
)
from videoflow.logs import LOG_FORMATS
from videoflow.run.unread_stdout import to_devnull

if TYPE_CHECKING:
    from videoflow.core.report import RunReport


def load_attribute(reference: str) -> Any:
    """The attribute named 'module:attribute', its module imported from the current
    directory as `python -m` would.

    Raises:
        CommandError: a malformed reference, a module that does not import, or a
            missing attribute.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise CommandError(f"a flow is named module:attribute, got {reference!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the current directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        # An import the module itself makes is named where it is made; a module that
        # is not there at all has no line to name.
        said = _raised_at(error) if _their_frames(error) else str(error)
        raise CommandError(f"cannot import {module_name!r}: {said}") from error
    except SyntaxError as error:
        where = f"{error.filename}, line {error.lineno}" if error.filename else "?"
        raise CommandError(f"cannot import {module_name!r}: {type(error).__name__}: "
                           f"{error.msg} ({where})") from error
    except Exception as error:  # the module's own code raised as it was imported
        raise CommandError(f"cannot import {module_name!r}: {_raised_at(error)}") from error
    try:
        return getattr(module, attribute)
    except AttributeError as error:
        raise CommandError(f"{module_name!r} has no attribute {attribute!r}") from error


def load_flow(reference: str, *arguments: Any) -> Any:
    """The Flow named 'module:attribute': a Flow, or a callable returning one, called
    with arguments.

    Raises:
        CommandError: as load_attribute; the callable raised; not a Flow.
    """
    from videoflow.flow import Flow

    found = load_attribute(reference)
    if callable(found) and not isinstance(found, Flow):
        try:
            found = found(*arguments)
        except Exception as error:  # the user's function that builds the flow
            raise CommandError(f"{reference}() raised {_raised_at(error)}") from error
    if not isinstance(found, Flow):
        raise CommandError(f"{reference} is a {type(found).__name__}, not a Flow")
    return found


def _raised_at(error: BaseException) -> str:
    """'Type: message (file, line N)' for an exception a user's module raised: where in
    their code, not where in videoflow's."""
    frames = traceback.extract_tb(error.__traceback__)
    theirs = _their_frames(error)
    at = theirs[-1] if theirs else (frames[-1] if frames else None)
    where = f" ({at.filename}, line {at.lineno})" if at is not None else ""
    return f"{type(error).__name__}: {error}{where}"


_PACKAGE: Final = Path(__file__).resolve().parent.parent
"""videoflow's own source tree, whose frames are not the user's."""


def _their_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The frames of error's traceback in the user's code: not videoflow's package, not
    the import machinery's (a checkout named videoflow is the user's all the same)."""
    return [f for f in traceback.extract_tb(error.__traceback__)
            if not f.filename.startswith("<frozen importlib")
            and "importlib" not in Path(f.filename).parts
            and not Path(f.filename).resolve().is_relative_to(_PACKAGE)]


# ------------------------------------------------------------------------- run


def _run(args: argparse.Namespace) -> int:
    return _run_to_end(load_flow(args.flow), args, resume_as=_same_run(args))


def _same_run(args: argparse.Namespace) -> str:
    """The command that reaches this run again: its flow, and the broker or store it
    ran on when given (a URL without its password, which is never printed)."""
    words = ["videoflow", "run", args.flow]
    if args.nats_url:
        words += ["--nats-url", redact_url(args.nats_url)]
    if args.store_dir:
        words += ["--store-dir", args.store_dir]
    return shlex.join(words)


REPLAY_START_DELAY_S = 5.0
"""With --speed, how long after `replay` starts the bag's first instant is replayed
(the sources' shared anchor): the broker, the run's streams and every replica's
process are started meanwhile (2 to 6 s on a busy 2-core machine). When the last
source is up later than that, the bag's start waits for it (REPLAY_GATE_DELAY_S)."""

REPLAY_GATE_DELAY_S = 0.5
"""With --speed, the least time from the last source's process up to the bag's first
instant (a StartGate over the sources)."""


def _replay(args: argparse.Namespace) -> int:
    """A bag's topics, each a RosbagSource, into the flow --into builds from them; with
    --speed, every source paced from one anchor, and none before every one is up, so
    the topics stay aligned as recorded however far apart their processes start."""
    from videoflow.io import RosbagSource
    from videoflow.io.start_gate import StartGate

    bag = args.bag[0] if len(args.bag) == 1 else args.bag
    for path in args.bag:
        if not Path(path).exists():
            raise CommandError(f"no bag at {path}")
    names = [topic.strip("/").replace("/", "_") or "root" for topic in args.topics]
    if len(set(names)) != len(names):
        raise CommandError(f"--topics names a topic twice: {' '.join(args.topics)}")
    if args.start_delay is not None and args.speed is None:
        raise CommandError("--start-delay paces a replay: give --speed too")
    if args.speed is None:
        sources = {topic: RosbagSource(bag, topic, name=name)
                   for topic, name in zip(args.topics, names, strict=True)}
        return _run_to_end(load_flow(args.into, sources), args)
    delay = REPLAY_START_DELAY_S if args.start_delay is None else args.start_delay
    anchor = time.time() + delay
    # Every replica runs on this host: the sources' marks in one directory of it say
    # when the last is up.
    with tempfile.TemporaryDirectory(prefix="videoflow-replay-") as marks:
        gate = StartGate(marks, tuple(names), REPLAY_GATE_DELAY_S)
        sources = {topic: RosbagSource(bag, topic, speed=args.speed, anchor=anchor,
                                       start_gate=gate, name=name)
                   for topic, name in zip(args.topics, names, strict=True)}
        return _run_to_end(load_flow(args.into, sources), args)


def _run_to_end(flow: Any, args: argparse.Namespace, resume_as: str | None = None) -> int:
    """Run flow as the command's arguments say, and print its report. resume_as: the
    command that runs this flow, for the report's resume hint (which, from run_flow,
    can only name it as MODULE:ATTR)."""
    from videoflow.errors import RunExists
    from videoflow.run.local import RESUME_COMMAND, run_flow
    from videoflow.run.metrics import MetricsUnavailable
    from videoflow.run.progress import LiveView

    # A live view on a terminal, plain progress lines otherwise; none with --json,
    # whose stdout is for machines.
    if args.resume and args.run and args.resume != args.run:
        raise CommandError(f"--resume {args.resume} and --run {args.run} name two runs")
    ours = (lambda text: text) if resume_as is None else (
        lambda text: text.replace(f"{RESUME_COMMAND} ", f"{resume_as} "))
    try:
        with stdout_for_the_document(args.json):  # what the nodes print: to stderr
            report = run_flow(flow, nats_url=args.nats_url, stop_after=args.stop_after,
                              run_id=args.resume or args.run,
                              view=False if args.json else LiveView(),
                              store_dir=args.store_dir, ephemeral=args.ephemeral,
                              replicas=args.replicas, outage_budget=args.outage_budget,
                              resume=bool(args.resume), metrics_port=args.metrics_port)
    except MetricsUnavailable as error:
        raise CommandError(str(error), EXIT_FAILED) from error
    except RunExists as error:
        raise CommandError(ours(str(error))) from error
    report.kept = ours(report.kept)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        # On a terminal, the table fits its width (a narrow one drops columns).
        print(report.format(shutil.get_terminal_size().columns if sys.stdout.isatty()
                            else None))
    return run_exit_code(report, fail_on_dead_letters=args.fail_on_dead_letters)


def run_exit_code(report: RunReport, *, fail_on_dead_letters: bool = False) -> int:
    """What `videoflow run` exits with, by its RunReport, the first that applies: 128 +
    the signal's number when one stopped it (130 for Ctrl-C, 143 for SIGTERM); 1 when it
    failed; 4 when it was kept with work left over; 3 when fail_on_dead_letters and it
    dead-lettered inputs; else 0 (completed, or stopped by --stop-after having
    processed all it took)."""
    if report.stopped_by in ("SIGINT", "SIGTERM"):
        # Whatever followed (a replica killed by the third): the user stopped it.
        return EXIT_SIGNALLED + int(signal.Signals[report.stopped_by])
    if not report.ok:
        return EXIT_FAILED
    if report.left_over:
        return EXIT_UNFINISHED
    if fail_on_dead_letters and report.dead_lettered:
        return EXIT_DEAD_LETTERS
    return 0


# ------------------------------------------------------------------- provision


def writable_output(path: str) -> Path:
    """path, once it is known that a file can be written there: its directory exists
    and is writable, and path is not a directory (an existing file must be writable).

    Raises:
        CommandError: any of those is not so (exit code 2).
    """
    out = Path(path)
    directory = out.parent
    if out.is_dir():
        raise CommandError(f"--out {path!r} is a directory, not a file")
    if not directory.exists():
        raise CommandError(f"--out {path!r}: the directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise CommandError(f"--out {path!r}: {str(directory)!r} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK) or (
            out.exists() and not os.access(out, os.W_OK)):
        raise CommandError(f"--out {path!r} is not writable")
    return out


def _provision(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from videoflow.messaging.topology import provision_flow_sync
    from videoflow.run.local import new_run_id, shared_memory_store
    from videoflow.run.runspec import RunSpec

    # Checked before anything exists on the broker: a run provisioned without its spec
    # is one nobody can start workers for.
    out = writable_output(args.out)
    flow = load_flow(args.flow)
    spec = RunSpec.for_flow(args.flow, flow, run_id=args.run or new_run_id(),
                            ack_wait=args.ack_wait, max_retries=args.max_retries,
                            replicas=args.replicas)
    # The run id first, so whatever happens from here the operator knows what to tear
    # down.
    print(f"provisioning run {spec.run_id} of flow {spec.flow_id!r}", flush=True)
    compiled = spec.compiled(flow)
    provision_flow_sync(args.nats_url, list(compiled.specs), spec.flow_id,
                        spec.run_id, spec.flow_type, timeout=args.timeout,
                        ack_wait=spec.ack_wait, max_retries=spec.max_retries,
                        ledger_budget=spec.ledger == "kv", replicas=spec.replicas)
    if args.payloads == "shm":
        spec = replace(spec, shared_memory=shared_memory_store(compiled, spec.run_id))
    try:
        out.write_text(spec.to_json())
    except OSError as error:
        raise CommandError(
            f"provisioned run {spec.run_id} of flow {spec.flow_id!r}, but could not write "
            f"its spec to {args.out!r} ({error.strerror or error}); remove the run with "
            f"`videoflow teardown --flow {spec.flow_id} --run {spec.run_id} --nats-url "
            f"{redact_url(args.nats_url)}`, or provision it again with --run "
            f"{spec.run_id} and another --out", EXIT_FAILED) from error
    print(f"provisioned run {spec.run_id} of flow {spec.flow_id!r}; spec in {args.out}")
    return 0


# ---------------------------------------------------------------------- worker


def _worker(args: argparse.Namespace) -> int:
    from videoflow.run.metrics import (
        MetricsServer,
        MetricsUnavailable,
        ReplicaSample,
        SnapshotCollector,
        metrics_port_from_env,
        observed_snapshot,
    )
    from videoflow.run.runspec import RunSpec
    from videoflow.run.worker import run_replica

    try:
        spec = RunSpec.from_json(Path(args.spec).read_text())
    except OSError as error:
        raise CommandError(f"cannot read the run spec {args.spec!r}: {error}") from error
    flow = load_flow(spec.flow)
    job, node = spec.replica(flow, args.node, args.replica, args.nats_url)
    logs.set_origin(job.key)
    logs.say(f"worker {job.key} of run {spec.run_id}: started")
    port = args.metrics_port if args.metrics_port is not None else metrics_port_from_env()
    latest: list[ReplicaSample] = []  # the replica's last report, read by each scrape
    metrics = None
    if port is not None:
        try:
            metrics = MetricsServer(SnapshotCollector(spec.flow_id, latest.copy), port)
        except MetricsUnavailable as error:
            raise CommandError(str(error), EXIT_FAILED) from error
        logs.say(f"worker {job.key}: metrics on {metrics.url}")

    def progress(task: Any) -> None:
        if metrics is not None:
            latest[:] = [ReplicaSample(job.spec.name, str(job.replica_id),
                                       observed_snapshot(task)[0],
                                       inputs=job.spec.kind != "producer")]
        s = task.stats
        logs.say(f"worker {job.key}: {s.outcome} processed={s.processed} "
                 f"emitted={s.emitted} failed={s.failed} dead_lettered={s.dead_lettered} "
                 f"drops={s.drops}", replica=job.key, outcome=s.outcome,
                 processed=s.processed, emitted=s.emitted, failed=s.failed,
                 dead_lettered=s.dead_lettered, drops=dict(s.drops))

    try:
        stats = run_replica(job, node, progress=progress, progress_every=args.progress_every)
    finally:
        if metrics is not None:
            metrics.close()
    return 0 if stats.outcome in ("ended", "quiesced") else EXIT_FAILED


# ------------------------------------------------------------------------ main


def fail_on_dead_letters_option(parser: argparse.ArgumentParser) -> None:
    """--fail-on-dead-letters, for a script or CI that counts a dead letter a failure."""
    parser.add_argument(
        "--fail-on-dead-letters", action="store_true",
        help=f"exit {EXIT_DEAD_LETTERS} when the run dead-lettered inputs (and would "
             "otherwise exit 0)")


DISTRIBUTION: Final = "videoflow-nats"
"""The name videoflow is installed by, from the package index or a checkout: "videoflow"
on the index is another project."""


def version_line() -> str:
    """What `videoflow --version` prints: the distribution's name and version.

    Returns:
        The name and the installed distribution's version (``videoflow-nats 0.1.0``);
        videoflow.__version__ where no distribution of that name is installed (a source
        tree on sys.path, or an install from before the name).
    """
    from videoflow import __version__

    try:
        return f"{DISTRIBUTION} {metadata.version(DISTRIBUTION)}"
    except metadata.PackageNotFoundError:
        return f"{DISTRIBUTION} {__version__}"


class _VersionAction(argparse.Action):
    """--version: the distribution's metadata is read when asked for, not on every
    command's start (finding it scans the installed distributions, ~60 ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **options: Any) -> None:
        options.setdefault("help", "show the distribution's name and version and exit")
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         **options)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_line())  # on stdout, as argparse's own version action does
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = VideoflowParser(
        prog="videoflow", description="Dataflow pipelines over NATS JetStream.")
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help=LOG_FORMAT_HELP)
    connection_arguments(parser)
    # Every command's parser takes -v, --log-format and the connection flags too, after
    # its name (CommandParser).
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=CommandParser)

    run = sub.add_parser("run", help="run a flow to its end on this machine")
    run.add_argument("flow", help="the flow, as module:attribute")
    nats_url_option(run, required_default=False)
    store = run.add_mutually_exclusive_group()
    store.add_argument("--store-dir", metavar="DIR",
                       help="the embedded broker's store, kept after the run (default: "
                            "$VIDEOFLOW_STORE_DIR, else the per-user data directory); "
                            "not used with a broker URL")
    store.add_argument("--ephemeral", action="store_true",
                       help="a throwaway store for the embedded broker, removed at the end "
                            "(the run's dead letters go with it)")
    run.add_argument("--run", help="the run id (default: a fresh one)")
    run.add_argument("--stop-after", type=budget_seconds, metavar="SECONDS",
                     help="ask the flow to stop after this long (0: at once)")
    run.add_argument("--json", action="store_true", help="print the report as JSON")
    fail_on_dead_letters_option(run)
    run.add_argument("--resume", metavar="RUN",
                     help="resume a kept run (one whose report said it was kept): start "
                          "the replicas that had not ended, on what its streams still hold")
    replicas_option(run)
    run.add_argument("--outage-budget", type=budget_seconds, metavar="SECONDS",
                     help="how long the broker may be away (restarted, frozen, electing "
                          "a leader) before the run fails (default: "
                          "$VIDEOFLOW_OUTAGE_BUDGET, else 60)")
    metrics_option(run)
    run.set_defaults(func=_run)

    replay = sub.add_parser("replay", help="replay topics of a ROS bag into a flow")
    replay.add_argument("bag", nargs="+",
                        help="a ROS 2 bag directory, or ROS 1 .bag files (a split recording)")
    replay.add_argument("--topics", nargs="+", required=True, metavar="TOPIC",
                        help="the topics to replay, each a source node named after it "
                             "('/cam0/image' is cam0_image)")
    replay.add_argument("--into", required=True, metavar="MODULE:ATTR",
                        help="a function of the sources ({topic: node}) returning the Flow")
    replay.add_argument("--speed", type=positive_number, metavar="X",
                        help="a multiple of the recorded pace (default: as fast as the "
                             "flow takes it)")
    replay.add_argument("--start-delay", type=budget_seconds, metavar="SECONDS",
                        help="with --speed, the bag's first instant is replayed this long "
                             "after launch, on every topic at once; a source up later "
                             f"catches up (default: {REPLAY_START_DELAY_S:g})")
    nats_url_option(replay, required_default=False)
    replay_store = replay.add_mutually_exclusive_group()
    replay_store.add_argument("--store-dir", metavar="DIR",
                              help="the embedded broker's store, as for run")
    replay_store.add_argument("--ephemeral", action="store_true",
                              help="a throwaway store for the embedded broker")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
    fail_on_dead_letters_option(replay)
    replicas_option(replay)
    metrics_option(replay)
    replay.set_defaults(func=_replay, run=None, resume=None, stop_after=None,
                        outage_budget=None)

    provision = sub.add_parser("provision",
                               help="create a run's streams and durables for workers")
    provision.add_argument("flow", help="the flow, as module:attribute")
    provision.add_argument("--out", required=True, help="where to write the run spec")
    provision.add_argument("--run", help="the run id (default: a fresh one)")
    provision.add_argument("--timeout", type=positive_seconds, default=30.0,
                           help="seconds provisioning may take, connect included")
    provision.add_argument("--ack-wait", type=whole_number(1), default=30, metavar="SECONDS",
                           help="how long a delivery stays leased before it is redelivered")
    provision.add_argument("--max-retries", type=whole_number(0), default=3)
    provision.add_argument(
        "--payloads", choices=("object_store", "shm"), default="object_store",
        help="where payloads too large for a message go: the flow's NATS object store, "
             "which workers on any host read (default), or this host's shared memory, "
             "for a run whose workers all run on this host")
    replicas_option(provision)
    nats_url_option(provision)
    provision.set_defaults(func=_provision)

    worker = sub.add_parser("worker", help="run one node replica of a provisioned run")
    worker.add_argument("--spec", required=True, help="the run spec `provision` wrote")
    worker.add_argument("--node", required=True, help="the node's name")
    worker.add_argument("--replica", type=whole_number(0), default=0, metavar="N",
                        help="which of the node's replicas this is, counted from 0 "
                        "(default 0); start one worker for each")
    worker.add_argument("--progress-every", type=positive_seconds, default=5.0,
                        metavar="SECONDS", help="how often it reports (on stderr, and to "
                        "its metrics)")
    metrics_option(worker)
    nats_url_option(worker)
    worker.set_defaults(func=_worker)

    demo.register(sub)
    ops.register(sub)
    ls.register(sub)
    edges.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit code."""
    try:
        try:
            return _command(argv)
        finally:
            # What is still buffered goes now, so a reader that stopped reading shows
            # here rather than in the interpreter's flush at exit (a traceback there).
            sys.stdout.flush()
    except BrokenPipeError:
        # `videoflow dlq list --json | head`: the reader has what it wanted; not an
        # error to print. stdout goes to devnull, so the flush at exit is quiet too.
        to_devnull(sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _say(message: object, error: BaseException | None = None) -> None:
    """The command's one line on stderr, without a secret in it (a JSON record when
    logs are json), then error's traceback when given."""
    text = str(message)
    logs.say(text, "ERROR" if text.startswith("error:") else "WARNING", error)


def _command(argv: Sequence[str] | None) -> int:
    from videoflow.broker.options import auth_options
    from videoflow.errors import (
        BrokerUnavailable,
        CredentialsRefused,
        EmbeddedServerError,
        MissingDependency,
    )

    parser = build_parser()
    VideoflowParser.json_errors = asks_json(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    # The command's own output says what failed, in one line; the library's per-attempt
    # warnings (a provision retrying its connect) only with --verbose. The replicas a
    # run starts log the same way (hand_down).
    level = logging.WARNING if args.verbose else logging.ERROR
    logs.configure(args.log_format, level)
    logs.hand_down(args.log_format, level)
    hand_down_connection(args)
    try:
        resolve_nats_url(args)
        # Credentials that contradict each other are refused before anything starts.
        auth_options(getattr(args, "nats_url", None))
        return int(args.func(args))
    except CommandError as error:
        _say(f"error: {error}", error.__cause__ if args.verbose else None)
        return error.code
    except (EmbeddedServerError, MissingDependency) as error:  # it says what to do
        _say(f"error: {error}")
        return EXIT_FAILED
    except CredentialsRefused as error:  # names the broker and what was presented
        _say(f"error: {error}")
        return EXIT_FAILED
    except (BrokerUnavailable, TimeoutError) as error:
        url = getattr(args, "nats_url", None)
        _say(f"error: the broker at {redact_url(url) if url else '?'} did not answer: "
             f"{error}")
        return EXIT_FAILED
    except (ValueError, KeyError) as error:  # a flow that does not compile, a bad name
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        _say(f"error: {message}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
