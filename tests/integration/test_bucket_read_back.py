"""check_bucket_replicas' read-back on a real nats-server. On a cluster that lost a
server, a bucket just bound can be answered 'stream not found' by a server that has not
caught up (seen in CI: a replica restarted while the leader of its stream was killed),
so the read-back asks again for READ_BACK_SECONDS before it believes the 404."""

from __future__ import annotations

import asyncio
import time

import nats.js.errors
import pytest

from videoflow.broker import link
from videoflow.errors import IncompatibleProfile

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]


async def test_a_bucket_that_appears_while_the_read_back_waits_is_read_back(jetstream):
    async def appear_later() -> None:
        await asyncio.sleep(1.0)
        await jetstream.create_key_value(bucket="late", history=1)

    maker = asyncio.create_task(appear_later())
    # One server keeps one copy, so reading it back for three says so: proof the
    # read-back reached the bucket made a second after it started asking.
    with pytest.raises(IncompatibleProfile, match="keeps 1 copy, the run asks for 3"):
        await link.check_bucket_replicas(jetstream, "KV_late", "late", 3)
    await maker


async def test_a_bucket_that_never_appears_is_not_found_after_the_read_back_window(
        jetstream, monkeypatch):
    monkeypatch.setattr(link, "READ_BACK_SECONDS", 0.6)
    started = time.monotonic()
    with pytest.raises(nats.js.errors.NotFoundError) as raised:
        await link.check_bucket_replicas(jetstream, "KV_never", "never", 3)
    assert raised.value.err_code == 10059
    assert 0.6 <= time.monotonic() - started < 5.0
