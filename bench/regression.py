"""Regression runs of the benchmarks against a hand-written peer: each case's
videoflow / peer ratio, measured within one run, compared with the ratio kept in
bench/baseline.json.

An absolute time says as much about the host as about videoflow: a shared CI runner,
or a 2-core machine with other work on it, drifts by tens of percent within minutes.
Both sides of a case run in the same run, one after the other, so a slow host slows
both, and their ratio is what holds from one run to the next. A case regressed when
its ratio is worse than the baseline's by more than the threshold: for a rate
(higher is better) when baseline / now > 1 + threshold, for a time (lower is better)
when now / baseline > 1 + threshold.

What a case is, in a pytest-benchmark JSON file (``--benchmark-json``):

- sides: the benchmarks of one group whose parameter ``side`` is ``videoflow`` and
  ``peer`` (bench/test_bench_flow.py's ``record()``), or the two sides PAIRINGS names
  for the group (bench/test_bench_backend.py: ``backend`` against the raw nats-py
  ceiling). Each side's figure is the one ``<key>_best`` entry of its extra_info (its
  best round: on a shared host the least disturbed one), or else its
  ``messages_per_s`` (bench/test_bench_backend.py's, from its median round). The
  ratio is videoflow's over the peer's, as the run's summary tables print it. Its
  direction comes from the extra_info's unit: a rate (``msg/s``, ``groups/s``:
  ending in ``/s``) is better higher, a time (``s``, ``ms``, ``us``, ``ns``) lower,
  and with no unit a figure named ``..._per_s`` is a rate; anything else is an
  error. The case is named for the group (and any other parameters, in brackets).
- lists: one benchmark whose extra_info holds a list of figures, one a round, under
  ``videoflow`` and under ``peer`` (bench/test_bench_io.py, whose rounds alternate the
  two sides). The figures are rates; the ratio is of each side's best round, as for
  sides: steadier there than the median of the rounds' ratios (over 8 runs, 0.69 to
  0.87 but for one 1.18, where the median of the rounds' ratios went from 0.57 to
  1.03). The case is named for the group.

Given several runs, a case's ratio is the median of its ratios in each run. A case of
the baseline that a run lacks is a failure, as is one whose figure changed (another
key or direction: refresh the baseline); a case the baseline lacks is reported, not
compared.

Usage (from the repository's root)::

    python bench/regression.py RUN.json [RUN.json ...]           # exit 1 on a regression
    python bench/regression.py --update RUN.json [RUN.json ...]  # write the baseline

Exit status: 0 every case of the baseline within the threshold, 1 a case regressed,
missing or changed, 2 a file that cannot be read or holds no benchmark.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASELINE = Path(__file__).resolve().with_name("baseline.json")
DEFAULT_THRESHOLD = 0.5
"""Worse than the baseline by more than this share fails, unless the baseline says
otherwise, for all its cases or for one. 50 %: over 15 runs of the suites on a 2-core
host with other work on it, the median of 3 runs of four of the eight cases was at
worst 19 % to 40 % worse than the baseline, and its 90th percentile 8 % to 17 %. A
case of another spread has its own threshold in bench/baseline.json (its "about" says
how each was chosen)."""

SUBJECT, PEER = "videoflow", "peer"
RATE_SUFFIX = "/s"
TIME_UNITS = frozenset({"s", "ms", "us", "ns"})
REFRESH = "python bench/regression.py --update RUN.json [RUN.json ...]"
FALLBACK_FIGURE = "messages_per_s"
PAIRINGS: dict[str, tuple[str, str]] = {
    "backend_publish": ("backend", "raw_publish_async"),
    "backend_receive_settle": ("backend", "raw_fetch_ack"),
}
"""Groups whose two sides are not named videoflow and peer: (videoflow's, the peer's).
The backend's against the honest nats-py ceiling of each (its docstring's pairs)."""


class BenchFileError(ValueError):
    """A benchmark run or baseline that cannot be read, or holds nothing to compare."""


@dataclass(frozen=True)
class Measured:
    """One case's ratio in one run.

    Attributes:
        case: its name (the benchmark group, other parameters in brackets).
        ratio: videoflow's figure over the peer's.
        lower_is_better: the figure is a time (a higher ratio is worse).
        figure: what was compared, e.g. ``rate_best (msg/s)``.
    """

    case: str
    ratio: float
    lower_is_better: bool
    figure: str


@dataclass
class Combined:
    """One case over several runs: its ratio in each, and their median.

    Attributes:
        ratios: per run, in the order of the files; None for a run that lacks it.
        problems: why a run gave no ratio (not in its file, one side only, ...).
    """

    case: str
    lower_is_better: bool
    figure: str
    ratios: list[float | None] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def measured(self) -> list[float]:
        return [r for r in self.ratios if r is not None]

    @property
    def ratio(self) -> float | None:
        """The median of the runs' ratios, None when no run measured it."""
        return statistics.median(self.measured) if self.measured else None


@dataclass(frozen=True)
class Verdict:
    """A case compared with the baseline.

    Attributes:
        status: ``ok``, ``regressed``, ``missing`` or ``changed`` (failures), ``new``
            (not in the baseline: reported only).
        worse: how many times worse than the baseline (1.25: worse by 25 %; below 1:
            better), None when not compared.
    """

    case: str
    status: str
    detail: str
    baseline: float | None = None
    now: float | None = None
    worse: float | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("regressed", "missing", "changed")


# ------------------------------------------------------------------ reading a run


def load_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from a file.

    Raises:
        BenchFileError: the file cannot be read, is not JSON, or not an object.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise BenchFileError(f"cannot read the {what} {path}: {error}") from error
    except json.JSONDecodeError as error:
        raise BenchFileError(f"the {what} {path} is not JSON: {error}") from error
    if not isinstance(data, dict):
        raise BenchFileError(f"the {what} {path} is not a JSON object")
    return data


def benchmarks_of(run: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The benchmarks of a pytest-benchmark JSON run.

    Raises:
        BenchFileError: none (a run with timing off, --benchmark-disable, saves none).
    """
    benchmarks = run.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise BenchFileError(
            f"{source} holds no benchmark: a pytest-benchmark JSON file from a run with "
            "timing on (--benchmark-json, without --benchmark-disable) is needed")
    return [b for b in benchmarks if isinstance(b, dict)]


def direction_of(unit: Any, key: str) -> bool:
    """Whether a figure is better lower (a time) or higher (a rate), by its unit, or
    with no unit by its name.

    Raises:
        ValueError: neither a rate nor a time.
    """
    if unit is None and key.removesuffix("_best").endswith("_per_s"):
        return False
    if isinstance(unit, str) and unit.endswith(RATE_SUFFIX):
        return False
    if unit in TIME_UNITS:
        return True
    raise ValueError(f"{key} in {unit!r} is neither a rate (.../s) nor a time "
                     f"({', '.join(sorted(TIME_UNITS))}): no direction to compare in")


def side_figure(extra: dict[str, Any]) -> tuple[str, float]:
    """A side's figure: the one ``<key>_best`` entry of its extra_info, else its
    ``messages_per_s``.

    Raises:
        ValueError: none, several, or not a positive number.
    """
    keys = [k for k in extra if k.endswith("_best")] or [
        k for k in (FALLBACK_FIGURE,) if k in extra]
    if len(keys) != 1:
        raise ValueError(f"expected one '<key>_best' figure (or {FALLBACK_FIGURE}) in "
                         f"extra_info, found {keys or 'none'}")
    value = extra[keys[0]]
    if not _positive(value):
        raise ValueError(f"{keys[0]} is {value!r}, not a positive figure")
    return keys[0], float(value)


def sides_case(case: str, subject: dict[str, Any], peer: dict[str, Any]) -> Measured:
    """A case of the sides kind from its two benchmarks' extra_info.

    Raises:
        ValueError: a side without a usable figure, the two sides' figures or units
            differing, or a figure with no direction.
    """
    (key, mine), (peer_key, theirs) = side_figure(subject), side_figure(peer)
    unit, peer_unit = subject.get("unit"), peer.get("unit")
    if (key, unit) != (peer_key, peer_unit):
        raise ValueError(f"the sides measure different figures: {key} ({unit}) against "
                         f"{peer_key} ({peer_unit})")
    shown = f"{key} ({unit})" if unit is not None else key
    return Measured(case, mine / theirs, direction_of(unit, key), shown)


def lists_case(group: str, extra: dict[str, Any]) -> Measured:
    """A case of the lists kind: each side's best round, videoflow's over the peer's.

    Raises:
        ValueError: a side with no positive figure.
    """
    best = []
    for side in (SUBJECT, PEER):
        values = [v for v in extra[side] if _positive(v)]
        if not values:
            raise ValueError(f"no round of the '{side}' side measured a rate: {extra[side]!r}")
        best.append(max(values))
    return Measured(group, best[0] / best[1], False, "rate, best round")


def case_name(group: str, params: dict[str, Any]) -> str:
    """The group, with the benchmark's parameters other than ``side`` in brackets."""
    rest = ",".join(f"{k}={v}" for k, v in sorted(params.items()) if k != "side")
    return f"{group}[{rest}]" if rest else group


def cases_of(run: dict[str, Any], source: str) -> tuple[dict[str, Measured], dict[str, str]]:
    """Every case a pytest-benchmark run measured (see the module's docstring).

    Arguments:
        run: the run's JSON.
        source: where it came from, for messages.

    Returns:
        (the cases measured by name, the cases whose benchmarks are there but gave no
        ratio, with why).

    Raises:
        BenchFileError: the run holds no benchmark.
    """
    sides: dict[str, dict[str, dict[str, Any]]] = {}
    wanted: dict[str, tuple[str, str]] = {}
    cases: dict[str, Measured] = {}
    problems: dict[str, str] = {}
    for bench in benchmarks_of(run, source):
        group = str(bench.get("group") or bench.get("name"))
        params = bench.get("params") or {}
        extra = bench.get("extra_info") or {}
        pair = PAIRINGS.get(group, (SUBJECT, PEER))
        if params.get("side") in pair:
            name = case_name(group, params)
            wanted[name] = pair
            if params["side"] in sides.setdefault(name, {}):
                problems[name] = f"two '{params['side']}' benchmarks in {source}"
            sides[name][params["side"]] = extra
        elif isinstance(extra.get(SUBJECT), list) and isinstance(extra.get(PEER), list):
            try:
                cases[group] = lists_case(group, extra)
            except ValueError as error:
                problems[group] = str(error)
    for name, found in sides.items():
        subject, peer = wanted[name]
        if name in problems:
            continue
        if set(found) != {subject, peer}:
            problems[name] = f"only the '{next(iter(found))}' side ran"
            continue
        try:
            cases[name] = sides_case(name, found[subject], found[peer])
        except ValueError as error:
            problems[name] = str(error)
    return cases, problems


def combine(runs: Sequence[tuple[dict[str, Measured], dict[str, str]]],
            sources: Sequence[str] | None = None) -> dict[str, Combined]:
    """Each case over several runs (cases_of of each), its ratios in the runs' order.

    A case whose figure or direction differs from one run to another keeps the first
    run's, and the others' ratios become problems.

    Arguments:
        sources: each run's file, for messages (default: run 1, run 2, ...).
    """
    sources = sources or [f"run {index + 1}" for index in range(len(runs))]
    combined: dict[str, Combined] = {}
    names = dict.fromkeys(n for cases, problems in runs for n in [*cases, *problems])
    for name in names:
        first = next((cases[name] for cases, _ in runs if name in cases), None)
        into = combined[name] = Combined(name, first.lower_is_better if first else False,
                                         first.figure if first else "?")
        for index, (cases, problems) in enumerate(runs):
            got = cases.get(name)
            if got is not None and (got.figure, got.lower_is_better) != (into.figure,
                                                                        into.lower_is_better):
                into.problems.append(f"{sources[index]} measures {got.figure}, not "
                                     f"{into.figure}")
                got = None
            elif got is None and name in problems:
                into.problems.append(f"{sources[index]}: {problems[name]}")
            elif got is None:
                into.problems.append(f"not in {sources[index]}")
            into.ratios.append(got.ratio if got is not None else None)
    return combined


def measure(paths: Sequence[Path]) -> dict[str, Combined]:
    """Every case of the runs in these pytest-benchmark JSON files, combined.

    Raises:
        BenchFileError: a file that cannot be read or holds no benchmark.
    """
    return combine([cases_of(load_json(path, "benchmark run"), str(path)) for path in paths],
                   [str(path) for path in paths])


# ------------------------------------------------------------------ comparing


def worse_by(baseline: float, now: float, lower_is_better: bool) -> float:
    """How many times worse now is than baseline: 1.3 is worse by 30 %, 0.5 better by
    100 % (twice as good), whichever way the figure is better."""
    return now / baseline if lower_is_better else baseline / now


def threshold_of(baseline: dict[str, Any], case: str, override: float | None) -> float:
    """The case's threshold: the command line's, else the case's own in the baseline,
    else the baseline's, else DEFAULT_THRESHOLD."""
    if override is not None:
        return override
    kept = baseline.get("cases", {}).get(case, {})
    return float(kept.get("threshold", baseline.get("threshold", DEFAULT_THRESHOLD)))


def compare(baseline: dict[str, Any], measured: dict[str, Combined],
            threshold: float | None = None) -> list[Verdict]:
    """Every case of the baseline against the runs, then the runs' new cases.

    Arguments:
        baseline: the baseline's JSON (its ``cases``: per case ``ratio``,
            ``lower_is_better``, ``figure``, and optionally ``threshold``).
        measured: the runs' cases (measure).
        threshold: overrides the baseline's.

    Returns:
        a verdict per case, the baseline's first, in its order.
    """
    verdicts: list[Verdict] = []
    kept_cases: dict[str, dict[str, Any]] = baseline.get("cases", {})
    for case, kept in kept_cases.items():
        limit = threshold_of(baseline, case, threshold)
        got = measured.get(case)
        lower = bool(kept.get("lower_is_better", False))
        if got is None:
            verdicts.append(Verdict(case, "missing", "in the baseline, not in the run",
                                    kept["ratio"]))
            continue
        if got.ratio is not None and (got.figure, got.lower_is_better) != (
                kept["figure"], lower):
            verdicts.append(Verdict(case, "changed", f"the run measures {got.figure} "
                                    f"({better(got.lower_is_better)}), the baseline "
                                    f"{kept['figure']} ({better(lower)}): refresh the "
                                    "baseline", kept["ratio"]))
            continue
        if got.problems or got.ratio is None:
            verdicts.append(Verdict(case, "missing", "; ".join(got.problems), kept["ratio"]))
            continue
        worse = worse_by(kept["ratio"], got.ratio, lower)
        if worse > 1 + limit:
            verdicts.append(Verdict(case, "regressed", f"worse by {percent(worse - 1)}, "
                                    f"over the threshold of {percent(limit)}", kept["ratio"],
                                    got.ratio, worse))
        else:
            detail = (f"worse by {percent(worse - 1)}" if worse >= 1.005
                      else f"better by {percent(1 / worse - 1)}" if worse <= 1 / 1.005
                      else "unchanged")
            detail += f" (threshold {percent(limit)})"
            if worse < 1 / (1 + limit):
                detail += ", better past it: a baseline to refresh?"
            verdicts.append(Verdict(case, "ok", detail, kept["ratio"], got.ratio, worse))
    for case, got in measured.items():
        if case not in kept_cases:
            verdicts.append(Verdict(case, "new", "not in the baseline, not compared (--update "
                                    "adds it)" + (f"; {'; '.join(got.problems)}"
                                                  if got.problems else ""), None, got.ratio))
    return verdicts


def percent(share: float) -> str:
    """A share as the README writes one: 0.25 is "25 %"."""
    return f"{share * 100:.0f} %"


def better(lower_is_better: bool) -> str:
    return "lower is better" if lower_is_better else "higher is better"


def report(verdicts: list[Verdict], measured: dict[str, Combined], runs: int,
           baseline_path: Path) -> list[str]:
    """The lines the comparison prints: a table, then what failed or that all passed."""
    lines = [f"videoflow / peer ratio per case, median over {runs} run(s), against "
             f"{baseline_path}",
             f"  {'case':<26}{'better':>8}{'baseline':>10}{'now':>8}  {'runs':<20}verdict"]
    for v in verdicts:
        got = measured.get(v.case)
        direction = "" if got is None else ("lower" if got.lower_is_better else "higher")
        each = " ".join("-" if r is None else f"{r:.3f}" for r in got.ratios) if got else "-"
        lines.append(f"  {v.case:<26}{direction:>8}{_num(v.baseline):>10}{_num(v.now):>8}  "
                     f"{each:<20}{v.status}: {v.detail}")
    failed = [v for v in verdicts if v.failed]
    if failed:
        lines.append(f"FAILED: {len(failed)} case(s): " + "; ".join(
            f"{v.case} {v.status} ({v.detail})" for v in failed))
    else:
        compared = sum(v.status == "ok" for v in verdicts)
        lines.append(f"passed: {compared} case(s) within their threshold")
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# ------------------------------------------------------------------ the baseline


def baseline_from(measured: dict[str, Combined], paths: Sequence[Path],
                  previous: dict[str, Any] | None = None,
                  threshold: float | None = None) -> tuple[dict[str, Any], list[str]]:
    """A baseline from the runs: every case measured in all of them, its median ratio.

    What the previous baseline says besides the ratios stays: its threshold (unless
    one is given), its ``about``, a case's own threshold.

    Returns:
        (the baseline's JSON, what was left out or dropped and why, one line each).
    """
    previous = previous or {}
    old_cases: dict[str, dict[str, Any]] = previous.get("cases", {})
    cases: dict[str, Any] = {}
    notes: list[str] = []
    for name, got in sorted(measured.items()):
        if any(r is None for r in got.ratios) or got.ratio is None:
            notes.append(f"left out {name}: not measured in every run "
                         f"({'; '.join(got.problems)})")
            continue
        entry: dict[str, Any] = {"ratio": round(got.ratio, 4),
                                 "lower_is_better": got.lower_is_better,
                                 "figure": got.figure,
                                 "runs": [round(r, 4) for r in got.measured]}
        if "threshold" in old_cases.get(name, {}):
            entry["threshold"] = old_cases[name]["threshold"]
        cases[name] = entry
    notes.extend(f"dropped {name}: in the previous baseline, not in these runs"
                 for name in old_cases if name not in cases and name not in measured)
    written = {
        "about": previous.get("about", (
            "videoflow / peer ratios per case, each the median over the runs, made by "
            f"`{REFRESH}`; see bench/regression.py")),
        "threshold": threshold if threshold is not None else previous.get(
            "threshold", DEFAULT_THRESHOLD),
        "recorded": recorded(paths),
        "cases": cases,
    }
    return written, notes


def recorded(paths: Sequence[Path]) -> dict[str, Any]:
    """Where and when the runs were made, from their machine_info and commit_info."""
    info: dict[str, Any] = {"runs": len(paths), "datetime": datetime.datetime.now(
        datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if paths:
        run = load_json(paths[0], "benchmark run")
        machine = run.get("machine_info") or {}
        cpu = machine.get("cpu") or {}
        info["machine"] = {"cpu": cpu.get("brand_raw"), "cores": cpu.get("count"),
                           "python": machine.get("python_version")}
        commit = run.get("commit_info") or {}
        info["commit"] = commit.get("id")
    return info


def check_baseline(baseline: dict[str, Any], path: Path) -> dict[str, Any]:
    """The baseline, once checked to hold what compare() reads.

    Raises:
        BenchFileError: no case, a case without a positive ratio, a direction or a
            figure, or a threshold that is not a positive number.
    """
    cases = baseline.get("cases")
    if not isinstance(cases, dict) or not cases:
        raise BenchFileError(f"the baseline {path} has no cases: write it with {REFRESH}")
    thresholds = {"the baseline's": baseline.get("threshold", DEFAULT_THRESHOLD)}
    for name, kept in cases.items():
        if not isinstance(kept, dict):
            raise BenchFileError(f"the baseline {path}: case {name} is not an object")
        ratio = kept.get("ratio")
        if not _positive(ratio) or not isinstance(kept.get("lower_is_better"), bool) or (
                not isinstance(kept.get("figure"), str)):
            raise BenchFileError(f"the baseline {path}: case {name} needs a positive "
                                 "'ratio', a boolean 'lower_is_better' and a 'figure', "
                                 f"has {kept}")
        if "threshold" in kept:
            thresholds[f"{name}'s"] = kept["threshold"]
    for whose, value in thresholds.items():
        if not _positive(value):
            raise BenchFileError(f"the baseline {path}: {whose} threshold is {value!r}, "
                                 "not a positive number")
    return baseline


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


# ------------------------------------------------------------------ command line


def main(argv: Sequence[str] | None = None) -> int:
    """Compare runs with the baseline, or write it (--update).

    Returns:
        the exit status: 0 passed (or written), 1 a case regressed, missing or changed,
        2 a file that cannot be read or holds nothing to compare.
    """
    parser = argparse.ArgumentParser(
        prog="bench/regression.py",
        description="Compare the videoflow / peer ratios of pytest-benchmark runs "
                    "(--benchmark-json) with the baseline, or write it.")
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json",
                        help="pytest-benchmark JSON files; a case's ratio is its median "
                             "over them")
    parser.add_argument("--baseline", type=Path, default=BASELINE,
                        help=f"the baseline file (default: {BASELINE})")
    parser.add_argument("--threshold", type=float, default=None,
                        help="worse than the baseline by more than this share fails "
                             "(default: the baseline's)")
    parser.add_argument("--update", action="store_true",
                        help="write the baseline from the runs instead of comparing")
    args = parser.parse_args(argv)
    if args.threshold is not None and not args.threshold > 0:
        parser.error(f"--threshold must be above 0, not {args.threshold}")
    try:
        measured = measure(args.runs)
        if args.update:
            previous = (load_json(args.baseline, "baseline") if args.baseline.exists()
                        else None)
            written, notes = baseline_from(measured, args.runs, previous, args.threshold)
            if not written["cases"]:
                raise BenchFileError("no case measured in every run: nothing to write")
            args.baseline.write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")
            for note in notes:
                print(note)
            print(f"wrote {args.baseline}: {len(written['cases'])} case(s), threshold "
                  f"{percent(written['threshold'])}")
            for name, entry in written["cases"].items():
                worst = max(worse_by(entry["ratio"], r, entry["lower_is_better"])
                            for r in entry["runs"])
                print(f"  {name:<26}{entry['ratio']:>8.3f}  {better(entry['lower_is_better'])}"
                      f", runs {entry['runs']}; the worst run worse by {percent(worst - 1)}")
            return 0
        baseline = check_baseline(load_json(args.baseline, "baseline"), args.baseline)
    except BenchFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    verdicts = compare(baseline, measured, args.threshold)
    for line in report(verdicts, measured, len(args.runs), args.baseline):
        print(line)
    return 1 if any(v.failed for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
