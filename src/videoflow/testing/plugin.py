"""videoflow's pytest plugin: fixtures to test and benchmark flows with.

Installing videoflow enables it (the ``pytest11`` entry point ``videoflow``, in every
pytest session of that environment); ``pytest -p no:videoflow`` disables it, as does
``addopts = "-p no:videoflow"`` in a project's pytest configuration. It costs nothing
until a test asks for one of its fixtures: this module imports pytest and nothing of
videoflow's, and no fixture is autouse; each imports what it needs when it is first
set up. One thing pytest does of its own for every package with a plugin: the asserts
of videoflow's modules, imported in a test session, are rewritten as a test's are
(they check the same, and say more when they fail; ``-p no:videoflow`` does not stop
it, ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` does).

Fixtures:

- ``videoflow_server`` (session): an embedded nats-server with JetStream, on a port
  the OS chooses and a temporary store, stopped at the session's end whatever ended it
  (a failure, Ctrl-C), its store removed. On Linux it also goes if pytest itself is
  killed (videoflow.broker.server.EmbeddedServer's die_with_owner).
- ``videoflow_run``: runs a whole flow to its end on that server, each node replica a
  process, and returns its RunReport (videoflow.testing.runner.FlowRunner); each run
  gets a run id of its own, named for the test, so the runs of a session never share
  a stream.
- ``videoflow_simulate``: the in-process runner, videoflow.testing.simulate: the flow
  on the memory adapter and simulated time, from scripted inputs.
- ``videoflow_benchmark``: times runs of a flow under pytest-benchmark and records
  what its nodes did beside the time (videoflow.testing.bench.FlowBenchmark); fails
  at once, naming it, without pytest-benchmark.

Usage::

    def test_squares(videoflow_run: FlowRunner) -> None:
        report = videoflow_run(squares_flow())
        assert report.outcome == "completed"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from videoflow.broker.server import EmbeddedServer
    from videoflow.testing.bench import FlowBenchmark
    from videoflow.testing.runner import FlowRunner
    from videoflow.testing.script import SimulationResult


@pytest.fixture(scope="session")
def videoflow_server() -> Iterator[EmbeddedServer]:
    """An embedded nats-server for the test session, stopped at its end however it
    ends (its temporary store removed); ``.url`` is where it listens."""
    import threading

    from videoflow.broker.server import EmbeddedServer

    # Killed with pytest (Linux): only when the thread starting it lives as long as
    # the session does, which the main thread does.
    server = EmbeddedServer(
        die_with_owner=threading.current_thread() is threading.main_thread())
    server.start()  # stops what it started if it fails, Ctrl-C included
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def videoflow_run(videoflow_server: EmbeddedServer,
                  request: pytest.FixtureRequest) -> FlowRunner:
    """Runs a flow to its end on the session's server: ``videoflow_run(flow,
    **Flow.run's options)`` returns the RunReport; no live view unless asked for."""
    from videoflow.testing.runner import FlowRunner

    return FlowRunner(videoflow_server.url, label=request.node.name)


@pytest.fixture
def videoflow_simulate() -> Callable[..., SimulationResult]:
    """The in-process runner: ``videoflow_simulate(flow, inputs, **options)`` is
    videoflow.testing.simulate (videoflow.testing.simulation)."""
    from videoflow.testing.simulation import simulate

    return simulate


@pytest.fixture
def videoflow_benchmark(request: pytest.FixtureRequest) -> FlowBenchmark:
    """Times runs of a flow on the session's server under pytest-benchmark:
    ``videoflow_benchmark(flow, rounds=3, frame_bytes={...}, **Flow.run's options)``
    returns the last run's RunReport and records its nodes' figures in the benchmark's
    extra_info (videoflow.testing.bench)."""
    from videoflow.testing.bench import FlowBenchmark, benchmark_fixture

    # Before the server starts: a missing pytest-benchmark is said at once.
    benchmark = benchmark_fixture(request)
    runner: FlowRunner = request.getfixturevalue("videoflow_run")
    return FlowBenchmark(benchmark, runner)
