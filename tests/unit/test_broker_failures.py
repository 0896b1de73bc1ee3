"""The one unknown_from and not_found (videoflow.broker.failures), which the operator
commands, the JetStream adapter and the stream read-back all answer through."""

from __future__ import annotations

import asyncio
import ssl

import nats.errors
import nats.js.errors
import pytest

from videoflow.backends.messaging import Unknown as ContractUnknown
from videoflow.broker.failures import JSErrorCode, not_found, tls_refusal, unknown_from
from videoflow.observation import Known, Unknown


def test_the_contract_s_known_and_unknown_are_the_ground_floor_s() -> None:
    from videoflow.backends import messaging

    assert ContractUnknown is Unknown and messaging.Known is Known


@pytest.mark.parametrize("code", [JSErrorCode.STREAM_NOT_FOUND, JSErrorCode.CONSUMER_NOT_FOUND])
def test_a_stream_or_durable_that_does_not_exist_is_missing(code: JSErrorCode) -> None:
    error = nats.js.errors.NotFoundError(code=404, err_code=code, description="not found")
    assert unknown_from(error) == Unknown("missing", "not found")


@pytest.mark.parametrize(("error", "reason"), [
    (asyncio.TimeoutError(), "timeout"),
    (nats.errors.NoServersError(), "unreachable"),
    (nats.js.errors.BadRequestError(code=400, err_code=JSErrorCode.STREAM_NAME_IN_USE), "api"),
    (ValueError("not json"), "malformed"),
])
def test_any_other_failure_takes_observation_failure_s_reason(
    error: BaseException, reason: str
) -> None:
    assert unknown_from(error).reason == reason


def test_what_the_error_callback_saw_is_read() -> None:
    refused = unknown_from(asyncio.TimeoutError(), ["ConnectionRefusedError: refused"])
    assert refused.reason == "unreachable" and "refused" in refused.detail
    denied = unknown_from(asyncio.TimeoutError(),
                          [nats.errors.Error('nats: permissions violation for publish to "x"')])
    assert denied.reason == "auth"


def test_not_found_matches_the_broker_s_404_with_that_code_only() -> None:
    missing = nats.js.errors.NotFoundError(code=404, err_code=10059)
    assert not_found(missing, JSErrorCode.STREAM_NOT_FOUND)
    assert not not_found(missing, JSErrorCode.CONSUMER_NOT_FOUND)
    # A client-side lookup by name raises NotFoundError with no err_code (NATS_FACTS §7).
    assert not not_found(nats.js.errors.NotFoundError(), JSErrorCode.STREAM_NOT_FOUND)
    refused = nats.js.errors.BadRequestError(code=400, err_code=10059)
    assert not not_found(refused, JSErrorCode.STREAM_NOT_FOUND)
    assert JSErrorCode.STREAM_NOT_FOUND == 10059  # compares with nats-py's plain int


def _eof() -> ssl.SSLEOFError:
    error = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    error.reason = "UNEXPECTED_EOF_WHILE_READING"  # as the ssl module sets it
    return error


@pytest.mark.parametrize("cut", [ConnectionResetError("Connection lost"), BrokenPipeError(),
                                 _eof(), nats.errors.UnexpectedEOF()])
def test_a_connection_cut_off_after_the_broker_asked_for_a_certificate_is_that_refusal(
        cut: BaseException) -> None:
    """Over TLS 1.3 the server's 'certificate required' alert can come after CONNECT
    was written, and the reset then loses it (issue 46): when the server's INFO asked
    for a client certificate none was given, the cut-off is that refusal, named."""
    refused = tls_refusal(cut, "tls://127.0.0.1:4222", certificate_asked=True)

    assert refused is not None
    assert "tls://127.0.0.1:4222 asks for a client certificate" in str(refused)
    assert "--tls-cert" in str(refused)
    # Without that ask, a cut-off is a broker going away: retried, not given up on.
    assert tls_refusal(cut, "tls://127.0.0.1:4222") is None
