"""bench/regression.py, the regression runs' comparison, on synthetic pytest-benchmark
JSON: a ratio against the peer worse than the baseline's beyond the threshold fails and
names its case, a latency's direction is the other way round, nothing is silent (a
case missing fails, a new one is reported), and --update writes a baseline that the
same runs then pass. No benchmark runs here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "regression.py"


def _load() -> ModuleType:
    """The script as a module (bench/ is no package on the tests' path)."""
    spec = importlib.util.spec_from_file_location("bench_regression", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


regression = _load()


# ------------------------------------------------------------------ synthetic runs


def bench(group: str, params: dict[str, Any] | None, extra: dict[str, Any]) -> dict[str, Any]:
    """One benchmark as pytest-benchmark's JSON holds it (the fields read, and stats)."""
    param = "-".join(str(v) for v in (params or {}).values()) or None
    return {"group": group, "name": f"test_{group}" + (f"[{param}]" if param else ""),
            "params": params, "param": param, "extra_info": extra,
            "stats": {"min": 1.0, "median": 1.0, "rounds": 3}}


def sides(group: str, videoflow: float, peer: float, key: str = "rate",
          unit: str = "msg/s") -> list[dict[str, Any]]:
    """A case as bench/test_bench_flow.py's record() leaves it: one benchmark per side."""
    return [bench(group, {"side": side}, {f"{key}_best": value, f"{key}_median": value,
                                          "unit": unit, "rounds": [{key: value}]})
            for side, value in (("videoflow", videoflow), ("peer", peer))]


def run_file(tmp_path: Path, name: str, *benches: list[dict[str, Any]]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"machine_info": {"cpu": {"brand_raw": "test", "count": 2},
                                                 "python_version": "3.12"},
                                "commit_info": {"id": "abc"},
                                "benchmarks": [b for group in benches for b in group]}))
    return path


def baseline_file(tmp_path: Path, cases: dict[str, dict[str, Any]],
                  threshold: float = 0.25) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps({"threshold": threshold, "cases": cases}))
    return path


def rate_case(ratio: float, **more: Any) -> dict[str, Any]:
    return {"ratio": ratio, "lower_is_better": False, "figure": "rate_best (msg/s)", **more}


def latency_case(ratio: float) -> dict[str, Any]:
    return {"ratio": ratio, "lower_is_better": True, "figure": "p50_ms_per_hop_best (ms)"}


def check(capsys: pytest.CaptureFixture[str], *args: Path | str) -> tuple[int, str]:
    """main() on these arguments: (its exit status, what it printed, stdout and stderr)."""
    status = regression.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return status, out + err


# ------------------------------------------------------------------ comparing


def test_a_rate_ratio_worse_than_the_baseline_beyond_the_threshold_fails_naming_the_case(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0),
                                        "flow_producer": rate_case(1.0)})
    # 0.7 of the peer against 1.0: worse by 43 %, past 25 %; the producer unchanged.
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 700.0, 1000.0),
                   sides("flow_producer", 1000.0, 1000.0))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 1
    failed = printed.splitlines()[-1]
    assert failed.startswith("FAILED: 1 case(s): flow_linear_batch regressed (worse by 43 %")
    assert "flow_producer" not in failed


def test_a_ratio_worse_within_the_threshold_passes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0)})
    # baseline / now = 1.0 / 0.81 = 1.235: worse by 23 %, within 25 %.
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 810.0, 1000.0))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 0, printed
    assert "ok: worse by 23 % (threshold 25 %)" in printed
    assert printed.splitlines()[-1] == "passed: 1 case(s) within their threshold"


def test_the_threshold_is_read_as_a_ratio_against_the_peer_not_an_absolute_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(0.5)})
    # A host three times slower: both sides slower alike, the ratio unchanged.
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 100.0, 200.0))

    assert check(capsys, run, "--baseline", baseline)[0] == 0


def test_a_latency_ratio_that_rises_regresses_and_one_that_falls_does_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_latency": latency_case(1.0)})
    slower = run_file(tmp_path, "slower.json",
                      sides("flow_latency", 1.5, 1.0, key="p50_ms_per_hop", unit="ms"))
    faster = run_file(tmp_path, "faster.json",
                      sides("flow_latency", 0.5, 1.0, key="p50_ms_per_hop", unit="ms"))

    slow_status, slow_printed = check(capsys, slower, "--baseline", baseline)
    fast_status, fast_printed = check(capsys, faster, "--baseline", baseline)

    # 1.5 ms per hop against the peer's 1.0: a higher latency ratio is worse.
    assert slow_status == 1
    assert "flow_latency regressed (worse by 50 %" in slow_printed
    # Half the peer's latency: twice as good, past the threshold the good way.
    assert fast_status == 0, fast_printed
    assert ("ok: better by 100 % (threshold 25 %), better past it: a baseline to "
            "refresh?") in fast_printed


def test_a_rate_ratio_that_rises_is_better_not_a_regression(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0)})
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 2000.0, 1000.0))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 0
    assert "ok: better by 100 %" in printed


def test_a_case_of_the_baseline_missing_from_the_run_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0),
                                        "flow_time_join": rate_case(1.0)})
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 1000.0, 1000.0))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 1
    assert printed.splitlines()[-1] == (
        "FAILED: 1 case(s): flow_time_join missing (in the baseline, not in the run)")


def test_a_case_missing_from_one_of_several_runs_fails_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_time_join": rate_case(1.0)})
    first = run_file(tmp_path, "first.json", sides("flow_time_join", 1000.0, 1000.0))
    second = run_file(tmp_path, "second.json", sides("flow_producer", 1000.0, 1000.0))

    status, printed = check(capsys, first, second, "--baseline", baseline)

    assert status == 1
    assert f"flow_time_join missing (not in {second})" in printed


def test_a_case_whose_peer_side_did_not_run_fails_saying_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_time_join": rate_case(1.0)})
    run = run_file(tmp_path, "run.json", sides("flow_time_join", 1000.0, 1000.0)[:1])

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 1
    assert "flow_time_join missing" in printed and "only the 'videoflow' side ran" in printed


def test_a_new_case_is_reported_and_does_not_fail(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0)})
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 1000.0, 1000.0),
                   sides("flow_brand_new", 10.0, 1000.0))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 0
    line = next(line for line in printed.splitlines() if "flow_brand_new" in line)
    assert "new: not in the baseline, not compared (--update adds it)" in line


def test_a_figure_that_changed_since_the_baseline_fails_asking_for_a_refresh(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_latency": latency_case(1.0)})
    run = run_file(tmp_path, "run.json", sides("flow_latency", 1.0, 1.0, key="p99_ms", unit="ms"))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 1
    assert ("flow_latency changed (the run measures p99_ms_best (ms) (lower is better), "
            "the baseline p50_ms_per_hop_best (ms)") in printed
    assert "refresh the baseline" in printed


def test_a_figure_neither_a_rate_nor_a_time_is_not_given_a_direction(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_odd": rate_case(1.0)})
    run = run_file(tmp_path, "run.json", sides("flow_odd", 3.0, 1.0, unit="frames"))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 1
    assert "flow_odd missing" in printed and "neither a rate (.../s) nor a time" in printed


def test_the_median_ratio_over_several_runs_is_compared(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0)})
    # One disturbed run at 0.5 among 0.95 and 1.0: the median, 0.95, passes.
    runs = [run_file(tmp_path, f"run{i}.json", sides("flow_linear_batch", vf, 1000.0))
            for i, vf in enumerate((950.0, 500.0, 1000.0))]

    status, printed = check(capsys, *runs, "--baseline", baseline)

    assert status == 0, printed
    assert "0.950 0.500 1.000" in printed


def test_a_case_of_per_round_lists_is_the_ratio_of_each_sides_best_round(
        tmp_path: Path) -> None:
    # bench/test_bench_io.py: one benchmark, each side's rate per round.
    run = json.loads(run_file(tmp_path, "run.json", [bench("io_source_sink", None, {
        "videoflow": [800.0, 900.0, 100.0], "peer": [1000.0, 500.0, 800.0]})]).read_text())

    cases, problems = regression.cases_of(run, "run.json")

    assert problems == {}
    assert cases["io_source_sink"].ratio == pytest.approx(0.9)
    assert cases["io_source_sink"].lower_is_better is False


def test_the_backend_is_compared_with_its_raw_nats_py_ceiling(tmp_path: Path) -> None:
    # bench/test_bench_backend.py: many sides, messages_per_s, no unit.
    run = json.loads(run_file(tmp_path, "run.json", [
        bench("backend_publish", {"side": side}, {"messages_per_s": rate})
        for side, rate in (("raw_publish_async", 1000.0), ("raw_publish_seq", 10.0),
                           ("backend", 2500.0), ("backend_sync", 5.0))]).read_text())

    cases, problems = regression.cases_of(run, "run.json")

    assert problems == {}
    assert (cases["backend_publish"].ratio, cases["backend_publish"].figure) == (
        2.5, "messages_per_s")


def test_a_case_threshold_and_the_command_line_override_the_baseline_threshold(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_latency": {**latency_case(1.0),
                                                         "threshold": 0.6}})
    run = run_file(tmp_path, "run.json",
                   sides("flow_latency", 1.5, 1.0, key="p50_ms_per_hop", unit="ms"))

    assert check(capsys, run, "--baseline", baseline)[0] == 0  # 50 % within its 60 %
    assert check(capsys, run, "--baseline", baseline, "--threshold", "0.4")[0] == 1


# ------------------------------------------------------------------ files, --update


def test_update_writes_a_baseline_the_same_runs_then_pass(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [run_file(tmp_path, f"run{i}.json", sides("flow_linear_batch", vf, 1000.0),
                     sides("flow_latency", lat, 1.0, key="p50_ms_per_hop", unit="ms"))
            for i, (vf, lat) in enumerate(((800.0, 1.2), (900.0, 1.4), (700.0, 1.3)))]
    baseline = tmp_path / "baseline.json"

    status, printed = check(capsys, *runs, "--baseline", baseline, "--update")

    assert status == 0, printed
    written = json.loads(baseline.read_text())
    assert written["threshold"] == regression.DEFAULT_THRESHOLD
    assert written["cases"]["flow_linear_batch"] == {
        "ratio": 0.8, "lower_is_better": False, "figure": "rate_best (msg/s)",
        "runs": [0.8, 0.9, 0.7]}
    assert written["cases"]["flow_latency"]["ratio"] == 1.3
    assert written["cases"]["flow_latency"]["lower_is_better"] is True
    assert written["recorded"]["runs"] == 3
    assert check(capsys, *runs, "--baseline", baseline)[0] == 0


def test_update_keeps_the_thresholds_and_says_what_it_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0, threshold=0.4),
                                        "flow_gone": rate_case(1.0)}, threshold=0.3)
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 500.0, 1000.0))

    status, printed = check(capsys, run, "--baseline", baseline, "--update")

    assert status == 0
    written = json.loads(baseline.read_text())
    assert written["threshold"] == 0.3
    assert written["cases"] == {"flow_linear_batch": {**rate_case(0.5, threshold=0.4),
                                                      "runs": [0.5]}}
    assert "dropped flow_gone: in the previous baseline, not in these runs" in printed


def test_a_run_made_with_timing_off_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0)})
    run = run_file(tmp_path, "run.json")  # --benchmark-disable saves no benchmark

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 2
    assert "holds no benchmark" in printed and "without --benchmark-disable" in printed


@pytest.mark.parametrize("cases", [{}, {"flow_linear_batch": {"ratio": 0}},
                                   {"flow_linear_batch": {"ratio": 1.0, "figure": "rate"}}])
def test_a_baseline_that_cannot_be_compared_with_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cases: dict[str, Any]) -> None:
    baseline = baseline_file(tmp_path, cases)
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 1000.0, 1000.0))

    status, printed = check(capsys, run, "--baseline", baseline)

    assert status == 2
    assert printed.startswith(f"error: the baseline {baseline}")


def test_the_repositorys_baseline_is_one_the_script_compares_with() -> None:
    baseline = regression.check_baseline(
        regression.load_json(regression.BASELINE, "baseline"), regression.BASELINE)

    assert baseline["threshold"] == regression.DEFAULT_THRESHOLD
    assert {"flow_linear_batch", "flow_latency"} <= set(baseline["cases"])
    assert baseline["cases"]["flow_latency"]["lower_is_better"] is True


def test_the_script_runs_from_the_repositorys_root(tmp_path: Path) -> None:
    baseline = baseline_file(tmp_path, {"flow_linear_batch": rate_case(1.0)})
    run = run_file(tmp_path, "run.json", sides("flow_linear_batch", 500.0, 1000.0))

    done = subprocess.run([sys.executable, "bench/regression.py", str(run), "--baseline",
                           str(baseline)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)

    assert done.returncode == 1, done.stderr
    assert "flow_linear_batch regressed (worse by 100 %" in done.stdout
