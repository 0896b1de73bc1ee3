"""NodeSpec: the record the compiler (a later issue) produces and provisioning reads."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from videoflow.core.compiler import NODE_KINDS, NodeSpec
from videoflow.core.policies import DeliveryPolicy, JoinPolicy


def test_defaults_and_kinds():
    spec = NodeSpec("src", "producer")
    assert spec.parents == ()
    assert spec.nb_tasks == 1
    assert spec.partition_by is None and not spec.partitioned
    assert spec.join_policy is None and spec.delivery is None
    assert spec.blob_readers is None and spec.blob_reader_ids is None
    assert spec.publishes
    assert NODE_KINDS == ("producer", "processor", "consumer")
    assert NodeSpec("p", "processor", parents=("src",)).publishes
    assert not NodeSpec("c", "consumer", parents=("src",)).publishes


def test_is_frozen():
    spec = NodeSpec("src", "producer")
    with pytest.raises(FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def test_sequences_become_tuples_and_policy_dicts_are_private_copies():
    join = {"mode": "time", "tolerance_ms": 40.0}
    spec = NodeSpec("fuse", "processor", parents=["a", "b"], join_policy=join,
                    blob_reader_ids=["sink"])
    assert spec.parents == ("a", "b")
    assert spec.blob_reader_ids == ("sink",)
    join["tolerance_ms"] = 1000.0  # the caller's later edit does not reach the spec
    assert spec.join_policy == {"mode": "time", "tolerance_ms": 40.0}


def test_policy_objects_are_taken_as_their_dicts():
    spec = NodeSpec("fuse", "processor", parents=("a", "b"),
                    join_policy=JoinPolicy(mode="time", tolerance_ms=10.0),
                    delivery=DeliveryPolicy(mode="best_effort"))
    assert spec.join_policy == JoinPolicy(mode="time", tolerance_ms=10.0).to_dict()
    assert spec.delivery == DeliveryPolicy(mode="best_effort").to_dict()


def test_partitioned_node():
    spec = NodeSpec("p", "processor", parents=("src",), nb_tasks=3, partition_by="camera")
    assert spec.partitioned and spec.nb_tasks == 3


@pytest.mark.parametrize("name", ["", "   ", None, 3])
def test_an_empty_or_non_str_name_is_refused(name):
    with pytest.raises(ValueError, match="node name must be a non-empty str"):
        NodeSpec(name, "producer")


def test_an_unknown_kind_is_refused_naming_the_node():
    with pytest.raises(ValueError, match="node 'x': kind must be one of"):
        NodeSpec("x", "sensor")


@pytest.mark.parametrize("kind", ["processor", "consumer"])
def test_a_processor_or_consumer_without_parents_is_refused(kind):
    with pytest.raises(ValueError, match=f"node 'x': a {kind} needs at least one parent"):
        NodeSpec("x", kind)


def test_a_producer_with_parents_is_refused():
    with pytest.raises(ValueError, match="node 'x': a producer has no parents"):
        NodeSpec("x", "producer", parents=("a",))


@pytest.mark.parametrize("field", [{"partition_by": "k"}, {"join_policy": {}}])
def test_a_producer_has_no_inputs_to_partition_or_join(field):
    with pytest.raises(ValueError, match="node 'x': a producer has no inputs"):
        NodeSpec("x", "producer", **field)


@pytest.mark.parametrize("nb_tasks", [0, -1, 1.5, True, "2"])
def test_nb_tasks_below_one_or_not_an_int_is_refused(nb_tasks):
    with pytest.raises(ValueError, match="node 'x': nb_tasks must be an int >= 1"):
        NodeSpec("x", "consumer", parents=("a",), nb_tasks=nb_tasks)


@pytest.mark.parametrize("kind", ["processor", "consumer"])
def test_a_join_with_competing_replicas_is_refused_and_a_partitioned_one_is_not(kind):
    # Two replicas competing for each parent's messages got the halves of one group in
    # two processes: a user audit lost 56 of 200 lineage groups, and 62 of 278 time
    # groups with 123 more wrong, in runs that said "completed".
    with pytest.raises(ValueError, match="node 'x': a join's replicas would split its "
                                         "groups .* nb_tasks=1, or give it partition_by"):
        NodeSpec("x", kind, parents=("a", "b"), nb_tasks=2)
    assert NodeSpec("x", kind, parents=("a", "b"), nb_tasks=2, partition_by="rig").nb_tasks == 2
    assert NodeSpec("x", kind, parents=("a", "b")).nb_tasks == 1
    assert NodeSpec("x", kind, parents=("a",), nb_tasks=2).nb_tasks == 2  # no groups to split


@pytest.mark.parametrize(
    "parents, match",
    [
        ("a", "parents must be a sequence"),
        (("a", "a"), "parents must be distinct"),
        (("x",), "a node cannot be its own parent"),
        (("a", ""), "parent names must be non-empty str"),
        (("a", 1), "parent names must be non-empty str"),
    ],
)
def test_nonsense_parents_are_refused(parents, match):
    with pytest.raises(ValueError, match=f"node 'x': {match}"):
        NodeSpec("x", "consumer", parents=parents)


def test_an_empty_partition_key_is_refused():
    with pytest.raises(ValueError, match="node 'x': partition_by"):
        NodeSpec("x", "consumer", parents=("a",), partition_by="")


@pytest.mark.parametrize(
    "policy, match",
    [
        ({"bogus": 1}, "unknown JoinPolicy field 'bogus'"),
        ({"mode": "time"}, "tolerance_ms is required"),
        ({"mode": "time", "tolerance_ms": 5.0, "collect": {"z": 10.0}},
         "collect parent 'z' is not a parent"),
        ({"quorum": 3}, "quorum 3 exceeds the 2 sync parents"),
        ([("mode", "trace")], "must be a dict"),
    ],
)
def test_a_join_policy_the_node_cannot_have_is_refused(policy, match):
    with pytest.raises(ValueError, match=f"node 'x': join_policy.*{match}"):
        NodeSpec("x", "processor", parents=("a", "b"), join_policy=policy)


@pytest.mark.parametrize(
    "delivery, match",
    [
        ({"mode": "twice"}, "mode must be one of"),
        ({"max_retries": -1}, "max_retries must be an int >= 0"),
        ("best_effort", "must be a dict"),
    ],
)
def test_a_delivery_override_policy_refuses_is_refused(delivery, match):
    with pytest.raises(ValueError, match=f"node 'x': delivery.*{match}"):
        NodeSpec("x", "consumer", parents=("a",), delivery=delivery)


@pytest.mark.parametrize(
    "field, match",
    [
        ({"blob_readers": -1}, "blob_readers must be an int >= 0"),
        ({"blob_readers": True}, "blob_readers must be an int >= 0"),
        ({"blob_reader_ids": "sink"}, "blob_reader_ids must be a sequence"),
        ({"blob_reader_ids": ("sink", "")}, "blob_reader_ids must be non-empty str"),
    ],
)
def test_bad_blob_reader_fields_are_refused(field, match):
    with pytest.raises(ValueError, match=f"node 'x': {match}"):
        NodeSpec("x", "processor", parents=("a",), **field)
