"""Flows run end to end by the local engine: every replica a spawned process, on a real
nats-server; the sinks' effects read back from files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from broker_reads import stream_names
from flow_nodes import (
    Add,
    DieOnce,
    Explode,
    KeyedNumbers,
    Numbers,
    Record,
    RecordCollector,
    RejectMultiplesOf,
    Scale,
    SlowOpenRecord,
    applied,
)

from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.naming import dlq_stream_name
from videoflow.flow import Flow
from videoflow.messaging.partitions import partition_of
from videoflow.ops import dlq_list

pytestmark = pytest.mark.timeout(120)


def test_a_linear_batch_flow_delivers_every_message_exactly_once(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    numbers = Numbers(300)
    sink = Record(str(out))(Scale(2, nb_tasks=2)(numbers))
    report = Flow([numbers], [sink], BATCH, name="linear").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    assert sorted(v for (v,) in applied(out)) == [2 * i for i in range(300)]
    nodes = report.nodes
    assert (nodes["numbers"].emitted, nodes["scale"].processed, nodes["scale"].emitted,
            nodes["record"].processed) == (300, 300, 300, 300)
    assert nodes["scale"].replicas == 2 and nodes["scale"].dropped_total == 0
    assert nodes["record"].join_latency_p99_ms is not None
    # The run's streams are gone; the flow's dead-letter stream stays, and so do its
    # ledger and payload buckets (flow-scoped, shared by runs).
    assert report.torn_down
    left = asyncio.run(stream_names(nats_server.url))
    assert dlq_stream_name("linear") in left
    assert [name for name in left if report.run_id in name] == []


def test_a_diamond_joins_both_branches_of_every_event(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    numbers = Numbers(200)
    double, triple = Scale(2, name="double")(numbers), Scale(3, name="triple")(numbers)
    total = Add(join_policy={"mode": "trace"})(double, triple)
    sink = Record(str(out))(total)
    report = Flow([numbers], [sink], name="diamond").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    assert sorted(v for (v,) in applied(out)) == [5 * i for i in range(200)]
    assert report.nodes["add"].processed == 200
    assert report.nodes["add"].join_latency_p50_ms is not None


def test_a_poison_input_is_dead_lettered_and_the_flow_completes(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    numbers = Numbers(50)
    sink = Record(str(out))(RejectMultiplesOf(7)(numbers))
    report = Flow([numbers], [sink], name="poison").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    rejected = [i for i in range(1, 50) if i % 7 == 0]
    assert sorted(v for (v,) in applied(out)) == [
        i for i in range(50) if i not in rejected]
    assert report.nodes["reject_multiples_of"].dead_lettered == len(rejected)
    entries = dlq_list(nats_server.url, "poison")
    letters = [entry.record for entry in entries if entry.record is not None]
    assert len(letters) == len(entries)  # every record decodes
    assert sorted(r.stream_seq for r in letters) == [i + 1 for i in rejected]
    assert {(r.node, r.parent, r.reason) for r in letters} == {
        ("reject_multiples_of", "numbers", "poison")}
    assert all("is a multiple of 7" in r.error_message for r in letters)


def test_a_replica_killed_mid_run_is_started_again_and_nothing_is_lost(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
) -> None:
    numbers = Numbers(100, pace=0.05)  # input 40 comes 2 s in, after a progress report
    sink = Record(str(out))(DieOnce(40, str(tmp_path / "died"))(numbers))
    # ack_wait bounds how long the dead replica's leased input waits to come back.
    report = Flow([numbers], [sink], name="restart").run(nats_server.url, view=False,
                                                         ack_wait=2)
    assert (tmp_path / "died").exists()
    assert report.outcome == "completed", report.format()
    die_once = report.nodes["die_once"]
    assert (die_once.restarts, die_once.replicas) == (1, 1)
    # The dead process reported progress before it died (the producer is paced so it
    # does): its counts stay in the report under a name of its own.
    assert die_once.outcomes == {"die_once[0]": "ended", "die_once[0]~1": "restarted"}
    assert sorted(v for (v,) in applied(out)) == list(range(100))


def test_a_realtime_flow_counts_every_output_it_never_read_as_superseded(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    """REALTIME keeps only the newest messages on a stream, so a slow reader misses
    older ones; each is still accounted for: processed, or counted as superseded
    (evicted on the stream, or received and skipped for a newer one)."""
    # Paced at about 500/s, ten times the sink's rate: an unpaced producer's 300 are
    # published within milliseconds, the stream keeps the newest of them, and the
    # sink then sees no more than the few its processor passed on.
    numbers = Numbers(300, pace=0.002)
    sink = Record(str(out), pace=0.02)(Scale(2, nb_tasks=2)(numbers))
    report = Flow([numbers], [sink], REALTIME, name="live").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    scale, record = report.nodes["scale"], report.nodes["record"]
    assert scale.processed + scale.dropped.get("superseded", 0) == 300
    assert record.processed + record.dropped.get("superseded", 0) == scale.emitted
    assert record.processed == len(applied(out)) <= record.received["scale"]
    assert record.dropped.get("superseded", 0) > 0  # the sink is slower than the flow


def test_a_realtime_producer_starts_once_its_readers_are_open(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    """A REALTIME stream keeps only its newest message, so a producer that started
    while its reader was still in open() (a model loading) lost its first outputs to a
    reader not yet reading (all but the few its first pull request held: about 10 in
    the second the reader takes to open, paced 0.1 s apart). The start gate opens once
    every reader is bound and open; then each output is read before the next."""
    numbers = Numbers(15, pace=0.1)
    sink = SlowOpenRecord(str(out), open_seconds=1.0, name="sink")(numbers)
    report = Flow([numbers], [sink], REALTIME, name="slow-open").run(nats_server.url,
                                                                      view=False)
    assert report.outcome == "completed", report.format()
    assert sorted(v for (v,) in applied(out)) == list(range(15)), report.format()
    assert report.nodes["sink"].dropped.get("superseded", 0) == 0


def test_partitioned_replicas_each_apply_exactly_their_keys(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    numbers = KeyedNumbers(120, keys=5)
    sink = Record(str(out), nb_tasks=3, partition_by="key")(numbers)
    report = Flow([numbers], [sink], name="keyed").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    assert sorted(v for (v,) in applied(out)) == list(range(120))
    replica_of = {}
    for line in (out / "applications.log").read_text().splitlines():
        _, _, replica, value = line.split()
        replica_of[int(value)] = int(replica)
    # Each value went to the replica its key routes to, and every replica had keys.
    wrong = {v: (replica_of[v], partition_of(v % 5, 3)) for v in range(120)
             if replica_of[v] != partition_of(v % 5, 3)}
    assert wrong == {}, (out / "applications.log").read_text()
    assert set(replica_of.values()) == {0, 1, 2}


def test_a_node_that_exits_its_process_ends_the_run_as_failed_not_hung(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    numbers = Numbers(50)
    sink = Record(str(out))(Explode(10)(numbers))
    report = Flow([numbers], [sink], name="exits").run(nats_server.url, view=False)
    assert report.outcome == "failed"
    assert report.nodes["explode"].outcomes == {"explode[0]": "failed"}
    assert report.nodes["explode"].errors == {"explode[0]": "SystemExit: exploded at 10"}
    # The abort reached the sink, which ended instead of waiting for a stream's end.
    assert report.nodes["record"].outcomes == {"record[0]": "aborted"}
    assert report.nodes["record"].errors["record[0]"].startswith(
        "explode died: SystemExit: exploded at 10")
    assert sorted(v for (v,) in applied(out)) == list(range(10))


def test_a_replica_process_walks_only_what_its_run_made_in_a_full_collection(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # What the process imported and set up, and what its node's open() loaded, is
    # frozen before its first input (videoflow.run.gc_freeze), so a full collection
    # does not walk it again and again. The imports and the messenger are frozen
    # before open(): the collection after it walks only what open() made, and no
    # longer holds the node's first inputs for one of the whole process.
    numbers = Numbers(20)
    sink = RecordCollector(str(out), loaded=50_000)(numbers)
    report = Flow([numbers], [sink], BATCH, name="frozen").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    held = json.loads((out / "collector.json").read_text())
    # numpy, nats-py, msgspec, videoflow, the replica (over 10,000), and the model
    assert held["frozen"] > 60_000, held
    assert held["frozen_at_open"] > 10_000, held
    assert held["walked"] < 10_000, held
