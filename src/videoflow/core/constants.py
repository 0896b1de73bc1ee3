"""Flow types.

REALTIME favours freshness: bounded backlogs, short join timeouts, drops counted.
BATCH favours completeness: keep until acknowledged, long join timeouts.
"""

from typing import Final

REALTIME: Final = "realtime"
BATCH: Final = "batch"

FLOW_TYPES: Final = (REALTIME, BATCH)


def check_flow_type(flow_type: str) -> None:
    """Raises ValueError unless flow_type is REALTIME or BATCH."""
    if flow_type not in FLOW_TYPES:
        raise ValueError(f"flow_type must be one of {FLOW_TYPES}, got {flow_type!r}")
