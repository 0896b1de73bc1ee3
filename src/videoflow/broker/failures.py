"""What went wrong with a request to the broker, in the vocabulary of Unknown: auth,
unreachable, timeout, malformed or api (observation_failure)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

import nats.errors
import nats.js.errors

_AUTH_MARKERS: Final = ("authorization violation", "permissions violation",
                        "authentication", "user authentication expired")
_REFUSED_MARKERS: Final = ("connectionrefusederror", "connection refused", "connect call failed",
                           "errno 111", "noserverserror", "no servers available")


_REFUSAL_MARKERS: Final = ("authorization violation", "user authentication expired",
                           "user authentication revoked", "account authentication expired")


def credentials_refused(error: BaseException | str) -> bool:
    """Whether error (or what an error callback saw) is the broker refusing this
    client's credentials as it connects: nats-py reports the server's 'Authorization
    Violation' as a plain nats.errors.Error or AuthorizationError (NATS_FACTS §8); a
    permissions violation, which leaves the connection open, is not one."""
    if isinstance(error, nats.errors.AuthorizationError):
        return True
    text = _text(error).lower()
    return any(marker in text for marker in _REFUSAL_MARKERS)


def describe(error: BaseException) -> str:
    """'Type: message', or the type alone for an error with no message (a bare
    TimeoutError), never a dangling colon."""
    try:
        text = str(error)
    except Exception:  # a broken __str__ must not break the failure path
        text = "<str() failed>"
    name = type(error).__name__
    return f"{name}: {text}" if text else name


def _text(item: Any) -> str:
    return describe(item) if isinstance(item, BaseException) else str(item)


def observation_failure(
    error: BaseException, reported: Sequence[str | BaseException] = ()
) -> tuple[str, str]:
    """(reason, detail) for a failed observation of the broker, in the Unknown
    vocabulary: auth (credentials refused, or a permissions violation the error callback
    saw while the request timed out), unreachable (no server answered — a refused
    connect shows up as a timeout with a ConnectionRefusedError in reported), timeout
    (the server is there and slow), malformed (an answer the client could not
    interpret), api (the server answered with a JetStream API error).

    Arguments:
        error (BaseException): what the observation raised.
        reported (Sequence[str]): what the connection's error_cb saw meanwhile (strings,
            or the exceptions themselves), oldest first.

    Returns:
        (reason, detail): detail names the error and, when there are any, the reports.
    """
    described = describe(error)
    notes = [_text(r) for r in reported]
    detail = described if not notes else f"{described} (reported: {'; '.join(notes)})"
    everything = " ".join([described, *notes]).lower()
    # Auth first: a permissions violation reaches only error_cb while the request
    # itself times out (NATS_FACTS S15, §8).
    if isinstance(error, nats.errors.AuthorizationError) or any(
        m in everything for m in _AUTH_MARKERS
    ):
        return "auth", detail
    if isinstance(error, (nats.errors.NoServersError, ConnectionRefusedError)):
        return "unreachable", detail
    if isinstance(
        error, (asyncio.TimeoutError, TimeoutError, nats.errors.TimeoutError)
    ) or isinstance(error, nats.js.errors.FetchTimeoutError):
        refused = " ".join(notes).lower()
        if any(m in refused for m in _REFUSED_MARKERS):
            return "unreachable", detail
        return "timeout", detail
    if isinstance(error, nats.js.errors.APIError):
        return "api", detail
    if isinstance(
        error,
        (
            nats.errors.ConnectionClosedError,
            nats.errors.StaleConnectionError,
            nats.errors.SecureConnFailedError,
            OSError,
        ),
    ):
        return "unreachable", detail
    if isinstance(error, nats.errors.NoRespondersError):
        # The server is there; nothing serves the JetStream API subject (JetStream off,
        # wrong domain).
        return "api", detail
    if isinstance(
        error, (nats.errors.JsonParseError, nats.errors.ProtocolError, ValueError, KeyError,
                TypeError, AttributeError)
    ):
        return "malformed", detail
    return "api", detail


__all__ = ["credentials_refused", "describe", "observation_failure"]
