"""Flow types.

REALTIME favours freshness: bounded backlogs, short join timeouts, drops counted.
BATCH favours completeness: keep until acknowledged, long join timeouts.
"""

from typing import Final

REALTIME: Final = "realtime"
BATCH: Final = "batch"

FLOW_TYPES: Final = (REALTIME, BATCH)
