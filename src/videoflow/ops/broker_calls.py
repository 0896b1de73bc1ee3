"""The plumbing every operator command shares: the connection each one opens, the one
deadline its requests share, and how a failure becomes BrokerUnavailable (or Unknown:
broker.failures.unknown_from, beside the broker's error codes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import nats.js.errors
from nats.aio.client import Client

from videoflow.backends.messaging import Known, Unknown
from videoflow.broker.failures import JSErrorCode, not_found, observation_failure
from videoflow.broker.loop import ErrorLog, close_client, connect_fail_fast
from videoflow.broker.options import connect_options_for
from videoflow.errors import BrokerUnavailable

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS: Final = 10.0
"""The overall bound of one operator command, connect included."""

READER_IDLE_SECONDS: Final = 30.0
"""How long the server keeps an operator command's ephemeral reader (a consumer that
acknowledges nothing) once nothing reads it: the command deletes it when done, and a
command that died leaves it for this long."""

API_PREFIX: Final = "$JS.API"

Count = Known[int] | Unknown


class Budget:
    """The monotonic deadline every request of one operation shares."""

    def __init__(self, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.deadline = self._loop.time() + timeout

    def left(self) -> float:
        return max(self.deadline - self._loop.time(), 0.0)

    async def run(self, awaitable: Awaitable[T]) -> T:
        """awaitable, bounded by what is left (asyncio.TimeoutError when it elapses)."""
        return await asyncio.wait_for(awaitable, self.left())


def check_timeout(timeout: float) -> None:
    connect_options_for(timeout, True, _ignore)  # ValueError unless finite and > 0


async def _ignore(_error: BaseException) -> None:
    return None


def run_sync(
    nats_url: str,
    timeout: float,
    work: Callable[[Client, Budget, ErrorLog], Awaitable[T]],
) -> T:
    """work on a fresh loop and a fresh fail-fast connection, all within timeout."""
    check_timeout(timeout)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("videoflow.ops functions cannot run inside an event loop")

    async def main() -> T:
        budget = Budget(timeout)
        errors = ErrorLog()
        nc = await connect_fail_fast(nats_url, timeout, errors)
        try:
            return await work(nc, budget, errors)
        finally:
            await close_client(nc, timeout=min(2.0, max(budget.left(), 0.5)))

    return asyncio.run(main())


def unavailable(
    what: str, error: BaseException, errors: ErrorLog | None = None
) -> BrokerUnavailable:
    reason, detail = observation_failure(error, errors.texts() if errors else ())
    code = getattr(error, "err_code", None)
    return BrokerUnavailable(f"{what} failed ({reason}): {detail}",
                             code=code if isinstance(code, int) else None)


def already_deleted(error: BaseException) -> bool:
    return not_found(error, JSErrorCode.MESSAGE_NOT_FOUND) or (
        isinstance(error, nats.js.errors.APIError)
        and error.err_code == JSErrorCode.MESSAGE_DELETE_FAILED
        and "no message found" in str(error.description or "").lower()
    )


def count_of(value: object, what: str) -> Count:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return Unknown("malformed", f"{what} is {value!r}")
    return Known(value)
