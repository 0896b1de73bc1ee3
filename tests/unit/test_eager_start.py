"""videoflow.broker.eager: a coroutine started eagerly runs to its first wait inside
the call, and from there on as a task that behaves as its own task would have."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from videoflow.broker.eager import start_eagerly

pytestmark = pytest.mark.timeout(10)


@pytest.mark.asyncio
async def test_a_coroutine_that_waits_for_nothing_is_done_inside_the_call() -> None:
    done: list[str] = []

    async def write() -> None:
        done.append("written")

    held: set[asyncio.Task[None]] = set()
    start_eagerly(write(), held)
    assert done == ["written"]
    assert held == set()  # no task was made


@pytest.mark.asyncio
async def test_a_coroutine_that_waits_goes_on_as_a_task_and_reads_what_it_waited_for(
) -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()
    failure: asyncio.Future[int] = loop.create_future()
    steps: list[Any] = []

    async def exchange() -> None:
        steps.append("sent")
        steps.append(await answer)
        try:
            await failure
        except KeyError as error:
            steps.append(f"raised {error}")
        await asyncio.sleep(0)  # a bare yield
        steps.append("done")

    held: set[asyncio.Task[None]] = set()
    start_eagerly(exchange(), held)
    assert steps == ["sent"]  # up to its first wait, inside the call
    (task,) = held
    answer.set_result(7)
    failure.set_exception(KeyError("refused"))
    await task
    assert steps == ["sent", 7, "raised 'refused'", "done"]
    assert held == set()


@pytest.mark.parametrize("answered_first", [False, True],
                         ids=["before_its_first_step", "after_its_wait_was_answered"])
@pytest.mark.asyncio
async def test_a_cancellation_of_the_task_reaches_the_coroutine_where_it_waits(
        answered_first: bool) -> None:
    awaited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def waits() -> None:
        try:
            await awaited
            seen.append("resumed")
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    held: set[asyncio.Task[None]] = set()
    start_eagerly(waits(), held)
    (task,) = held
    if answered_first:
        await asyncio.sleep(0)  # the task now waits on it itself
        # Done, it cannot be cancelled: the task is, at its next step -- which must
        # reach the coroutine, not be lost.
        awaited.set_result(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]


@pytest.mark.asyncio
async def test_what_it_raises_before_its_first_wait_goes_to_the_loops_handler() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))

    async def broken() -> None:
        raise ValueError("a bug")

    try:
        start_eagerly(broken(), set())
    finally:
        loop.set_exception_handler(None)
    assert [type(c["exception"]) for c in reported] == [ValueError]
