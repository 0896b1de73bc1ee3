"""`videoflow buckets` (videoflow.ops.buckets) against a real nats-server: the ledger and
payload buckets a flow leaves behind, listed, and removed — never under a run that still
has streams, never another flow's, never the dead letters."""

from __future__ import annotations

import argparse
import asyncio
import json

import nats
import pytest

from videoflow import ops
from videoflow.backends.messaging import Known
from videoflow.broker import server as embedded
from videoflow.cli.ops import register
from videoflow.core.compiler import NodeSpec
from videoflow.core.constants import BATCH
from videoflow.core.naming import dlq_stream_name, ledger_bucket, payload_bucket
from videoflow.core.runtime_records import key_token
from videoflow.messaging.topology import provision_flow_sync

pytestmark = pytest.mark.timeout(90)

FLOW = "flow"
SPECS = [NodeSpec("cam", "producer"), NodeSpec("sink", "consumer", parents=("cam",))]


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="videoflow")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


async def leave_buckets(url: str, ledger_records: dict[str, int]) -> None:
    """What runs of FLOW leave behind: ledger records per run, a payload and its record,
    and another flow's ledger."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        ledger = await js.create_key_value(bucket=ledger_bucket(FLOW), history=1)
        for run, count in ledger_records.items():
            for n in range(count):
                await ledger.put(f"{key_token(FLOW)}.{key_token(run)}.outbox.{n}", b"x")
        objects = await js.create_object_store(payload_bucket(FLOW))
        await objects.put("ref-1", b"payload" * 100)
        records = await js.create_key_value(bucket=payload_bucket(FLOW) + "-obligations",
                                            history=1)
        await records.put("ref-1", b"{}")
        other = await js.create_key_value(bucket=ledger_bucket("other"), history=1)
        await other.put(f"{key_token('other')}.r.outbox.0", b"x")
    finally:
        await nc.close()


async def stream_names(url: str) -> set[str]:
    nc = await nats.connect(url)
    try:
        return {info.config.name for info in await nc.jetstream().streams_info()}
    finally:
        await nc.close()


@pytest.fixture
def url(nats_server: embedded.EmbeddedServer) -> str:
    provision_flow_sync(nats_server.url, SPECS, FLOW, "live", BATCH, timeout=30)
    asyncio.run(leave_buckets(nats_server.url, {"live": 2, "gone": 3, "gone-x": 1}))
    return nats_server.url


def test_a_flows_buckets_are_listed_with_what_they_hold(url: str) -> None:
    found = ops.buckets_list(url, FLOW, timeout=10)
    assert [(b.name, b.kind, b.flow) for b in found] == [
        ("vf-ledger-flow", "ledger", "flow"),
        ("vf-payloads-flow", "payloads", "flow"),
        ("vf-payloads-flow-obligations", "payload_obligations", "flow")]
    assert found[0].stream == "KV_vf-ledger-flow" and found[0].messages == Known(6)
    assert found[1].stream == "OBJ_vf-payloads-flow"
    assert isinstance(found[1].bytes, Known) and found[1].bytes.value > 700
    everyone = ops.buckets_list(url, timeout=10)
    assert {b.name for b in everyone} == {b.name for b in found} | {"vf-ledger-other"}
    assert ops.buckets_list(url, "never-ran", timeout=10) == []


def test_a_runs_ledger_records_are_purged_and_no_one_elses(url: str) -> None:
    removal = ops.buckets_remove(url, FLOW, run_id="gone", timeout=10)
    assert removal == ops.BucketRemoval(FLOW, "gone", (), 3)
    # 'gone-x' is another run for all its shared prefix; 'live' is untouched.
    (ledger,) = [b for b in ops.buckets_list(url, FLOW, timeout=10) if b.kind == "ledger"]
    assert ledger.messages == Known(3)
    assert ops.buckets_remove(url, FLOW, run_id="gone", timeout=10).purged_records == 0


def test_a_run_with_streams_keeps_its_records_and_its_flow_keeps_its_buckets(
    url: str,
) -> None:
    with pytest.raises(ops.BucketsInUse,
                       match="videoflow teardown --flow flow --run live") as refused:
        ops.buckets_remove(url, FLOW, run_id="live", timeout=10)
    assert refused.value.runs == ("live",)
    with pytest.raises(ops.BucketsInUse, match="run\\(s\\) live"):
        ops.buckets_remove(url, FLOW, timeout=10)
    assert len(ops.buckets_list(url, FLOW, timeout=10)) == 3


def test_once_its_runs_are_torn_down_a_flows_buckets_are_removed_and_nothing_else(
    url: str,
) -> None:
    assert ops.teardown(url, FLOW, "live", timeout=10).complete
    before = asyncio.run(stream_names(url))
    assert dlq_stream_name(FLOW) in before
    removal = ops.buckets_remove(url, FLOW, timeout=10)
    assert removal.removed == ("vf-ledger-flow", "vf-payloads-flow",
                               "vf-payloads-flow-obligations")
    after = asyncio.run(stream_names(url))
    assert before - after == {"KV_vf-ledger-flow", "OBJ_vf-payloads-flow",
                              "KV_vf-payloads-flow-obligations"}
    assert ops.buckets_list(url, FLOW, timeout=10) == []
    assert ops.buckets_remove(url, FLOW, timeout=10).removed == ()  # safe to repeat


def test_the_commands_list_as_json_and_remove_only_with_yes(
    url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(["buckets", "list", "--nats-url", url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [b["name"] for b in listed] == ["vf-ledger-flow", "vf-ledger-other",
                                           "vf-payloads-flow", "vf-payloads-flow-obligations"]
    assert listed[0]["messages"] == 6
    assert cli(["buckets", "remove", "--nats-url", url, "--flow", FLOW]) == 2
    assert "add --yes" in capsys.readouterr().err
    assert cli(["buckets", "remove", "--nats-url", url, "--flow", FLOW, "--yes"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("videoflow: error: flow 'flow' still has streams of run(s) live")
    assert cli(["buckets", "remove", "--nats-url", url, "--flow", FLOW, "--run", "gone",
                "--yes"]) == 0
    assert capsys.readouterr().out.startswith("purged 3 ledger records of run 'gone'")
    assert cli(["teardown", "--nats-url", url, "--flow", FLOW, "--run", "live"]) == 0
    capsys.readouterr()
    assert cli(["buckets", "remove", "--nats-url", url, "--flow", FLOW, "--yes",
                "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == [
        "vf-ledger-flow", "vf-payloads-flow", "vf-payloads-flow-obligations"]
