"""Pure topology: names, configs, credit, delivery caps, profile checks (no broker)."""

from __future__ import annotations

import asyncio
import inspect
import sys
from dataclasses import FrozenInstanceError

import nats.errors
import nats.js.errors
import pytest
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StreamConfig,
)

from videoflow.backends.messaging import UNKNOWN_REASONS, ProfileRequest, Unknown
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.credit import REALTIME_BURST, realtime_buffer_for
from videoflow.core.policies import JoinPolicy
from videoflow.errors import BrokerUnavailable, IncompatibleProfile, UnobservableState
from videoflow.messaging import topology as t

# --------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------


def test_documented_constants():
    assert t.DEFAULT_ITEM_CREDIT == 1
    assert t.DEFAULT_MAX_ACK_PENDING == 8
    assert t.DEFAULT_PREFETCH == 4
    assert t.DEFAULT_READ_BACK_TIMEOUT_SECONDS == 30.0
    assert t.DEFAULT_REALTIME_BUFFER == 1
    assert t.DLQ_RETENTION_SECONDS == 604800  # STREAM-8: 7 days
    assert t.LEGACY_BIND_CREDIT == 6


# --------------------------------------------------------------------------------------
# Naming
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("abc", "abc"),
        ("a-b_c9", "a-b_c9"),
        ("a.b", "a_b"),
        ("a*b>c", "a_b_c"),
        ("a b\tc", "a_b_c"),
        ("a/\\b", "a_b"),
        ("a..b", "a_b"),
        ("caméra", "cam_ra"),
        ("", ""),
    ],
)
def test_sanitize(raw, clean):
    assert t.sanitize(raw) == clean


def test_sanitize_never_lets_a_dot_through():
    for raw in ["a.b", ".", "...", "x.y.z", "a.*.>"]:
        assert "." not in t.sanitize(raw)
        assert "*" not in t.sanitize(raw)
        assert ">" not in t.sanitize(raw)


def test_sanitize_rejects_non_str():
    with pytest.raises(TypeError):
        t.sanitize(3)  # type: ignore[arg-type]


def test_subject_stream_and_eos_names():
    assert t.subject_for("f", "r", "n") == "vf.f.r.n"
    assert t.eos_subject_for("f", "r", "n") == "vf.f.r.n._eos"
    assert t.stream_name_for("f", "r", "n") == "vf-f-r-n"
    assert t.control_subject_for("f", "r") == "vf.f.r._control.stop"
    assert t.stream_label_selector("f", "r") == "vf-f-r-"
    assert t.subject_for("my.flow", "run 1", "cam*0") == "vf.my_flow.run_1.cam_0"


def test_durable_names():
    assert t.durable_name_for("child", "parent") == "child--from--parent"
    assert t.partitioned_durable_name_for("child", "parent", 2) == "child--from--parent--p2"
    assert t.eos_durable_name_for("child", "parent", "ab12") == "child--eos--parent--ab12"
    assert t.eos_anchor_durable_name_for("n") == "n--eos--anchor"
    assert t.durable_name_for("a.b", "c d") == "a_b--from--c_d"


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0"])
def test_partitioned_durable_rejects_bad_replica(bad):
    with pytest.raises(ValueError):
        t.partitioned_durable_name_for("c", "p", bad)


def test_dlq_names():
    assert t.dlq_stream_name("f") == "vf-f-dlq"
    assert t.dlq_subject_for("f", "r", "n") == "vf.f._dlq.r.n"
    assert t.dlq_subject_filter("f") == "vf.f._dlq.>"
    assert t.dlq_subject_filter("f", "r") == "vf.f._dlq.r.*"
    assert t.dlq_subject_filter("f", "r", "n") == "vf.f._dlq.r.n"
    assert t.dlq_subject_filter("f", node_name="n") == "vf.f._dlq.*.n"


def test_dlq_stream_name_is_flow_scoped():
    # STREAM-8: no run id in the DLQ stream name.
    assert t.dlq_stream_name("f") == t.dlq_stream_name("f")
    assert "r1" not in t.dlq_stream_name("f")


@pytest.mark.parametrize("bad", ["", "_eos", "_dlq", "_control"])
def test_naming_refuses_empty_and_reserved_parts(bad):
    with pytest.raises(ValueError):
        t.subject_for("f", "r", bad)
    with pytest.raises(ValueError):
        t.subject_for("f", bad, "n")
    with pytest.raises(ValueError):
        t.stream_name_for(bad, "r", "n")


def test_hyphenated_names_collide_but_subjects_do_not():
    # The documented ambiguity: node x-n of run r and node n of run r-x.
    assert t.stream_name_for("f", "r", "x-n") == t.stream_name_for("f", "r-x", "n")
    assert t.subject_for("f", "r", "x-n") != t.subject_for("f", "r-x", "n")
    assert t.stream_label_selector("f", "r") and t.stream_name_for("f", "r-x", "n").startswith(
        t.stream_label_selector("f", "r")
    )


def test_subject_owner_run_r_x_is_never_run_r():
    assert t.subject_owner("vf.f.r.x-n") == ("f", "r", "x-n")
    assert t.subject_owner("vf.f.r-x.n") == ("f", "r-x", "n")
    assert t.subject_owner(t.subject_for("f", "r-x", "n"))[1] == "r-x"
    assert t.subject_owner(t.eos_subject_for("f", "r-x", "n"))[1] == "r-x"


@pytest.mark.parametrize(
    ("flow", "run", "node"),
    [
        ("f", "r", "n"),
        ("f", "r", "x-n"),
        ("f", "r-x", "n"),
        ("my.flow", "run 7", "cam*0"),
        ("F_1", "2026-11-29T10:00", "fuse"),
        ("f", "r", "_private"),
    ],
)
def test_subject_owner_round_trips(flow, run, node):
    expected = (t.sanitize(flow), t.sanitize(run), t.sanitize(node))
    assert t.subject_owner(t.subject_for(flow, run, node)) == expected
    assert t.subject_owner(t.eos_subject_for(flow, run, node)) == expected
    # And the tokens rebuild the same subject.
    assert t.subject_for(*expected) == t.subject_for(flow, run, node)


@pytest.mark.parametrize(
    "subject",
    [
        "vf.f.r._control.stop",
        "vf.f._dlq.r.n",
        "vf.f._dlq.r._eos",
        "vf.f._dlq.>",
        "vf.f.r.*",
        "vf.f.r.>",
        "vf.f.*.n",
        "vf.f.r",
        "vf.f.r.n.extra",
        "vf.f.r.n._eos.x",
        "xx.f.r.n",
        "vf..r.n",
        "vf.f.r.",
        "foo",
        "",
        "vf-f-r-n",
        "vf.f._dlq.n",
        "vf.f.r._eos",
    ],
)
def test_subject_owner_rejects_other_subjects(subject):
    assert t.subject_owner(subject) is None


def test_control_and_dlq_subjects_are_not_owned():
    assert t.subject_owner(t.control_subject_for("f", "r")) is None
    assert t.subject_owner(t.dlq_subject_for("f", "r", "n")) is None
    assert t.subject_owner(t.dlq_subject_filter("f")) is None


# --------------------------------------------------------------------------------------
# Stream and consumer configs
# --------------------------------------------------------------------------------------


def test_realtime_stream_config():
    cfg = t.stream_config_for("f", "r", "n", REALTIME)
    assert isinstance(cfg, StreamConfig)
    assert cfg.name == "vf-f-r-n"
    assert cfg.subjects == ["vf.f.r.n", "vf.f.r.n._eos"]
    assert cfg.retention == RetentionPolicy.LIMITS
    assert cfg.discard == DiscardPolicy.OLD
    # The bound is per subject, so data never evicts an end-of-stream marker.
    assert cfg.max_msgs_per_subject == t.DEFAULT_REALTIME_BUFFER
    assert cfg.max_msgs == 2 * t.DEFAULT_REALTIME_BUFFER
    assert cfg.num_replicas is None


def test_realtime_buffer_is_at_least_one():
    def bounds(buffer: int) -> tuple[int | None, int | None]:
        cfg = t.stream_config_for("f", "r", "n", REALTIME, realtime_buffer=buffer)
        return cfg.max_msgs_per_subject, cfg.max_msgs

    assert bounds(0) == (1, 2)
    assert bounds(5) == (5, 10)


def test_a_realtime_stream_has_room_for_every_replica_s_end_marker():
    """Provisioning sizes a REALTIME node's per-subject bound to its replica count where
    that is more than REALTIME_BURST: each replica's end marker stays on the EOS subject
    until a reader takes it."""
    from videoflow.backends.jetstream.flow_provisioning import _flow_plan
    from videoflow.core.compiler import NodeSpec

    many = REALTIME_BURST + 3
    specs = [NodeSpec("cam", "producer", nb_tasks=many), NodeSpec("one", "processor",
                                                                  parents=("cam",)),
             NodeSpec("sink", "consumer", parents=("one",))]
    streams = {c.name: c for c in _flow_plan(specs, "f", "r", REALTIME).streams}
    assert streams["vf-f-r-cam"].max_msgs_per_subject == many
    assert streams["vf-f-r-one"].max_msgs_per_subject == REALTIME_BURST


def test_a_realtime_stream_read_by_a_join_keeps_one_message_per_subject():
    """A join takes whatever its parents' streams keep: one slower than its cameras
    would work through a backlog, always that far behind the newest frames. So its
    parents' streams keep one; the join's own stream, read by a one-parent sink, keeps
    a burst."""
    from videoflow.backends.jetstream.flow_provisioning import _flow_plan
    from videoflow.core.compiler import NodeSpec

    specs = [NodeSpec("cam_a", "producer"), NodeSpec("cam_b", "producer", nb_tasks=2),
             NodeSpec("fuse", "processor", parents=("cam_a", "cam_b")),
             NodeSpec("sink", "consumer", parents=("fuse",))]
    streams = {c.name: c for c in _flow_plan(specs, "f", "r", REALTIME).streams}
    assert streams["vf-f-r-cam_a"].max_msgs_per_subject == 1
    assert streams["vf-f-r-cam_b"].max_msgs_per_subject == 2  # its replicas' markers
    assert streams["vf-f-r-fuse"].max_msgs_per_subject == REALTIME_BURST


@pytest.mark.parametrize(("nb_tasks", "readers", "bound"), [
    (1, [1], REALTIME_BURST), (1, [1, 1], REALTIME_BURST), (1, [1, 2], 1), (1, [], 1),
    (3, [2], 3), (REALTIME_BURST + 1, [1], REALTIME_BURST + 1)])
def test_realtime_buffer_for(nb_tasks: int, readers: list[int], bound: int) -> None:
    assert realtime_buffer_for(nb_tasks, readers) == bound


def test_batch_stream_config():
    cfg = t.stream_config_for("f", "r", "n", BATCH)
    assert cfg.retention == RetentionPolicy.INTEREST
    assert cfg.discard == DiscardPolicy.NEW
    assert cfg.max_msgs == 10_000
    assert t.stream_config_for("f", "r", "n", BATCH, batch_max_msgs=7).max_msgs == 7
    with pytest.raises(ValueError):
        t.stream_config_for("f", "r", "n", BATCH, batch_max_msgs=0)


def test_stream_config_owner_labels_stream_14():
    cfg = t.stream_config_for("my.flow", "r-x", "n", BATCH)
    # Verbatim, not sanitized: teardown compares them against the ids it is given.
    assert cfg.metadata == {
        "videoflow.io/flow-id": "my.flow",
        "videoflow.io/run-id": "r-x",
        "videoflow.io/node": "n",
        "videoflow.io/kind": "stream",
    }
    gen = t.stream_config_for("f", "r", "n", BATCH, generation="g7")
    assert gen.metadata["videoflow.io/generation"] == "g7"


def test_stream_config_replicas():
    assert t.stream_config_for("f", "r", "n", BATCH, replicas=1).num_replicas is None
    assert t.stream_config_for("f", "r", "n", BATCH, replicas=3).num_replicas == 3
    assert "num_replicas" not in t.stream_config_for("f", "r", "n", BATCH).as_dict()
    with pytest.raises(ValueError):
        t.stream_config_for("f", "r", "n", BATCH, replicas=0)


def test_stream_config_custom_subjects_and_unknown_flow_type():
    subjects = ["a.b"]
    cfg = t.stream_config_for("f", "r", "n", REALTIME, subjects=subjects)
    assert cfg.subjects == ["a.b"]
    assert cfg.subjects is not subjects
    with pytest.raises(ValueError):
        t.stream_config_for("f", "r", "n", "streaming")


def test_stream_configs_are_fresh_objects():
    a = t.stream_config_for("f", "r", "n", BATCH)
    b = t.stream_config_for("f", "r", "n", BATCH)
    assert a == b and a is not b and a.metadata is not b.metadata


def test_dlq_stream_config_stream_8():
    cfg = t.dlq_stream_config("f")
    assert cfg.name == "vf-f-dlq"
    assert cfg.subjects == ["vf.f._dlq.>"]
    assert cfg.retention == RetentionPolicy.LIMITS
    assert cfg.max_age == 7 * 24 * 3600
    assert cfg.metadata == {"videoflow.io/flow-id": "f", "videoflow.io/kind": "dlq"}
    assert "videoflow.io/run-id" not in cfg.metadata
    assert cfg.num_replicas is None
    assert t.dlq_stream_config("f", replicas=3).num_replicas == 3
    # Every dead-letter subject of the flow lands in it, and no data subject does.
    assert t.dlq_subject_for("f", "r", "n").startswith("vf.f._dlq.")


def test_consumer_config_for():
    cfg = t.consumer_config_for("f", "r", "child", "parent")
    assert isinstance(cfg, ConsumerConfig)
    assert cfg.durable_name == "child--from--parent"
    assert cfg.filter_subject == "vf.f.r.parent"
    assert cfg.ack_policy == AckPolicy.EXPLICIT
    assert cfg.deliver_policy == DeliverPolicy.ALL
    assert (cfg.ack_wait, cfg.max_deliver, cfg.max_ack_pending) == (60, 1, 8)
    assert cfg.metadata == {
        "videoflow.io/flow-id": "f",
        "videoflow.io/run-id": "r",
        "videoflow.io/node": "child",
        "videoflow.io/kind": "durable",
    }
    custom = t.consumer_config_for(
        "f", "r", "c", "p", ack_wait=5, max_deliver=4, max_ack_pending=20, generation="g"
    )
    assert (custom.ack_wait, custom.max_deliver, custom.max_ack_pending) == (5, 4, 20)
    assert custom.metadata["videoflow.io/generation"] == "g"


def test_consumer_config_filters_data_not_eos():
    cfg = t.consumer_config_for("f", "r", "c", "p")
    assert cfg.filter_subject != t.eos_subject_for("f", "r", "p")


def test_eos_consumer_config():
    cfg = t.eos_consumer_config("f", "r", "c", "p", "abc")
    assert cfg.durable_name == "c--eos--p--abc"
    assert cfg.filter_subject == "vf.f.r.p._eos"
    assert cfg.inactive_threshold == 3600
    assert cfg.ack_policy == AckPolicy.EXPLICIT
    assert cfg.metadata["videoflow.io/node"] == "c"
    assert cfg.metadata["videoflow.io/kind"] == "eos_durable"
    short = t.eos_consumer_config("f", "r", "c", "p", "x", inactive_threshold=5)
    assert short.inactive_threshold == 5


def test_eos_anchor_config():
    cfg = t.eos_anchor_config("f", "r", "n", generation="g")
    assert cfg.durable_name == "n--eos--anchor"
    assert cfg.filter_subject == "vf.f.r.n._eos"
    assert cfg.inactive_threshold is None  # must not be reaped while the run is alive
    assert cfg.deliver_policy == DeliverPolicy.ALL
    assert cfg.metadata == {
        "videoflow.io/flow-id": "f",
        "videoflow.io/run-id": "r",
        "videoflow.io/node": "n",
        "videoflow.io/kind": "eos_anchor",
        "videoflow.io/generation": "g",
    }


async def _cb(_e: BaseException) -> None:
    return None


def test_connect_options_fail_fast_recipe():
    opts = t.connect_options_for(5.0, True, _cb)
    # NATS_FACTS §8: allow_reconnect=False, max_reconnect_attempts=1 (0 loops forever, S4),
    # reconnect_time_wait=0.1, connect_timeout=2.
    assert opts == {
        "allow_reconnect": False,
        "max_reconnect_attempts": 1,
        "reconnect_time_wait": 0.1,
        "connect_timeout": 2.0,
        "error_cb": _cb,
    }
    assert t.connect_options_for(0.5, True, _cb)["connect_timeout"] == 0.5


def test_connect_options_retrying():
    opts = t.connect_options_for(30.0, False, _cb)
    assert opts["allow_reconnect"] is True
    assert opts["max_reconnect_attempts"] == 60
    assert opts["reconnect_time_wait"] == 2.0
    assert opts["error_cb"] is _cb


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_connect_options_reject_bad_timeout(bad):
    with pytest.raises(ValueError):
        t.connect_options_for(bad, True, _cb)


def test_quiet_error_cb():
    assert asyncio.run(t.quiet_error_cb(RuntimeError("x"))) is None


# --------------------------------------------------------------------------------------
# Credit (STREAM-15, RUN-005, RUN-024) and delivery caps
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nb_tasks", "partitioned", "item_credit", "prefetch", "credit"),
    [
        (1, False, 1, 4, 5),
        (3, False, 1, 4, 15),
        (3, True, 1, 4, 5),
        (1, True, 1, 4, 5),
        (2, False, 10, 0, 20),
        (4, False, 2, 3, 20),
        (4, True, 2, 3, 5),
    ],
)
def test_consumer_credit(nb_tasks, partitioned, item_credit, prefetch, credit):
    assert t.consumer_credit(nb_tasks, partitioned, item_credit, prefetch) == credit


def test_consumer_credit_defaults():
    assert t.consumer_credit(1, False) == t.DEFAULT_ITEM_CREDIT + t.DEFAULT_PREFETCH
    assert t.consumer_credit(2, False) == 10


@pytest.mark.parametrize(
    "args", [(0, False), (1, False, 0), (1, False, 1, -1), (True, False), (1.5, False)]
)
def test_consumer_credit_rejects_out_of_range(args):
    with pytest.raises(ValueError):
        t.consumer_credit(*args)


@pytest.mark.parametrize(
    ("effective", "partitioned", "item_credit", "prefetch", "admits"),
    [
        (5, False, 1, 4, 1),
        (15, False, 1, 4, 3),
        (14, False, 1, 4, 2),
        (4, False, 1, 4, 0),
        (0, False, 1, 4, 0),
        (8, False, 1, 4, 1),  # the legacy DEFAULT_MAX_ACK_PENDING admits one replica
        (6, False, 1, 4, 1),  # LEGACY_BIND_CREDIT
        (1, True, 1, 4, 1),
        (100, True, 1, 4, 1),
        (0, True, 1, 4, 1),
        (-1, False, 1, 4, sys.maxsize),
        (40, False, 7, 3, 4),
    ],
)
def test_credit_admits(effective, partitioned, item_credit, prefetch, admits):
    assert t.credit_admits(effective, partitioned, item_credit, prefetch) == admits


@pytest.mark.parametrize("nb_tasks", [1, 2, 3, 8, 17])
@pytest.mark.parametrize("item_credit", [1, 3, 2049])
def test_credit_admits_inverts_consumer_credit(nb_tasks, item_credit):
    credit = t.consumer_credit(nb_tasks, False, item_credit)
    assert t.credit_admits(credit, False, item_credit) == nb_tasks
    # RUN-024: one short of the credit admits one replica fewer.
    assert t.credit_admits(credit - 1, False, item_credit) == nb_tasks - 1


def test_credit_admits_rejects_non_int():
    with pytest.raises(ValueError):
        t.credit_admits(None, False)  # type: ignore[arg-type]


def test_join_item_credit_single_parent_and_source():
    assert t.join_item_credit(["a"], None, BATCH) == 1
    assert t.join_item_credit([], None, REALTIME) == 1
    assert t.join_item_credit(["a"], {"max_pending": 5}, BATCH) == 1


@pytest.mark.parametrize(
    ("parents", "policy", "flow_type", "credit"),
    [
        # RUN-005: (max_pending + 1) per sync parent, max_pending per collect parent.
        (["a", "b"], None, REALTIME, (1024 + 1) * 2),
        (["a", "b"], None, BATCH, (100_000 + 1) * 2),
        (["a", "b", "c"], {"max_pending": 4}, BATCH, 5 * 3),
        (["a", "b"], {"max_pending": 9}, REALTIME, 10 * 2),
        (
            ["a", "b", "c"],
            {"mode": "time", "tolerance_ms": 5.0, "max_pending": 8, "collect": {"c": 20.0}},
            BATCH,
            9 * 2 + 8,
        ),
    ],
)
def test_join_item_credit_is_working_set(parents, policy, flow_type, credit):
    assert t.join_item_credit(parents, policy, flow_type) == credit


def test_join_item_credit_matches_joinpolicy_working_set():
    policy = {"max_pending": 16, "timeout_ms": 100.0}
    parents = ["x", "y", "z"]
    expected = JoinPolicy.from_dict(
        {**JoinPolicy.default_for(BATCH).to_dict(), **policy}
    ).working_set(parents)
    assert t.join_item_credit(parents, policy, BATCH) == expected


def test_node_credit_admits_everything_a_replica_holds_unsettled():
    # A replica holds unsettled, per durable: the group in processing, its window's
    # groups, the acks it gathers before sending (fewer than SETTLE_BATCH) and its
    # parked prefetch. A credit below that has the broker hold its input back while
    # the acks wait for their linger.
    holds = 1 + t.WINDOW_GROUPS + (t.SETTLE_BATCH - 1) + t.RECEIVE_PREFETCH
    assert t.node_credit(1, False, ["cam"], None, BATCH) >= holds
    assert t.node_credit(3, False, ["cam"], None, BATCH) >= 3 * holds
    assert t.node_credit(3, True, ["cam"], None, BATCH) >= holds


def test_join_item_credit_errors():
    with pytest.raises(ValueError):
        t.join_item_credit(["a", "b"], None, "nope")
    with pytest.raises(ValueError):
        t.join_item_credit(["a", "b"], {"bogus": 1}, BATCH)
    with pytest.raises(ValueError):
        t.join_item_credit(["a", "b"], {"quorum": 3}, BATCH)


@pytest.mark.parametrize(
    ("flow_type", "max_retries", "delivery", "ledger", "expected"),
    [
        (REALTIME, 3, None, False, 1),  # best effort preset
        (BATCH, 3, None, False, 4),  # at least once: retries + 1
        (BATCH, 0, None, False, 1),
        (BATCH, 5, None, False, 6),
        (REALTIME, 3, {"mode": "at_least_once"}, False, 4),
        (REALTIME, 2, {"mode": "at_least_once"}, False, 3),
        (BATCH, 3, {"mode": "best_effort"}, False, 1),
        (BATCH, 3, {"max_retries": 7}, False, 8),  # the node override wins
        (BATCH, 3, {"mode": "at_least_once", "backoff": {"base_ms": 10.0}}, False, 4),
        (BATCH, 3, None, True, -1),  # STREAM-15 / D11: the ledger enforces the budget
        (REALTIME, 3, {"mode": "at_least_once"}, True, -1),
        (REALTIME, 3, None, True, 1),  # best effort keeps 1 either way
        (BATCH, 3, {"mode": "best_effort"}, True, 1),
    ],
)
def test_max_deliver_for(flow_type, max_retries, delivery, ledger, expected):
    assert t.max_deliver_for(flow_type, max_retries, delivery, ledger) == expected


def test_max_deliver_for_defaults_and_errors():
    assert t.max_deliver_for(BATCH) == 4
    assert t.max_deliver_for(REALTIME) == 1
    with pytest.raises(ValueError):
        t.max_deliver_for("nope")
    with pytest.raises(ValueError):
        t.max_deliver_for(BATCH, -1)
    with pytest.raises(ValueError):
        t.max_deliver_for(BATCH, 3, {"mode": "sometimes"})
    with pytest.raises(ValueError):
        t.max_deliver_for(BATCH, 3, {"retries": 2})


# --------------------------------------------------------------------------------------
# Verification types, field-level mismatches, profile checks
# --------------------------------------------------------------------------------------


def _read_back(cfg: StreamConfig, **overrides) -> StreamConfig:
    """What stream_info returns: the wire form parsed back, enums as plain str (S17),
    server metadata keys added (S7)."""
    wire = cfg.as_dict()
    wire.update({k: v.value for k, v in wire.items() if hasattr(v, "value")})
    wire["metadata"] = {
        **(wire.get("metadata") or {}),
        "_nats.level": "5",
        "_nats.req.level": "0",
        "_nats.ver": "2.15.1",
    }
    wire.setdefault("storage", "file")
    wire.setdefault("num_replicas", 1)
    effective = StreamConfig.from_response(wire)
    for key, value in overrides.items():
        setattr(effective, key, value)
    return effective


def test_verified_types():
    req = t.stream_config_for("f", "r", "n", BATCH)
    vs = t.VerifiedStream(req, None)
    assert vs.mismatches == () and vs.effective is None and vs.requested is req
    with pytest.raises(FrozenInstanceError):
        vs.mismatches = ("x",)  # type: ignore[misc]
    creq = t.consumer_config_for("f", "r", "c", "p")
    vc = t.VerifiedConsumer(creq, creq, ("a: b",))
    assert vc.mismatches == ("a: b",)


@pytest.mark.parametrize("flow_type", [REALTIME, BATCH])
def test_stream_read_back_matches_itself(flow_type):
    req = t.stream_config_for("f", "r", "n", flow_type, generation="g")
    effective = _read_back(req)
    assert isinstance(effective.retention, str)  # S17 reproduced
    assert t.stream_mismatches(req, effective) == ()


def test_stream_read_back_reports_what_the_broker_did_not_honour():
    req = t.stream_config_for("f", "r", "n", REALTIME, replicas=3)
    effective = _read_back(req, retention="interest", num_replicas=1)
    found = t.stream_mismatches(req, effective)
    assert "retention: requested 'limits', effective 'interest'" in found
    assert "num_replicas: requested 3, effective 1" in found
    assert len(found) == 2


def test_stream_read_back_metadata_subset_ignores_server_keys():
    req = t.stream_config_for("f", "r", "n", BATCH)
    effective = _read_back(req)
    effective.metadata = {"_nats.ver": "2.15.1"}  # a server that dropped user metadata
    (finding,) = t.stream_mismatches(req, effective)
    assert finding.startswith("metadata: requested")
    assert "_nats" not in finding


def test_consumer_read_back():
    req = t.consumer_config_for("f", "r", "c", "p", max_ack_pending=15)
    wire = req.as_dict()
    wire.update({k: v.value for k, v in wire.items() if hasattr(v, "value")})
    wire["metadata"] = {**wire["metadata"], "_nats.ver": "2.15.1"}
    effective = ConsumerConfig.from_response(wire)
    assert t.consumer_mismatches(req, effective) == ()
    effective.max_ack_pending = 8
    assert t.consumer_mismatches(req, effective) == (
        "max_ack_pending: requested 15, effective 8",
    )


def test_user_metadata_drops_server_keys():
    assert t.user_metadata({"_nats.ver": "x", "a": "b"}) == {"a": "b"}
    assert t.user_metadata(None) == {}


def test_profile_mismatches_batch_carries_reliable_work():
    eff = _read_back(t.stream_config_for("f", "r", "n", BATCH))
    assert t.profile_mismatches("reliable_work", eff) == ()
    assert len(t.profile_mismatches("live_latest", eff)) == 2


def test_profile_mismatches_realtime_carries_live_latest():
    eff = _read_back(t.stream_config_for("f", "r", "n", REALTIME))
    assert t.profile_mismatches("live_latest", eff) == ()
    found = t.profile_mismatches("reliable_work", eff)
    assert [f.split(":")[0] for f in found] == ["retention", "discard"]
    assert found[0].startswith("retention: limits ")
    assert found[1].startswith("discard: old ")


@pytest.mark.parametrize(
    ("retention", "discard", "findings"),
    [
        (RetentionPolicy.INTEREST, DiscardPolicy.NEW, ()),
        (RetentionPolicy.WORK_QUEUE, DiscardPolicy.NEW, ()),
        ("interest", "new", ()),
        ("workqueue", "new", ()),
        ("limits", "new", ("retention",)),
        ("interest", "old", ("discard",)),
        (RetentionPolicy.LIMITS, DiscardPolicy.OLD, ("retention", "discard")),
    ],
)
def test_profile_mismatches_reliable_work(retention, discard, findings):
    eff = StreamConfig(name="s", retention=retention, discard=discard, max_msgs=10)
    found = t.profile_mismatches("reliable_work", eff)
    assert tuple(f.split(":")[0] for f in found) == findings


@pytest.mark.parametrize(
    ("bounds", "bounded"),
    [
        ({"max_msgs": 1}, True),
        ({"max_bytes": 1024}, True),
        ({"max_age": 60.0}, True),
        ({"max_msgs": -1, "max_bytes": -1, "max_age": 0.0}, False),
        ({}, False),
        ({"max_msgs": 0}, False),
    ],
)
def test_profile_mismatches_live_latest_needs_a_bound(bounds, bounded):
    eff = StreamConfig(name="s", retention="limits", discard="old", **bounds)
    found = t.profile_mismatches("live_latest", eff)
    assert (found == ()) == bounded
    if not bounded:
        assert found[0].startswith("max_msgs: ")
        assert "unbounded" in found[0]


def test_profile_mismatches_live_latest_wrong_shape():
    eff = StreamConfig(name="s", retention="interest", discard="new", max_msgs=5)
    found = t.profile_mismatches("live_latest", eff)
    assert [f.split(":")[0] for f in found] == ["retention", "discard"]


@pytest.mark.parametrize("profile", ["durable_control", "replay_archive"])
def test_profile_mismatches_non_stream_profiles_have_no_findings(profile):
    eff = StreamConfig(name="s", retention="limits", discard="old")
    assert t.profile_mismatches(profile, eff) == ()


def test_profile_mismatches_unknown_profile():
    with pytest.raises(ValueError):
        t.profile_mismatches("fast", StreamConfig(name="s"))


# --------------------------------------------------------------------------------------
# observation_failure
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "reported", "reason"),
    [
        (nats.errors.Error("nats: 'Authorization Violation'"), (), "auth"),
        (nats.errors.AuthorizationError(), (), "auth"),
        (
            asyncio.TimeoutError(),
            ('nats: permissions violation for publish to "$JS.API.STREAM.INFO.x"',),
            "auth",
        ),
        (nats.errors.TimeoutError(), ("Error: nats: 'Authorization Violation'",), "auth"),
        (nats.errors.NoServersError(), (), "unreachable"),
        (ConnectionRefusedError(111, "Connect call failed"), (), "unreachable"),
        (
            asyncio.TimeoutError(),
            ("ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', 1)",),
            "unreachable",
        ),
        (TimeoutError(), (ConnectionRefusedError(111, "Connect call failed"),), "unreachable"),
        (asyncio.TimeoutError(), (), "timeout"),
        (nats.errors.TimeoutError(), (), "timeout"),
        (TimeoutError(), ("something else",), "timeout"),
        (nats.js.errors.ServiceUnavailableError(), (), "api"),
        (nats.js.errors.ServerError(), (), "api"),
        (nats.errors.NoRespondersError(), (), "api"),
        (nats.errors.ConnectionClosedError(), (), "unreachable"),
        (ValueError("bad json"), (), "malformed"),
        (KeyError("config"), (), "malformed"),
        (nats.errors.JsonParseError(), (), "malformed"),
    ],
)
def test_observation_failure(error, reported, reason):
    got, detail = t.observation_failure(error, reported)
    assert got == reason
    assert got in UNKNOWN_REASONS
    assert type(error).__name__ in detail


def test_observation_failure_detail_includes_reports():
    reason, detail = t.observation_failure(asyncio.TimeoutError(), ("first", "second"))
    assert reason == "timeout"
    assert "first" in detail and "second" in detail


# --------------------------------------------------------------------------------------
# verify_channel_profiles
# --------------------------------------------------------------------------------------


def _verified(flow_type: str, node: str = "n", **overrides) -> t.VerifiedStream:
    req = t.stream_config_for("f", "r", node, flow_type, replicas=3)
    eff = _read_back(req, **overrides)
    return t.VerifiedStream(req, eff, t.stream_mismatches(req, eff))


def test_verify_passes_when_streams_carry_their_profiles():
    read_back = {"a": _verified(BATCH, "a"), "b": _verified(REALTIME, "b")}
    requests = [ProfileRequest("a", "reliable_work"), ProfileRequest("b", "live_latest")]
    t.verify_channel_profiles(read_back, requests, unknown_is_fatal=True, where="provision")
    t.verify_channel_profiles(
        read_back, requests, unknown_is_fatal=True, where="provision", config_mismatches=True
    )


def test_verify_rejects_a_stream_without_the_profile():
    read_back = {"a": _verified(REALTIME, "a")}
    with pytest.raises(IncompatibleProfile) as info:
        t.verify_channel_profiles(
            read_back,
            [ProfileRequest("a", "reliable_work", requested_by="fuse")],
            unknown_is_fatal=False,
            where="worker fuse",
        )
    err = info.value
    assert (err.channel, err.profile) == ("a", "reliable_work")
    assert [f.split(":")[0] for f in err.findings] == ["retention", "discard"]
    assert "worker fuse" in str(err) and "requested by fuse" in str(err)


def test_verify_config_mismatches_only_when_asked():
    read_back = {"a": _verified(BATCH, "a", num_replicas=1)}
    assert read_back["a"].mismatches == ("num_replicas: requested 3, effective 1",)
    requests = [ProfileRequest("a", "reliable_work")]
    t.verify_channel_profiles(read_back, requests, unknown_is_fatal=True, where="worker a")
    with pytest.raises(IncompatibleProfile) as info:
        t.verify_channel_profiles(
            read_back, requests, unknown_is_fatal=True, where="provision", config_mismatches=True
        )
    assert info.value.findings == ("num_replicas: requested 3, effective 1",)


def test_verify_missing_stream_is_broker_unavailable():
    read_back = {"a": Unknown("missing", "stream not found")}
    for fatal in (True, False):
        with pytest.raises(BrokerUnavailable):
            t.verify_channel_profiles(
                read_back, [ProfileRequest("a", "live_latest")], unknown_is_fatal=fatal,
                where="provision",
            )


def test_verify_unobservable_is_fatal_only_when_asked(caplog):
    read_back = {"a": Unknown("timeout", "no answer in 30 s")}
    requests = [ProfileRequest("a", "reliable_work")]
    with pytest.raises(UnobservableState) as info:
        t.verify_channel_profiles(read_back, requests, unknown_is_fatal=True, where="provision")
    assert (info.value.reason, info.value.detail) == ("timeout", "no answer in 30 s")
    with caplog.at_level("WARNING"):
        t.verify_channel_profiles(read_back, requests, unknown_is_fatal=False, where="worker a")
    assert "could not be read back" in caplog.text


def test_verify_failed_read_back_counts_as_unobserved():
    req = t.stream_config_for("f", "r", "a", BATCH)
    read_back = {"a": t.VerifiedStream(req, None, ("read-back failed",))}
    requests = [ProfileRequest("a", "reliable_work")]
    with pytest.raises(UnobservableState):
        t.verify_channel_profiles(read_back, requests, unknown_is_fatal=True, where="provision")
    t.verify_channel_profiles(read_back, requests, unknown_is_fatal=False, where="provision")


def test_verify_skips_channels_not_read_back():
    t.verify_channel_profiles(
        {}, [ProfileRequest("elsewhere", "reliable_work")], unknown_is_fatal=True, where="w"
    )


def test_verify_most_definite_verdict_wins():
    read_back = {
        "gone": Unknown("missing"),
        "slow": Unknown("timeout"),
        "wrong": _verified(REALTIME, "wrong"),
    }
    requests = [
        ProfileRequest("slow", "reliable_work"),
        ProfileRequest("gone", "reliable_work"),
        ProfileRequest("wrong", "reliable_work"),
    ]
    with pytest.raises(IncompatibleProfile):
        t.verify_channel_profiles(read_back, requests, unknown_is_fatal=True, where="p")
    with pytest.raises(BrokerUnavailable):
        t.verify_channel_profiles(read_back, requests[:2], unknown_is_fatal=True, where="p")


def test_verify_non_stream_profiles_have_no_profile_findings():
    read_back = {"a": _verified(REALTIME, "a")}
    t.verify_channel_profiles(
        read_back, [ProfileRequest("a", "durable_control")], unknown_is_fatal=True, where="p"
    )


# --------------------------------------------------------------------------------------
# The documented signatures and defaults
# --------------------------------------------------------------------------------------

_DOCUMENTED_DEFAULTS = {
    "consumer_config_for": {"ack_wait": 60, "max_deliver": 1, "max_ack_pending": 8,
                            "generation": None},
    "consumer_credit": {"item_credit": 1, "prefetch": 4},
    "credit_admits": {"item_credit": 1, "prefetch": 4},
    "dlq_stream_config": {"replicas": 1},
    "dlq_subject_filter": {"run_id": None, "node_name": None},
    "eos_anchor_config": {"generation": None},
    "eos_consumer_config": {"inactive_threshold": 3600, "generation": None},
    "max_deliver_for": {"max_retries": 3, "delivery": None, "ledger_budget": False},
    "observation_failure": {"reported": ()},
    "stream_config_for": {"subjects": None, "realtime_buffer": 1, "batch_max_msgs": 10000,
                          "generation": None, "replicas": 1},
    "verify_channel_profiles": {"config_mismatches": False},
}


@pytest.mark.parametrize("name", sorted(_DOCUMENTED_DEFAULTS))
def test_documented_defaults(name):
    params = inspect.signature(getattr(t, name)).parameters
    defaults = {
        k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty
    }
    assert defaults == _DOCUMENTED_DEFAULTS[name]


def test_verify_channel_profiles_flags_are_keyword_only():
    params = inspect.signature(t.verify_channel_profiles).parameters
    for name in ("unknown_is_fatal", "where", "config_mismatches"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_consumer_configs_are_fresh_objects():
    # pull_subscribe mutates the config it is given (NATS_FACTS S18).
    for build in (
        lambda: t.consumer_config_for("f", "r", "c", "p"),
        lambda: t.eos_consumer_config("f", "r", "c", "p", "i"),
        lambda: t.eos_anchor_config("f", "r", "n"),
    ):
        a, b = build(), build()
        assert a == b and a is not b and a.metadata is not b.metadata
