"""Writing a flow: node wiring, and compile_flow's checks and derived values."""

from __future__ import annotations

import re
from typing import Any

import pytest

from videoflow.backends.jetstream.flow_provisioning import _flow_plan
from videoflow.core.compiler import compile_flow
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.credit import (
    RECEIVE_PREFETCH,
    SETTLE_BATCH,
    WINDOW_GROUPS,
    consumer_credit,
    join_item_credit,
    max_deliver_for,
)
from videoflow.core.naming import partitioned_durable_name_for
from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
from videoflow.flow import Flow


class Camera(ProducerNode):
    def next(self) -> Any:
        raise StopIteration


class Fusion(ProcessorNode):
    def process(self, *inputs: Any) -> Any:
        return inputs


class Sink(ConsumerNode):
    def consume(self, *inputs: Any) -> None:
        return None


def test_calling_a_node_on_its_parents_wires_it_and_returns_it() -> None:
    a, b = Camera(name="a"), Camera(name="b")
    fusion = Fusion()
    assert fusion(a, b) is fusion and fusion.parents == (a, b)


@pytest.mark.parametrize("wire, error, match", [
    (lambda: Camera()(Camera()), TypeError, "a producer has no parents"),
    (lambda: Fusion()(), ValueError, "at least one parent"),
    (lambda: Fusion()(Sink()(Camera())), TypeError, "is a consumer"),
    (lambda: Fusion()("cam"), TypeError, "must be a Node"),
    (lambda: (lambda c: Fusion()(c, c))(Camera()), ValueError, "given twice"),
    (lambda: (lambda f: f(Camera()) and f(Camera()))(Fusion()), ValueError, "already wired"),
    (lambda: Fusion(nb_tasks=0), ValueError, "nb_tasks must be an int >= 1"),
    (lambda: Fusion(join_policy={"mode": "nearest"}), ValueError, "join_policy"),
    (lambda: Fusion(delivery={"max_retries": -1}), ValueError, "delivery"),
])
def test_wiring_mistakes_are_refused_naming_the_node(wire: Any, error: type[Exception],
                                                     match: str) -> None:
    with pytest.raises(error, match=match):
        wire()


def test_the_compiler_orders_parents_first_names_nodes_and_derives_readers() -> None:
    cams = [Camera(), Camera()]
    fusion = Fusion(join_policy={"mode": "time", "tolerance_ms": 5.0})(*cams)
    sinks = [Sink()(fusion), Sink(name="archive", nb_tasks=3, partition_by="camera")(fusion)]
    compiled = compile_flow(Flow(cams, sinks, REALTIME, name="f"))
    assert [s.name for s in compiled.specs] == ["camera", "camera_2", "fusion", "sink",
                                                "archive"]
    assert compiled.spec("fusion").parents == ("camera", "camera_2")
    fusion_spec = compiled.spec("fusion")
    # BLOB-14: one obligation per competing child, one per partitioned replica.
    assert fusion_spec.blob_reader_ids == ("sink", "archive/p0", "archive/p1", "archive/p2")
    assert fusion_spec.blob_readers == 4
    assert compiled.spec("camera").blob_reader_ids == ("fusion",)
    assert compiled.spec("sink").blob_reader_ids is None
    assert compiled.profile == "live_latest"
    assert compiled.nodes["camera_2"] is cams[1]


def test_the_derived_credit_and_max_deliver_are_what_provisioning_creates() -> None:
    """MSG-017: what the compiler derives for a node's durables is what provisioning
    creates, so a replica binds exactly the provisioned durable."""
    cams = [Camera(name=f"cam{i}") for i in range(3)]
    fusion = Fusion(nb_tasks=2, partition_by="rig",
                    join_policy={"mode": "time", "tolerance_ms": 5.0, "quorum": 2,
                                 "collect": {"cam2": 10.0}},
                    delivery={"max_retries": 5})(*cams)
    compiled = compile_flow(Flow(cams, [Sink()(fusion)], BATCH, name="f"), max_retries=3)
    plan = compiled.spec("fusion").plan
    spec = compiled.spec("fusion")
    # Two replicas, each holding its working set, the publication window, its gathered
    # acks and its prefetch unsettled.
    assert plan.credit == consumer_credit(2, True, join_item_credit(
        spec.parents, spec.join_policy, BATCH), WINDOW_GROUPS + SETTLE_BATCH + RECEIVE_PREFETCH)
    assert plan.max_deliver == max_deliver_for(BATCH, 3, spec.delivery)
    data_durables = {partitioned_durable_name_for("fusion", parent, replica)
                     for parent in spec.parents for replica in range(2)}
    provisioned = {config.durable_name: config for _, config in
                   _flow_plan(list(compiled.specs), "f", "r", BATCH).durables
                   if config.durable_name in data_durables}
    assert provisioned.keys() == data_durables and all(
        (c.max_ack_pending, c.max_deliver) == (plan.credit, plan.max_deliver)
        for c in provisioned.values())


def _flow(consumers: list[Any], producers: list[Any]) -> Flow:
    return Flow(producers, consumers, name="f")


def test_a_cycle_is_refused_naming_its_nodes() -> None:
    cam = Camera(name="cam")
    first, second = Fusion(name="first"), Fusion(name="second")
    first(cam, second)
    second(first)
    with pytest.raises(ValueError, match="cycle: .*first -> second -> first"):
        compile_flow(_flow([Sink()(first)], [cam]))


@pytest.mark.parametrize("build, match", [
    (lambda: _flow([Sink()(Camera(name="a"))], [Camera(name="b")]),
     "'b': a producer no consumer reads"),
    (lambda: _flow([Sink()(Camera(name="a"))], []), "at least one of its producers"),
    (lambda: (lambda a, b: _flow([Sink()(Fusion()(a, b))], [a, b]))(
        Camera(name="a"), Camera(name="a")), "'a': two nodes have this name"),
    (lambda: (lambda a: _flow([Sink()(Fusion()(a, Camera(name="hidden")))], [a]))(
        Camera(name="a")), "'hidden': a producer the flow reads but its producers do not"),
    (lambda: (lambda a, b: _flow([Sink()(Fusion(join_policy={
        "mode": "time", "tolerance_ms": 5.0, "collect": {"x": 5.0}})(a, b))], [a, b]))(
        Camera(name="a"), Camera(name="b")), "collect parent 'x' is not a parent"),
    (lambda: (lambda a: _flow([Sink()(Fusion(join_policy={
        "mode": "time", "tolerance_ms": 5.0, "collect": {"a": 5.0}})(a))], [a]))(
        Camera(name="a")), "join_policy is for a node with two parents or more"),
    (lambda: (lambda a: _flow([Sink(name="a_b")(Fusion(name="a.b")(a))], [a]))(Camera()),
     "'a_b'.* the same subjects and streams as 'a.b'"),
    (lambda: (lambda a: _flow([Sink()(a)], [a]))(Camera(name="_eos")), "reserved"),
])
def test_a_flow_no_worker_could_run_is_refused_naming_the_node(build: Any,
                                                              match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compile_flow(build())


def test_a_node_class_defined_in_a_function_is_refused() -> None:
    class Local(ConsumerNode):
        def consume(self, *inputs: Any) -> None:
            return None

    cam = Camera()
    with pytest.raises(ValueError, match="'local'.*defined inside a function"):
        compile_flow(_flow([Local()(cam)], [cam]))


def test_a_node_class_of_an_interactive_session_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    session = types.ModuleType("__main__")  # a REPL's or notebook's: no file behind it
    monkeypatch.setitem(sys.modules, "__main__", session)
    interactive = type("Typed", (ConsumerNode,), {"__module__": "__main__",
                                                  "consume": lambda self, *i: None})
    session.Typed = interactive  # type: ignore[attr-defined]
    cam = Camera()
    with pytest.raises(ValueError, match="'typed'.*interactive session"):
        compile_flow(_flow([interactive()(cam)], [cam]))


def test_a_flow_refuses_an_unknown_type_or_an_empty_name() -> None:
    with pytest.raises(ValueError, match="flow_type must be one of"):
        Flow([], [], flow_type="streaming")
    with pytest.raises(ValueError, match="non-empty str"):
        Flow([], [], name=" ")


@pytest.mark.parametrize("url, said", [
    ("http://localhost:4222", "has the scheme 'http://'"),
    ("not a url", "a host name holds no spaces"),
])
def test_running_on_a_malformed_broker_url_raises_value_error_saying_what_is_wrong(
        url: str, said: str) -> None:
    camera = Camera(name="camera")
    flow = Flow([camera], [Sink()(camera)], name="malformed-url")
    with pytest.raises(ValueError, match=re.escape(said)):
        flow.run(nats_url=url, view=False)


class Replayable(Camera):
    replayable = True


def test_pack_is_a_live_producers_or_a_one_parent_processors_in_a_batch_flow() -> None:
    # A live producer mints each output's id once; a one-parent processor packs as its
    # inputs came. A replayable producer sends an output again under its id, one per
    # message; a REALTIME stream keeps its newest messages, an output each; a join's
    # groups span its parents' packs; a consumer publishes nothing.
    cam = Camera(name="cam", pack=True)
    assert compile_flow(Flow([cam], [Sink()(cam)], BATCH)).nodes["cam"].pack
    cam = Camera(name="cam", pack=True)
    compiled = compile_flow(Flow([cam], [Sink()(Fusion(name="f", pack=True)(cam))], BATCH))
    assert compiled.nodes["f"].pack
    for build, said in [
        (lambda: (lambda c: Flow([c], [Sink()(c)], REALTIME))(Camera(pack=True)),
         "needs a BATCH flow"),
        (lambda: (lambda c: Flow([c], [Sink()(Fusion(pack=True)(c))], REALTIME))(Camera()),
         "needs a BATCH flow"),
        (lambda: (lambda c: Flow([c], [Sink()(c)], BATCH))(Replayable(pack=True)),
         "a replayable one's"),
        (lambda: (lambda a, b: Flow([a, b], [Sink()(Fusion(pack=True)(a, b))], BATCH))(
            Camera(name="a"), Camera(name="b")), "needs one parent, .* it has 2"),
        (lambda: (lambda c: Flow([c], [Sink(pack=True)(c)], BATCH))(Camera()),
         "a consumer publishes none"),
    ]:
        with pytest.raises(ValueError, match=said):
            compile_flow(build())
    with pytest.raises(ValueError, match="pack must be True or False, got 'yes'"):
        Camera(pack="yes")
