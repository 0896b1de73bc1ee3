"""The end-of-module summary the whole-system benchmark modules print: their table,
through pytest's terminal reporter (output capture would swallow a plain print)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

Writer = Callable[[Callable[[str], None]], None]


def summary_at_end(request: pytest.FixtureRequest, measured: Callable[[], bool],
                   write_summary: Writer, timed_only: bool = True) -> Iterator[None]:
    """The body of a module-scoped fixture: once the module has run, write_summary
    gets the reporter's write_line, when measured() says there is something to show.

    Arguments:
        timed_only: nothing with timing off (--benchmark-disable), whose smoke sizes
            make no figures worth reading.
    """
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin("capturemanager")
    if not measured() or reporter is None or (
            timed_only and request.config.getoption("benchmark_disable")):
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        write_summary(reporter.write_line)
