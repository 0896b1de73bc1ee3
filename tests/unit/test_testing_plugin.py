"""The pytest plugin and the flow benchmark's parts that need no broker: the plugin is
registered by its entry point, imports nothing heavy, is disabled by -p no:videoflow;
the benchmark fixture without pytest-benchmark fails at once, naming it; the figures a
benchmark records say unknown (None) where a report does not know, never 0; a node's
CPU time is summed over its replica processes, unknown when one did not say; and a
runner gives each run an id of its own."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

import pytest

from videoflow.core.report import NodeReport, RunReport
from videoflow.errors import MissingDependency
from videoflow.testing.bench import benchmark_fixture, flow_figures, node_figures
from videoflow.testing.runner import LABEL_CHARACTERS, FlowRunner

pytest_plugins = ["pytester"]


def test_installing_videoflow_registers_the_plugin_by_its_pytest11_entry_point() -> None:
    # The distribution that installed the package: videoflow-nats, or "videoflow" in an
    # environment installed before the name.
    installed = set(importlib.metadata.packages_distributions()["videoflow"])
    found = {e.name: e.value for e in importlib.metadata.entry_points(group="pytest11")
             if e.dist is not None and e.dist.name in installed}

    # Missing here: the environment's videoflow was installed before the entry point
    # existed; `pip install -e .` again.
    assert found == {"videoflow": "videoflow.testing.plugin"}


def test_the_plugin_imports_nothing_of_videoflow_and_nothing_heavy() -> None:
    script = ("import json, sys\n"
              "before = set(sys.modules)\n"
              "import videoflow.testing.plugin\n"
              "print(json.dumps(sorted(set(sys.modules) - before)))\n")

    loaded = json.loads(subprocess.run([sys.executable, "-c", script], check=True,
                                       capture_output=True, text=True).stdout)

    assert [m for m in loaded if m.startswith("videoflow")] == [
        "videoflow", "videoflow.testing", "videoflow.testing.plugin"]
    heavy = ("nats", "numpy", "msgspec", "rich", "pytest_benchmark")
    assert [m for m in loaded if m.split(".")[0] in heavy] == []


def test_p_no_videoflow_disables_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_server="def test_server(videoflow_server):\n    pass\n")

    result = pytester.runpytest_subprocess("-p", "no:videoflow", "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'videoflow_server' not found*"])


def test_the_benchmark_fixture_without_pytest_benchmarks_plugin_fails_before_any_server(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_speed="def test_speed(videoflow_benchmark):\n    pass\n")

    result = pytester.runpytest_subprocess("-p", "no:benchmark", "-p", "no:cacheprovider",
                                           "--setup-show")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*MissingDependency: benchmarking a flow "
                                 "(videoflow_benchmark) needs pytest-benchmark's plugin*"
                                 "drop '-p no:benchmark'"])
    assert "videoflow_server" not in result.stdout.str()  # never set up


def test_the_benchmark_fixture_without_pytest_benchmark_names_what_to_install(
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytest_benchmark", None)  # import fails

    with pytest.raises(MissingDependency, match=r"pip install pytest-benchmark$"):
        benchmark_fixture(request)


def test_a_nodes_cpu_time_is_its_processes_summed_and_unknown_when_one_did_not_say() -> None:
    finals = {"scale[0]": {"processed": 3, "cpu_seconds": 0.25},
              "scale[1]": {"processed": 2, "cpu_seconds": 0.5}}

    assert NodeReport.from_replicas("processor", finals).cpu_seconds == 0.75
    # A process that died reported progress, not its CPU time: the sum is unknown.
    finals["scale[0]~1"] = {"processed": 1}
    assert NodeReport.from_replicas("processor", finals).cpu_seconds is None


def test_node_figures_are_none_where_the_report_does_not_know_never_zero() -> None:
    # One frame emitted: no rate (one thing done), so no bytes per second either; no
    # CPU time said; a producer waits for no group.
    camera = NodeReport("producer", emitted=1, throughput=None)

    assert node_figures(camera, frame_bytes=100) == {
        "messages": 1, "rate_per_s": None, "cpu_ms_per_message": None,
        "join_latency_p50_ms": None, "join_latency_p99_ms": None, "bytes_per_s": None}


def test_node_figures_count_cpu_per_message_and_bytes_from_the_frame_size_given() -> None:
    fuse = NodeReport("processor", processed=200, emitted=200, throughput=50.0,
                      cpu_seconds=0.4, join_latency_p50_ms=2.0, join_latency_p99_ms=9.0)

    figures = node_figures(fuse, frame_bytes=1000)

    assert figures == {"messages": 200, "rate_per_s": 50.0, "cpu_ms_per_message": 2.0,
                       "join_latency_p50_ms": 2.0, "join_latency_p99_ms": 9.0,
                       "bytes_per_s": 50_000.0}
    assert node_figures(fuse)["bytes_per_s"] is None
    idle = NodeReport("consumer", processed=0, throughput=0.0, cpu_seconds=0.1)
    assert node_figures(idle)["cpu_ms_per_message"] is None  # nothing to divide by


def _run(run_id: str, rate: float | None, seconds: float) -> RunReport:
    return RunReport("f", run_id, "batch", "nats://x", seconds=seconds, nodes={
        "cam": NodeReport("producer", emitted=10, throughput=rate, cpu_seconds=None)})


def test_flow_figures_are_each_the_median_over_the_runs_that_know_it() -> None:
    runs = [_run("a", 10.0, 3.0), _run("b", None, 1.0), _run("c", 30.0, 2.0)]

    figures = flow_figures(runs, frame_bytes={"cam": 2})

    assert figures["runs"] == ["a", "b", "c"] and figures["seconds"] == 2.0
    assert figures["nodes"]["cam"] == {
        "kind": "producer", "messages": 10, "rate_per_s": 20.0, "cpu_ms_per_message": None,
        "join_latency_p50_ms": None, "join_latency_p99_ms": None, "bytes_per_s": 40.0}
    assert json.loads(json.dumps(figures)) == figures  # pytest-benchmark's JSON holds it


def test_flow_figures_refuse_a_frame_size_for_a_node_the_flow_does_not_have() -> None:
    with pytest.raises(ValueError, match=r"frame_bytes names nodes .* \['camera'\]"):
        flow_figures([_run("a", 1.0, 1.0)], frame_bytes={"camera": 2})


def test_a_runner_gives_each_run_an_id_of_its_own_named_for_its_label() -> None:
    runner = FlowRunner("nats://127.0.0.1:4222", label="test_join[cam 1/2]")

    first, second = runner.next_run_id(), runner.next_run_id()

    assert re.fullmatch(r"test_join_cam_1_2-1-[0-9a-f]{6}", first)
    assert re.fullmatch(r"test_join_cam_1_2-2-[0-9a-f]{6}", second)
    long = FlowRunner("nats://x", label="t" * 100).next_run_id()
    assert long.startswith("t" * LABEL_CHARACTERS + "-1-")


def test_a_runner_runs_on_its_own_broker_only() -> None:
    runner = FlowRunner("nats://127.0.0.1:4222")

    with pytest.raises(TypeError, match="nats_url cannot be given"):
        runner(None, nats_url="nats://elsewhere:4222")  # type: ignore[arg-type]
