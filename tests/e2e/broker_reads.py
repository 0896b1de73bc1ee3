"""What the end-to-end tests read back from the broker."""

from __future__ import annotations

import nats


async def stream_names(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return [info.config.name for info in await nc.jetstream().streams_info()]
    finally:
        await nc.close()
