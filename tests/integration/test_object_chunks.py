"""Pipelined objects (videoflow.backends.jetstream.objects) on a real nats-server: the
layout stays nats-py's, so each side reads what the other wrote, digest checked; sizes
at and around chunk boundaries come back whole; a wrong digest, a missing object and a
deleted one are told apart; a get reads by direct gets, and from the leader through a
consumer where the stream takes none."""

from __future__ import annotations

import json

import nats
import pytest
from nats.js.api import ObjectStoreConfig, StreamConfig

from videoflow.backends.jetstream.objects import (
    chunk_bytes,
    get_object,
    meta_subject,
    object_info,
    put_object,
)

pytestmark = pytest.mark.timeout(60)

CHUNK = 64 * 1024  # small, so a few hundred KB make several chunks


def data_of(size: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(size))


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 17])
async def test_what_put_object_writes_nats_py_reads_and_get_object_reads_it_back(
        nats_client: nats.NATS, size: int) -> None:
    js = nats_client.jetstream()
    store = await js.create_object_store("objs", config=ObjectStoreConfig())
    data = data_of(size)
    info = await put_object(js, "objs", "ref-1", memoryview(data), CHUNK, 5.0)
    assert (info.size, info.chunks) == (size, -(-size // CHUNK))
    assert (await store.get("ref-1")).data == data  # nats-py checks the digest too
    assert await get_object(js, "objs", "ref-1", 5.0) == data


@pytest.mark.asyncio
async def test_get_object_reads_what_nats_py_wrote(nats_client: nats.NATS) -> None:
    js = nats_client.jetstream()
    store = await js.create_object_store("objs", config=ObjectStoreConfig())
    data = data_of(300_000)  # three of nats-py's 128 KiB chunks
    await store.put("from-nats-py", data)
    got = await get_object(js, "objs", "from-nats-py", 5.0)
    assert isinstance(got, bytearray) and got == data


@pytest.mark.asyncio
async def test_a_missing_or_deleted_object_is_none_and_a_wrong_digest_an_error(
        nats_client: nats.NATS) -> None:
    js = nats_client.jetstream()
    store = await js.create_object_store("objs", config=ObjectStoreConfig())
    assert await get_object(js, "objs", "never", 5.0) is None
    await put_object(js, "objs", "gone", data_of(1000), CHUNK, 5.0)
    await store.delete("gone")
    assert await object_info(js, "objs", "gone") is None
    assert await get_object(js, "objs", "gone", 5.0) is None
    info = await put_object(js, "objs", "tampered", data_of(1000), CHUNK, 5.0)
    meta = info.as_dict()
    meta["digest"] = "SHA-256=" + "A" * 43 + "="
    await js.publish(meta_subject("objs", "tampered"), json.dumps(meta).encode(),
                     headers={"Nats-Rollup": "sub"})
    with pytest.raises(ValueError, match="digest"):
        await get_object(js, "objs", "tampered", 5.0)


@pytest.mark.asyncio
async def test_a_put_that_fails_leaves_no_chunks(nats_client: nats.NATS) -> None:
    js = nats_client.jetstream()
    # A bucket that holds 200 KB: the chunks of a 1 MB object cannot all be stored.
    await js.create_object_store("small", config=ObjectStoreConfig(max_bytes=200_000))
    with pytest.raises(nats.js.errors.APIError):
        await put_object(js, "small", "too-big", data_of(1_000_000), CHUNK, 5.0)
    state = (await js.stream_info("OBJ_small")).state
    assert state.messages == 0 and await object_info(js, "small", "too-big") is None


def object_stream(bucket: str, **config: object) -> StreamConfig:
    """A bucket's stream as nats-py makes it, with config changed."""
    return StreamConfig(name=f"OBJ_{bucket}", subjects=[f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
                        allow_rollup_hdrs=True, **config)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_get_reads_by_direct_gets_and_makes_no_consumer(nats_client: nats.NATS) -> None:
    # The stream takes one consumer, and one is there: a get through a consumer of its
    # own could not be made, a get by direct gets needs none.
    js = nats_client.jetstream()
    await js.add_stream(object_stream("direct", allow_direct=True, max_consumers=1))
    await js.add_consumer("OBJ_direct", durable_name="taken")
    data = data_of(5 * CHUNK + 17)
    await put_object(js, "direct", "ref-1", data, CHUNK, 5.0)
    assert await get_object(js, "direct", "ref-1", 5.0) == data


@pytest.mark.asyncio
async def test_a_stream_that_takes_no_direct_gets_is_read_through_a_consumer(
        nats_client: nats.NATS) -> None:
    js = nats_client.jetstream()
    await js.add_stream(object_stream("leader", allow_direct=False))
    data = data_of(3 * CHUNK + 5)
    await put_object(js, "leader", "ref-1", data, CHUNK, 5.0)
    assert await get_object(js, "leader", "ref-1", 5.0) == data
    assert await get_object(js, "leader", "never", 5.0) is None


def test_the_chunk_size_stays_under_the_servers_max_payload() -> None:
    assert chunk_bytes(1024 * 1024) == 960 * 1024
    assert chunk_bytes(8 * 1024 * 1024) == 960 * 1024
    assert chunk_bytes(64 * 1024) == 60 * 1024
