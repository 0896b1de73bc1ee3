"""Logging as the videoflow command and its processes set it up.

Every module logs to its own logger (``logging.getLogger(__name__)``), so a user's
configuration can raise or lower one part (``videoflow.broker.link``, say). A program
that uses videoflow as a library keeps its own logging setup: nothing here runs unless
it is called. The ``videoflow`` command calls configure() with its ``--log-format``
and ``-v``, and writes both to the environment (LOG_FORMAT_ENV, LOG_LEVEL_ENV), so the
replica processes it starts log the same way (configure() with no arguments reads
them).

Formats: ``text``, one line per record (``videoflow: <logger>: <message>``), and
``json``, one JSON object per line (time in UTC, level, logger, message, pid, and the
exception's traceback when there is one) for a log collector. A node replica's process
names its replica in each record (set_origin: ``videoflow: scale[0]: <logger>: ...``,
and ``replica`` in json). Either way a broker URL's password or token in a message is
masked (``nats://user:***@host``), and so is every secret the process was given apart
from a URL (keep_secret: the --password and --token
of the videoflow command), wherever it appears.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import sys
import time
import traceback
from typing import Any, Final

LOG_FORMAT_ENV: Final = "VIDEOFLOW_LOG_FORMAT"
LOG_LEVEL_ENV: Final = "VIDEOFLOW_LOG_LEVEL"
LOG_FORMATS: Final = ("text", "json")

TEXT_FORMAT: Final = "videoflow: %(name)s: %(message)s"

NODE_FAILURES: Final = "videoflow.core.task"
"""The logger of a node's exceptions (videoflow.core.task): the first of each type a
replica meets at WARNING, the next ones at INFO, each with its traceback. configure
lets its warnings through at the default level (ERROR), so a failing node is seen
without -v, and everything it logs with -v (WARNING)."""

# scheme://user:password@ or scheme://token@ anywhere in a text; the user part ends at
# the last '@' before the host's end (whitespace, '/', ',' between servers, a quote).
_SECRET_IN_URL: Final = re.compile(
    r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<user>[^\s/@:,'\"]*)(?P<password>:[^\s/,'\"]*)?@",
    re.IGNORECASE)


SHORTEST_SECRET: Final = 4
"""Secrets shorter than this are not masked in free text: masking 'a' would mangle
every message, and a secret that short protects nothing anyway."""

_secrets: set[str] = set()


def keep_secret(value: str) -> None:
    """Have redact_text mask value wherever it appears from now on (a password or token
    this process presents to the broker)."""
    if isinstance(value, str) and len(value) >= SHORTEST_SECRET:
        _secrets.add(value)


def redact_text(text: str) -> str:
    """text with every URL's password (or token: a user part with no password), and
    every secret kept with keep_secret, replaced by '***'."""

    def mask(found: re.Match[str]) -> str:
        if found["password"] is not None:
            return f"{found['scheme']}{found['user']}:***@"
        return f"{found['scheme']}***@"

    text = _SECRET_IN_URL.sub(mask, text)
    for secret in sorted(_secrets, key=len, reverse=True):  # the longest first
        text = text.replace(secret, "***")
    return text


class RedactingFormatter(logging.Formatter):
    """The text format, with secrets in URLs masked; in a node replica's process, the
    replica named after 'videoflow: ' (set_origin)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if _origin is not None and text.startswith("videoflow: "):
            text = f"videoflow: {_origin}: {text[len('videoflow: '):]}"
        return redact_text(text)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, pid,
    and exception (the formatted traceback) when the record carries one; secrets in
    URLs masked."""

    def format(self, record: logging.LogRecord) -> str:
        document = _document(record.created, record.levelname, record.name,
                             record.getMessage(), record.process)
        if _origin is not None:
            document["replica"] = _origin
        if record.exc_info:
            document["exception"] = redact_text(self.formatException(record.exc_info))
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, default=str)


def _document(created: float, level: str, logger: str, message: str, pid: int | None
              ) -> dict[str, Any]:
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    return {"time": moment.isoformat(timespec="milliseconds"), "level": level,
            "logger": logger, "message": redact_text(message), "pid": pid}


_origin: str | None = None


def set_origin(origin: str | None) -> None:
    """Name this process's log records after the node replica it runs ('scale[0]'),
    so that lines alike from several replicas (a broker outage each of them sees) tell
    whose they are: the text format says it after 'videoflow: ', the json format as
    'replica'. None: no name."""
    global _origin
    _origin = origin


def json_line(logger: str, message: str, level: str = "INFO", **fields: Any) -> str:
    """One line in the json format's shape, for what is written beside the logs rather
    than through them (the run's progress off a terminal): time, level, logger,
    message, pid, then fields."""
    return json.dumps({**_document(time.time(), level, logger, message, os.getpid()),
                       **fields}, default=str)


def say(message: str, level: str = "INFO", error: BaseException | None = None,
        **fields: Any) -> None:
    """What the videoflow command says on stderr whatever the log level (its one error
    line, where its metrics are served), secrets masked: 'videoflow: <message>' (then
    error's traceback, when given), or, when logs are json, one record in their shape
    (logger 'videoflow', the traceback as 'exception', and fields)."""
    if in_json():
        if error is not None:
            fields["exception"] = redact_text("".join(
                traceback.format_exception(type(error), error, error.__traceback__)))
        line = json_line("videoflow", message, level, **fields)
    else:
        line = f"videoflow: {redact_text(message)}"
        if error is not None:
            line += "\n" + "".join(traceback.format_exception(
                type(error), error, error.__traceback__)).rstrip("\n")
    print(line, file=sys.stderr, flush=True)


def in_json() -> bool:
    """Whether the videoflow command chose json logs (for this process and the ones it
    starts: LOG_FORMAT_ENV)."""
    return os.environ.get(LOG_FORMAT_ENV) == "json"


def configure(log_format: str | None = None, level: int | None = None) -> None:
    """Send the root logger's records to stderr in log_format, at level; a node's
    exceptions (NODE_FAILURES) one step more: its first of each type (WARNING) above
    WARNING, every one (INFO) at WARNING.

    Arguments:
        log_format: 'text' or 'json'; None reads LOG_FORMAT_ENV, else 'text'.
        level: a logging level; None reads LOG_LEVEL_ENV (a level name), else ERROR.

    Raises:
        ValueError: an unknown format or level name.
    """
    if log_format is None:
        log_format = os.environ.get(LOG_FORMAT_ENV) or "text"
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, "
                         f"got {log_format!r}")
    if level is None:
        name = (os.environ.get(LOG_LEVEL_ENV) or "ERROR").upper()
        named = logging.getLevelName(name)
        if not isinstance(named, int):
            raise ValueError(f"{LOG_LEVEL_ENV}: not a logging level: {name!r}")
        level = named
    global _installed
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else RedactingFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    # Only the handler an earlier call installed is replaced: one a host program (or a
    # test harness) added stays.
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(level)
    _installed = handler
    logging.getLogger(NODE_FAILURES).setLevel(
        logging.WARNING if level > logging.WARNING else min(level, logging.INFO))


_installed: logging.Handler | None = None


def hand_down(log_format: str, level: int) -> None:
    """Write the choice to the environment, for the processes this one starts."""
    os.environ[LOG_FORMAT_ENV] = log_format
    os.environ[LOG_LEVEL_ENV] = logging.getLevelName(level)


__all__ = ["LOG_FORMATS", "LOG_FORMAT_ENV", "LOG_LEVEL_ENV", "NODE_FAILURES", "JsonFormatter",
           "RedactingFormatter", "SHORTEST_SECRET", "configure", "hand_down", "keep_secret",
           "redact_text"]
