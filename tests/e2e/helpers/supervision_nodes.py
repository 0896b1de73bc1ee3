"""Nodes and flows of the process-supervision tests (test_supervision.py). Module
level, so the spawned replica processes import them; the flows read their sizes from
the environment, so `videoflow run` builds them in its own process."""

from __future__ import annotations

import os
import signal
from typing import Any

from flow_nodes import Numbers, Record

from videoflow.core.node import ProcessorNode
from videoflow.flow import Flow


class CrashOn(ProcessorNode):
    """Passes values through, but its process dies without a word every time it is
    handed the value `at`: 'kill' sends itself SIGKILL (a segfault, the OOM killer),
    'exit' calls os._exit(1) (native code exiting). Each death appends this process's
    pid to `log`, so the test knows which processes died."""

    def __init__(self, at: int, how: str, log: str, **options: Any) -> None:
        super().__init__(**options)
        self.at, self.how, self.log = at, how, log

    def process(self, value: int) -> int:
        if value == self.at:
            with open(self.log, "a") as log:
                log.write(f"{os.getpid()}\n")
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(1)
        return value


def crash_loop(out: str, at: int, how: str, log: str, count: int = 30,
               replicas: int = 1, name: str = "crash_on") -> Flow:
    """numbers -> crash_on(at) (`replicas` competing replicas; named name) -> record:
    every process of crash_on dies on `at`."""
    numbers = Numbers(count)
    sink = Record(out)(CrashOn(at, how, log, nb_tasks=replicas, name=name)(numbers))
    return Flow([numbers], [sink], name=f"crashloop-{how}")


class FailsToStartOnce(ProcessorNode):
    """Passes values through; the first of its processes to be built (its node
    unpickled in the replica, before the replica binds or its task starts) fails
    there: it claims `claim` with an exclusive create, the others find it taken.
    Copies made in the process that built it (the engine's) are left alone."""

    def __init__(self, claim: str, **options: Any) -> None:
        super().__init__(**options)
        self.claim, self.builder = claim, os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if os.getpid() == self.builder:
            return
        try:
            os.close(os.open(self.claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        raise RuntimeError("this replica cannot start")

    def process(self, value: int) -> int:
        return value


def one_fails_to_start(out: str, claim: str, count: int = 30) -> Flow:
    """numbers -> starts (2 competing replicas, one of which fails to start) -> record."""
    numbers = Numbers(count)
    sink = Record(out)(FailsToStartOnce(claim, nb_tasks=2)(numbers))
    return Flow([numbers], [sink], name="fails-to-start")
