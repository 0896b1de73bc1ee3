"""What the commands share: the broker URL option and its default, exit codes, the
one-line CommandError, the parser class that takes the global options after a command's
name, and the argparse types for counts, seconds and budgets."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Final, NoReturn

from videoflow.broker.link import check_budget
from videoflow.broker.options import (
    CONTEXT_ENV,
    CREDS_ENV,
    NKEY_ENV,
    PASSWORD_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    USER_ENV,
    context_url,
)
from videoflow.broker.urls import servers_of
from videoflow.errors import VideoflowError
from videoflow.logs import LOG_FORMAT_ENV, LOG_FORMATS, json_line

ENV_NATS_URL: Final = "VIDEOFLOW_NATS_URL"
DEFAULT_NATS_URL: Final = "nats://127.0.0.1:4222"

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_DEAD_LETTERS: Final = 3
"""`videoflow run --fail-on-dead-letters`: the run did all it could, and dead-lettered
inputs (1, 130 and 4 say more, and come first)."""
EXIT_UNFINISHED: Final = 4
"""`videoflow run`: the run ended with work left over, kept for --resume, and neither
failed nor was interrupted (either says so first: 1, 130)."""
EXIT_SIGNALLED: Final = 128
"""Plus the signal's number: what `videoflow run` exits with when a signal stopped it
(130 for Ctrl-C's SIGINT, 143 for SIGTERM), as a shell reports a command one ended."""
EXIT_BROKEN_PIPE: Final = 141
"""What a shell reports for a command its reader stopped reading (128 + SIGPIPE), as
for `head` closing the pipe of a listing."""

VERBOSE_HELP: Final = ("also log the library's warnings (retries, reconnects) and every "
                       "exception a node raises (the first of each type is logged anyway)")
LOG_FORMAT_HELP: Final = ("how logs are written to stderr: text lines, or one JSON object per "
                          "line for a log collector (default: text)")


class VideoflowParser(argparse.ArgumentParser):
    """The command's parsers: with json logs asked for (json_errors), a usage error is
    one record in the logs' shape, as the command's other errors are, not argparse's
    usage and line."""

    json_errors = False
    """Set by the command from its arguments before they are parsed (asks_json)."""

    def error(self, message: str) -> NoReturn:
        if VideoflowParser.json_errors:
            print(json_line("videoflow", f"error: {self.prog}: {message}", "ERROR"),
                  file=sys.stderr, flush=True)
            self.exit(EXIT_USAGE)
        super().error(message)


def asks_json(argv: Sequence[str]) -> bool:
    """Whether argv (or LOG_FORMAT_ENV) asks for json logs, read before argparse parses
    it: a usage error in the same arguments is then a json record."""
    argv = list(argv)
    return (os.environ.get(LOG_FORMAT_ENV) == "json" or "--log-format=json" in argv
            or ("--log-format", "json") in itertools.pairwise(argv))


class CommandParser(VideoflowParser):
    """A command's parser: the global options (-v, --log-format, the broker's TLS and
    credentials) are taken after the command's name too. Their default here is
    SUPPRESS, so a flag given before the name is not reset when the command's own
    arguments are parsed. Nested commands (dlq list) get this
    class too (argparse makes subparsers of their parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                          help=VERBOSE_HELP)
        self.add_argument("--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS,
                          help=LOG_FORMAT_HELP)
        connection_arguments(self, default=argparse.SUPPRESS)


class CommandError(VideoflowError):
    """A problem the command reports in one line (exit code in .code)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def stdout_for_the_document(document: bool) -> Iterator[None]:
    """With document (--json), what anyone writes to stdout while the block runs --
    the command, the nodes it runs, the replica processes it starts (they inherit the
    descriptor) -- goes to stderr instead, so stdout holds only the JSON document
    printed after the block. Without, nothing changes."""
    if not document:
        yield
        return
    sys.stdout.flush()
    try:
        kept = os.dup(1)
    except OSError:  # no descriptor 1 to keep (a closed stdout): Python's own only
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    try:
        sys.stderr.flush()
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        try:
            # What was written meanwhile goes where it was meant to: stderr.
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
        finally:  # a second Ctrl-C in the flush must not leave stdout on stderr
            os.dup2(kept, 1)
            os.close(kept)


def nats_url_option(parser: argparse.ArgumentParser, required_default: bool = True) -> None:
    """--nats-url, defaulting to VIDEOFLOW_NATS_URL, then the --context's URL, then the
    local default port when required_default (resolve_nats_url, once the command's
    flags are all known)."""
    parser.add_argument("--nats-url", default=None,
                        help="the NATS server (default: $VIDEOFLOW_NATS_URL, else the "
                             "--context's URL"
                             + (f", else {DEFAULT_NATS_URL})" if required_default
                                else ", else the embedded server)"))
    parser.set_defaults(nats_url_fallback=DEFAULT_NATS_URL if required_default else None)


def resolve_nats_url(args: argparse.Namespace) -> None:
    """Set args.nats_url, for a command that takes one: --nats-url, else
    VIDEOFLOW_NATS_URL, else the URL of the nats context named (--context), else the
    command's fallback (nats_url_option; None: the embedded server). Call it once the
    connection flags are handed down (hand_down_connection).

    Raises:
        ValueError: the named context cannot be read.
        CommandError: the URL is no broker URL (a usage error, exit 2: servers_of says
            what is wrong with it), before anything tries to connect.
    """
    if not hasattr(args, "nats_url"):
        return
    args.nats_url = (args.nats_url or os.environ.get(ENV_NATS_URL) or context_url()
                     or getattr(args, "nats_url_fallback", None))
    if args.nats_url is not None:
        try:
            servers_of(args.nats_url)
        except ValueError as error:
            raise CommandError(str(error)) from None


def replicas_option(parser: argparse.ArgumentParser) -> None:
    """--replicas: the copies a clustered broker keeps of the run's streams."""
    parser.add_argument("--replicas", type=replica_count, default=1, metavar="N",
                        help="copies a NATS cluster keeps of the run's streams, its "
                             "dead-letter stream and the flow's buckets (default: 1; 3 "
                             "on a 3-node cluster rides out the loss of any one node)")


def replica_count(text: str) -> int:
    """An argparse type: a replica count from 1 to 5 (JetStream's limit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 5:
        raise argparse.ArgumentTypeError(f"must be from 1 to 5, got {value}")
    return value


CONNECTION_FLAGS: Final = (
    ("--tls-ca", TLS_CA_ENV, "a PEM file of the authorities that sign the broker's "
                             "certificate (default: the system's)"),
    ("--tls-cert", TLS_CERT_ENV, "this client's certificate (PEM), for a broker that "
                                 "verifies its clients; with --tls-key"),
    ("--tls-key", TLS_KEY_ENV, "the client certificate's private key (PEM)"),
    ("--creds", CREDS_ENV, "a NATS credentials file (a user JWT and its nkey seed)"),
    ("--nkey", NKEY_ENV, "a file holding a user's nkey seed"),
    ("--user", USER_ENV, "the user to connect as; with --password"),
    ("--password", PASSWORD_ENV, "the user's password (prefer the variable: a flag shows "
                                 "in the process list)"),
    ("--token", TOKEN_ENV, "the broker's authorization token (prefer the variable)"),
    ("--context", CONTEXT_ENV, "a nats CLI context by name: its URL and credentials, where "
                               "none are given"),
)
"""The broker's TLS and credential flags, each with the variable it writes
(videoflow.broker.options), so every connection of the command, and of the replicas and
workers it starts, uses them."""

FILE_FLAGS: Final = ("--tls-ca", "--tls-cert", "--tls-key", "--creds", "--nkey")
SECRET_FLAGS: Final = ("--password", "--token")
_METAVARS: Final = {"--user": "NAME", "--password": "SECRET", "--token": "SECRET",
                    "--context": "NAME"}


def readable_file(text: str) -> str:
    """An argparse type: a file that exists and can be read, as an absolute path (the
    replicas a run starts may run elsewhere in the tree)."""
    path = os.path.abspath(text)
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"not a readable file: {text!r}")
    return path


def connection_arguments(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """Add the broker's TLS and credential flags (CONNECTION_FLAGS) to parser."""
    for flag, variable, help_text in CONNECTION_FLAGS:
        if flag in FILE_FLAGS:
            parser.add_argument(flag, type=readable_file, default=default, metavar="FILE",
                                help=f"{help_text} (also ${variable})")
        else:
            parser.add_argument(flag, type=_not_empty, default=default,
                                metavar=_METAVARS[flag], help=f"{help_text} (also ${variable})")


def _not_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


CREDENTIAL_METHODS: Final = ((CREDS_ENV,), (NKEY_ENV,), (USER_ENV, PASSWORD_ENV),
                              (TOKEN_ENV,))
"""The ways of authenticating, by the variables each is given in."""


def hand_down_connection(args: argparse.Namespace) -> None:
    """Write the connection flags given to the environment (see CONNECTION_FLAGS). A
    way of authenticating given by flags wins over another one the environment gives:
    the variables of the others are removed (`--token` with VIDEOFLOW_NATS_PASSWORD
    set presents the token), while the flag and the variable of one way combine
    (`--user vf` with VIDEOFLOW_NATS_PASSWORD set)."""
    given = set()
    for flag, variable, _ in CONNECTION_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None:
            os.environ[variable] = value
            given.add(variable)
    chosen = [method for method in CREDENTIAL_METHODS if given.intersection(method)]
    if len(chosen) == 1:
        for method in CREDENTIAL_METHODS:
            if method is not chosen[0]:
                for variable in method:
                    os.environ.pop(variable, None)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (nan, inf and -5 are
    refused)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0 (a speed multiple)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535 (0: one the OS picks)."""
    value = whole_number(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {value}")
    return value


def metrics_option(parser: argparse.ArgumentParser) -> None:
    """--metrics-port: serve Prometheus metrics while the command runs."""
    parser.add_argument(
        "--metrics-port", type=port_number, metavar="PORT",
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics while it runs "
             "(0: a free port, said on stderr; default: $VIDEOFLOW_METRICS_PORT, else "
             "none; $VIDEOFLOW_METRICS_HOST=0.0.0.0 to be scraped from elsewhere); needs "
             "prometheus-client")


def whole_number(minimum: int) -> Any:
    """An argparse type: a whole number of at least minimum."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def budget_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        return check_budget(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds >= 0, got {text!r}") from None
