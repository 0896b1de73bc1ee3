"""How the JetStream receiver wakes a waiting receive once per read (Receiver.ring):
for bytes parsed inline, at the end of that read, on the same pass of the loop
(reads_parsed); for bytes nats-py's read loop parsed, on the loop's next pass. No
broker: the connection is a stand-in holding what the receiver reads of it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from videoflow.backends.jetstream.bindings import Bindings
from videoflow.backends.jetstream.receiver import Receiver


def receiver(parsing_inline: bool) -> tuple[Receiver, SimpleNamespace, list[str]]:
    pokes: list[str] = []
    connection = SimpleNamespace(
        runner=SimpleNamespace(poke=lambda: pokes.append("poke")),
        client=SimpleNamespace(parsing_inline=parsing_inline), on_reads_parsed=None)
    made = Receiver(connection, Bindings(), prefetch=8,  # type: ignore[arg-type]
                    fetch_timeout=1.0, byte_budget=None)
    return made, connection, pokes


def test_deliveries_parsed_inline_are_rung_once_at_the_end_of_their_read() -> None:
    async def run() -> None:
        made, connection, pokes = receiver(parsing_inline=True)
        assert connection.on_reads_parsed == made.reads_parsed  # the read's end calls it
        for _ in range(3):  # three deliveries parked from one read
            made.ring()
        await asyncio.sleep(0)  # a pass of the loop: nothing was left for it
        assert pokes == []
        connection.client.parsing_inline = False
        connection.on_reads_parsed()
        assert pokes == ["poke"]  # once for the read, on its own pass
        await asyncio.sleep(0)
        connection.on_reads_parsed()  # a read that parked nothing rings nothing
        assert pokes == ["poke"]
    asyncio.run(run())


def test_deliveries_parsed_by_the_read_loop_are_rung_once_on_the_next_pass() -> None:
    async def run() -> None:
        made, _, pokes = receiver(parsing_inline=False)
        made.ring()
        made.ring()
        assert pokes == []
        await asyncio.sleep(0)
        assert pokes == ["poke"]
    asyncio.run(run())
