"""Nodes the end-to-end flows are built from. Module level, so the spawned replica
processes import them as users' workers would; a sink records what it applied in a
directory of files, one per applied group, named by the group's identity."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
from videoflow.core.policies import PoisonMessage


class Numbers(ProducerNode):
    """0 .. count-1, each stamped with an event time; sleeps pace it when asked."""

    def __init__(self, count: int, pace: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.count, self.pace, self.i = count, pace, 0

    def next(self) -> int:
        if self.i >= self.count:
            raise StopIteration
        value, self.i = self.i, self.i + 1
        assert self.context is not None
        self.context.set_event_timestamp(1000.0 + value)
        if self.pace:
            time.sleep(self.pace)
        return value


class KeyedNumbers(Numbers):
    """Numbers whose outputs carry a partition key: the value modulo `keys`."""

    def __init__(self, count: int, keys: int, **options: Any) -> None:
        super().__init__(count, **options)
        self.keys = keys

    def next(self) -> int:
        value = super().next()
        assert self.context is not None
        self.context.set_partition_key(value % self.keys)
        return value


class Scale(ProcessorNode):
    def __init__(self, factor: int, **options: Any) -> None:
        super().__init__(**options)
        self.factor = factor

    def process(self, value: int) -> int:
        return value * self.factor


class Add(ProcessorNode):
    def process(self, a: int, b: int) -> int:
        return a + b


class RejectMultiplesOf(ProcessorNode):
    """Poison on multiples of k (but 0): dead-lettered, the flow goes on."""

    def __init__(self, k: int, **options: Any) -> None:
        super().__init__(**options)
        self.k = k

    def process(self, value: int) -> int:
        if value and value % self.k == 0:
            raise PoisonMessage(f"{value} is a multiple of {self.k}")
        return value


class Record(ConsumerNode):
    """Applies each group once: a file per group key, holding the inputs (a redelivered
    group finds its file and is not applied again). Counts applications in a log."""

    def __init__(self, directory: str, pace: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.directory, self.pace = directory, pace

    def consume(self, *inputs: Any) -> None:
        assert self.context is not None
        key = self.context.last_input_key
        assert key is not None
        if self.pace:
            time.sleep(self.pace)
        path = Path(self.directory) / key.replace("/", "_")
        with open(Path(self.directory) / "applications.log", "a") as log:
            log.write(f"{key} {os.getpid()} {self.context.replica_id} {inputs[0]!r}\n")
        if not path.exists():
            # Written whole or not at all: a replica SIGKILLed mid-write must not leave
            # a torn file that its redelivered group then takes for applied.
            partial = path.with_name(path.name + ".partial")
            partial.write_text(repr(list(inputs)))
            os.replace(partial, path)


def applied(directory: Path) -> list[Any]:
    """What a Record sink applied: one value list per group."""
    import ast

    return [ast.literal_eval(p.read_text()) for p in sorted(directory.iterdir())
            if p.name != "applications.log" and not p.name.endswith(".partial")]


class DieOnce(ProcessorNode):
    """Kills its own process (SIGKILL, no last words) at the given input, once per
    marker file: the engine must start the replica again and lose nothing."""

    def __init__(self, at: int, marker: str, **options: Any) -> None:
        super().__init__(**options)
        self.at, self.marker = at, marker

    def process(self, value: int) -> int:
        if value == self.at and not os.path.exists(self.marker):
            Path(self.marker).write_text("died")
            os.kill(os.getpid(), 9)
        return value


class Explode(ProcessorNode):
    """Exits its process at the given input (sys.exit in a node's code)."""

    def __init__(self, at: int, **options: Any) -> None:
        super().__init__(**options)
        self.at = at

    def process(self, value: int) -> int:
        if value == self.at:
            raise SystemExit(f"exploded at {value}")
        return value
