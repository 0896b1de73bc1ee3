"""The one unknown_from and not_found (videoflow.broker.failures), which the operator
commands, the JetStream adapter and the stream read-back all answer through."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest

from videoflow.backends.messaging import Unknown as ContractUnknown
from videoflow.broker.failures import JSErrorCode, not_found, unknown_from
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
