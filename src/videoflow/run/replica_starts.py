"""How the local engine starts its replicas' processes: forked from a server that has
imported, once, what every replica imports, or spawned as fresh interpreters.

A spawned replica is a new interpreter that imports numpy, nats-py and videoflow again:
0.3-0.5 s of CPU for every replica and every restart, which a flow of many replicas
pays at its start on a machine of few cores. Where multiprocessing has a forkserver
(POSIX), the engine starts one that imports videoflow's replica side first
(REPLICA_IMPORTS), and every replica is a fork of it: a few milliseconds each.
VIDEOFLOW_START_METHOD=spawn, and platforms without a forkserver (Windows), spawn.

A forked replica inherits from the server, not from the engine, and the engine hands
it what would otherwise differ from a spawned one:
- the environment: the server's is the engine's when the server started, so the
  engine sends its own as it is when the replica starts (ReplicaInheritance);
- stdout and stderr: likewise, the engine's of the moment, which a test's capture or a
  program's redirection may have changed since;
- the engine's death: the server is the replica's parent and ends when the engine
  does, so the kernel's parent-death signal still comes; the replica also watches the
  engine itself, through multiprocessing's parent sentinel (die_with_parent).
What a module read from the environment when the server imported it stays as it was:
the pure-Python switch (videoflow.native), read at import, is checked, and a replica
whose engine changed it since fails at its start saying so.

The server is started by the first replica's start, inside the engine's spawn guard
(processes._spawn: SIGTERM blocked, SIGINT ignored), and keeps both for its life: the
terminal's Ctrl-C and systemd's SIGTERM to the whole process group must not end it
(and, through the parent-death signal, every replica) while the engine winds down.
It ends when the engine's process does, and serves every run that process makes.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Final

from videoflow import native
from videoflow.errors import StartMethodError

START_METHOD_ENV: Final = "VIDEOFLOW_START_METHOD"
"""Set to 'spawn' to start every replica as a fresh interpreter; 'forkserver' (where
there is one) is the default."""

START_METHODS: Final = ("forkserver", "spawn")

REPLICA_IMPORTS: Final = (
    "videoflow.flow",  # what a flow's module imports
    "videoflow.io",  # and its sources and sinks
    "videoflow.run.processes",  # the replica process's main, the task, nats-py
    "videoflow.messaging.nats_messenger",  # the messenger, grouping core, wire, numpy
    "videoflow.backends.jetstream.backend",
    "videoflow.backends.jetstream.payloads",
    "videoflow.backends.jetstream.ledger_store",
    "videoflow.backends.shm_payload",
    "videoflow.backends.filesystem_payload",
)
"""What the server imports before its first fork: everything a replica of a flow
imports of videoflow and its dependencies (checked by tests/unit/test_replica_starts);
the node's own module and the optional extras (opentelemetry) are imported by each."""


def start_method() -> str:
    """The start method of this engine's replicas: VIDEOFLOW_START_METHOD if set, else
    'forkserver' where multiprocessing has one, else 'spawn'.

    Raises:
        StartMethodError: VIDEOFLOW_START_METHOD names another, or one this platform
            lacks.
    """
    available = multiprocessing.get_all_start_methods()
    chosen = os.environ.get(START_METHOD_ENV, "").strip()
    if not chosen:
        return "forkserver" if "forkserver" in available else "spawn"
    if chosen not in START_METHODS or chosen not in available:
        offered = [m for m in START_METHODS if m in available]
        raise StartMethodError(f"{START_METHOD_ENV}={chosen!r}: this platform starts "
                               f"replicas by {' or '.join(offered)}")
    return chosen


def replica_context() -> BaseContext:
    """The multiprocessing context the engine starts replicas with (start_method);
    a forkserver's imports REPLICA_IMPORTS before its first fork, unless something in
    this process started it before (it then forks with what it has)."""
    context = multiprocessing.get_context(start_method())
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload(list(REPLICA_IMPORTS))
    return context


@dataclass
class ReplicaInheritance:
    """What a replica takes from its engine at its start rather than from the process
    it was forked from: the environment, stdout and stderr (each a multiprocessing
    Connection over a duplicate of the engine's descriptor, so that it pickles to the
    child with the descriptor; None where the engine has none open)."""

    environment: dict[str, str]
    stdout: multiprocessing.connection.Connection | None
    stderr: multiprocessing.connection.Connection | None

    @classmethod
    def of_this_process(cls, *, stdio: bool = True) -> ReplicaInheritance:
        """This process's environment, and (stdio) its stdout and stderr, as they are
        now."""
        if not stdio:
            return cls(dict(os.environ), None, None)
        return cls(dict(os.environ), _duplicate(1), _duplicate(2))

    def adopt(self) -> None:
        """In the replica: the engine's environment in place of this process's, and
        its stdout and stderr (if sent) on descriptors 1 and 2."""
        if os.environ != self.environment:
            os.environ.clear()
            os.environ.update(self.environment)
        for connection, fd in ((self.stdout, 1), (self.stderr, 2)):
            if connection is not None:
                os.dup2(connection.fileno(), fd)
                connection.close()

    def check_imports(self) -> None:
        """In the replica, once adopted: what this process imported before it was
        forked agrees with the engine's environment.

        Raises:
            StartMethodError: the pure-Python switch says otherwise than when this
                process imported the grouping core.
        """
        if native.asked_now() != native.PURE_PYTHON:
            raise StartMethodError(
                f"{native.PURE_PYTHON_ENV} changed in the engine after its replica server "
                f"imported videoflow: set {START_METHOD_ENV}=spawn for replicas that "
                f"follow it, or set it before the first run")

    def close(self) -> None:
        """In the engine, once the replica started: its duplicates are the child's."""
        for connection in (self.stdout, self.stderr):
            if connection is not None:
                connection.close()


def _duplicate(fd: int) -> multiprocessing.connection.Connection | None:
    try:
        return multiprocessing.connection.Connection(os.dup(fd))
    except OSError:  # not open (a daemon's): the child keeps the server's
        return None


__all__ = ["REPLICA_IMPORTS", "START_METHODS", "START_METHOD_ENV", "ReplicaInheritance",
           "replica_context", "start_method"]
