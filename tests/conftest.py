"""Session-wide checks: which grouping core this run loaded."""

import os

from videoflow.messaging import grouping

EXPECTED_CORE = "reference" if os.environ.get("VIDEOFLOW_PURE_PYTHON") == "1" else "compiled"

# The environment switch must select exactly one core; a silent fallback from
# compiled to reference would hide a broken build behind slow, passing tests.
assert grouping.CORE_KIND == EXPECTED_CORE, (
    f"loaded the {grouping.CORE_KIND} grouping core, expected {EXPECTED_CORE}"
)


def pytest_report_header() -> str:
    return f"videoflow grouping core: {grouping.CORE_KIND}"
