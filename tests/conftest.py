"""Session-wide checks: which grouping core and envelope decoder this run loaded."""

import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from videoflow.messaging import grouping
from videoflow.wire import serialization

# Hypothesis times its examples by the wall clock: its deadline and its too_slow
# check failed tests whose examples are fast, when the suite shares two cores with
# other work (one draw took 1.4 s). What the tests check is what the examples do.
settings.register_profile("default", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# CI replays the same examples on every run, so a red build is reproducible from its
# log; local runs keep exploring new ones.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True,
                          print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")



def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (the README's test command): two workers for every core. The tests
    wait on brokers, process starts and timeouts for much of their time. On this 2-core
    host, with replicas forked from a replica server, the same tree ran in 424 s at
    three workers and 367 s at four, the cores 75 % and 89 % busy."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist reads it itself
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) * 2)


EXPECTED_CORE = "reference" if os.environ.get("VIDEOFLOW_PURE_PYTHON") == "1" else "compiled"

# The environment switch must select exactly one core; a silent fallback from
# compiled to reference would hide a broken build behind slow, passing tests.
assert grouping.CORE_KIND == EXPECTED_CORE, (
    f"loaded the {grouping.CORE_KIND} grouping core, expected {EXPECTED_CORE}"
)
assert serialization.DECODER_KIND == EXPECTED_CORE, (
    f"loaded the {serialization.DECODER_KIND} envelope decoder, expected {EXPECTED_CORE}"
)


@pytest.fixture(autouse=True)
def _broker_store_in_tmp(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test, and every command it starts, keeps the embedded broker's default
    store under pytest's tmp dir, never in the user's data directory: a run or an
    operator command without a broker URL otherwise writes to ~/.local/share. The
    directory is only named here (made when a server starts on it), one per test, so
    tests never share or lock each other's store."""
    store = tmp_path_factory.getbasetemp() / "broker-stores" / uuid.uuid4().hex
    monkeypatch.setenv("VIDEOFLOW_STORE_DIR", str(store))
    yield


def pytest_report_header() -> str:
    return (
        f"videoflow grouping core: {grouping.CORE_KIND}; "
        f"envelope decoder: {serialization.DECODER_KIND}"
    )
