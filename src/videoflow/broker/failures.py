"""What went wrong with a request to the broker: the JetStream API error codes videoflow
tells apart (JSErrorCode), and a failure in the vocabulary of Unknown: missing, auth,
unreachable, timeout, malformed or api (unknown_from, observation_failure).

The one place in the package a JetStream error code is written as a number, as
nats.py keeps its codes in js/errors.py: everything else names a JSErrorCode member."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, Final

import nats.errors
import nats.js.errors

from videoflow.errors import TLSRefused
from videoflow.observation import Unknown, UnknownReason


class JSErrorCode(IntEnum):
    """A JetStream API error's err_code (nats.js.errors.APIError.err_code), as the
    server's errors.json numbers it; the server's own name beside each. An IntEnum, so
    a member compares equal to the plain int nats-py hands back."""

    CONSUMER_NOT_FOUND = 10014
    """JSConsumerNotFoundErr (404): the durable does not exist (NATS_FACTS §7)."""
    MESSAGE_NOT_FOUND = 10037
    """JSNoMessageFoundErr (404): STREAM.MSG.GET / MSG.DELETE for a sequence the stream
    does not hold."""
    MESSAGE_TOO_LARGE = 10054
    """JSStreamMessageExceedsMaximumErr (400): a message over max_msg_size, headers
    counted (NATS_FACTS S9); waiting never helps."""
    MESSAGE_DELETE_FAILED = 10057
    """JSStreamMsgDeleteFailedF (500): STREAM.MSG.DELETE failed; 'no message found'
    when the sequence is already gone."""
    STREAM_NAME_IN_USE = 10058
    """JSStreamNameExistErr (400): add_stream for a name already in use with a different
    configuration."""
    STREAM_NOT_FOUND = 10059
    """JSStreamNotFoundErr (404): the stream does not exist (NATS_FACTS §7)."""
    STREAM_NOT_MATCH = 10060
    """JSStreamNotMatchErr (400): the publish's expected stream is not the one that
    captured it (NATS_FACTS §2)."""
    WRONG_LAST_SEQUENCE = 10071
    """JSStreamWrongLastSequenceErrF (400): a compare-and-swap (KV update with last=)
    lost to another writer."""
    REPLICAS_UNSUPPORTED = 10074
    """JSStreamReplicasNotSupportedErr (500): replicas > 1 on a standalone server
    (NATS_FACTS §4)."""
    STORE_FAILED = 10077
    """JSStreamStoreFailedF (503): a full DiscardPolicy.NEW stream (NATS_FACTS S8);
    acknowledgements freeing room can help."""
    WRONG_LAST_SEQUENCE_CONSTANT = 10164
    """JSStreamWrongLastSequenceConstantErr (400): WRONG_LAST_SEQUENCE without the
    sequence in its description."""


def not_found(error: BaseException, code: JSErrorCode) -> bool:
    """Whether error is the broker's 404 with this err_code (a client-side NotFoundError,
    from a lookup by name, carries none)."""
    return isinstance(error, nats.js.errors.NotFoundError) and error.err_code == code


def unknown_from(error: BaseException, reported: Sequence[str | BaseException] = ()) -> Unknown:
    """A failed observation of the broker as Unknown: missing for a NotFoundError (a
    stream or consumer that does not exist, STREAM_NOT_FOUND / CONSUMER_NOT_FOUND),
    else observation_failure's reason.

    Arguments:
        error: what the observation raised.
        reported: what the connection's error_cb saw meanwhile, oldest first
            (observation_failure).

    Returns:
        Unknown: its detail the error's description for a missing thing, else
        observation_failure's detail.
    """
    if isinstance(error, nats.js.errors.NotFoundError):
        return Unknown("missing", f"{error.description or error}")
    reason, detail = observation_failure(error, reported)
    return Unknown(reason, detail)

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


_CERTIFICATE_REQUIRED: Final = ("TLSV13_ALERT_CERTIFICATE_REQUIRED",)
"""The alert of a TLS 1.3 server that asks for a client certificate none was given."""
_CERTIFICATE_REFUSED: Final = (
    "SSLV3_ALERT_BAD_CERTIFICATE", "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "TLSV1_ALERT_ACCESS_DENIED")
"""Alerts of a server that refuses the client certificate it was given."""
_NAME_MISMATCH: Final = (62, 64)
"""X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH, as an
SSLCertVerificationError's verify_code."""


_CUT_OFF: Final = (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError,
                   ssl.SSLZeroReturnError, nats.errors.UnexpectedEOF)
"""How a connection the server closed shows, its alert lost."""


def tls_refusal(error: BaseException, where: str,
                certificate_asked: bool = False) -> TLSRefused | None:
    """The TLSRefused for a connect attempt's error that no retry can mend, None for
    any other error (a TLS handshake cut short by a broker going away is retried).

    Arguments:
        error: what the attempt raised, or what the error callback saw.
        where: the broker, redacted (link.redact_url), for the message.
        certificate_asked: the server's INFO asked for a client certificate and none
            was given (client.TlsClient). Over TLS 1.3 its alert can come after the
            client wrote CONNECT, and the connection is then cut off with the alert
            unread: such a cut is that refusal, not a broker going away.
    """
    if isinstance(error, TLSRefused):
        return error
    if certificate_asked and isinstance(error, _CUT_OFF):
        return _certificate_required(where)
    if isinstance(error, ssl.SSLCertVerificationError):
        if error.verify_code in _NAME_MISMATCH:
            advice = "connect to it by a name or address its certificate holds"
        else:
            advice = ("give the authority that signed it with --tls-ca "
                      "(VIDEOFLOW_NATS_TLS_CA)")
        return TLSRefused(f"the broker at {where} presented a certificate that is not "
                          f"trusted ({error.verify_message or error.reason}): {advice}")
    if isinstance(error, ssl.SSLError):
        if error.reason in _CERTIFICATE_REQUIRED:
            return _certificate_required(where)
        if error.reason in _CERTIFICATE_REFUSED:
            return TLSRefused(f"the broker at {where} refused the client certificate "
                              f"({error.reason.lower().replace('_', ' ')})")
    return None


def _certificate_required(where: str) -> TLSRefused:
    return TLSRefused(f"the broker at {where} asks for a client certificate: give one "
                      "with --tls-cert and --tls-key (VIDEOFLOW_NATS_TLS_CERT, "
                      "VIDEOFLOW_NATS_TLS_KEY)")


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
) -> tuple[UnknownReason, str]:
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
        A (reason, detail) pair; detail names the error and, when there are any, the reports.
    """
    described = describe(error)
    notes = [_text(r) for r in reported]
    detail = described if not notes else f"{described} (reported: {'; '.join(notes)})"
    everything = " ".join([described, *notes]).lower()
    # Auth first: a permissions violation reaches only error_cb while the request
    # itself times out (NATS_FACTS S15, §8); a TLS identity refused is one too.
    if isinstance(error, nats.errors.AuthorizationError) or any(
        m in everything for m in _AUTH_MARKERS
    ) or any(tls_refusal(e, "") is not None for e in (error, *reported)
             if isinstance(e, BaseException)):
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


__all__ = ["JSErrorCode", "TLSRefused", "credentials_refused", "describe", "not_found",
           "observation_failure", "tls_refusal", "unknown_from"]
