"""A VIDEOFLOW_TRACING_SETUP hook for the replicas a flow spawns: the OpenTelemetry SDK
as the process's tracer provider, each span written as one JSON line to a file of its
own process under $VF_TEST_SPANS (read back by tests/e2e/test_tracing_flows.py)."""

from __future__ import annotations

import os
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def _one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def install() -> None:
    out = open(Path(os.environ["VF_TEST_SPANS"]) / f"{os.getpid()}.jsonl", "a")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=out, formatter=_one_line)))
    trace.set_tracer_provider(provider)
