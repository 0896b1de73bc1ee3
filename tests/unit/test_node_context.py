"""A node's context: there while its replica runs it, a clear error anywhere else."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from videoflow.core.context import RuntimeContext
from videoflow.core.node import ProducerNode
from videoflow.errors import NodeNotRunning, VideoflowError


class Stamped(ProducerNode):
    def next(self) -> float:
        self.context.set_event_timestamp(1.5)  # no None check: typed non-optional
        return 1.5


class Stamps:
    """A messenger that only keeps the event times set on it."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def set_output_event_timestamp(self, value: float) -> None:
        self.stamps.append(value)


def _context(messenger: Any, name: str) -> RuntimeContext:
    return RuntimeContext(messenger, name)


def test_reading_a_nodes_context_outside_a_run_raises_naming_the_node_and_when_it_is_set(
) -> None:
    node = Stamped(name="cam0")

    with pytest.raises(NodeNotRunning, match=r"node 'cam0' has no context outside a run: "
                                             r"its replica sets node.context before open\(\)"):
        node.context  # noqa: B018 - the read is the test

    with pytest.raises(NodeNotRunning, match="node 'cam0'"):
        node.next()


def test_node_not_running_is_a_videoflow_error_and_a_runtime_error() -> None:
    assert issubclass(NodeNotRunning, VideoflowError)
    assert issubclass(NodeNotRunning, RuntimeError)


def test_a_context_set_by_the_replica_is_what_node_code_reads_until_it_is_deleted() -> None:
    node, messenger = Stamped(name="cam0"), Stamps()
    context = _context(messenger, "cam0")

    node.context = context
    assert node.context is context
    assert node.next() == 1.5
    assert messenger.stamps == [1.5]

    del node.context
    with pytest.raises(NodeNotRunning, match="node 'cam0'"):
        node.context  # noqa: B018 - the read is the test


def test_a_node_sent_to_its_worker_travels_without_the_senders_context() -> None:
    from videoflow.run.local import _portable

    node = Stamped(name="cam0")
    node.context = _context(Stamps(), "cam0")

    travelled = pickle.loads(_portable("cam0", node))

    with pytest.raises(NodeNotRunning, match="node 'cam0'"):
        travelled.context  # noqa: B018 - the read is the test
    assert node.context is not None  # the sender's own node keeps its context
