"""The broker half of topology against a real nats-server: read-back, teardown by exact
ownership, idempotent create with read-back (never a mock broker)."""

from __future__ import annotations

import asyncio
import inspect
import time

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StreamConfig

from videoflow.backends.jetstream import streams as p
from videoflow.backends.messaging import CleanupObservation, Unknown
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.credit import REALTIME_BURST
from videoflow.messaging import topology as t

pytestmark = pytest.mark.timeout(60)

FLOW = "f"
RUN = "r"


async def _add(js: JetStreamContext, config: StreamConfig) -> None:
    await js.add_stream(config)


async def _names(js: JetStreamContext) -> set[str]:
    return {info.config.name or "" for info in await js.streams_info()}


# --------------------------------------------------------------------------------------
# read_back_streams_async / read_back_streams
# --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_read_back_reports_an_exact_stream_without_mismatches(jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    got = await t.read_back_streams_async(jetstream, FLOW, RUN, ["a"], BATCH)
    entry = got["a"]
    assert isinstance(entry, t.VerifiedStream)
    assert entry.effective is not None
    assert entry.mismatches == ()
    assert entry.requested.name == t.stream_name_for(FLOW, RUN, "a")
    assert entry.effective.retention == RetentionPolicy.INTEREST


@pytest.mark.asyncio
async def test_read_back_reports_fields_the_broker_holds_differently(jetstream):
    # As a flow's provisioning makes it (REALTIME_BURST per subject), but for max_msgs.
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", REALTIME,
                                              realtime_buffer=REALTIME_BURST
                                              ).evolve(max_msgs=5))
    got = await t.read_back_streams_async(jetstream, FLOW, RUN, ["a"], REALTIME)
    entry = got["a"]
    assert isinstance(entry, t.VerifiedStream)
    assert entry.mismatches == (f"max_msgs: requested {2 * REALTIME_BURST}, effective 5",)


@pytest.mark.asyncio
async def test_read_back_against_the_wrong_flow_type_reports_retention_and_discard(jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", REALTIME))
    entry = (await t.read_back_streams_async(jetstream, FLOW, RUN, ["a"], BATCH))["a"]
    assert isinstance(entry, t.VerifiedStream)
    fields = {m.split(":")[0] for m in entry.mismatches}
    assert {"retention", "discard", "max_msgs"} <= fields


@pytest.mark.asyncio
async def test_read_back_reports_a_missing_stream_as_missing(jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    got = await t.read_back_streams_async(jetstream, FLOW, RUN, ["a", "b"], BATCH)
    assert isinstance(got["a"], t.VerifiedStream)
    missing = got["b"]
    assert isinstance(missing, Unknown)
    assert missing.reason == "missing"
    assert t.stream_name_for(FLOW, RUN, "b") in missing.detail
    assert list(got) == ["a", "b"]


@pytest.mark.asyncio
async def test_read_back_keeps_an_unobservable_stream_apart_from_a_missing_one(nats_server):
    nc = await nats.connect(nats_server.url, allow_reconnect=False,
                            max_reconnect_attempts=1, reconnect_time_wait=0.1)
    js = nc.jetstream()
    await nc.close()
    got = await t.read_back_streams_async(js, FLOW, RUN, ["a", "b"], BATCH)
    for entry in got.values():
        assert isinstance(entry, Unknown)
        assert entry.reason == "unreachable"


def test_read_back_streams_over_its_own_connection(nats_server):
    async def setup() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            await nc.jetstream().add_stream(
                t.stream_config_for(FLOW, RUN, "a", BATCH, generation="g1")
            )
        finally:
            await nc.close()

    asyncio.run(setup())
    got = t.read_back_streams(nats_server.url, FLOW, RUN, ["a", "b"], BATCH,
                              timeout=10.0, generation="g1")
    assert isinstance(got["a"], t.VerifiedStream)
    assert got["a"].mismatches == ()
    assert isinstance(got["b"], Unknown) and got["b"].reason == "missing"
    # A different generation is a metadata mismatch, not a missing stream.
    other = t.read_back_streams(nats_server.url, FLOW, RUN, ["a"], BATCH, timeout=10.0,
                                generation="g2")
    entry = other["a"]
    assert isinstance(entry, t.VerifiedStream)
    assert len(entry.mismatches) == 1 and entry.mismatches[0].startswith("metadata:")


def test_read_back_streams_fails_fast_against_a_refused_port(closed_port_url):
    started = time.monotonic()
    got = t.read_back_streams(closed_port_url, FLOW, RUN, ["a", "b"], BATCH, timeout=20.0)
    elapsed = time.monotonic() - started
    assert elapsed < 5.0
    first, second = got["a"], got["b"]
    assert isinstance(first, Unknown)
    assert first.reason == "unreachable"
    assert first == second


def test_read_back_streams_without_fail_fast_is_bounded_by_timeout(closed_port_url):
    started = time.monotonic()
    got = t.read_back_streams(closed_port_url, FLOW, RUN, ["a"], BATCH, timeout=1.0,
                              fail_fast=False)
    assert time.monotonic() - started < 5.0
    entry = got["a"]
    assert isinstance(entry, Unknown)
    assert entry.reason in ("unreachable", "timeout")


def test_read_back_streams_rejects_a_bad_request_before_connecting(closed_port_url):
    with pytest.raises(ValueError, match="flow_type"):
        t.read_back_streams(closed_port_url, FLOW, RUN, ["a"], "weekly", timeout=1.0)
    with pytest.raises(ValueError, match="timeout"):
        t.read_back_streams(closed_port_url, FLOW, RUN, ["a"], BATCH, timeout=0)


def test_read_back_streams_default_timeout_is_the_documented_constant():
    default = inspect.signature(t.read_back_streams).parameters["timeout"].default
    assert default == t.DEFAULT_READ_BACK_TIMEOUT_SECONDS


# --------------------------------------------------------------------------------------
# delete_run_streams / owned_stream
# --------------------------------------------------------------------------------------


def _unlabelled(flow: str, run: str, node: str) -> StreamConfig:
    return t.stream_config_for(flow, run, node, BATCH).evolve(metadata=None)


@pytest.mark.asyncio
async def test_delete_never_mistakes_run_r_x_for_run_r(nats_client, jetstream):
    # Both names start with vf-f-r-: a prefix match would delete run r-x's too.
    await _add(jetstream, t.stream_config_for(FLOW, "r", "n", BATCH))
    await _add(jetstream, t.stream_config_for(FLOW, "r-x", "n", BATCH))
    await _add(jetstream, t.stream_config_for(FLOW, "r", "m", REALTIME))
    result = await t.delete_run_streams(nats_client, FLOW, "r")
    assert isinstance(result, CleanupObservation)
    assert set(result.removed) == {"vf-f-r-n", "vf-f-r-m"}
    assert result.remaining == () and result.complete
    assert await _names(jetstream) == {"vf-f-r-x-n"}


@pytest.mark.asyncio
async def test_delete_attributes_unlabelled_streams_by_subject_token(nats_client, jetstream):
    # vf-f-r-x-n is the name of node x-n of run r AND of node n of run r-x; only the
    # subject says which. This one is node n of run r-x.
    await _add(jetstream, _unlabelled(FLOW, "r-x", "n"))
    await _add(jetstream, _unlabelled(FLOW, "r", "m"))
    result = await t.delete_run_streams(nats_client, FLOW, "r")
    assert result.removed == ("vf-f-r-m",)
    assert await _names(jetstream) == {"vf-f-r-x-n"}
    result = await t.delete_run_streams(nats_client, FLOW, "r-x")
    assert result.removed == ("vf-f-r-x-n",)
    assert await _names(jetstream) == set()


@pytest.mark.asyncio
async def test_delete_never_deletes_the_flow_dlq(nats_client, jetstream):
    await _add(jetstream, t.dlq_stream_config(FLOW))
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    result = await t.delete_run_streams(nats_client, FLOW, RUN)
    assert result.removed == ("vf-f-r-a",)
    assert result.complete
    assert await _names(jetstream) == {t.dlq_stream_name(FLOW)}  # STREAM-8


@pytest.mark.asyncio
async def test_delete_leaves_unattributed_and_foreign_streams(nats_client, jetstream):
    await _add(jetstream, StreamConfig(name="custom", subjects=["vf.f.r.a.extra"]))
    await _add(jetstream, StreamConfig(name="vf-f-r-z", subjects=["elsewhere.>"]))
    await _add(jetstream, t.stream_config_for("g", RUN, "a", BATCH))
    result = await t.delete_run_streams(nats_client, FLOW, RUN)
    assert result == CleanupObservation(removed=(), remaining=(), complete=True)
    assert await _names(jetstream) == {"custom", "vf-f-r-z", "vf-g-r-a"}


@pytest.mark.asyncio
async def test_delete_narrows_to_node_names(nats_client, jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "b", BATCH))
    await _add(jetstream, _unlabelled(FLOW, RUN, "c"))
    result = await t.delete_run_streams(nats_client, FLOW, RUN, node_names=["a", "c"])
    assert set(result.removed) == {"vf-f-r-a", "vf-f-r-c"}
    assert await _names(jetstream) == {"vf-f-r-b"}


@pytest.mark.asyncio
async def test_delete_by_generation_removes_only_that_provisioning(nats_client, jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH, generation="g1"))
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "b", BATCH, generation="g2"))
    await _add(jetstream, _unlabelled(FLOW, RUN, "c"))
    result = await t.delete_run_streams(nats_client, FLOW, RUN, generation="g1")
    assert result.removed == ("vf-f-r-a",)
    assert await _names(jetstream) == {"vf-f-r-b", "vf-f-r-c"}


@pytest.mark.asyncio
async def test_delete_counts_a_stream_already_gone_as_removed(nats_client, jetstream,
                                                              monkeypatch):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    listed = await p._list_streams(nats_client.jsm())
    # The stream disappears between the listing and the delete (a concurrent teardown).
    await jetstream.delete_stream("vf-f-r-a")

    async def stale_listing(_jsm):
        return listed

    monkeypatch.setattr(p, "_list_streams", stale_listing)
    result = await t.delete_run_streams(nats_client, FLOW, RUN)
    assert result == CleanupObservation(removed=("vf-f-r-a",), remaining=(), complete=True)


@pytest.mark.asyncio
async def test_delete_after_a_listing_failure_deletes_nothing(nats_server, jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    nc = await nats.connect(nats_server.url, allow_reconnect=False,
                            max_reconnect_attempts=1, reconnect_time_wait=0.1)
    await nc.close()
    result = await t.delete_run_streams(nc, FLOW, RUN)
    assert result == CleanupObservation(removed=(), remaining=(), complete=False)
    assert await _names(jetstream) == {"vf-f-r-a"}


@pytest.mark.asyncio
async def test_delete_reports_a_failed_delete_as_remaining(nats_client, jetstream,
                                                           monkeypatch):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "b", BATCH))
    jsm = nats_client.jsm()
    real_delete = type(jsm).delete_stream

    async def flaky(self, name):
        if name == "vf-f-r-b":
            raise asyncio.TimeoutError()
        return await real_delete(self, name)

    monkeypatch.setattr(type(jsm), "delete_stream", flaky)
    result = await t.delete_run_streams(nats_client, FLOW, RUN)
    assert result.removed == ("vf-f-r-a",)
    assert result.remaining == ("vf-f-r-b",)
    assert result.complete is False


@pytest.mark.asyncio
async def test_delete_is_safe_to_rerun(nats_client, jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    first = await t.delete_run_streams(nats_client, FLOW, RUN)
    again = await t.delete_run_streams(nats_client, FLOW, RUN)
    assert first.removed == ("vf-f-r-a",)
    assert again == CleanupObservation(removed=(), remaining=(), complete=True)


@pytest.mark.asyncio
async def test_delete_rejects_a_reserved_run_id_before_listing(nats_client):
    with pytest.raises(ValueError, match="reserved"):
        await t.delete_run_streams(nats_client, FLOW, "_eos")


@pytest.mark.asyncio
async def test_delete_pages_through_more_streams_than_one_listing_holds(nats_client,
                                                                         jetstream):
    # STREAM.LIST answers at most 256 streams per page.
    for i in range(260):
        await _add(jetstream, StreamConfig(name=f"other-{i}", subjects=[f"other.{i}"]))
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    result = await t.delete_run_streams(nats_client, FLOW, RUN)
    assert result.removed == ("vf-f-r-a",)


def test_owned_stream_rules_without_a_broker():
    labelled = t.stream_config_for(FLOW, "r", "x-n", BATCH)
    assert p.owned_stream(labelled, FLOW, "r")
    assert not p.owned_stream(labelled, FLOW, "r-x")
    assert not p.owned_stream(labelled, FLOW, "r", node_names=["n"])
    assert not p.owned_stream(t.dlq_stream_config(FLOW), FLOW, "r")
    # Labels compare verbatim: a run id that sanitizes alike is another run.
    dotted = t.stream_config_for(FLOW, "r.1", "a", BATCH)
    assert not p.owned_stream(dotted, FLOW, "r_1")
    assert p.owned_stream(dotted, FLOW, "r.1")
    unlabelled = _unlabelled(FLOW, "r-x", "n")
    assert p.owned_stream(unlabelled, FLOW, "r-x")
    assert not p.owned_stream(unlabelled, FLOW, "r")
    assert not p.owned_stream(unlabelled, FLOW, "r-x", generation="g")


# --------------------------------------------------------------------------------------
# ensure_stream / ensure_consumer
# --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_ensure_stream_is_idempotent_and_read_back(jetstream):
    config = t.stream_config_for(FLOW, RUN, "a", BATCH, generation="g1")
    before = config.as_dict()
    first = await p.ensure_stream(jetstream, config)
    again = await p.ensure_stream(jetstream, config)
    assert first.mismatches == () and again.mismatches == ()
    assert first.effective is not None
    assert config.as_dict() == before  # never mutated


@pytest.mark.asyncio
async def test_ensure_stream_updates_a_changed_stream_without_wiping_it(jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH).evolve(max_msgs=5))
    verified = await p.ensure_stream(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    assert verified.mismatches == ()
    assert verified.effective is not None
    assert verified.effective.max_msgs == t.DEFAULT_BATCH_MAX_MSGS
    # S6: a full replace would have reset the subjects to the stream name.
    assert verified.effective.subjects == [t.subject_for(FLOW, RUN, "a"),
                                           t.eos_subject_for(FLOW, RUN, "a")]


@pytest.mark.asyncio
async def test_ensure_stream_update_keeps_settings_the_request_does_not_name(jetstream):
    # deny_purge cannot be cancelled by an update; laying the dataclass default (False)
    # over it would make the broker refuse the whole update.
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH).evolve(
        max_msgs=5, deny_purge=True))
    verified = await p.ensure_stream(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    assert verified.mismatches == ()
    assert verified.effective is not None and verified.effective.deny_purge is True


@pytest.mark.asyncio
async def test_ensure_stream_reports_a_refused_update_as_mismatches(jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH).evolve(
        retention=RetentionPolicy.WORK_QUEUE))
    verified = await p.ensure_stream(jetstream, t.stream_config_for(FLOW, RUN, "a", BATCH))
    assert any(m.startswith("retention:") for m in verified.mismatches)


@pytest.mark.asyncio
async def test_ensure_consumer_updates_an_existing_durable_and_reads_it_back(jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "p", BATCH))
    stream = t.stream_name_for(FLOW, RUN, "p")
    config = t.consumer_config_for(FLOW, RUN, "c", "p", max_ack_pending=8)
    before = config.as_dict()
    first = await p.ensure_consumer(jetstream, stream, config)
    assert first.mismatches == () and first.effective is not None
    assert config.as_dict() == before  # S18: never mutated
    # S5: pull_subscribe would bind to the old durable and keep max_ack_pending 8.
    changed = t.consumer_config_for(FLOW, RUN, "c", "p", max_ack_pending=20)
    second = await p.ensure_consumer(jetstream, stream, changed)
    assert second.mismatches == ()
    assert second.effective is not None and second.effective.max_ack_pending == 20


@pytest.mark.asyncio
async def test_ensure_consumer_on_a_missing_stream_raises_not_found(jetstream):
    import nats.js.errors

    config = t.consumer_config_for(FLOW, RUN, "c", "p")
    with pytest.raises(nats.js.errors.NotFoundError):
        await p.ensure_consumer(jetstream, t.stream_name_for(FLOW, RUN, "p"), config)


@pytest.mark.asyncio
async def test_ensure_consumer_reports_a_refused_update_as_mismatches(jetstream):
    from nats.js.api import DeliverPolicy

    await _add(jetstream, t.stream_config_for(FLOW, RUN, "p", BATCH))
    stream = t.stream_name_for(FLOW, RUN, "p")
    await p.ensure_consumer(jetstream, stream, t.consumer_config_for(FLOW, RUN, "c", "p"))
    # deliver_policy is not editable: the broker refuses, the read-back says so.
    changed = t.consumer_config_for(FLOW, RUN, "c", "p").evolve(
        deliver_policy=DeliverPolicy.NEW)
    verified = await p.ensure_consumer(jetstream, stream, changed)
    assert verified.effective is not None
    assert any(m.startswith("deliver_policy:") for m in verified.mismatches)


@pytest.mark.asyncio
async def test_ensure_consumer_creates_the_eos_anchor_exactly(jetstream):
    await _add(jetstream, t.stream_config_for(FLOW, RUN, "p", BATCH, generation="g1"))
    verified = await p.ensure_consumer(
        jetstream, t.stream_name_for(FLOW, RUN, "p"),
        t.eos_anchor_config(FLOW, RUN, "p", generation="g1"),
    )
    assert verified.mismatches == ()
    assert verified.effective is not None
    assert verified.effective.durable_name == t.eos_anchor_durable_name_for("p")
