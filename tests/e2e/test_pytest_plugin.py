"""videoflow's pytest plugin as a user gets it: a fresh test directory (pytest's
pytester), pytest run in a process of its own, which loads the plugin by its pytest11
entry point. Its fixtures run a flow on a session's embedded nats-server (and
simulate it in one process), tear that server down whatever ended the session, and
benchmark a flow, so that
--benchmark-compare-fail catches a flow made slower; and the example under
examples/benchmark_my_flow passes, timed and with timing off."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from readme_blocks import Block, python_blocks

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.timeout(180)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "benchmark_my_flow"

README_TESTS = [b for b in python_blocks()
                if (b.file_name or "").startswith("test_") and b.needs_broker]
"""The README's test files that use the plugin's broker."""

TINY_FLOW = '''
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from videoflow import ConsumerNode, Flow, ProducerNode


class Numbers(ProducerNode):
    def __init__(self, count: int, **options: Any) -> None:
        super().__init__(**options)
        self.count, self.i = count, 0

    def next(self) -> int:
        if self.i == self.count:
            raise StopIteration
        self.i += 1
        self.context.set_event_timestamp(float(self.i))
        return self.i


class Keep(ConsumerNode):
    """Writes each number it gets into a file of its own in folder, after pace s."""

    def __init__(self, folder: str, pace: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self.folder, self.pace = folder, pace

    def consume(self, n: int) -> None:
        time.sleep(self.pace)
        (Path(self.folder) / str(n)).touch()


def numbers(folder: Path, count: int, pace: float = 0.0) -> Flow:
    source = Numbers(count, name="numbers")
    return Flow([source], [Keep(str(folder), pace, name="keep")(source)], name="tiny")


def kept_numbers(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir())
'''
"""The flow module of the generated tests: numbers -> keep, two processes."""


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest each test starts is a user's own, not a worker of this session's
    pytest-xdist: pytest-benchmark reads PYTEST_XDIST_WORKER from the environment and,
    finding it, times nothing."""
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        monkeypatch.delenv(name)


def test_a_fresh_test_directory_runs_a_flow_on_the_sessions_server(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(tiny_flow=TINY_FLOW)
    pytester.makepyfile(test_tiny='''
        from tiny_flow import kept_numbers, numbers

        SEEN = []

        def test_the_flow_completes(videoflow_server, videoflow_run, tmp_path):
            report = videoflow_run(numbers(tmp_path, 4))

            assert report.outcome == "completed", report.format()
            assert report.nats_url == videoflow_server.url
            assert report.nodes["keep"].processed == 4
            assert kept_numbers(tmp_path) == [1, 2, 3, 4]
            SEEN.append((videoflow_server.url, report.run_id))

        def test_a_second_test_meets_the_same_server_under_a_run_id_of_its_own(
                videoflow_server, videoflow_run, tmp_path):
            report = videoflow_run(numbers(tmp_path, 3))

            assert report.outcome == "completed", report.format()
            assert kept_numbers(tmp_path) == [1, 2, 3]
            (url, first_run), = SEEN
            assert url == videoflow_server.url
            assert first_run.startswith("test_the_flow_completes-1-")
            assert report.run_id.startswith("test_a_second_test_meets_the_same_server-1-")

        def test_the_same_flow_simulated_in_this_process(videoflow_simulate, tmp_path):
            result = videoflow_simulate(numbers(tmp_path, 3))

            assert result.report.nodes["keep"].processed == 3
            assert kept_numbers(tmp_path) == [1, 2, 3]
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=3)


def test_the_sessions_server_is_stopped_after_a_failure_and_a_ctrl_c(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_ends='''
        from pathlib import Path

        def test_fails(videoflow_server):
            Path("server.json").write_text(
                f'[{videoflow_server.process.pid}, "{videoflow_server.store_dir}"]')
            assert False, "a test that fails"

        def test_interrupted(videoflow_server):
            raise KeyboardInterrupt

        def test_never_reached():
            pass
    ''')

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    result.assert_outcomes(failed=1)
    pid, store = json.loads((pytester.path / "server.json").read_text())
    assert not Path(store).exists(), "the server's temporary store was left behind"
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"nats-server {pid} still runs"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_compare_fail_catches_a_flow_made_slower_and_passes_it_as_fast_as_before(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(tiny_flow=TINY_FLOW)
    pytester.makepyfile(test_speed='''
        import os

        from tiny_flow import numbers

        def test_flow_speed(videoflow_benchmark, tmp_path):
            pace = float(os.environ["TINY_PACE"])
            report = videoflow_benchmark(numbers(tmp_path, 4, pace),
                                         rounds=int(os.environ["TINY_ROUNDS"]))

            assert report.nodes["keep"].processed == 4
    ''')
    storage = f"--benchmark-storage=file://{pytester.path / 'benchmarks'}"
    # A regression is a best time 6 s over the saved one's. The fast flow's runs are
    # its processes' startup, 1.1 s on an idle 2-core machine and up to 5 s under the
    # load of the suite beside it, so a ratio of two of them says how loaded the
    # machine was; their difference stays under 3 s (of the best of two runs). The
    # slow one's sink sleeps 12 s on top, so it is at least 8 s over.
    compare = ["--benchmark-compare=0001", "--benchmark-compare-fail=min:6"]
    monkeypatch.setenv("TINY_PACE", "0")
    monkeypatch.setenv("TINY_ROUNDS", "2")

    saved = pytester.runpytest_subprocess("-p", "no:cacheprovider", storage,
                                          "--benchmark-save=fast")

    saved.assert_outcomes(passed=1)
    monkeypatch.setenv("TINY_PACE", "3.0")
    monkeypatch.setenv("TINY_ROUNDS", "1")

    slower = pytester.runpytest_subprocess("-p", "no:cacheprovider", storage, *compare)

    # The test passes; the comparison fails the session, after the test's report (it
    # raises in pytest's terminal summary, which then has no line of outcomes).
    assert slower.ret != pytest.ExitCode.OK, slower.stdout.str()
    slower.stdout.fnmatch_lines(["test_speed.py .*"])
    slower.stderr.fnmatch_lines(["*Performance has regressed:*",
                                 "*test_flow_speed (0001_fast) - Field 'min' has failed *"])
    monkeypatch.setenv("TINY_PACE", "0")
    monkeypatch.setenv("TINY_ROUNDS", "2")

    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", storage, *compare)

    again.assert_outcomes(passed=1)
    assert again.ret == pytest.ExitCode.OK, again.stdout.str() + again.stderr.str()
    assert "regressed" not in again.stdout.str() + again.stderr.str()


@pytest.fixture
def example(pytester: pytest.Pytester) -> pytest.Pytester:
    """A fresh directory holding the example's files."""
    assert (EXAMPLE / "test_my_flow.py").is_file()
    for path in EXAMPLE.glob("*.py"):
        shutil.copy(path, pytester.path / path.name)
    return pytester


def test_the_examples_benchmark_records_what_each_node_did(example: pytest.Pytester) -> None:
    result = example.runpytest_subprocess("-p", "no:cacheprovider",
                                          "--benchmark-json=timed.json")

    result.assert_outcomes(passed=1)
    bench, = json.loads((example.path / "timed.json").read_text())["benchmarks"]
    assert bench["stats"]["rounds"] == 3
    figures = bench["extra_info"]["videoflow"]
    assert figures["flow"] == "brightness" and len(figures["runs"]) == 3
    camera, brightness, record = (figures["nodes"][n] for n in ("camera", "brightness",
                                                                "record"))
    assert [camera["messages"], brightness["messages"], record["messages"]] == [100] * 3
    for node in (camera, brightness, record):
        assert node["rate_per_s"] > 0 and node["cpu_ms_per_message"] > 0
    # A camera waits for no group; only its frame size was given: unknown, never 0.
    assert camera["join_latency_p50_ms"] is None and camera["join_latency_p99_ms"] is None
    assert camera["bytes_per_s"] == pytest.approx(camera["rate_per_s"] * 64 * 48 * 3)
    assert brightness["bytes_per_s"] is None and record["bytes_per_s"] is None
    assert 0 <= brightness["join_latency_p50_ms"] <= brightness["join_latency_p99_ms"]


def test_the_examples_test_runs_its_flow_once_with_timing_off(
        example: pytest.Pytester) -> None:
    result = example.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-disable",
                                          "--benchmark-json=untimed.json")

    result.assert_outcomes(passed=1)
    saved = example.path / "untimed.json"  # nothing timed, nothing recorded
    assert not saved.exists() or json.loads(saved.read_text())["benchmarks"] == []


def test_the_readme_shows_a_test_file_of_each_of_the_plugins_broker_fixtures() -> None:
    assert [b.file_name for b in README_TESTS] == ["test_squares.py", "test_speed.py"]


@pytest.mark.parametrize("block", README_TESTS, ids=[b.id for b in README_TESTS])
def test_each_readme_test_file_on_the_plugins_broker_passes(
        pytester: pytest.Pytester, block: Block) -> None:
    assert block.file_name is not None
    (pytester.path / block.file_name).write_text(block.source, encoding="utf-8")

    # As CI runs benchmarks: timing off, each flow run once and checked.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-disable")

    result.assert_outcomes(passed=block.source.count("\ndef test_"))
