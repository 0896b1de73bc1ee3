"""/metrics scraped from live runs: the local engine's (every replica's latest report)
and a worker's (its own replica), as Prometheus would scrape them while a flow runs."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_cli import HELPERS, command, environment, wait_for

from videoflow.broker import server as embedded

pytestmark = pytest.mark.timeout(120)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Series:
    """Every sample of one scrape, by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(series: Series, name: str, **labels: str) -> float | None:
    """The sample of name whose labels include labels (None when absent; one at most)."""
    found = [v for (n, ls), v in series.items()
             if n == name and set(labels.items()) <= set(ls)]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def watch(process: subprocess.Popen[str], prefix: str) -> tuple[str, list[str]]:
    """The metrics URL the process says on stderr; its stderr keeps being read (into
    the list returned) so the process never blocks on a full pipe."""
    lines: list[str] = []
    assert process.stderr is not None
    stderr = process.stderr

    def read() -> None:
        for line in stderr:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    wait_for(lambda: any(prefix in line for line in lines) or process.poll() is not None,
             60, "the metrics URL on stderr")
    said = [line for line in lines if prefix in line]
    assert said, "".join(lines)
    return said[0].rsplit(" on ", 1)[1].strip(), lines


def scrapes_while(process: subprocess.Popen[str], url: str) -> list[Series]:
    got = []
    while process.poll() is None:
        try:
            got.append(scrape(url))
        except OSError:  # the run ended between poll and scrape: its server is closed
            break
        time.sleep(0.3)
    return got


def assert_histogram(series: Series, name: str, **labels: str) -> int:
    """The histogram's count, once its buckets are checked cumulative and ending at it."""
    buckets = sorted(((float(dict(ls)["le"]), v) for (n, ls), v in series.items()
                      if n == f"{name}_bucket" and set(labels.items()) <= set(ls)))
    assert buckets and buckets[-1][0] == float("inf"), (name, labels)
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "buckets are cumulative"
    count = value(series, f"{name}_count", **labels)
    assert count == counts[-1]
    assert (value(series, f"{name}_sum", **labels) or 0.0) >= 0.0
    return int(count)


def test_a_local_run_serves_every_replicas_metrics_while_it_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = environment(out, count=300, pace=0.01, sink_replicas=2)
    process = subprocess.Popen(
        command("run", "flows:chain", "--ephemeral", "--metrics-port", "0", "--json"),
        cwd=HELPERS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, stderr = watch(process, "metrics of run")
        got = scrapes_while(process, url)
        stdout, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    report = json.loads(stdout)
    assert report["outcome"] == "completed", "".join(stderr)
    flow = {"flow": "cli"}
    # Scrapes during the run show it moving: numbers' outputs grow from one to another.
    seen = [s for s in got if value(s, "videoflow_outputs_total", node="numbers") is not None]
    assert len(seen) >= 3, f"{len(got)} scrapes, {len(seen)} with the producer's report"
    outputs = [value(s, "videoflow_outputs_total", node="numbers", replica="0", **flow)
               for s in seen]
    assert outputs == sorted(outputs) and outputs[0] < outputs[-1] <= 300
    last = seen[-1]
    # Every replica is there, by node and replica: numbers 0, scale 0, record 0 and 1.
    for node, replica in (("scale", "0"), ("record", "0"), ("record", "1")):
        processed = value(last, "videoflow_processed_total", node=node, replica=replica)
        assert processed is not None, (node, replica)
        assert value(last, "videoflow_received_total", node=node, replica=replica,
                     parent="numbers" if node == "scale" else "scale") is not None
        assert value(last, "videoflow_replica_up", node=node, replica=replica) in (0.0, 1.0)
        assert value(last, "videoflow_restarts_total", node=node, replica=replica) == 0
    # At most what the run did in the end, and scale's share of it.
    scale_done = value(last, "videoflow_processed_total", node="scale", replica="0")
    assert 0 < scale_done <= report["nodes"]["scale"]["processed"] == 300
    assert assert_histogram(last, "videoflow_hop_latency_seconds", node="scale") > 0
    assert assert_histogram(last, "videoflow_join_latency_seconds", node="scale") > 0
    # A producer has no groups, so no latency histograms.
    assert value(last, "videoflow_hop_latency_seconds_count", node="numbers") is None
    assert value(last, "videoflow_join_latency_seconds_count", node="numbers") is None
    # The broker's count of scale's work: a number, or absent with why -- never both,
    # and at least once read.
    counted = 0
    for s in seen:
        if value(s, "videoflow_processed_total", node="scale") is None:
            continue  # scale had not reported yet
        pending = value(s, "videoflow_pending_messages", node="scale", parent="numbers")
        unknown = [ls for (n, ls), _ in s.items() if n == "videoflow_pending_unknown"
                   and ("node", "scale") in ls]
        assert (pending is None) != (not unknown), (pending, unknown)
        counted += pending is not None
        if pending is not None:
            assert value(s, "videoflow_unresolved_messages", node="scale",
                         parent="numbers") == 0
    assert counted > 0
    # record's two replicas read one durable: it is one series, with no replica label
    # (one per replica would make a sum by node twice its backlog).
    record = [dict(ls) for s in seen for (n, ls), _ in s.items()
              if n == "videoflow_pending_messages" and ("node", "record") in ls]
    assert record and all(ls["durable"] == "record--from--scale" and "replica" not in ls
                          for ls in record)
    # Its outputs are accepted as they go: never more than it made (and its end of
    # stream, once), and -- confirmations taking far less than a report's second --
    # at the last report at least what it had made two reports before. A report taken
    # mid-run counts outputs handed to the broker and not yet confirmed, so the two
    # differ by what was in flight at that moment.
    accepted = [value(s, "videoflow_publications_total", node="numbers", outcome="accepted")
                or 0.0 for s in seen]
    assert accepted == sorted(accepted)
    assert all(a <= made + 1 for a, made in zip(accepted, outputs, strict=True))
    assert accepted[-1] >= outputs[0] and accepted[-1] > 0


def test_a_run_refuses_a_metrics_port_it_cannot_bind_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            command("run", "flows:chain", "--ephemeral", "--metrics-port", str(port)),
            cwd=HELPERS, env=environment(tmp_path, count=5), capture_output=True, text=True,
            timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"videoflow: error: cannot serve metrics on 127.0.0.1:{port}")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_a_metrics_port_that_is_not_a_port_is_a_usage_error(port: str,
                                                            tmp_path: Path) -> None:
    done = subprocess.run(command("run", "flows:chain", "--metrics-port", port), cwd=HELPERS,
                          env=environment(tmp_path), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--metrics-port" in done.stderr


def test_a_worker_serves_its_replicas_metrics(nats_server: embedded.EmbeddedServer,
                                             tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = environment(out, count=200, pace=0.01)
    spec = tmp_path / "run.json"
    made = subprocess.run(command("provision", "flows:chain", "--out", str(spec),
                                  "--nats-url", nats_server.url),
                          cwd=HELPERS, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    processes: list[subprocess.Popen[str]] = []
    try:
        for node, extra in (("record", ()), ("scale", ("--metrics-port", "0")),
                            ("numbers", ())):
            processes.append(subprocess.Popen(
                command("worker", "--spec", str(spec), "--node", node, "--nats-url",
                        nats_server.url, "--progress-every", "0.5", *extra),
                cwd=HELPERS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        scale = processes[1]
        url, stderr = watch(scale, "metrics on")
        got = scrapes_while(scale, url)
        for process in processes:
            process.wait(timeout=60)
        assert [p.returncode for p in processes] == [0, 0, 0], "".join(stderr)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    done = [value(s, "videoflow_processed_total", flow="cli", node="scale", replica="0")
            for s in got]
    done = [d for d in done if d is not None]
    assert len(done) >= 2 and done == sorted(done) and 0 < done[-1] <= 200
    assert done[0] < done[-1]
    # Only its own replica: no other node's series.
    assert {dict(ls).get("node") for s in got for (_, ls) in s} <= {"scale", None}


