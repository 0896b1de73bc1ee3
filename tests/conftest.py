"""Session-wide checks: which grouping core and envelope decoder this run loaded."""

import os

from hypothesis import settings

from videoflow.messaging import grouping
from videoflow.wire import serialization

# CI replays the same examples on every run, so a red build is reproducible from its
# log; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

EXPECTED_CORE = "reference" if os.environ.get("VIDEOFLOW_PURE_PYTHON") == "1" else "compiled"

# The environment switch must select exactly one core; a silent fallback from
# compiled to reference would hide a broken build behind slow, passing tests.
assert grouping.CORE_KIND == EXPECTED_CORE, (
    f"loaded the {grouping.CORE_KIND} grouping core, expected {EXPECTED_CORE}"
)
assert serialization.DECODER_KIND == EXPECTED_CORE, (
    f"loaded the {serialization.DECODER_KIND} envelope decoder, expected {EXPECTED_CORE}"
)


def pytest_report_header() -> str:
    return (
        f"videoflow grouping core: {grouping.CORE_KIND}; "
        f"envelope decoder: {serialization.DECODER_KIND}"
    )
