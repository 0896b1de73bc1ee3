"""Benchmarks of whole flows under pytest-benchmark, with what each node did recorded
beside the time.

pytest-benchmark times each round: one whole run of the flow (run_flow, each node
replica a process, on the broker a FlowRunner runs against), from its start to its
report, process startup and teardown included. So a flow worth benchmarking runs
for a while: a flow of a few messages is timed as its processes' startup (about a
second). Beside the time, the benchmark's JSON (``extra_info["videoflow"]``) records
per node what the run reports said, each figure the median over the timed rounds:

- ``messages``: what it did: processed, or emitted for a producer;
- ``rate_per_s``: messages a second over its active span (NodeReport.throughput);
- ``cpu_ms_per_message``: CPU time of its replica processes (NodeReport.cpu_seconds)
  per message, in milliseconds;
- ``join_latency_p50_ms`` / ``join_latency_p99_ms``: how long a group waited at the
  node, its members' wait for each other and its time queued included
  (NodeReport.join_latency_p50_ms, the report's 'wait' columns);
- ``bytes_per_s``: rate_per_s times the size of its frames, for a node whose frame
  size was given (frame_bytes): a product of what is said, not a measurement.

A figure that is not known is None (null in the JSON), never 0: a producer has no
join latency, a node that did one thing has no rate, a process that died did not say
its CPU time, a node without frame_bytes has no bytes per second. The run's wall time
is what ``--benchmark-compare-fail`` compares; the figures are there to read (and to
compare with ``pytest-benchmark compare``'s JSON, by a tool of the user's).

Usage (the plugin's fixture, videoflow.testing.plugin)::

    def test_my_flow_speed(videoflow_benchmark: FlowBenchmark) -> None:
        report = videoflow_benchmark(my_flow(), rounds=3)
        assert report.nodes["sink"].processed == 100
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from videoflow.errors import MissingDependency, VideoflowError

if TYPE_CHECKING:
    import pytest
    from pytest_benchmark.fixture import BenchmarkFixture

    from videoflow.core.report import NodeReport, RunReport
    from videoflow.flow import Flow
    from videoflow.testing.runner import FlowRunner

FIGURES_KEY = "videoflow"
"""The key of the figures in the benchmark's extra_info."""

Figure = float | int | None
"""One figure of a node, a number or None when it is not known."""

_NUMBERS = ("messages", "rate_per_s", "cpu_ms_per_message", "join_latency_p50_ms",
            "join_latency_p99_ms", "bytes_per_s")


class FlowRunFailed(VideoflowError, RuntimeError):
    """A benchmarked run of a flow failed: its time says nothing of the flow, so it is
    not recorded. The message holds the run's report.

    Attributes:
        report: the failed run's RunReport.
    """

    def __init__(self, report: RunReport) -> None:
        super().__init__(f"run {report.run_id} of flow {report.flow_id!r} {report.outcome}: "
                         f"a failed run is not benchmarked\n{report.format()}")
        self.report = report


def node_figures(node: NodeReport, frame_bytes: int | None = None) -> dict[str, Figure]:
    """What one run's report says a node did, as the benchmark records it.

    Arguments:
        node: the node's report.
        frame_bytes: the size of each message it emits, in bytes, when known.

    Returns:
        messages, rate_per_s, cpu_ms_per_message, join_latency_p50_ms,
        join_latency_p99_ms and bytes_per_s (see the module's docstring), None for
        each that is not known.
    """
    count = node.emitted if node.kind == "producer" else node.processed
    rate = node.throughput
    cpu = (None if node.cpu_seconds is None or count == 0
           else node.cpu_seconds / count * 1000.0)
    return {"messages": count, "rate_per_s": rate, "cpu_ms_per_message": cpu,
            "join_latency_p50_ms": node.join_latency_p50_ms,
            "join_latency_p99_ms": node.join_latency_p99_ms,
            "bytes_per_s": None if frame_bytes is None or rate is None else rate * frame_bytes}


def flow_figures(reports: Sequence[RunReport],
                 frame_bytes: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The figures of runs of one flow, each the median over the runs that know it.

    Arguments:
        reports: the runs' reports (at least one), of one flow.
        frame_bytes: per node name, the size of each message it emits in bytes (a
            camera's frame: width * height * channels); nodes not named have no
            bytes_per_s.

    Returns:
        A dict of the flow's id, its run ids, the median wall time and per node its
        kind and each figure's median or None:
        ``{"flow": id, "runs": [run ids], "seconds": median wall time,
        "nodes": {name: {"kind": ..., figure: median or None, ...}}}``.

    Raises:
        ValueError: no reports, or frame_bytes names a node the flow does not have.
    """
    if not reports:
        raise ValueError("figures need at least one run's report")
    sizes = dict(frame_bytes or {})
    unknown = sorted(set(sizes) - set(reports[0].nodes))
    if unknown:
        raise ValueError(f"frame_bytes names nodes flow {reports[0].flow_id!r} does not "
                         f"have: {unknown}; its nodes: {list(reports[0].nodes)}")
    nodes: dict[str, dict[str, Any]] = {}
    for name, node in reports[0].nodes.items():
        per_run = [node_figures(report.nodes[name], sizes.get(name))
                   for report in reports if name in report.nodes]
        nodes[name] = {"kind": node.kind,
                       **{key: _median([run[key] for run in per_run]) for key in _NUMBERS}}
    return {"flow": reports[0].flow_id, "runs": [report.run_id for report in reports],
            "seconds": statistics.median(report.seconds for report in reports),
            "nodes": nodes}


def _median(values: Sequence[Figure]) -> Figure:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def benchmark_fixture(request: pytest.FixtureRequest) -> BenchmarkFixture:
    """pytest-benchmark's ``benchmark`` fixture for the test request stands for.

    Raises:
        MissingDependency: pytest-benchmark is not installed, or its plugin is not
            active (``-p no:benchmark``); the message says which and what to do.
    """
    try:
        import pytest_benchmark  # noqa: F401 - only whether it is there
    except ImportError as error:
        raise MissingDependency(
            "benchmarking a flow (videoflow_benchmark) needs pytest-benchmark: "
            "pip install pytest-benchmark") from error
    if not request.config.pluginmanager.has_plugin("benchmark"):
        raise MissingDependency(
            "benchmarking a flow (videoflow_benchmark) needs pytest-benchmark's plugin, "
            "which this pytest session does not load: drop '-p no:benchmark'")
    fixture: BenchmarkFixture = request.getfixturevalue("benchmark")
    return fixture


class FlowBenchmark:
    """Times whole runs of a flow under pytest-benchmark and records what its nodes
    did in the benchmark's extra_info (FIGURES_KEY; see the module's docstring).

    Arguments:
        benchmark: pytest-benchmark's ``benchmark`` fixture of the test.
        runner: runs the flow (on the test session's broker, for the plugin's
            fixture).
    """

    def __init__(self, benchmark: BenchmarkFixture, runner: FlowRunner) -> None:
        self.benchmark = benchmark
        self.runner = runner

    def __call__(self, flow: Flow, *, rounds: int = 3, warmup_rounds: int = 0,
                 frame_bytes: Mapping[str, int] | None = None,
                 **options: Any) -> RunReport:
        """Runs flow rounds times (after warmup_rounds untimed runs), each run timed
        from its start to its report. With ``--benchmark-disable`` it runs once,
        untimed, so the test still checks what the flow did.

        Arguments:
            flow: the flow; one Flow object serves every round.
            rounds: timed runs (pytest-benchmark's pedantic rounds).
            warmup_rounds: untimed runs first.
            frame_bytes: per node name, the size in bytes of each message it emits,
                for its bytes_per_s.
            **options: Flow.run's, for every run (as FlowRunner).

        Returns:
            the last run's RunReport (every run completed or stopped).

        Raises:
            FlowRunFailed: a run failed (the benchmark records nothing).
            ValueError: rounds below 1, warmup_rounds below 0, or frame_bytes naming
                a node the flow does not have.
        """
        if rounds < 1 or warmup_rounds < 0:
            raise ValueError(f"rounds must be 1 or more and warmup_rounds 0 or more, got "
                             f"{rounds} and {warmup_rounds}")
        reports: list[RunReport] = []

        def one_run() -> RunReport:
            report = self.runner(flow, **options)
            if not report.ok:
                raise FlowRunFailed(report)
            reports.append(report)
            return report

        last: RunReport = self.benchmark.pedantic(
            one_run, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
        timed = reports if self.benchmark.disabled else \
            reports[warmup_rounds:warmup_rounds + rounds]
        self.benchmark.extra_info[FIGURES_KEY] = flow_figures(timed, frame_bytes)
        return last


def benchmark_flow(benchmark: BenchmarkFixture, flow: Flow, nats_url: str, *,
                   label: str = "bench", **options: Any) -> RunReport:
    """FlowBenchmark without the plugin's fixtures: times runs of flow on the broker
    at nats_url under benchmark (pytest-benchmark's fixture).

    Arguments:
        benchmark: the test's ``benchmark`` fixture.
        flow: the flow.
        nats_url: the broker the runs use.
        label: what the runs' ids start with.
        **options: FlowBenchmark's (rounds, warmup_rounds, frame_bytes) and Flow.run's.

    Returns / Raises:
        as FlowBenchmark.
    """
    from videoflow.testing.runner import FlowRunner

    return FlowBenchmark(benchmark, FlowRunner(nats_url, label))(flow, **options)


__all__ = ["FIGURES_KEY", "FlowBenchmark", "FlowRunFailed", "benchmark_flow",
           "benchmark_fixture", "flow_figures", "node_figures"]
