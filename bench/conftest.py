"""Shared helpers for the benchmarks: the two grouping cores as a fixture parameter,
an entries/s recorder whose figures are summarised at the end of the run, with the
compiled/reference ratio per group, and, for the whole-flow benchmarks, an embedded
nats-server per module (server) and fresh directories for each round's stage files.
"""

from __future__ import annotations

import importlib
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from videoflow.broker import server as embedded

CORE_MODULES = {
    "compiled": "videoflow.messaging._grouping_core",
    "reference": "videoflow.messaging._grouping_ref",
}

# (group, core kind, size or None, entries per round, fastest round s, median round s)
_RESULTS: list[tuple[str, str, int | None, int, float, float]] = []


@pytest.fixture(params=list(CORE_MODULES))
def grouping_core(request: pytest.FixtureRequest) -> ModuleType:
    """Each grouping core in turn, so one run holds both sides of every ratio.

    Benchmarks parametrise it indirectly as their outermost parameter (the decorator
    on top) so the two cores of one case run back to back, under the same load.

    The compiled one is required: its absence fails the run (as it fails the package
    import), except under VIDEOFLOW_PURE_PYTHON=1, where it is skipped.
    """
    try:
        module = importlib.import_module(CORE_MODULES[request.param])
    except ImportError:
        if request.param == "compiled" and os.environ.get("VIDEOFLOW_PURE_PYTHON") == "1":
            pytest.skip("compiled grouping core not built (VIDEOFLOW_PURE_PYTHON=1)")
        raise
    assert module.CORE_KIND == request.param
    return module


@pytest.fixture
def record_throughput(benchmark: Any) -> Callable[..., None]:
    """Returns record(entries, core_kind, size=None), to call after the benchmark ran.

    Stores entries per round and, when timing is on, entries/s and ns per entry in the
    benchmark's extra_info (from the median round) and in the end-of-run summary.
    """

    def record(entries: int, core_kind: str, size: int | None = None) -> None:
        benchmark.extra_info["entries"] = entries
        if benchmark.stats is None:  # --benchmark-disable: nothing was timed
            return
        stats = benchmark.stats.stats
        benchmark.extra_info["entries_per_s"] = entries / stats.median
        benchmark.extra_info["ns_per_entry"] = stats.median / entries * 1e9
        _RESULTS.append((benchmark.group, core_kind, size, entries, stats.min, stats.median))

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Entries/s per case and core, compiled/reference ratios, and for the pending-scale
    groups the cost per entry at the largest pending count over the smallest. Ratios
    use the fastest round: on a shared machine it is the least disturbed one."""
    if not _RESULTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("grouping throughput")
    write(
        f"{'group':<21}{'size':>8}{'core':>11}{'entries':>9}{'entries/s best':>16}"
        f"{'median':>12}{'ns/entry':>10}{'cmp/ref':>9}"
    )
    best = {(g, c, s): t / n for g, c, s, n, t, _ in _RESULTS}
    for group, kind, size, entries, fastest, median in sorted(
        _RESULTS, key=lambda r: (r[0], r[2] or 0, r[1])
    ):
        ratio = ""
        ref = best.get((group, "reference", size))
        if kind == "compiled" and ref is not None:
            ratio = f"{ref / (fastest / entries):.1f}x"
        write(
            f"{group:<21}{size if size is not None else '':>8}{kind:>11}{entries:>9}"
            f"{entries / fastest:>16,.0f}{entries / median:>12,.0f}"
            f"{fastest / entries * 1e9:>10.0f}{ratio:>9}"
        )
    for group in sorted({g for g, _, s, *_ in _RESULTS if s is not None}):
        for kind in CORE_MODULES:
            sizes = sorted(s for g, c, s, *_ in _RESULTS
                           if g == group and c == kind and s is not None)
            if len(sizes) < 2:
                continue
            lo, hi = best[(group, kind, sizes[0])], best[(group, kind, sizes[-1])]
            write(
                f"{group} {kind}: ns/entry at {sizes[-1]:,} pending / at {sizes[0]:,} "
                f"= {hi / lo:.2f}"
            )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[embedded.EmbeddedServer]:
    """An embedded nats-server for one benchmark module, on a store of its own."""
    with embedded.start(Path(tmp_path_factory.mktemp("bench-flows")) / "store") as running:
        yield running


@pytest.fixture
def rounds_dir(tmp_path: Path) -> Callable[[], Path]:
    """Returns new(): a fresh directory for one round's stage files."""
    counter = itertools.count()

    def new() -> Path:
        made = tmp_path / f"round{next(counter)}"
        made.mkdir()
        return made

    return new
