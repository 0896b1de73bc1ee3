"""Coroutines run at once, up to their first wait, and as tasks from there: what
Python 3.12's eager tasks do, for every Python this library runs on.

A pipelined batch of publications or settlements, or the parse of bytes just read,
waits for nothing nearly always. As a task of its own it ran on the loop's next pass
instead: a pass more on every hop of every message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["start_eagerly"]


def start_eagerly(coro: Coroutine[Any, Any, None], held: set[asyncio.Task[None]]) -> None:
    """On the loop: run coro at once, up to its first wait, and as a task from there,
    held in `held` until it is done. What coro raises before its first wait goes to
    the loop's exception handler, as an unretrieved task error would."""
    try:
        waited = coro.send(None)
    except StopIteration:
        return
    except Exception as error:
        asyncio.get_running_loop().call_exception_handler({
            "message": "a coroutine started eagerly failed", "exception": error})
        return
    task = asyncio.get_running_loop().create_task(_Suspended(coro, waited))
    held.add(task)  # a strong reference until it is done
    task.add_done_callback(held.discard)


class _Suspended(Coroutine[Any, Any, None]):
    """A coroutine run up to its first wait, for a task to carry on: the task's first
    step finds it still waiting on what it yielded (a future, or None for a bare
    yield), and everything after goes to the coroutine itself. So the task behaves as
    the coroutine's own would have; a cancellation, even one before the task's first
    step, reaches it where it waits."""

    __slots__ = ("_coro", "_first", "_waited")

    def __init__(self, coro: Coroutine[Any, Any, None], waited: Any) -> None:
        self._coro, self._waited, self._first = coro, waited, True

    def send(self, value: Any) -> Any:
        if self._first:
            self._first = False
            return self._waited
        return self._coro.send(value)

    def throw(self, error: Any, *rest: Any) -> Any:
        self._first = False
        return self._coro.throw(error, *rest)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        raise TypeError("a suspended coroutine is carried on by its task only")
