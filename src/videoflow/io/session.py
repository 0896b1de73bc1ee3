"""BrokerSession: the connection a node of its own (a sink or a source talking to
plain NATS) holds from open() to close(): a loop thread of its own (LoopRunner) and a
client connected through the connect every videoflow connection uses."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from videoflow.broker.link import connect
from videoflow.broker.loop import LoopRunner

T = TypeVar("T")


class BrokerSession:
    """A node's own connection to a broker.

    Arguments:
        url: the broker.
        timeout: seconds the connect, and each call run on it by default, may take.
        name: names the loop thread.

    Raises:
        BrokerUnavailable / CredentialsRefused: as broker.link.connect.
    """

    def __init__(self, url: str, timeout: float, name: str) -> None:
        self.timeout = timeout
        self.runner = LoopRunner(name=name)
        self.runner.start()

        async def ignore(error: BaseException) -> None:
            return None  # a failed call raises where it is made

        try:
            self.client = self.runner.run(connect(url, timeout, ignore), timeout * 2)
        except BaseException:
            self.runner.stop()
            raise
        self.jetstream = self.client.jetstream(timeout=timeout)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run coro on the session's loop and wait for its result.

        Raises:
            TimeoutError: no result within timeout (default: twice the session's).
            what coro raised.
        """
        return self.runner.run(coro, self.timeout * 2 if timeout is None else timeout)

    def close(self) -> None:
        """Close the client (what it still had to send goes first), then the loop."""
        try:
            self.runner.run(self.client.close(), self.timeout)
        finally:
            self.runner.stop()


__all__ = ["BrokerSession"]
