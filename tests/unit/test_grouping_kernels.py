"""The sorted event-time kernels of both cores against brute-force oracles."""

from __future__ import annotations

import importlib
from bisect import insort

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from videoflow.messaging import _grouping_ref

# The compiled twin of the reference's kernels lives in its own module.
CORES = {
    "compiled": importlib.import_module("videoflow.messaging._timeline"),
    "reference": _grouping_ref,
}

times = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@pytest.fixture(params=sorted(CORES))
def core(request: pytest.FixtureRequest):
    return CORES[request.param]


@pytest.mark.parametrize("writeable", [True, False])
@settings(max_examples=200, deadline=None)
@given(values=st.lists(times, max_size=60), a=times, width=st.floats(0, 50))
def test_search_window_matches_a_scan_on_writable_and_read_only_arrays(writeable, values, a, width):
    arr = np.array(sorted(values), dtype=np.float64)
    arr.setflags(write=writeable)
    b = a + width
    expected = [k for k, t in enumerate(arr) if a <= t <= b]
    for core in CORES.values():
        i, j = core.search_window(arr, a, b)
        assert list(range(i, j)) == expected


def test_search_window_accepts_an_array_over_received_bytes(core):
    payload = np.array([1.0, 2.0, 3.0, 4.0]).tobytes()
    arr = np.frombuffer(payload, dtype=np.float64)
    assert not arr.flags.writeable
    assert core.search_window(arr, 1.5, 3.0) == (1, 3)
    assert core.search_window(np.empty(0), 0.0, 1.0) == (0, 0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 40).map(lambda k: k * 0.5)),
        st.tuples(st.just("remove"), st.integers(0, 10_000)),
    ),
    max_size=400,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops)
def test_sorted_times_keep_order_through_inserts_and_removals(ops):
    for core in CORES.values():
        s = core.SortedTimes()
        oracle: list[tuple[float, int]] = []  # (time, insertion number): stable for ties
        slot = 0
        for op, value in ops:
            if op == "insert":
                s.py_insert(value, slot)
                insort(oracle, (value, slot))
                slot += 1
            elif oracle:
                t, victim = oracle.pop(value % len(oracle))
                s.py_remove(t, victim)
            live_t, live_s = s.live()
            assert list(live_t) == [t for t, _ in oracle]
            assert list(live_s) == [k for _, k in oracle]


def test_sorted_times_bounds_cover_a_closed_window(core):
    s = core.SortedTimes()
    for k, t in enumerate([1.0, 2.0, 2.0, 3.0]):
        s.py_insert(t, k)
    i, j = s.py_bounds(2.0, 2.0)
    assert j - i == 2
    s.py_remove(2.0, 1)
    i, j = s.py_bounds(2.0, 2.0)
    live_t, live_s = s.live()
    assert list(live_s) == [0, 2, 3] and list(live_t) == [1.0, 2.0, 3.0]
