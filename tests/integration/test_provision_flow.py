"""provision_flow, provision_flow_connect and provision_flow_sync against a real
nats-server: every stream and durable a flow needs, read back from the server."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, StreamInfo

from videoflow.backends.messaging import RELIABLE_WORK, ProfileRequest
from videoflow.core.compiler import NodeSpec
from videoflow.core.constants import BATCH, REALTIME
from videoflow.messaging import topology as t

pytestmark = pytest.mark.timeout(60)

FLOW = "f"
RUN = "r"
GEN = "g1"
LABELS = "videoflow.io/"

# Expected values are written out here rather than derived with the functions under
# test: DeliveryPolicy presets (REALTIME best_effort -> 1 delivery; BATCH at_least_once
# with 3 retries -> 4), the credit = (item credit + a window of 64 groups in flight +
# up to 64 gathered acks + prefetch 64) x competing replicas, and a join's item credit =
# (max_pending + 1) x sync parents (RUN-005).
MAX_DELIVER = {REALTIME: 1, BATCH: 4}
RETENTION = {REALTIME: "limits", BATCH: "interest"}
IN_FLIGHT = 64 + 64 + 64
SINGLE_PARENT_CREDIT = 1 + IN_FLIGHT
JOIN_MAX_PENDING = 16
JOIN_CREDIT = (JOIN_MAX_PENDING + 1) * 2 + IN_FLIGHT

FLOW_TYPES = pytest.mark.parametrize("flow_type", [REALTIME, BATCH])


def chain() -> list[NodeSpec]:
    return [
        NodeSpec("src", "producer"),
        NodeSpec("proc", "processor", parents=("src",)),
        NodeSpec("sink", "consumer", parents=("proc",)),
    ]


def join() -> list[NodeSpec]:
    policy = {"mode": "time", "tolerance_ms": 50.0, "timeout_ms": 500.0,
              "max_pending": JOIN_MAX_PENDING}
    return [
        NodeSpec("cam_a", "producer"),
        NodeSpec("cam_b", "producer"),
        NodeSpec("fuse", "processor", parents=("cam_a", "cam_b"), join_policy=policy),
        NodeSpec("sink", "consumer", parents=("fuse",)),
    ]


async def streams(js: JetStreamContext) -> dict[str, StreamInfo]:
    return {info.config.name or "": info for info in await js.streams_info()}


async def consumers(js: JetStreamContext, stream: str) -> dict[str, ConsumerInfo]:
    return {info.name: info for info in await js.consumers_info(stream)}


def labels(metadata: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (metadata or {}).items() if k.startswith(LABELS)}


def owner(node: str, kind: str) -> dict[str, str]:
    return {
        f"{LABELS}flow-id": FLOW, f"{LABELS}run-id": RUN, f"{LABELS}node": node,
        f"{LABELS}kind": kind, f"{LABELS}generation": GEN,
    }


def assert_data_durable(info: ConsumerInfo, child: str, parent: str, flow_type: str,
                        credit: int, max_deliver: int | None = None,
                        ack_wait: float = 60.0) -> None:
    config = info.config
    assert config.filter_subject == f"vf.{FLOW}.{RUN}.{parent}"
    assert config.max_deliver == (MAX_DELIVER[flow_type] if max_deliver is None
                                  else max_deliver)
    assert config.max_ack_pending == credit
    assert config.ack_wait == ack_wait
    assert labels(config.metadata) == owner(child, "durable")


def assert_anchor(info: ConsumerInfo, node: str) -> None:
    assert info.config.filter_subject == f"vf.{FLOW}.{RUN}.{node}._eos"
    assert labels(info.config.metadata) == owner(node, "eos_anchor")


def assert_node_stream(info: StreamInfo, node: str, flow_type: str) -> None:
    config = info.config
    assert config.retention == RETENTION[flow_type]
    assert config.subjects == [f"vf.{FLOW}.{RUN}.{node}", f"vf.{FLOW}.{RUN}.{node}._eos"]
    assert labels(config.metadata) == owner(node, "stream")


# --------------------------------------------------------------------------------------
# What gets created
# --------------------------------------------------------------------------------------


@FLOW_TYPES
@pytest.mark.asyncio
async def test_a_chain_gets_a_stream_per_publisher_the_dlq_and_a_durable_per_edge(
    nats_client, jetstream, flow_type, caplog
):
    with caplog.at_level(logging.WARNING, logger="videoflow.backends.jetstream.streams"):
        await t.provision_flow(nats_client, chain(), FLOW, RUN, flow_type, generation=GEN)
    # Every read-back matched its request: nothing was reported.
    assert [r.getMessage() for r in caplog.records] == []
    got = await streams(jetstream)
    # The sink publishes nothing, so it has no stream.
    assert set(got) == {"vf-f-dlq", "vf-f-r-src", "vf-f-r-proc"}
    assert_node_stream(got["vf-f-r-src"], "src", flow_type)
    assert_node_stream(got["vf-f-r-proc"], "proc", flow_type)
    on_src = await consumers(jetstream, "vf-f-r-src")
    assert set(on_src) == {"proc--from--src", "src--eos--anchor"}
    assert_data_durable(on_src["proc--from--src"], "proc", "src", flow_type,
                        SINGLE_PARENT_CREDIT)
    assert_anchor(on_src["src--eos--anchor"], "src")
    on_proc = await consumers(jetstream, "vf-f-r-proc")
    assert set(on_proc) == {"sink--from--proc", "proc--eos--anchor"}
    assert_data_durable(on_proc["sink--from--proc"], "sink", "proc", flow_type,
                        SINGLE_PARENT_CREDIT)
    assert_anchor(on_proc["proc--eos--anchor"], "proc")


@FLOW_TYPES
@pytest.mark.asyncio
async def test_a_time_join_gets_a_durable_per_parent_with_its_working_set_as_credit(
    nats_client, jetstream, flow_type
):
    await t.provision_flow(nats_client, join(), FLOW, RUN, flow_type, generation=GEN)
    got = await streams(jetstream)
    assert set(got) == {"vf-f-dlq", "vf-f-r-cam_a", "vf-f-r-cam_b", "vf-f-r-fuse"}
    for camera in ("cam_a", "cam_b"):
        assert_node_stream(got[f"vf-f-r-{camera}"], camera, flow_type)
        on_camera = await consumers(jetstream, f"vf-f-r-{camera}")
        assert set(on_camera) == {f"fuse--from--{camera}", f"{camera}--eos--anchor"}
        # RUN-005: every half of every pending group plus the one being assembled.
        assert_data_durable(on_camera[f"fuse--from--{camera}"], "fuse", camera, flow_type,
                            JOIN_CREDIT)
    on_fuse = await consumers(jetstream, "vf-f-r-fuse")
    assert_data_durable(on_fuse["sink--from--fuse"], "sink", "fuse", flow_type,
                        SINGLE_PARENT_CREDIT)


@FLOW_TYPES
@pytest.mark.asyncio
async def test_the_dlq_is_flow_scoped_and_kept_a_week(nats_client, jetstream, flow_type):
    await t.provision_flow(nats_client, chain(), FLOW, RUN, flow_type, generation=GEN)
    dlq = (await streams(jetstream))["vf-f-dlq"].config
    assert dlq.subjects == ["vf.f._dlq.>"]
    assert dlq.retention == "limits"
    assert dlq.max_age == 7 * 24 * 3600
    # STREAM-8: no run id (and so no generation), or a run's teardown could own it.
    assert labels(dlq.metadata) == {f"{LABELS}flow-id": FLOW, f"{LABELS}kind": "dlq"}


@pytest.mark.asyncio
async def test_explicit_credit_ack_wait_and_delivery_overrides_reach_the_durables(
    nats_client, jetstream
):
    specs = [
        NodeSpec("src", "producer"),
        NodeSpec("proc", "processor", parents=("src",),
                 delivery={"mode": "at_least_once", "max_retries": 2}),
        NodeSpec("sink", "consumer", parents=("proc",)),
    ]
    await t.provision_flow(nats_client, specs, FLOW, RUN, REALTIME, ack_wait=30,
                           max_ack_pending=9, generation=GEN)
    proc = (await consumers(jetstream, "vf-f-r-src"))["proc--from--src"]
    # An at-least-once node in a REALTIME flow needs a cap above 1.
    assert_data_durable(proc, "proc", "src", REALTIME, 9, max_deliver=3, ack_wait=30.0)
    sink = (await consumers(jetstream, "vf-f-r-proc"))["sink--from--proc"]
    assert_data_durable(sink, "sink", "proc", REALTIME, 9, ack_wait=30.0)


@pytest.mark.asyncio
async def test_a_ledger_budget_leaves_at_least_once_durables_uncapped(nats_client,
                                                                      jetstream):
    await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, max_retries=5,
                           generation=GEN, ledger_budget=True)
    proc = (await consumers(jetstream, "vf-f-r-src"))["proc--from--src"]
    assert_data_durable(proc, "proc", "src", BATCH, SINGLE_PARENT_CREDIT, max_deliver=-1)


@pytest.mark.asyncio
async def test_max_retries_sets_the_batch_cap(nats_client, jetstream):
    await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, max_retries=5,
                           generation=GEN)
    proc = (await consumers(jetstream, "vf-f-r-src"))["proc--from--src"]
    assert_data_durable(proc, "proc", "src", BATCH, SINGLE_PARENT_CREDIT, max_deliver=6)


@FLOW_TYPES
@pytest.mark.asyncio
async def test_a_partitioned_node_gets_a_durable_per_replica(nats_client, jetstream,
                                                             flow_type):
    specs = [
        NodeSpec("src", "producer"),
        NodeSpec("proc", "processor", parents=("src",), nb_tasks=3, partition_by="camera"),
        NodeSpec("sink", "consumer", parents=("proc",), nb_tasks=3),
    ]
    await t.provision_flow(nats_client, specs, FLOW, RUN, flow_type, generation=GEN)
    on_src = await consumers(jetstream, "vf-f-r-src")
    replicas = {f"proc--from--src--p{i}" for i in range(3)}
    assert set(on_src) == replicas | {"src--eos--anchor"}
    for name in replicas:
        # STREAM-15: a per-replica durable carries one replica's credit.
        assert_data_durable(on_src[name], "proc", "src", flow_type, SINGLE_PARENT_CREDIT)
    # Three competing replicas share one durable with three replicas' credit.
    on_proc = await consumers(jetstream, "vf-f-r-proc")
    assert_data_durable(on_proc["sink--from--proc"], "sink", "proc", flow_type,
                        3 * SINGLE_PARENT_CREDIT)


# --------------------------------------------------------------------------------------
# Idempotence, teardown, retention
# --------------------------------------------------------------------------------------


async def snapshot(js: JetStreamContext) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, info in (await streams(js)).items():
        state[name] = (info.config.as_dict(), info.created)
        for durable, cinfo in (await consumers(js, name)).items():
            state[f"{name}/{durable}"] = (cinfo.config.as_dict(), cinfo.created)
    return state


@FLOW_TYPES
@pytest.mark.asyncio
async def test_provisioning_twice_succeeds_and_changes_nothing(nats_client, jetstream,
                                                               flow_type):
    specs = join()
    await t.provision_flow(nats_client, specs, FLOW, RUN, flow_type, generation=GEN)
    before = await snapshot(jetstream)
    await t.provision_flow(nats_client, specs, FLOW, RUN, flow_type, generation=GEN)
    assert await snapshot(jetstream) == before


@pytest.mark.asyncio
async def test_provisioning_again_with_a_new_credit_updates_the_durables_in_place(
    nats_client, jetstream
):
    await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, generation=GEN)
    created = (await consumers(jetstream, "vf-f-r-src"))["proc--from--src"].created
    await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, generation=GEN,
                           max_ack_pending=20)
    after = (await consumers(jetstream, "vf-f-r-src"))["proc--from--src"]
    assert after.config.max_ack_pending == 20
    assert after.created == created  # updated, not recreated


@FLOW_TYPES
@pytest.mark.asyncio
async def test_teardown_after_provisioning_leaves_only_the_dlq(nats_client, jetstream,
                                                               flow_type):
    await t.provision_flow(nats_client, join(), FLOW, RUN, flow_type, generation=GEN)
    result = await t.delete_run_streams(nats_client, FLOW, RUN, generation=GEN)
    assert set(result.removed) == {"vf-f-r-cam_a", "vf-f-r-cam_b", "vf-f-r-fuse"}
    assert result.complete
    assert set(await streams(jetstream)) == {"vf-f-dlq"}  # STREAM-8


@pytest.mark.asyncio
async def test_batch_retains_data_and_eos_published_before_any_worker_binds(
    nats_client, jetstream
):
    # Why provisioning exists: under INTEREST retention a message nobody is interested
    # in is dropped at once (NATS_FACTS §5). The data durable and the EOS anchor are
    # that interest.
    await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, generation=GEN)
    await jetstream.publish(t.subject_for(FLOW, RUN, "src"), b"frame")
    await jetstream.publish(t.eos_subject_for(FLOW, RUN, "src"), b"eos")
    state = (await jetstream.stream_info("vf-f-r-src")).state
    assert state.messages == 2


# --------------------------------------------------------------------------------------
# Refusals before the broker is touched, and what the broker refuses
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "specs, match",
    [
        ([NodeSpec("proc", "processor", parents=("src",))], "parent 'src' is not in the flow"),
        ([NodeSpec("src", "producer"), NodeSpec("src", "producer")], "appears twice"),
        ([NodeSpec("src", "producer"), NodeSpec("sink", "consumer", parents=("src",)),
          NodeSpec("after", "consumer", parents=("sink",))], "publishes nothing"),
    ],
)
def test_a_flow_that_cannot_exist_is_refused_before_connecting(closed_port_url, specs,
                                                               match):
    started = time.monotonic()
    with pytest.raises(ValueError, match=match):
        t.provision_flow_sync(closed_port_url, specs, FLOW, RUN, BATCH, timeout=30)
    assert time.monotonic() - started < 1.0


def test_bad_arguments_are_refused_before_connecting(closed_port_url):
    with pytest.raises(ValueError, match="flow_type"):
        t.provision_flow_sync(closed_port_url, chain(), FLOW, RUN, "weekly", timeout=30)
    with pytest.raises(ValueError, match="timeout"):
        t.provision_flow_sync(closed_port_url, chain(), FLOW, RUN, BATCH, timeout=0)
    with pytest.raises(ValueError, match="max_ack_pending"):
        t.provision_flow_sync(closed_port_url, chain(), FLOW, RUN, BATCH, timeout=30,
                              max_ack_pending=0)
    with pytest.raises(ValueError, match="ack_wait"):
        t.provision_flow_sync(closed_port_url, chain(), FLOW, RUN, BATCH, timeout=30,
                              ack_wait=0)
    with pytest.raises(TypeError, match="NodeSpec"):
        t.provision_flow_sync(closed_port_url, [{"name": "src"}], FLOW, RUN, BATCH,
                              timeout=30)


@pytest.mark.asyncio
async def test_replicas_a_standalone_server_cannot_keep_are_an_api_error(nats_client):
    with pytest.raises(nats.js.errors.APIError, match="replicas"):
        await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, replicas=3)


# --------------------------------------------------------------------------------------
# provision_flow_connect / provision_flow_sync / read-back
# --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_provision_flow_connect_provisions_over_its_own_connection(nats_server,
                                                                          jetstream):
    await t.provision_flow_connect(
        nats_server.url, join(), FLOW, RUN, BATCH,
        connect_options={"max_reconnect_attempts": 1, "reconnect_time_wait": 0.1},
        generation=GEN,
    )
    assert set(await streams(jetstream)) == {
        "vf-f-dlq", "vf-f-r-cam_a", "vf-f-r-cam_b", "vf-f-r-fuse"}
    on_camera = await consumers(jetstream, "vf-f-r-cam_a")
    assert_data_durable(on_camera["fuse--from--cam_a"], "fuse", "cam_a", BATCH, JOIN_CREDIT)


@pytest.mark.asyncio
async def test_provision_flow_connect_fails_fast_when_told_to(closed_port_url):
    with pytest.raises(nats.errors.NoServersError):
        await asyncio.wait_for(
            t.provision_flow_connect(
                closed_port_url, chain(), FLOW, RUN, BATCH,
                connect_options={"max_reconnect_attempts": 1, "reconnect_time_wait": 0.1},
            ),
            10,
        )


def test_provision_flow_sync_against_an_unreachable_broker_times_out(closed_port_url):
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        t.provision_flow_sync(closed_port_url, chain(), FLOW, RUN, BATCH, timeout=1)
    assert time.monotonic() - started < 2.0


@FLOW_TYPES
def test_read_back_after_provision_flow_sync_verifies_every_stream(nats_server, flow_type):
    specs = join()
    t.provision_flow_sync(nats_server.url, specs, FLOW, RUN, flow_type, timeout=20,
                          generation=GEN)
    got = t.read_back_streams(nats_server.url, FLOW, RUN, [s.name for s in specs],
                              flow_type, timeout=10.0, generation=GEN)
    publishers = ["cam_a", "cam_b", "fuse"]
    for node in publishers:
        entry = got[node]
        assert isinstance(entry, t.VerifiedStream), entry
        assert entry.effective is not None and entry.mismatches == ()
    # The sink owns no stream; the read-back says so rather than inventing one.
    sink = got["sink"]
    assert not isinstance(sink, t.VerifiedStream) and sink.reason == "missing"
    if flow_type == BATCH:
        t.verify_channel_profiles(
            {n: got[n] for n in publishers},
            [ProfileRequest(channel=n, profile=RELIABLE_WORK) for n in publishers],
            unknown_is_fatal=True, where="provision", config_mismatches=True,
        )


@pytest.mark.asyncio
async def test_provision_flow_sync_refuses_a_running_loop(nats_server):
    with pytest.raises(RuntimeError, match="provision_flow_connect"):
        t.provision_flow_sync(nats_server.url, chain(), FLOW, RUN, BATCH, timeout=5)


@pytest.mark.asyncio
async def test_a_durable_the_broker_holds_differently_is_reported(nats_client, jetstream,
                                                                  caplog):
    from nats.js.api import DeliverPolicy

    await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, generation=GEN)
    # Recreate one durable with a deliver policy no update can change.
    await jetstream.delete_consumer("vf-f-r-src", "proc--from--src")
    await jetstream.add_consumer("vf-f-r-src", t.consumer_config_for(
        FLOW, RUN, "proc", "src", max_deliver=4, max_ack_pending=5, generation=GEN,
    ).evolve(deliver_policy=DeliverPolicy.NEW))
    with caplog.at_level(logging.WARNING, logger="videoflow.backends.jetstream.streams"):
        await t.provision_flow(nats_client, chain(), FLOW, RUN, BATCH, generation=GEN)
    reported = [r.getMessage() for r in caplog.records
                if "is not as requested" in r.getMessage()]
    assert len(reported) == 1
    assert "proc--from--src" in reported[0] and "deliver_policy" in reported[0]
