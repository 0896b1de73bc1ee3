"""The task loops on the memory adapter: one node after another on one thread, each
with its own backend on one broker (as worker processes share one server)."""

from __future__ import annotations

import logging
import re
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from videoflow import logs
from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import RELIABLE_WORK, ChannelId, ChannelSpec, SubscriptionId
from videoflow.core import task as task_module
from videoflow.core.constants import BATCH
from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
from videoflow.core.policies import PoisonMessage
from videoflow.core.runtime import FlowRuntime, MemoryRuntimeStore
from videoflow.core.task import RuntimeContext, task_for
from videoflow.errors import DurabilityUnavailable
from videoflow.messaging.nats_messenger import NATSMessenger

FLOW, RUN = "flow", "run"


class Items(ProducerNode):
    def __init__(self, items: list[Any], fail_at: int | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.items, self.fail_at, self.i = list(items), fail_at, 0
        self.resumed_at: int | None = None

    def resume(self, offset: int) -> None:
        self.resumed_at, self.i = offset, offset

    def next(self) -> Any:
        if self.i == self.fail_at:
            raise RuntimeError(f"camera unplugged at {self.i}")
        if self.i >= len(self.items):
            raise StopIteration
        self.i += 1
        return self.items[self.i - 1]


class Replayable(Items):
    replayable = True


class Upper(ProcessorNode):
    def process(self, text: str) -> str:
        if text == "poison":
            raise PoisonMessage("not a word")
        return text.upper()


class Keep(ConsumerNode):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.kept: list[Any] = []
        self.seen: list[tuple[str, dict[str, str]]] = []  # (group key, parent trace ids)
        self.opened = self.closed = False

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.closed = True

    def consume(self, *inputs: Any) -> None:
        self.kept.append(inputs[0] if len(inputs) == 1 else inputs)
        assert self.context is not None
        info, key = self.context.input_info, self.context.last_input_key
        assert info is not None and key is not None
        self.seen.append((key, {p: i["trace_id"] for p, i in info.items()}))


class Chain:
    """items -> upper -> keep on one broker; run(node) runs a node's task to its end."""

    def __init__(self, edges: dict[str, tuple[str, ...]]) -> None:
        self.broker = MemoryBroker(duplicate_window=120.0)
        self.edges = edges
        admin = self.backend()
        admin.ensure_dead_letters("dlq")
        for node, parents in edges.items():
            for parent in parents:
                channel = ChannelId(FLOW, RUN, parent)
                admin.ensure_channel(ChannelSpec(channel, RELIABLE_WORK, required=(
                    SubscriptionId(node, channel), SubscriptionId("anchor", channel, "eos"))),
                    "provision")

    def backend(self) -> MemoryMessagingBackend:
        made = MemoryMessagingBackend(self.broker, flow_id=FLOW, run_id=RUN)
        made.start()
        return made

    def task(self, name: str, node: Any, opened: Any = None, **options: Any) -> Any:
        return task_for(node, *_messenger_and_context(self, name, node.kind != "consumer",
                                                      **options), opened=opened)


def _messenger_and_context(chain: Chain, name: str, publishes: bool,
                           **options: Any) -> tuple[NATSMessenger, RuntimeContext]:
    parents = chain.edges.get(name, ())
    messenger = NATSMessenger(SimpleNamespace(name=name), list(parents), "nats://unused",
                              FLOW, BATCH, RUN, backend=chain.backend(), **options)
    return messenger, RuntimeContext(messenger, name, parents=parents,
                                     publishes=publishes, flow_id=FLOW,
                                     run_id=RUN)


def test_each_input_is_processed_published_and_acknowledged_and_the_end_propagates() -> None:
    chain = Chain({"upper": ("items",), "keep": ("upper",)})
    keep = Keep()
    items = chain.task("items", Items(["a", "poison", "b"])).run()
    upper = chain.task("upper", Upper(), delivery_policy={"max_retries": 0}).run()
    kept = chain.task("keep", keep).run()
    assert keep.kept == ["A", "B"] and keep.opened and keep.closed
    # The context names each group, and its inputs carry their producer's trace.
    assert [key.split(":")[0] for key, _ in keep.seen] == [t["upper"] for _, t in keep.seen]
    assert len({key for key, _ in keep.seen}) == 2
    assert (items.emitted, items.outcome) == (3, "ended")
    assert (upper.processed, upper.emitted, upper.failed, upper.dead_lettered,
            upper.outcome) == (2, 2, 1, 1, "ended")
    assert (kept.processed, kept.outcome) == (2, "ended")
    assert len(upper.join_latencies) == 3  # every group received, the poison one too


def test_what_a_node_raises_is_logged_with_its_traceback_the_first_of_a_type_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Picky(ProcessorNode):
        def process(self, text: str) -> str:
            if text == "poison":
                raise PoisonMessage("not a word")
            if text.startswith("boom"):
                raise RuntimeError(f"cannot take {text}")
            return text

    chain = Chain({"picky": ("items",), "keep": ("picky",)})
    chain.task("items", Items(["a", "boom1", "poison", "boom2", "b"])).run()
    caplog.set_level(logging.INFO, logger=logs.NODE_FAILURES)
    stats = chain.task("picky", Picky(), delivery_policy={"max_retries": 0}).run()
    assert (stats.failed, stats.dead_lettered, stats.processed) == (3, 3, 2)
    assert task_module.logger.name == logs.NODE_FAILURES  # what configure sets up
    records = [r for r in caplog.records if r.name == logs.NODE_FAILURES]
    # Each names the input as `dlq show` does: its parent, trace id and sequence.
    said = [(r.levelno, re.sub(r" [0-9a-f]{32}:", " T:", r.getMessage().split(";")[0]))
            for r in records]
    assert said == [
        (logging.WARNING, "picky raised on its input (items T:2): RuntimeError: cannot take "
                          "boom1"),
        (logging.WARNING, "picky raised on its input (items T:3): PoisonMessage: not a word"),
        (logging.INFO, "picky raised on its input (items T:4): RuntimeError: cannot take "
                       "boom2")]
    assert "the first RuntimeError here" in records[0].getMessage()
    assert "the first" not in records[2].getMessage()
    for record in records:  # each with the frame that raised: its file and line
        assert record.exc_info is not None
        formatted = logging.Formatter().formatException(record.exc_info)
        assert f'File "{__file__}", line ' in formatted and ", in process\n" in formatted


def test_the_opened_hook_runs_once_the_node_is_open_before_its_first_input() -> None:
    chain = Chain({"keep": ("items",)})
    chain.task("items", Items(["a", "b"])).run()
    events: list[str] = []

    class Watched(Keep):
        def open(self) -> None:
            events.append("open")

        def consume(self, *inputs: Any) -> None:
            events.append(f"consume {inputs[0]}")

    chain.task("keep", Watched(), opened=lambda: events.append("opened")).run()
    assert events == ["open", "opened", "consume a", "consume b"]


def test_a_producer_that_dies_aborts_and_every_descendant_learns_who_and_why() -> None:
    chain = Chain({"upper": ("items",), "keep": ("upper",)})
    producer = chain.task("items", Items(["a", "b", "c"], fail_at=2))
    with pytest.raises(RuntimeError, match="camera unplugged at 2"):
        producer.run()
    assert producer.stats.outcome == "failed"
    assert producer.stats.error == "RuntimeError: camera unplugged at 2"
    upper = chain.task("upper", Upper()).run()
    keep = Keep()
    kept = chain.task("keep", keep).run()
    assert keep.kept == ["A", "B"]  # what was published before the death still arrives
    assert upper.outcome == kept.outcome == "aborted"
    # The relay keeps the origin: the sink two hops down names the producer.
    assert kept.error == "items died: RuntimeError: camera unplugged at 2"


def test_a_quiesced_task_ends_without_publishing_an_end_of_stream() -> None:
    chain = Chain({"keep": ("items",)})
    chain.task("items", Items(["a"])).run()
    keep = Keep()
    task = chain.task("keep", keep)
    task.quiesce()
    assert task.run().outcome == "quiesced" and keep.kept == []
    survivor = Keep()
    assert chain.task("keep", survivor).run().outcome == "ended"
    assert survivor.kept == ["a"]  # handed back, taken by the replacement


def test_a_sink_checkpoint_on_a_ledger_that_dies_with_the_process_is_refused() -> None:
    class Checkpointing(Keep):
        def consume(self, *inputs: Any) -> None:
            assert self.context is not None
            self.context.checkpoint(b"state")

    chain = Chain({"keep": ("items",)})
    chain.task("items", Items(["a"])).run()
    with pytest.raises(DurabilityUnavailable):
        chain.task("keep", Checkpointing()).run()


def test_a_replayable_producer_resumes_after_what_was_accepted() -> None:
    chain = Chain({"keep": ("items",)})
    ledger = MemoryRuntimeStore()  # one ledger across the restart

    def producer(node: Items) -> Any:
        return chain.task("items", node, replayable=True,
                          runtime=FlowRuntime(ledger, FLOW, RUN, "items"))

    first = Replayable(["a", "b", "c", "d"], fail_at=2)
    with pytest.raises(RuntimeError):
        producer(first).run()
    assert first.resumed_at is None
    second = Replayable(["a", "b", "c", "d"])
    assert producer(second).run().emitted == 2
    assert second.resumed_at == 2


def test_a_node_waiting_for_input_still_reports_what_it_has_done() -> None:
    # Its progress went out only between inputs: a sink whose parent stalled showed the
    # figures of its last input for as long as it waited (0, for a fast first burst).
    chain = Chain({"keep": ("items",)})
    resume = threading.Event()

    class TwoThenStall(Items):
        def next(self) -> Any:
            if self.i == 2:
                assert resume.wait(10)
            return super().next()

    reports: list[int] = []
    producer = threading.Thread(target=chain.task("items", TwoThenStall(["a", "b", "c"])).run)
    producer.start()
    keep = Keep()
    consumer = task_for(keep, *_messenger_and_context(chain, "keep", False),
                        progress=lambda task: reports.append(task.stats.processed),
                        progress_every=0.05)
    consuming = threading.Thread(target=consumer.run)
    consuming.start()
    try:
        deadline = time.monotonic() + 10
        while 2 not in reports:
            assert time.monotonic() < deadline, reports
            time.sleep(0.02)
        assert keep.kept == ["a", "b"]  # reported while the producer still stalls
    finally:
        resume.set()
        producer.join(10)
        consuming.join(10)
    assert keep.kept == ["a", "b", "c"]
