"""A connection that rides out its broker: server lists, the outage budget, and the one
connect every long-lived connection of videoflow goes through (the JetStream backend,
the KV ledger, the payload store, the operator commands).

nats-py has one retry setting for the first connect and for reconnects alike
(max_reconnect_attempts; NATS_FACTS S4, §8). videoflow wants both: the first connect
fails fast (a wrong URL is reported in a tenth of a second, not retried for two
minutes), and once connected the client reconnects for as long as the outage budget
allows. So connect() connects with the fail-fast options and, once connected, turns the
client's own reconnect settings to "forever" (its options dict is read afresh at every
attempt, aio/client.py _select_next_server); the budget is enforced here, by a watchdog
that closes the client once its broker has been away for longer than the budget.

A broker that stops answering without closing the socket (a frozen process, a lost
route) is found by the client's pings: every PING_SECONDS, and given up as a stale
connection after MAX_OUTSTANDING_PINGS unanswered, which starts the same reconnect.

Each outage is logged as a warning (this module's logger, videoflow.broker.link, which
`videoflow -v` shows) once as it begins (the broker, and how long the connection will
wait for it), once as it ends (how long the broker was away) and once if the connection
is given up (a warning too: whoever uses the connection fails with that reason and
reports it); never once per reconnect attempt. A request retried with the connection
up is a warning too, at most one per connection every TRANSIENT_RETRY_SECONDS
(wait_back). Every connection of a process logs its own, its broker's URL redacted
(redact_url).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from videoflow.broker.client import CLIENT_CLASS
from videoflow.broker.failures import (
    credentials_refused,
    describe,
    observation_failure,
    tls_refusal,
)
from videoflow.broker.options import auth_options, presented_credentials
from videoflow.broker.urls import redact_url, servers_of
from videoflow.errors import BrokerUnavailable, CredentialsRefused, IncompatibleProfile

logger = logging.getLogger(__name__)

DEFAULT_OUTAGE_BUDGET_SECONDS: Final = 60.0
"""How long a connection waits for its broker to come back before it gives up."""

OUTAGE_BUDGET_ENV: Final = "VIDEOFLOW_OUTAGE_BUDGET"
"""The environment variable that overrides DEFAULT_OUTAGE_BUDGET_SECONDS (seconds)."""

BROKER_KNOWN_ENV: Final = "VIDEOFLOW_BROKER_KNOWN"
"""Set to 1 in a replica's process: its broker is known to exist (its run was
provisioned on it), so a first connect that finds it away waits for it, within the
outage budget, instead of failing fast as a mistyped URL should."""

RECOVERY_SECONDS: Final = 15.0
"""After the broker is back, how long outcomes it left unknown may still be pursued:
the acknowledgements, publications and ledger writes of the outage resolve in it."""

RECONNECT_FIRST_WAIT: Final = 0.1
RECONNECT_MAX_WAIT: Final = 1.0
"""The wait between reconnect attempts to one server: RECONNECT_FIRST_WAIT, doubling
with each second of the outage, up to RECONNECT_MAX_WAIT."""

PING_SECONDS: Final = 3
MAX_OUTSTANDING_PINGS: Final = 2
"""A broker that answers no ping for about (MAX_OUTSTANDING_PINGS + 1) * PING_SECONDS
is taken for gone and reconnected to (nats-py's default finds a frozen broker after
six minutes)."""

WATCH_SECONDS: Final = 0.25
"""How often the watchdog looks at an outage."""

def outage_budget_from_env(default: float = DEFAULT_OUTAGE_BUDGET_SECONDS) -> float:
    """The outage budget VIDEOFLOW_OUTAGE_BUDGET sets, else default.

    Raises:
        ValueError: the variable is set but not a finite number >= 0.
    """
    text = os.environ.get(OUTAGE_BUDGET_ENV)
    if text is None or not text.strip():
        return default
    try:
        return check_budget(float(text))
    except ValueError:
        raise ValueError(f"{OUTAGE_BUDGET_ENV} must be a finite number of seconds >= 0, "
                         f"got {text!r}") from None


def broker_known_from_env() -> bool:
    """Whether BROKER_KNOWN_ENV says this process's broker is known to exist."""
    return os.environ.get(BROKER_KNOWN_ENV, "").strip() == "1"



def check_budget(budget: float) -> float:
    """budget, once checked to be a finite number of seconds >= 0.

    Raises:
        ValueError: it is not.
    """
    if (isinstance(budget, bool) or not isinstance(budget, (int, float))
            or not 0 <= budget < float("inf")):
        raise ValueError(f"the outage budget must be a finite number of seconds >= 0, "
                         f"got {budget!r}")
    return float(budget)


class Outage:
    """Whether a connection's broker is away, since when, and for how long it may be.

    Arguments:
        budget: seconds the broker may be away before the connection is given up
            (0: at once, as a connection without reconnects).
        where: the broker, for messages.
        clock: monotonic seconds.
        known: the broker is known to exist (a replica of a provisioned run): a first
            connect that finds it away is made again within the budget.
        what: the connection, as the log lines name it ('the payload store's
            connection'): a process holds several, whose outages are logged alike.

    Attributes:
        down_since: when the current outage began, None while connected.
        back_at: when the latest outage ended, None before any.
        given_up: why the connection was given up (the budget ran out), else None.
        retry_noted: when a request retried with the connection up was last logged
            (wait_back), None before any.
    """

    def __init__(self, budget: float = DEFAULT_OUTAGE_BUDGET_SECONDS, where: str = "",
                 clock: Callable[[], float] = time.monotonic, known: bool = False,
                 what: str = "the connection") -> None:
        self.budget = check_budget(budget)
        self.where, self.what = where, what
        self.clock = clock
        self.known = known
        self.down_since: float | None = None
        self.back_at: float | None = None
        self.given_up: str | None = None
        self.retry_noted: float | None = None
        self.on_back: list[Callable[[], None]] = []  # called on the loop as it returns
        self._watch: asyncio.Task[None] | None = None

    def first_connect_bound(self, connect_timeout: float) -> float:
        """How long a first connect may take in all: connect_timeout, plus the budget
        for a known broker (whose first connect waits for it)."""
        return connect_timeout + (self.budget if self.known else 0.0)

    @property
    def away(self) -> bool:
        return self.down_since is not None

    def pursue_until(self) -> float:
        """Until when (monotonic) an outcome the outage left unknown or unsent may still
        be pursued: while the broker is away, until the budget runs out; once it is
        back, RECOVERY_SECONDS more; 0.0 without a recent outage or once given up."""
        if self.given_up is not None:
            return 0.0
        if self.down_since is not None:
            return self.down_since + self.budget + RECOVERY_SECONDS
        if self.back_at is not None:
            return self.back_at + RECOVERY_SECONDS
        return 0.0

    def went_away(self) -> bool:
        """Record that the broker is away (a second report of the same outage changes
        nothing).

        Returns:
            whether this began an outage.
        """
        if self.down_since is not None:
            return False
        self.down_since = self.clock()
        return True

    def came_back(self) -> float | None:
        """Record that the broker is back, and run the on_back callbacks.

        Returns:
            how long it was away, in seconds; None when no outage was on record.
        """
        away = None
        if self.down_since is not None:
            away = max(self.clock() - self.down_since, 0.0)
            self.down_since, self.back_at = None, self.clock()
        for callback in list(self.on_back):
            callback()
        return away

    def overdue(self) -> bool:
        """Whether the current outage has outlasted the budget."""
        return self.down_since is not None and self.clock() - self.down_since > self.budget

    def reason(self) -> str:
        """Why the connection was given up, in words an operator can act on."""
        return (f"the broker {redact_url(self.where)} was unreachable for more than "
                f"{self.budget:g} s (the outage budget; raise it with --outage-budget, "
                f"outage_budget= or {OUTAGE_BUDGET_ENV})")

    def reconnect_wait(self) -> float:
        """The wait between reconnect attempts now: short at first, longer as the
        outage goes on."""
        if self.down_since is None:
            return RECONNECT_FIRST_WAIT
        doublings = int(max(self.clock() - self.down_since, 0.0))
        return min(RECONNECT_MAX_WAIT, RECONNECT_FIRST_WAIT * 2 ** min(doublings, 8))

    async def watch(self, client: Client) -> None:
        """Give the client up once an outage outlasts the budget (closing it fails
        everything waiting on it at once); meanwhile, lengthen its reconnect wait."""
        while not client.is_closed:
            await asyncio.sleep(WATCH_SECONDS)
            client.options["reconnect_time_wait"] = self.reconnect_wait()
            if self.overdue():
                self.given_up = self.reason()
                # A warning, not an error: whoever uses the connection fails with this
                # reason and says so (a command's one error line, a run's report).
                logger.warning("gave up %s: %s", self.what, self.given_up)
                with contextlib.suppress(Exception):
                    await client.close()
                return


TRANSIENT_RETRY_SECONDS: Final = 20.0
"""How long a request that failed transiently is tried again without an outage on
record: a cluster electing a stream's or the meta leader answers 'no responders' or
'JetStream unavailable' for a few seconds (about 5 s seen), with the connection up."""


def transient(error: BaseException) -> bool:
    """Whether a failed request may succeed if simply made again: a timeout, the
    connection lost or reconnecting, no responders (a stream or KV bucket between two
    leaders), or the JetStream API answering 503 (not ready after a restart, no
    leader). A closed connection counts too: the caller asks the outage whether it
    was given up."""
    if isinstance(error, nats.js.errors.APIError):
        return error.code == 503
    return isinstance(error, (
        asyncio.TimeoutError, TimeoutError, nats.errors.TimeoutError,
        nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
        nats.errors.NoRespondersError, nats.errors.StaleConnectionError,
        nats.errors.FlushTimeoutError, nats.errors.OutboundBufferLimitError,
        nats.js.errors.NoStreamResponseError, ConnectionError,
    ))


def retry_until(outage: Outage, started: float) -> float:
    """Until when (monotonic) a request first made at `started` that failed
    transiently may be made again: TRANSIENT_RETRY_SECONDS, or as long as the
    outage extends it; 0.0 once the connection was given up."""
    if outage.given_up is not None:
        return 0.0
    return max(started + TRANSIENT_RETRY_SECONDS, outage.pursue_until())


def wait_back(client: Client, outage: Outage, until: float, step: float = 0.1,
              error: BaseException | None = None) -> None:
    """Block the calling thread (never the client's loop) until the client is
    connected again, `until` (monotonic) passes, or the connection is given up.

    A request retried with the connection up (a stream between two leaders, JetStream
    not ready yet after a restart) is logged as a warning, at most once per
    TRANSIENT_RETRY_SECONDS per connection; one retried while the broker is away is
    the outage's to log (its lost and back lines).

    Arguments:
        error: the failure being retried, for the warning; None: the exception being
            handled (the retry ladders call this from their except blocks).
    """
    if client.is_connected and outage.given_up is None:
        _note_retry(outage, error if error is not None else sys.exc_info()[1], until)
    while (not client.is_connected and outage.given_up is None
           and outage.clock() < until and not client.is_closed):
        time.sleep(step)
    time.sleep(min(step, max(until - outage.clock(), 0.0)))


def _note_retry(outage: Outage, error: BaseException | None, until: float) -> None:
    """The warning for a request retried with the connection up, unless this
    connection gave one less than TRANSIENT_RETRY_SECONDS ago."""
    now = outage.clock()
    if outage.retry_noted is not None and now - outage.retry_noted < TRANSIENT_RETRY_SECONDS:
        return
    outage.retry_noted = now
    failure = "" if error is None else f" ({describe(error)})"
    logger.warning("a request to the broker at %s failed with the connection up%s; "
                   "trying again for up to %.0f s", redact_url(outage.where), failure,
                   max(until - now, 0.0))


async def check_bucket_replicas(js: Any, stream: str, bucket: str, replicas: int) -> None:
    """Read back the copies a KV bucket or object store (its stream) keeps, as the run's
    streams are read back: an existing bucket is bound as it is, so one made with fewer
    copies than asked for would quietly keep the flow's ledger or payloads on fewer
    servers than its streams. A 'stream not found' is asked again for READ_BACK_SECONDS:
    the caller has just bound the bucket, so it is a server not caught up yet.

    Raises:
        IncompatibleProfile: it keeps fewer than replicas; the message says how to mend.
        nats.js.errors.NotFoundError: the stream stayed missing past READ_BACK_SECONDS.
    """
    if replicas <= 1:
        return
    info = await _bound_stream_info(js, stream)
    kept = int(getattr(info.config, "num_replicas", None) or 1)
    if kept < replicas:
        raise IncompatibleProfile(
            f"bucket {bucket!r} keeps {kept} cop{'y' if kept == 1 else 'ies'}, the run asks "
            f"for {replicas}: remove the flow's buckets (`videoflow buckets remove`) so they "
            "are made again, or run with the replicas they have",
            channel=bucket, findings=(f"num_replicas {kept} < {replicas}",))


READ_BACK_SECONDS: Final = 10.0
"""How long a bucket's read-back may answer 'stream not found' after the bucket was
bound: on a cluster that lost a server, a server whose view of the streams has not
caught up answers 404 for a stream that exists."""


async def _bound_stream_info(js: Any, stream: str) -> Any:
    """stream_info of a stream the caller has just bound, asked again while the
    cluster answers 404 for it (READ_BACK_SECONDS), then the 404 as it came."""
    deadline = time.monotonic() + READ_BACK_SECONDS
    while True:
        try:
            return await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


ErrorCallback = Callable[[BaseException], Awaitable[None]]


async def connect(
    url: str,
    connect_timeout: float,
    error_cb: ErrorCallback,
    outage: Outage | None = None,
    **options: Any,
) -> Client:
    """Connect to the first server of url that answers, failing fast, then reconnect
    after any outage for as long as outage's budget allows.

    Arguments:
        url: one server or several, comma-separated (servers_of).
        connect_timeout: the bound of the whole first connect, in seconds (> 0).
        error_cb: the client's error callback (every failed attempt reaches it).
        outage: tracks this connection's outages and holds its budget; None keeps no
            record and gives a broker DEFAULT_OUTAGE_BUDGET_SECONDS.
        **options: further nats.connect keyword arguments.

    Returns:
        a connected client.

    Raises:
        CredentialsRefused: the broker refused the credentials (never waited for).
        TLSRefused: the TLS connection asked for cannot be made (failures.tls_refusal;
            never waited for either).
        BrokerUnavailable: no server answered within connect_timeout (refused, a hung
            handshake); the message names the servers.
        ValueError: an empty server list; credentials that contradict each other
            (auth_options).
        MissingDependency: as auth_options.
    """
    servers_of(url)  # ValueError before anything starts
    tracked = outage if outage is not None else Outage(where=url)
    if not tracked.where:
        tracked.where = url
    seen: list[BaseException] = []

    async def record(error: BaseException) -> None:
        seen.append(error)
        del seen[:-8]
        await error_cb(error)

    connected: list[Client] = []  # the client, once its first connect succeeded

    async def disconnected() -> None:
        # nats-py calls this at every close as well: only a client that is
        # reconnecting lost its broker (a close, the watchdog's included, is its
        # owner's doing, and the watchdog logs its own).
        began = tracked.went_away()
        if began and connected and connected[0].is_reconnecting:
            logger.warning("lost %s to the broker at %s; reconnecting for up to %g s "
                           "(the outage budget)", tracked.what, redact_url(url),
                           tracked.budget)

    async def reconnected() -> None:
        away = tracked.came_back()
        if away is not None:
            _log_back(connected[0] if connected else None, url, away, tracked.what)

    settings: dict[str, Any] = {
        # NATS_FACTS §8: fail fast on the first connect (NoServersError after two
        # refused attempts per server, a bare TimeoutError on a hung handshake).
        "allow_reconnect": True,
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": RECONNECT_FIRST_WAIT,
        "connect_timeout": max(min(2.0, connect_timeout), 0.1),
        "ping_interval": PING_SECONDS,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        "error_cb": record,
        "disconnected_cb": disconnected,
        "reconnected_cb": reconnected,
        **auth_options(url),
    }
    settings.update(options)
    while True:
        try:
            client = await asyncio.wait_for(connect_or_refused(url, **settings),
                                            connect_timeout)
            break
        except CredentialsRefused:  # TLSRefused too: waiting mends neither
            raise
        except Exception as error:
            reason, detail = observation_failure(error, list(seen))
            if seen and all(isinstance(e, TimeoutError) for e in seen):
                # Connected, but no INFO came: something else listens on that port.
                detail += ("; nothing there answered as a NATS server would: is it "
                           "the broker's client port?")
            if reason == "auth" and any(credentials_refused(e) for e in [error, *seen]):
                raise refusal(url) from error
            if not _wait_for_known(tracked, reason):
                raise BrokerUnavailable(
                    f"cannot connect to {redact_url(url)} ({reason}): {detail}") from error
            await asyncio.sleep(RECONNECT_MAX_WAIT)
    connected.append(client)
    if tracked.away:
        away = tracked.came_back()
        if away is not None:
            _log_back(client, url, away, tracked.what)
    if tracked.budget > 0:
        # Connected: from now on, reconnect until the watchdog gives up.
        client.options["max_reconnect_attempts"] = -1
        tracked._watch = asyncio.get_running_loop().create_task(
            tracked.watch(client), name="videoflow-outage-watch")
    else:
        client.options["allow_reconnect"] = False
    return client


def _log_back(client: Client | None, url: str, away: float, what: str) -> None:
    """The one line that says a connection's broker is back, and after how long."""
    server = getattr(client, "connected_url", None)
    at = redact_url(server.geturl()) if server is not None else redact_url(url)
    logger.warning("%s to the broker at %s is back after %.1f s", what, at, away)


def refusal(url: str) -> CredentialsRefused:
    """The error for a broker at url that refused this process's credentials: what was
    presented (never the secret itself) and where it came from."""
    return CredentialsRefused(
        f"the broker at {redact_url(url)} refused the credentials (authorization "
        f"violation); presented: {presented_credentials(url)}")


async def connect_or_refused(url: str, **options: Any) -> Client:
    """nats.connect to the servers of url with options, given up at the first refusal
    that waiting cannot mend: the credentials refused, or a TLS connection that cannot
    be made as asked (failures.tls_refusal). A client that retries its first connect
    (the provision Job, whose broker may still be starting, retries for ever) would
    otherwise take a refusal for a broker not there yet and wait on it; and after an
    untrusted certificate, nats-py's next attempt hangs until the caller's bound.

    Raises:
        CredentialsRefused: the broker refused the credentials.
        TLSRefused: as failures.tls_refusal.
        as nats.connect otherwise.
    """
    refused: asyncio.Future[tuple[BaseException, BaseException]] = (
        asyncio.get_running_loop().create_future())
    theirs = options.get("error_cb")

    async def error_cb(error: BaseException) -> None:
        final = _final_refusal(error, url, client.certificate_asked)
        if final is not None and not refused.done():
            refused.set_result((final, error))
        if theirs is not None:
            await theirs(error)

    # A client given up before it connected is closed here, which is no disconnect
    # of the caller's: its callbacks hear only of a client that did connect.
    callbacks = {name: _once_connected(options[name], lambda: connecting)
                 for name in ("disconnected_cb", "closed_cb") if options.get(name)}
    client = CLIENT_CLASS()
    connecting = asyncio.ensure_future(client.connect(
        servers_of(url), **{**options, **callbacks, "error_cb": error_cb}))
    try:
        either: set[asyncio.Future[Any]] = {connecting, refused}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not connecting.done():  # refused, or the caller gave up waiting
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await connecting
            with contextlib.suppress(Exception):
                await client.close()
    if refused.done():
        if connecting.done() and not connecting.cancelled():
            connecting.exception()  # read: the refusal says what failed, not asyncio
        with contextlib.suppress(Exception):
            await client.close()
        final, cause = refused.result()
        if final is cause:
            raise final
        raise final from cause
    try:
        await connecting  # what the connect raised, if it did
    except Exception as error:  # without reconnects, nats-py raises the attempt's own
        given_up = _final_refusal(error, url, client.certificate_asked)
        if given_up is None or given_up is error:
            raise
        raise given_up from error
    return client


def _once_connected(callback: Callable[[], Awaitable[None]],
                    connecting: Callable[[], asyncio.Future[Any]]
                    ) -> Callable[[], Awaitable[None]]:
    """callback, called only once the first connect (connecting()) succeeded."""
    async def called() -> None:
        first = connecting()
        if first.done() and not first.cancelled() and first.exception() is None:
            await callback()
    return called


def _final_refusal(error: BaseException, url: str,
                   certificate_asked: bool = False) -> CredentialsRefused | None:
    """The error a connect gives up with at once when an attempt failed with error,
    None when another attempt may succeed (certificate_asked: as tls_refusal's)."""
    if credentials_refused(error):
        return refusal(url)
    return tls_refusal(error, redact_url(url), certificate_asked)


def _wait_for_known(outage: Outage, reason: str) -> bool:
    """Whether a first connect that failed for reason is made again: only to a known
    broker found away (refused or silent, never credentials refused), within the
    budget counted from the first failure."""
    if not outage.known or reason not in ("unreachable", "timeout"):
        return False
    if outage.went_away():
        logger.warning("the broker at %s does not answer (%s); waiting for it for up to "
                       "%g s (the outage budget)", redact_url(outage.where), reason,
                       outage.budget)
    assert outage.down_since is not None
    return outage.clock() - outage.down_since < outage.budget


__all__ = [
    "BROKER_KNOWN_ENV",
    "DEFAULT_OUTAGE_BUDGET_SECONDS",
    "OUTAGE_BUDGET_ENV",
    "READ_BACK_SECONDS",
    "RECOVERY_SECONDS",
    "TRANSIENT_RETRY_SECONDS",
    "Outage",
    "broker_known_from_env",
    "check_bucket_replicas",
    "check_budget",
    "connect",
    "connect_or_refused",
    "outage_budget_from_env",
    "refusal",
    "retry_until",
    "redact_url",
    "servers_of",
    "transient",
    "wait_back",
]
