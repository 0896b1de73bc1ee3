"""Unit tests of videoflow.core.policies: JoinPolicy, DeliveryPolicy and the delivery errors."""

from __future__ import annotations

import asyncio
import json
import math
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.policies import (
    ACTION_KINDS,
    DEAD_LETTER,
    DROP,
    MAX_SYNC_PARENTS,
    NAK_UNCOUNTED,
    POISON,
    RETRY,
    TRANSIENT,
    WORKER_FATAL,
    Backoff,
    DeliveryAction,
    DeliveryPolicy,
    JoinPolicy,
    PoisonMessage,
    WorkerFatal,
    classify_error,
)
from videoflow.errors import VideoflowError, WireError

# --------------------------------------------------------------------------------------
# JoinPolicy
# --------------------------------------------------------------------------------------


def test_join_policy_fields_are_exactly_the_documented_ones_in_order():
    assert JoinPolicy.__struct_fields__ == (
        "mode",
        "tolerance_ms",
        "timeout_ms",
        "missing",
        "quorum",
        "max_pending",
        "collect",
        "max_drift_ms",
        "disorder_ms",
        "clock_offsets",
        "clock_correction",
        "clock_step_ms",
        "clock_limit_ms",
    )


def test_join_policy_defaults_are_trace_mode_with_drop():
    policy = JoinPolicy()
    assert policy.mode == "trace"
    assert policy.missing == "drop"
    assert policy.quorum is None
    assert policy.collect == {}


def test_join_policy_is_frozen():
    policy = JoinPolicy()
    with pytest.raises(AttributeError):
        policy.mode = "time"  # type: ignore[misc]


def test_join_policy_to_dict_from_dict_round_trips_a_full_time_policy():
    policy = JoinPolicy(
        mode="time",
        tolerance_ms=33.0,
        timeout_ms=1500.0,
        missing="dead_letter",
        quorum=2,
        max_pending=64,
        collect={"imu": 10.0},
        max_drift_ms=250.0,
        disorder_ms=300.0,
        clock_offsets={"cam": -0.0198},
        clock_correction="running",
        clock_step_ms=5.0,
        clock_limit_ms=50.0,
    )
    data = policy.to_dict()
    assert data == {
        "mode": "time",
        "tolerance_ms": 33.0,
        "timeout_ms": 1500.0,
        "missing": "dead_letter",
        "quorum": 2,
        "max_pending": 64,
        "collect": {"imu": 10.0},
        "max_drift_ms": 250.0,
        "disorder_ms": 300.0,
        "clock_offsets": {"cam": -0.0198},
        "clock_correction": "running",
        "clock_step_ms": 5.0,
        "clock_limit_ms": 50.0,
    }
    assert JoinPolicy.from_dict(data) == policy


def test_join_policy_to_dict_survives_json():
    policy = JoinPolicy(mode="time", tolerance_ms=5.0, collect={"lidar": 20.0})
    assert JoinPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy


def test_join_policy_to_dict_copies_collect():
    policy = JoinPolicy(mode="time", tolerance_ms=5.0, collect={"imu": 1.0})
    policy.to_dict()["collect"]["imu"] = -1.0
    assert policy.collect == {"imu": 1.0}


def test_join_policy_from_dict_with_absent_keys_takes_defaults():
    assert JoinPolicy.from_dict({}) == JoinPolicy()
    assert JoinPolicy.from_dict({"max_pending": 8}) == JoinPolicy(max_pending=8)


def test_join_policy_from_dict_accepts_a_mapping_collect():
    from types import MappingProxyType

    policy = JoinPolicy.from_dict(
        {"mode": "time", "tolerance_ms": 1.0, "collect": MappingProxyType({"imu": 2.0})}
    )
    assert policy.collect == {"imu": 2.0}


_finite_ms = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
_positive_ms = st.floats(min_value=1e-3, max_value=1e9, allow_nan=False, allow_infinity=False)
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)


@st.composite
def valid_join_policies(draw: st.DrawFn) -> JoinPolicy:
    mode = draw(st.sampled_from(["trace", "time"]))
    tolerance = draw(_finite_ms) if mode == "time" else draw(st.none() | _finite_ms)
    collect = draw(st.dictionaries(_names, _finite_ms, max_size=4)) if mode == "time" else {}
    return JoinPolicy(
        mode=mode,
        tolerance_ms=tolerance,
        timeout_ms=draw(st.none() | _positive_ms),
        missing=draw(st.sampled_from(["drop", "dead_letter", "wait"])),
        quorum=draw(st.none() | st.integers(min_value=1, max_value=64)),
        max_pending=draw(st.integers(min_value=1, max_value=10**6)),
        collect=collect,
        max_drift_ms=None if mode == "trace" or draw(st.booleans()) else max(
            [1.0, tolerance or 0.0, *collect.values()]) * draw(st.floats(1.0, 10.0)),
        disorder_ms=0.0 if mode == "trace" else draw(_finite_ms),
    )


@given(valid_join_policies())
def test_join_policy_round_trips_through_dict_for_any_valid_policy(policy: JoinPolicy):
    assert JoinPolicy.from_dict(policy.to_dict()) == policy


def test_join_policy_default_for_realtime_favours_freshness():
    policy = JoinPolicy.default_for(REALTIME)
    assert policy.missing == "drop"
    assert policy.timeout_ms == 2000.0
    assert policy.max_pending == 1024


def test_join_policy_default_for_batch_favours_completeness():
    realtime = JoinPolicy.default_for(REALTIME)
    batch = JoinPolicy.default_for(BATCH)
    assert batch.missing == "dead_letter"
    assert batch.timeout_ms is not None and realtime.timeout_ms is not None
    assert batch.timeout_ms > realtime.timeout_ms
    assert batch.max_pending > realtime.max_pending


def test_join_policy_default_for_unknown_flow_type_names_flow_type():
    with pytest.raises(ValueError, match=r"flow_type must be one of .*'streaming'"):
        JoinPolicy.default_for("streaming")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "nearest"}, r"^mode must be one of \('trace', 'time'\), got 'nearest'"),
        ({"mode": None}, r"^mode must be one of"),
        ({"missing": "retry"}, r"^missing must be one of .*got 'retry'"),
        ({"missing": ""}, r"^missing must be one of"),
        ({"mode": "time"}, r"^tolerance_ms is required in time mode"),
        ({"mode": "time", "tolerance_ms": None}, r"^tolerance_ms is required in time mode"),
        ({"tolerance_ms": -1.0}, r"^tolerance_ms must be finite and >= 0"),
        ({"tolerance_ms": math.nan}, r"^tolerance_ms must be finite"),
        ({"tolerance_ms": True}, r"^tolerance_ms must be a number"),
        ({"timeout_ms": 0.0}, r"^timeout_ms must be finite and > 0"),
        ({"timeout_ms": math.inf}, r"^timeout_ms must be finite"),
        ({"timeout_ms": "5s"}, r"^timeout_ms must be a number"),
        ({"quorum": 0}, r"^quorum must be an int >= 1 or None, got 0"),
        ({"quorum": -2}, r"^quorum must be an int >= 1 or None, got -2"),
        ({"quorum": 1.5}, r"^quorum must be an int"),
        ({"quorum": True}, r"^quorum must be an int"),
        ({"max_pending": 0}, r"^max_pending must be an int >= 1, got 0"),
        ({"max_pending": 2.0}, r"^max_pending must be an int"),
        ({"collect": [("imu", 1.0)]}, r"^collect must be a dict"),
        ({"collect": {"imu": 1.0}}, r"^collect windows need mode='time'"),
        (
            {"mode": "time", "tolerance_ms": 1.0, "collect": {"imu": -5.0}},
            r"^collect\['imu'\] must be finite and >= 0, got -5.0",
        ),
        (
            {"mode": "time", "tolerance_ms": 1.0, "collect": {"imu": math.nan}},
            r"^collect\['imu'\] must be finite",
        ),
        (
            {"mode": "time", "tolerance_ms": 1.0, "collect": {3: 1.0}},
            r"^collect keys must be parent names, got 3",
        ),
        ({"max_drift_ms": 100.0}, r"^max_drift_ms needs mode='time'"),
        ({"disorder_ms": 100.0}, r"^disorder_ms needs mode='time'"),
        ({"mode": "time", "tolerance_ms": 1.0, "disorder_ms": -1.0},
         r"^disorder_ms must be finite and >= 0"),
        ({"mode": "time", "tolerance_ms": 1.0, "disorder_ms": math.nan},
         r"^disorder_ms must be finite"),
        ({"mode": "time", "tolerance_ms": 1.0, "max_drift_ms": 0.0},
         r"^max_drift_ms must be finite and > 0"),
        ({"mode": "time", "tolerance_ms": 1.0, "max_drift_ms": math.inf},
         r"^max_drift_ms must be finite"),
        ({"mode": "time", "tolerance_ms": 40.0, "max_drift_ms": 30.0},
         r"^max_drift_ms 30.0 is below tolerance_ms 40.0"),
        ({"mode": "time", "tolerance_ms": 8.0, "collect": {"imu": 50.0}, "max_drift_ms": 30.0},
         r"^max_drift_ms 30.0 is below collect\['imu'\] 50.0"),
    ],
)
def test_join_policy_rejects_invalid_field_with_message_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match):
        JoinPolicy(**kwargs)


def test_a_time_joins_drift_bound_defaults_to_a_second_or_twice_what_a_group_spans():
    assert JoinPolicy(mode="time", tolerance_ms=8.0).drift_seconds() == 1.0
    assert JoinPolicy(mode="time", tolerance_ms=800.0).drift_seconds() == 1.6
    assert JoinPolicy(mode="time", tolerance_ms=8.0,
                      collect={"imu": 700.0}).drift_seconds() == 1.4
    assert JoinPolicy(mode="time", tolerance_ms=8.0, max_drift_ms=50.0).drift_seconds() == 0.05
    assert JoinPolicy(mode="trace").drift_seconds() is None  # no event time to align by


def test_join_policy_from_dict_rejects_unknown_key_by_name():
    with pytest.raises(ValueError, match=r"unknown JoinPolicy field 'tolerance'"):
        JoinPolicy.from_dict({"mode": "time", "tolerance": 5.0})


@pytest.mark.parametrize(
    ("build", "said"),
    [
        (lambda: JoinPolicy.from_dict({"mode": "time", "tolerence_ms": 5.0}),
         "unknown JoinPolicy field 'tolerence_ms'; did you mean 'tolerance_ms'?"),
        (lambda: JoinPolicy.from_dict({"max_drift": 5.0}),
         "unknown JoinPolicy field 'max_drift'; did you mean 'max_drift_ms'?"),
        (lambda: DeliveryPolicy.from_dict({"max_retry": 3}),
         "unknown DeliveryPolicy field 'max_retry'; did you mean 'max_retries'?"),
        (lambda: DeliveryPolicy.from_dict({"backoff": {"base": 1.0}}),
         "unknown backoff field 'base'; did you mean 'base_ms'?"),
        (lambda: Backoff.from_dict({"max": 1.0}),
         "unknown backoff field 'max'; did you mean 'max_ms'?"),
        (lambda: JoinPolicy(mode="time", tolerance_ms=1.0, collect={"imu0": 5.0})
         .validate_for(["cam", "imu"]),
         "collect parent 'imu0' is not a parent of this node; did you mean 'imu'?"),
    ],
)
def test_a_misspelt_field_is_refused_with_the_field_meant(build, said):
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        build()


def test_a_field_close_to_none_is_refused_without_a_guess():
    with pytest.raises(ValueError, match=r"^unknown JoinPolicy field 'colour'$"):
        JoinPolicy.from_dict({"colour": "red"})


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"mode": "fuzzy"}, r"^mode must be one of"),
        ({"missing": "ignore"}, r"^missing must be one of"),
        ({"collect": None}, r"^collect must be a dict"),
        ({"mode": "time", "tolerance_ms": 1.0, "collect": 5}, r"^collect must be a dict"),
        ({"mode": "time", "tolerance_ms": 1.0, "collect": "ab"}, r"^collect must be a dict"),
    ],
)
def test_join_policy_from_dict_rejects_bad_values_with_message_naming_field(data, match):
    with pytest.raises(ValueError, match=match):
        JoinPolicy.from_dict(data)


def test_validate_for_returns_sync_parents_in_parent_order():
    policy = JoinPolicy(mode="time", tolerance_ms=10.0, collect={"imu": 5.0})
    assert policy.validate_for(["cam_b", "imu", "cam_a"]) == ["cam_b", "cam_a"]


def test_validate_for_rejects_quorum_above_sync_parent_count():
    policy = JoinPolicy(mode="time", tolerance_ms=10.0, quorum=3, collect={"imu": 5.0})
    with pytest.raises(ValueError, match=r"^quorum 3 exceeds the 2 sync parents"):
        policy.validate_for(["cam_a", "cam_b", "imu"])


def test_validate_for_accepts_quorum_equal_to_sync_parent_count():
    policy = JoinPolicy(quorum=2)
    assert policy.validate_for(["a", "b"]) == ["a", "b"]


def test_validate_for_rejects_collect_parent_that_is_not_a_parent():
    policy = JoinPolicy(mode="time", tolerance_ms=10.0, collect={"radar": 5.0})
    with pytest.raises(ValueError, match=r"^collect parent 'radar' is not a parent"):
        policy.validate_for(["cam_a", "cam_b"])


def test_working_set_rejects_collect_parent_that_is_not_a_parent():
    policy = JoinPolicy(mode="time", tolerance_ms=10.0, collect={"radar": 5.0})
    with pytest.raises(ValueError, match=r"^collect parent 'radar' is not a parent"):
        policy.working_set(["cam_a"])


def test_validate_for_rejects_all_parents_being_collect_parents():
    policy = JoinPolicy(mode="time", tolerance_ms=10.0, collect={"a": 1.0, "b": 1.0})
    with pytest.raises(ValueError, match=r"^collect: at least one parent must be a sync"):
        policy.validate_for(["a", "b"])


def test_validate_for_rejects_more_than_64_sync_parents():
    parents = [f"p{i}" for i in range(MAX_SYNC_PARENTS + 1)]
    with pytest.raises(ValueError, match=r"^parents: 65 sync parents exceed the maximum of 64"):
        JoinPolicy().validate_for(parents)


def test_validate_for_accepts_exactly_64_sync_parents_plus_collect_parents():
    parents = [f"p{i}" for i in range(MAX_SYNC_PARENTS)] + ["imu"]
    policy = JoinPolicy(mode="time", tolerance_ms=1.0, collect={"imu": 1.0})
    assert len(policy.validate_for(parents)) == MAX_SYNC_PARENTS


def test_validate_for_rejects_duplicate_parents():
    with pytest.raises(ValueError, match=r"^parents must be distinct"):
        JoinPolicy().validate_for(["a", "a"])


def test_working_set_holds_every_half_of_every_pending_group_plus_one_group():
    policy = JoinPolicy(max_pending=10)
    assert policy.working_set(["a", "b", "c"]) == (10 + 1) * 3


def test_working_set_adds_one_sample_buffer_per_collect_parent():
    policy = JoinPolicy(mode="time", tolerance_ms=5.0, max_pending=100, collect={"imu": 2.0})
    assert policy.working_set(["cam_a", "cam_b", "imu"]) == 101 * 2 + 100 * 1


def test_working_set_of_a_single_parent_with_one_pending_group():
    assert JoinPolicy(max_pending=1).working_set(["only"]) == 2


@given(
    max_pending=st.integers(min_value=1, max_value=10**6),
    n_sync=st.integers(min_value=1, max_value=MAX_SYNC_PARENTS),
    n_collect=st.integers(min_value=0, max_value=5),
)
def test_working_set_matches_its_formula(max_pending: int, n_sync: int, n_collect: int):
    sync = [f"s{i}" for i in range(n_sync)]
    collect = {f"c{i}": 1.0 for i in range(n_collect)}
    policy = JoinPolicy(mode="time", tolerance_ms=1.0, max_pending=max_pending, collect=collect)
    expected = (max_pending + 1) * n_sync + max_pending * n_collect
    assert policy.working_set(sync + list(collect)) == expected


# --------------------------------------------------------------------------------------
# Delivery errors and classification
# --------------------------------------------------------------------------------------


def test_poison_message_and_worker_fatal_are_videoflow_errors():
    assert issubclass(PoisonMessage, VideoflowError)
    assert issubclass(WorkerFatal, VideoflowError)
    assert PoisonMessage.retryable is False
    assert WorkerFatal.retryable is True


@pytest.mark.parametrize(
    "error",
    [
        PoisonMessage("frame has no pixels"),
        WireError("truncated envelope"),
        ValueError("bad value"),
        TypeError("not a frame"),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        json.JSONDecodeError("Expecting value", "", 0),
        msgspec.ValidationError("Expected `int`, got `str`"),
    ],
)
def test_classify_error_treats_decode_and_validation_errors_as_poison(error):
    assert classify_error(error) == POISON


@pytest.mark.parametrize(
    "error",
    [
        WorkerFatal("GPU lost"),
        MemoryError(),
        KeyboardInterrupt(),
        SystemExit(1),
        asyncio.CancelledError(),
    ],
)
def test_classify_error_treats_broken_or_stopping_worker_as_worker_fatal(error):
    assert classify_error(error) == WORKER_FATAL


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("flaky"),
        OSError("disk"),
        TimeoutError(),
        ConnectionError(),
        KeyError("frame"),
        IndexError(),
        AttributeError(),
        ZeroDivisionError(),
        VideoflowError("generic"),
    ],
)
def test_classify_error_treats_everything_else_as_transient(error):
    assert classify_error(error) == TRANSIENT


def test_classify_error_worker_fatal_wins_over_poison():
    class Both(WorkerFatal, ValueError):
        pass

    class FatalPoison(PoisonMessage, WorkerFatal):
        pass

    assert classify_error(Both()) == WORKER_FATAL
    assert classify_error(FatalPoison()) == WORKER_FATAL


def test_classify_error_honours_retryable_videoflow_error_over_value_error_base():
    class RetryableValue(VideoflowError, ValueError):
        retryable = True

    assert classify_error(RetryableValue()) == TRANSIENT


def test_classify_error_poison_message_wins_over_retryable_flag():
    error = PoisonMessage("bad")
    error.retryable = True
    assert classify_error(error) == POISON


def test_classify_error_rejects_a_non_exception():
    with pytest.raises(TypeError, match=r"^error must be an exception instance"):
        classify_error(ValueError)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# DeliveryAction and Backoff
# --------------------------------------------------------------------------------------


def test_delivery_action_kinds_are_the_four_documented_ones():
    assert set(ACTION_KINDS) == {"retry", "dead_letter", "nak_uncounted", "drop"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "ack"}, r"^kind must be one of"),
        ({"kind": "retry", "delay": -1.0}, r"^delay must be finite and >= 0"),
        ({"kind": "retry", "delay": math.inf}, r"^delay must be finite"),
        ({"kind": "drop", "delay": 1.0}, r"^delay applies to 'retry' only"),
        ({"kind": "drop", "reason": 5}, r"^reason must be a str"),
    ],
)
def test_delivery_action_rejects_invalid_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DeliveryAction(**kwargs)


def test_delivery_action_is_frozen():
    action = DeliveryAction(kind="drop")
    with pytest.raises(AttributeError):
        action.kind = "retry"  # type: ignore[misc]


def test_backoff_delay_starts_at_base_and_grows_by_factor_per_delivery():
    backoff = Backoff(base_ms=100.0, factor=3.0, max_ms=1e9)
    assert [backoff.delay_for(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.3, 0.9, 2.7])


def test_backoff_delay_is_capped_at_max_ms():
    backoff = Backoff(base_ms=1000.0, factor=2.0, max_ms=5000.0)
    assert [backoff.delay_for(n) for n in (1, 2, 3, 4, 5, 50)] == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_backoff_delay_saturates_at_cap_for_a_huge_delivery_count():
    backoff = Backoff(base_ms=1.0, factor=10.0, max_ms=30_000.0)
    assert backoff.delay_for(10**9) == 30.0


def test_backoff_with_factor_one_is_constant_and_zero_base_never_waits():
    assert Backoff(base_ms=250.0, factor=1.0, max_ms=250.0).delay_for(7) == 0.25
    assert Backoff(base_ms=0.0, factor=2.0, max_ms=0.0).delay_for(9) == 0.0


@given(
    base_ms=st.floats(min_value=0.0, max_value=1e6),
    factor=st.floats(min_value=1.0, max_value=100.0),
    extra_ms=st.floats(min_value=0.0, max_value=1e7),
    n=st.integers(min_value=1, max_value=10**6),
)
def test_backoff_delay_is_monotone_and_bounded_by_cap(
    base_ms: float, factor: float, extra_ms: float, n: int
):
    backoff = Backoff(base_ms=base_ms, factor=factor, max_ms=base_ms + extra_ms)
    first, this, following = backoff.delay_for(1), backoff.delay_for(n), backoff.delay_for(n + 1)
    assert first == pytest.approx(base_ms / 1000.0)
    assert first <= this <= following <= backoff.max_ms / 1000.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_ms": -1.0}, r"^backoff.base_ms must be finite and >= 0"),
        ({"base_ms": math.nan}, r"^backoff.base_ms must be finite"),
        ({"base_ms": "1s"}, r"^backoff.base_ms must be a number"),
        ({"factor": 0.5}, r"^backoff.factor must be finite and >= 1, got 0.5"),
        ({"factor": math.inf}, r"^backoff.factor must be finite"),
        ({"factor": True}, r"^backoff.factor must be a number"),
        ({"max_ms": math.inf}, r"^backoff.max_ms must be finite"),
        ({"base_ms": 500.0, "max_ms": 100.0}, r"^backoff.max_ms must be >= backoff.base_ms"),
    ],
)
def test_backoff_rejects_invalid_values_with_message_naming_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Backoff(**kwargs)


@pytest.mark.parametrize("num_delivered", [0, -1, True, 1.0, None])
def test_backoff_delay_rejects_num_delivered_below_one_or_not_int(num_delivered):
    with pytest.raises(ValueError, match=r"^num_delivered must be an int >= 1"):
        Backoff().delay_for(num_delivered)


def test_backoff_from_dict_rejects_unknown_key_and_non_mapping():
    with pytest.raises(ValueError, match=r"unknown backoff field 'jitter'"):
        Backoff.from_dict({"jitter": 0.1})
    with pytest.raises(ValueError, match=r"^backoff must be a dict"):
        Backoff.from_dict([1000, 2000])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# DeliveryPolicy
# --------------------------------------------------------------------------------------


def test_delivery_policy_fields_and_defaults():
    assert DeliveryPolicy.__struct_fields__ == ("mode", "max_retries", "backoff")
    policy = DeliveryPolicy()
    assert policy.mode == "at_least_once"
    assert policy.max_retries == 3
    assert policy.backoff == Backoff(base_ms=1000.0, factor=2.0, max_ms=60_000.0)


def test_delivery_policy_default_for_realtime_is_best_effort():
    policy = DeliveryPolicy.default_for(REALTIME)
    assert policy.mode == "best_effort"
    assert policy.max_deliveries == 1


def test_delivery_policy_default_for_batch_is_at_least_once_with_three_retries():
    policy = DeliveryPolicy.default_for(BATCH)
    assert policy.mode == "at_least_once"
    assert policy.max_retries == 3
    assert policy.max_deliveries == 4


def test_delivery_policy_default_for_unknown_flow_type_names_flow_type():
    with pytest.raises(ValueError, match=r"^flow_type must be one of .*'nightly'"):
        DeliveryPolicy.default_for("nightly")


def test_delivery_policy_max_deliveries_is_one_plus_retries_or_one_for_best_effort():
    assert DeliveryPolicy(max_retries=0).max_deliveries == 1
    assert DeliveryPolicy(max_retries=5).max_deliveries == 6
    assert DeliveryPolicy(mode="best_effort", max_retries=5).max_deliveries == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "exactly_once"}, r"^mode must be one of .*got 'exactly_once'"),
        ({"max_retries": -1}, r"^max_retries must be an int >= 0, got -1"),
        ({"max_retries": 2.0}, r"^max_retries must be an int"),
        ({"max_retries": False}, r"^max_retries must be an int"),
        ({"backoff": {"base_ms": 1.0}}, r"^backoff must be a Backoff"),
        ({"backoff": (100, 200)}, r"^backoff must be a Backoff"),
    ],
)
def test_delivery_policy_rejects_invalid_field_with_message_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DeliveryPolicy(**kwargs)


def test_delivery_policy_to_dict_is_plain_nested_data():
    policy = DeliveryPolicy(
        mode="best_effort", max_retries=1, backoff=Backoff(base_ms=5.0, factor=1.5, max_ms=50.0)
    )
    assert policy.to_dict() == {
        "mode": "best_effort",
        "max_retries": 1,
        "backoff": {"base_ms": 5.0, "factor": 1.5, "max_ms": 50.0},
    }
    assert DeliveryPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy


def test_delivery_policy_from_dict_with_absent_keys_takes_defaults():
    assert DeliveryPolicy.from_dict({}) == DeliveryPolicy()
    partial = DeliveryPolicy.from_dict({"backoff": {"max_ms": 2000.0}})
    assert partial.backoff == Backoff(base_ms=1000.0, factor=2.0, max_ms=2000.0)


def test_delivery_policy_from_dict_accepts_a_backoff_instance():
    backoff = Backoff(base_ms=1.0, max_ms=1.0)
    assert DeliveryPolicy.from_dict({"backoff": backoff}).backoff == backoff


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"retries": 3}, r"unknown DeliveryPolicy field 'retries'"),
        ({"backoff": {"base": 1.0}}, r"unknown backoff field 'base'"),
        ({"backoff": None}, r"^backoff must be a dict"),
        ({"backoff": {"factor": 0.0}}, r"^backoff.factor must be finite and >= 1"),
        ({"mode": "at_most_once"}, r"^mode must be one of"),
        ({"max_retries": "3"}, r"^max_retries must be an int"),
    ],
)
def test_delivery_policy_from_dict_rejects_bad_input_naming_key_or_field(data, match):
    with pytest.raises(ValueError, match=match):
        DeliveryPolicy.from_dict(data)


@st.composite
def valid_delivery_policies(draw: st.DrawFn) -> DeliveryPolicy:
    base_ms = draw(st.floats(min_value=0.0, max_value=1e7))
    return DeliveryPolicy(
        mode=draw(st.sampled_from(["at_least_once", "best_effort"])),
        max_retries=draw(st.integers(min_value=0, max_value=1000)),
        backoff=Backoff(
            base_ms=base_ms,
            factor=draw(st.floats(min_value=1.0, max_value=1e3)),
            max_ms=base_ms + draw(st.floats(min_value=0.0, max_value=1e7)),
        ),
    )


@given(valid_delivery_policies())
def test_delivery_policy_round_trips_through_dict_for_any_valid_policy(policy: DeliveryPolicy):
    assert DeliveryPolicy.from_dict(policy.to_dict()) == policy


# action_for ---------------------------------------------------------------------------

AT_LEAST_ONCE = DeliveryPolicy(
    mode="at_least_once", max_retries=3, backoff=Backoff(base_ms=1000.0, factor=2.0, max_ms=3000.0)
)
BEST_EFFORT = DeliveryPolicy(mode="best_effort", max_retries=3)
BOTH_MODES = pytest.mark.parametrize(
    "policy", [AT_LEAST_ONCE, BEST_EFFORT], ids=["at_least_once", "best_effort"]
)


@BOTH_MODES
@pytest.mark.parametrize(
    "error",
    [PoisonMessage("corrupt"), WireError("truncated"), ValueError("x"), TypeError("y")],
)
def test_action_for_poison_dead_letters_on_first_delivery_in_either_mode(policy, error):
    action = policy.action_for(error, 1)
    assert action.kind == DEAD_LETTER
    assert action.delay == 0.0
    assert action.reason.startswith("poison: ")


@BOTH_MODES
@pytest.mark.parametrize("error", [WorkerFatal("GPU lost"), MemoryError()])
@pytest.mark.parametrize("num_delivered", [1, 4, 100])
def test_action_for_worker_fatal_naks_uncounted_in_either_mode_on_any_delivery(
    policy, error, num_delivered
):
    action = policy.action_for(error, num_delivered)
    assert action.kind == NAK_UNCOUNTED
    assert action.delay == 0.0
    assert action.reason.startswith("worker fatal: ")


def test_action_for_transient_at_least_once_retries_then_dead_letters_after_max_retries():
    error = RuntimeError("flaky")
    kinds = [AT_LEAST_ONCE.action_for(error, n).kind for n in range(1, 7)]
    # max_retries=3: deliveries 1..3 are retried, the 4th failure is final (1 + 3 tries).
    assert kinds == [RETRY, RETRY, RETRY, DEAD_LETTER, DEAD_LETTER, DEAD_LETTER]


def test_action_for_boundary_last_retry_is_at_num_delivered_equal_max_retries():
    error = OSError("disk")
    assert AT_LEAST_ONCE.action_for(error, 3).kind == RETRY
    final = AT_LEAST_ONCE.action_for(error, 4)
    assert final.kind == DEAD_LETTER
    assert final.delay == 0.0
    assert "retries exhausted after 4 deliveries" in final.reason


def test_action_for_transient_retry_delay_grows_with_num_delivered_and_is_capped():
    policy = DeliveryPolicy(
        max_retries=10, backoff=Backoff(base_ms=1000.0, factor=2.0, max_ms=5000.0)
    )
    delays = [policy.action_for(TimeoutError(), n).delay for n in range(1, 6)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_action_for_retry_reason_names_the_attempt_and_the_error():
    action = AT_LEAST_ONCE.action_for(ConnectionError("reset by peer"), 2)
    assert action.reason == "transient, delivery 2 of 4: ConnectionError: reset by peer"


def test_action_for_with_zero_retries_dead_letters_a_transient_failure_at_once():
    policy = DeliveryPolicy(max_retries=0)
    assert policy.action_for(RuntimeError("flaky"), 1).kind == DEAD_LETTER


@pytest.mark.parametrize("num_delivered", [1, 2, 50])
def test_action_for_transient_best_effort_drops_without_retry(num_delivered):
    action = BEST_EFFORT.action_for(RuntimeError("flaky"), num_delivered)
    assert action.kind == DROP
    assert action.delay == 0.0
    assert action.reason.startswith("best effort, not retried: ")


@pytest.mark.parametrize("num_delivered", [0, -3, True, 2.5, "1"])
def test_action_for_rejects_num_delivered_below_one_or_not_int(num_delivered):
    with pytest.raises(ValueError, match=r"^num_delivered must be an int >= 1"):
        AT_LEAST_ONCE.action_for(RuntimeError(), num_delivered)


def test_action_for_rejects_a_non_exception_error():
    with pytest.raises(TypeError, match=r"^error must be an exception instance"):
        AT_LEAST_ONCE.action_for("boom", 1)  # type: ignore[arg-type]


def test_action_for_truncates_a_huge_error_message_in_the_reason():
    action = AT_LEAST_ONCE.action_for(ValueError("x" * 10_000), 1)
    assert len(action.reason) < 300
    assert action.reason.endswith("...")


def test_action_for_survives_an_error_whose_str_raises():
    class Unprintable(RuntimeError):
        def __str__(self) -> str:
            raise RuntimeError("no")

    action = BEST_EFFORT.action_for(Unprintable(), 1)
    assert action.kind == DROP
    assert "<str() failed>" in action.reason


def test_action_for_names_the_error_class_when_message_is_empty():
    assert AT_LEAST_ONCE.action_for(MemoryError(), 1).reason == "worker fatal: MemoryError"


@given(
    policy=valid_delivery_policies(),
    num_delivered=st.integers(min_value=1, max_value=10**6),
)
def test_action_for_transient_verdict_matches_the_documented_ladder(
    policy: DeliveryPolicy, num_delivered: int
):
    action = policy.action_for(RuntimeError("flaky"), num_delivered)
    if policy.mode == "best_effort":
        assert action.kind == DROP
    elif num_delivered <= policy.max_retries:
        assert action.kind == RETRY
        assert action.delay == policy.backoff.delay_for(num_delivered)
        assert num_delivered < policy.max_deliveries
    else:
        assert action.kind == DEAD_LETTER
        assert num_delivered >= policy.max_deliveries
