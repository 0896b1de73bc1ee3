"""Tracing in flows run by the local engine (every replica a spawned process) on a real
nats-server: what the replicas publish is tapped with a core NATS subscription, headers
and all. Without a tracer provider in the replicas every output still carries a valid
traceparent continuing its input's trace; with the SDK installed in each replica by the
VIDEOFLOW_TRACING_SETUP hook (tests/e2e/helpers/tracing_setup.py) the replicas' spans
chain across the processes."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from flow_nodes import Numbers, Record, RejectMultiplesOf, Scale

from videoflow.broker import server as embedded
from videoflow.broker.loop import registered
from videoflow.core.constants import BATCH
from videoflow.errors import WireError
from videoflow.flow import Flow
from videoflow.messaging.tracing import (
    SETUP_ENV,
    TRACING_ENV,
    parse_traceparent,
    w3c_trace_id,
)
from videoflow.wire.serialization import decode_envelope

pytestmark = pytest.mark.timeout(120)

COUNT = 20


class Tap:
    """Every data envelope published on the broker while it runs, with its headers: a
    core subscription to every videoflow subject, on a loop of its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.raw: list[tuple[str, bytes, dict[str, str]]] = []  # every message, as is
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()))

    async def _run(self) -> None:
        nc = await nats.connect(self.url)

        async def seen(msg: Any) -> None:
            self.raw.append((msg.subject, msg.data, dict(msg.headers or {})))
            try:
                envelope = decode_envelope(msg.data)
            except WireError:
                return  # not an envelope (a control message)
            if not envelope["is_stop_signal"] and not envelope["is_abort"]:
                self.seen.append((msg.subject, envelope, dict(msg.headers or {})))

        await nc.subscribe("vf.>", cb=seen)
        await registered(nc, 5)
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        await nc.drain()

    def __enter__(self) -> Tap:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def by_node(self) -> dict[str, list[tuple[dict[str, Any], tuple[str, str, str]]]]:
        """node -> (envelope, parsed traceparent) per output; asserts each is valid."""
        found: dict[str, list[tuple[dict[str, Any], tuple[str, str, str]]]] = {}
        for subject, envelope, headers in self.seen:
            parsed = parse_traceparent(headers.get("traceparent"))
            assert parsed is not None, (subject, headers)
            found.setdefault(subject.rsplit(".", 1)[-1], []).append((envelope, parsed))
        return found


def run_chain(url: str, out: Path) -> dict[str, list[tuple[dict[str, Any], tuple[str, str, str]]]]:
    numbers = Numbers(COUNT)
    sink = Record(str(out))(Scale(2)(numbers))
    with Tap(url) as tap:
        report = Flow([numbers], [sink], BATCH, name="traced").run(url, view=False)
    assert report.outcome == "completed", report.format()
    outputs = tap.by_node()
    assert {node: len(found) for node, found in outputs.items()} == {
        "numbers": COUNT, "scale": COUNT}
    return outputs


def lineage_traces(outputs: list[tuple[dict[str, Any], tuple[str, str, str]]]) -> dict[str, str]:
    return {envelope["trace_id"]: parsed[0] for envelope, parsed in outputs}


def test_without_a_tracer_every_output_carries_a_traceparent_continuing_its_input(
    nats_server: embedded.EmbeddedServer, out: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SETUP_ENV, raising=False)
    outputs = run_chain(nats_server.url, out)
    produced, scaled = lineage_traces(outputs["numbers"]), lineage_traces(outputs["scale"])
    # The producer's trace ids are its lineage ids' (a live producer's are W3C ids).
    assert all(trace == w3c_trace_id(lineage) for lineage, trace in produced.items())
    assert len(set(produced.values())) == COUNT
    # Each processed output continues its input's trace (the same lineage id).
    assert scaled == produced
    assert all(parsed[2] == "01" for _, parsed in outputs["numbers"] + outputs["scale"])


@pytest.fixture
def spans_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    made = tmp_path / "spans"
    made.mkdir()
    monkeypatch.setenv(SETUP_ENV, "tracing_setup:install")
    monkeypatch.setenv("VF_TEST_SPANS", str(made))
    yield made


def read_spans(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in directory.glob("*.jsonl")
            for line in path.read_text().splitlines() if line]


def test_replicas_set_up_by_the_hook_chain_their_spans_across_processes(
    nats_server: embedded.EmbeddedServer, out: Path, spans_dir: Path,
) -> None:
    outputs = run_chain(nats_server.url, out)
    spans = read_spans(spans_dir)
    names: dict[str, int] = {}
    for span in spans:
        names[span["name"]] = names.get(span["name"], 0) + 1
    assert names == {"publish numbers": COUNT, "publish scale": COUNT,
                     **{f"{op} {node}": COUNT for op in ("receive", "process", "settle")
                        for node in ("scale", "record")}}
    by_id = {span["context"]["span_id"]: span for span in spans}
    # Each header is its publish span's context, made in the replica that published.
    for node in ("numbers", "scale"):
        assert sorted((f"0x{p[0]}", f"0x{p[1]}") for _, p in outputs[node]) == sorted(
            (s["context"]["trace_id"], s["context"]["span_id"]) for s in spans
            if s["name"] == f"publish {node}")
    # The chain: publish numbers <- process scale <- publish scale <- process record,
    # one trace per produced output.
    for span in spans:
        if span["name"] in ("process scale", "receive scale"):
            assert by_id[span["parent_id"]]["name"] == "publish numbers"
        elif span["name"] in ("process record", "receive record"):
            assert by_id[span["parent_id"]]["name"] == "publish scale"
        elif span["name"] in ("publish scale", "settle scale"):
            assert by_id[span["parent_id"]]["name"] == "process scale"
        elif span["name"] == "settle record":
            assert by_id[span["parent_id"]]["name"] == "process record"
        else:
            assert span["name"] == "publish numbers" and span["parent_id"] is None
        if span["parent_id"] is not None:
            assert span["context"]["trace_id"] == by_id[span["parent_id"]]["context"][
                "trace_id"]
    assert len({s["context"]["trace_id"] for s in spans}) == COUNT


def test_end_markers_carry_a_trace_and_a_dead_letter_carries_its_input_s(
    nats_server: embedded.EmbeddedServer, out: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SETUP_ENV, raising=False)
    numbers = Numbers(COUNT)
    sink = Record(str(out))(RejectMultiplesOf(7, name="reject")(numbers))
    with Tap(nats_server.url) as tap:
        report = Flow([numbers], [sink], BATCH, name="tracedlq").run(nats_server.url,
                                                                    view=False)
    assert report.outcome == "completed", report.format()
    assert report.nodes["reject"].dead_lettered == 2, report.format()
    # Which input each traceparent the producer wrote belongs to.
    value_of = {headers["traceparent"]: envelope["message"]
                for subject, envelope, headers in tap.seen if subject.endswith(".numbers")}
    assert len(value_of) == COUNT
    dead = [headers for subject, _, headers in tap.raw if "._dlq." in subject]
    assert sorted(value_of[h["traceparent"]] for h in dead) == [7, 14]
    ends = [headers for subject, _, headers in tap.raw if subject.endswith("._eos")]
    assert len(ends) == 2  # numbers' and reject's
    assert all(parse_traceparent(h.get("traceparent")) is not None for h in ends)


def test_tracing_off_publishes_no_traceparent_at_all(
    nats_server: embedded.EmbeddedServer, out: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SETUP_ENV, raising=False)
    monkeypatch.setenv(TRACING_ENV, "off")
    numbers = Numbers(COUNT)
    sink = Record(str(out))(RejectMultiplesOf(7)(numbers))
    with Tap(nats_server.url) as tap:
        report = Flow([numbers], [sink], BATCH, name="untraced").run(nats_server.url,
                                                                    view=False)
    assert report.outcome == "completed", report.format()
    published = [(subject, headers) for subject, _, headers in tap.raw
                 if subject.startswith("vf.untraced.")]
    assert len(published) >= 2 * COUNT  # outputs, end markers, dead letters
    assert [p for p in published if "traceparent" in p[1]] == []
