"""The metrics' families built from snapshots: Prometheus names and labels, histograms
that add up over replicas and processes, counters that do not go back when a replica's
process is started again, and an unknown broker count exported as absent, never 0."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from videoflow.core.histogram import LATENCY_BOUNDS, Histogram
from videoflow.run.metrics import ReplicaSample, SnapshotCollector, check_port, merged


def exposition(samples: list[ReplicaSample]) -> dict[tuple[str, frozenset], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector("f", lambda: samples))
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def histogram(*seconds: float) -> dict:
    h = Histogram()
    for s in seconds:
        h.observe(s)
    return h.as_dict()


def test_a_histogram_counts_an_observation_at_a_bound_in_that_bound_s_bucket() -> None:
    h = Histogram()
    for seconds in (0.0005, 0.0006, 100.0):
        h.observe(seconds)
    cumulative = dict(h.cumulative())
    assert cumulative[repr(LATENCY_BOUNDS[0])] == 1
    assert cumulative[repr(LATENCY_BOUNDS[1])] == 2
    assert cumulative[repr(LATENCY_BOUNDS[-1])] == 2 and cumulative["+Inf"] == 3
    assert h.count == 3 and h.total == pytest.approx(100.0011)


def test_families_follow_prometheus_names_and_label_every_series() -> None:
    stats = {"processed": 7, "emitted": 7, "failed": 1, "dead_lettered": 1,
             "drops": {"expired": 2}, "received": {"cam": 9},
             "publications": {"accepted": 7}, "budget_waits": 3,
             "watermark_lag": {"cam": 0.25}, "outcome": "running",
             "join_latency": histogram(0.002, 0.02), "hop_latency": histogram(0.003),
             "subscriptions": {"cam": {"available": 4, "leased": 2, "unresolved": 1,
                                       "durable": "fuse--from--cam"}}}
    got = exposition([ReplicaSample("fuse", "0", stats, restarts=2)])
    labels = {("flow", "f"), ("node", "fuse"), ("replica", "0")}

    def at(name: str, **extra: str) -> float:
        return got[(name, frozenset(labels | set(extra.items())))]

    assert at("videoflow_processed_total") == 7
    assert at("videoflow_outputs_total") == 7
    assert at("videoflow_failures_total") == 1
    assert at("videoflow_dead_letters_total") == 1
    assert at("videoflow_dropped_total", reason="expired") == 2
    assert at("videoflow_received_total", parent="cam") == 9
    assert at("videoflow_publications_total", outcome="accepted") == 7
    assert at("videoflow_budget_waits_total") == 3
    assert at("videoflow_restarts_total") == 2
    assert at("videoflow_watermark_lag_seconds", parent="cam") == 0.25
    by_durable = {("flow", "f"), ("node", "fuse"), ("parent", "cam"),
                  ("durable", "fuse--from--cam")}
    assert got[("videoflow_pending_messages", frozenset(by_durable))] == 6
    assert got[("videoflow_unresolved_messages", frozenset(by_durable))] == 1
    assert at("videoflow_replica_up") == 1
    assert at("videoflow_join_latency_seconds_count") == 2
    assert at("videoflow_join_latency_seconds_bucket", le="0.0025") == 1
    assert at("videoflow_join_latency_seconds_sum") == pytest.approx(0.022)
    assert at("videoflow_hop_latency_seconds_count") == 1


def test_latency_histograms_are_a_node_with_inputs_own_even_before_it_observed_any() -> None:
    empty = {"join_latency": histogram(), "hop_latency": histogram(), "outcome": "running"}
    got = exposition([ReplicaSample("cam", "0", {**empty, "emitted": 5}, inputs=False),
                      ReplicaSample("fuse", "0", empty)])
    histograms = {(name, dict(labels)["node"]) for name, labels in got
                  if name.startswith(("videoflow_join_latency", "videoflow_hop_latency"))}
    # The producer's never-observed histograms are not exported; the fuse node's are,
    # at zero, from its first report (a rate over them then counts its first groups).
    assert {node for _, node in histograms} == {"fuse"}
    assert got[("videoflow_hop_latency_seconds_count", frozenset(
        {("flow", "f"), ("node", "fuse"), ("replica", "0")}))] == 0
    assert got[("videoflow_outputs_total", frozenset(
        {("flow", "f"), ("node", "cam"), ("replica", "0")}))] == 5


def test_an_unknown_broker_count_is_absent_with_its_reason_never_zero() -> None:
    stats = {"processed": 1, "subscriptions": {"cam": {"unknown": "timeout"}}}
    got = exposition([ReplicaSample("fuse", "0", stats)])
    names = {name for name, _ in got}
    assert "videoflow_pending_messages" not in names
    assert "videoflow_unresolved_messages" not in names
    assert got[("videoflow_pending_unknown", frozenset({
        ("flow", "f"), ("node", "fuse"), ("parent", "cam"), ("durable", ""),
        ("reason", "timeout")}))] == 1
    # Restarts are counted only where they are known (the engine), not as 0 elsewhere.
    assert "videoflow_restarts_total" not in names


def test_a_durable_the_replicas_share_is_one_series_as_last_read_and_own_ones_each() -> None:
    def reading(at: float, available: int, durable: str, unresolved: int = 0) -> dict:
        return {"outcome": "running", "at": at, "subscriptions": {"cam": {
            "available": available, "leased": 3, "unresolved": unresolved,
            "durable": durable}}}

    got = exposition([
        ReplicaSample("scale", "0", reading(10.0, 400, "scale--from--cam", 2)),
        ReplicaSample("scale", "1", reading(10.5, 390, "scale--from--cam")),
        ReplicaSample("part", "0", reading(10.0, 7, "part--from--cam--p0")),
        ReplicaSample("part", "1", reading(9.0, 9, "part--from--cam--p1"))])
    pending = {dict(labels)["durable"]: value for (name, labels), value in got.items()
               if name == "videoflow_pending_messages"}
    # Two replicas reading one durable are not two backlogs (a sum by node would be
    # twice the stream): the later reading stands for it.
    assert pending == {"scale--from--cam": 393, "part--from--cam--p0": 10,
                       "part--from--cam--p1": 12}
    # Unresolved: the most any replica knows of (each hears of its own exhaustions).
    assert got[("videoflow_unresolved_messages", frozenset({
        ("flow", "f"), ("node", "scale"), ("parent", "cam"),
        ("durable", "scale--from--cam")}))] == 2


def test_a_replica_started_again_keeps_counting_from_where_its_dead_process_was() -> None:
    dead = {"processed": 40, "emitted": 40, "drops": {"expired": 1},
            "received": {"cam": 41}, "publications": {"accepted": 40},
            "hop_latency": histogram(0.01, 0.02), "outcome": "restarted",
            "watermark_lag": {"cam": 9.0}}
    live = {"processed": 5, "emitted": 5, "drops": {"late": 2}, "received": {"cam": 6},
            "publications": {"accepted": 5}, "hop_latency": histogram(0.5),
            "outcome": "running", "watermark_lag": {"cam": 0.1}}
    one = merged([dead, live])
    assert one["processed"] == 45 and one["emitted"] == 45
    assert one["drops"] == {"expired": 1, "late": 2}
    assert one["received"] == {"cam": 47} and one["publications"] == {"accepted": 45}
    assert sum(one["hop_latency"]["counts"]) == 3
    # A gauge is the current process's word, not a sum.
    assert one["watermark_lag"] == {"cam": 0.1} and one["outcome"] == "running"


@pytest.mark.parametrize("bad", [-1, 65536, "x", True, None])
def test_a_port_must_be_a_port(bad: object) -> None:
    with pytest.raises(ValueError, match="port"):
        check_port(bad)


def test_alignment_and_payload_shares_are_series_of_the_join_and_of_each_writer() -> None:
    fuse = {"outcome": "running", "held_back": {"cam0": 12.5, "cam1": 0.0},
            "held_back_now": {"cam0": "drift"}, "waiting_on": {"cam2": "silent"},
            "clock_offsets": {"cam2": {"offset_s": 0.0198, "spread_s": 0.0005,
                                       "samples": 64, "basis": "near misses",
                                       "matched": 0.0}}}
    cam = {"outcome": "running", "payload": {"held_bytes": 300, "share_bytes": 341,
                                             "waiting_seconds": 1.5, "waited_seconds": 4.0}}
    got = exposition([ReplicaSample("fuse", "0", fuse), ReplicaSample("cam0", "0", cam,
                                                                       inputs=False)])

    def at(name: str, node: str, **extra: str) -> float:
        labels = {("flow", "f"), ("node", node), ("replica", "0"), *extra.items()}
        return got[(name, frozenset(labels))]

    assert at("videoflow_held_back_seconds_total", "fuse", parent="cam0") == 12.5
    assert at("videoflow_held_back", "fuse", parent="cam0") == 1.0
    assert at("videoflow_held_back", "fuse", parent="cam1") == 0.0
    assert at("videoflow_join_waiting", "fuse", parent="cam2", why="silent") == 1.0
    assert at("videoflow_clock_offset_seconds", "fuse", parent="cam2") == 0.0198
    assert at("videoflow_payload_held_bytes", "cam0") == 300
    assert at("videoflow_payload_share_bytes", "cam0") == 341
    assert at("videoflow_payload_waiting", "cam0") == 1.0
    assert at("videoflow_payload_wait_seconds_total", "cam0") == 4.0
    assert not any(name.startswith("videoflow_payload") and ("node", "fuse") in labels
                   for name, labels in got)  # a node writing no payload has no series


def test_codec_counts_are_series_by_codec_and_add_up_over_a_replicas_processes() -> None:
    jpeg = {"encoded": 30, "raw_bytes": 6_912_000, "coded_bytes": 420_000,
            "encode_seconds": 0.09, "decoded": 0, "decode_seconds": 0.0}
    dead = {"processed": 0, "emitted": 30, "codecs": {"jpeg": jpeg}}
    live = {"processed": 0, "emitted": 5,
            "codecs": {"jpeg": {**jpeg, "encoded": 5, "raw_bytes": 1_152_000,
                                "coded_bytes": 70_000, "encode_seconds": 0.015}}}
    one = merged([dead, live])
    assert one["codecs"]["jpeg"]["encoded"] == 35
    assert one["codecs"]["jpeg"]["raw_bytes"] == 8_064_000
    got = exposition([ReplicaSample("camera", "0", one)])

    def at(name: str, **extra: str) -> float:
        labels = {"flow": "f", "node": "camera", "replica": "0", **extra}
        return got[(name, frozenset(labels.items()))]

    assert at("videoflow_codec_arrays_total", codec="jpeg", way="encoded") == 35
    assert at("videoflow_codec_arrays_total", codec="jpeg", way="decoded") == 0
    assert at("videoflow_codec_bytes_total", codec="jpeg", side="raw") == 8_064_000
    assert at("videoflow_codec_bytes_total", codec="jpeg", side="coded") == 490_000
    assert at("videoflow_codec_seconds_total", codec="jpeg", way="encoded") == pytest.approx(
        0.105)
