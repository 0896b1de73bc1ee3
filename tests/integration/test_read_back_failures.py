"""read_back_streams' Unknown reasons on real nats-servers: a broker that refuses the
credentials (auth), one that is not there (unreachable), one that is there but does not
answer (timeout), and one that answers but serves no JetStream (api).

observation_failure's vocabulary (reference, topology): auth = credentials refused or a
permissions violation the error callback saw while the request timed out; unreachable
= no server answered; timeout = the server is there and slow; api = the server answered
with a JetStream API error. A server without JetStream answers at once — its no-
responders status becomes nats-py's ServiceUnavailableError (js/manager.py
_api_request) — so it is api, not timeout: nothing is slow there.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import nats
import pytest

from videoflow.backends.messaging import Unknown
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.messaging import topology as t

pytestmark = pytest.mark.timeout(60)

FLOW = "f"
RUN = "r"
NODES = ["a", "b"]

posix_only = pytest.mark.skipif(sys.platform == "win32",
                                reason="freezes the server with SIGSTOP")


def with_credentials(url: str, credentials: str) -> str:
    return url.replace("nats://", f"nats://{credentials}@", 1)


def assert_all_unknown(got: dict, reason: str) -> Unknown:
    assert list(got) == NODES
    first = got[NODES[0]]
    assert isinstance(first, Unknown), first
    assert first.reason == reason, first
    assert all(entry == first for entry in got.values())  # one failure, said once per node
    return first


def assert_all_missing(got: dict) -> None:
    # The control: a definite observation, each naming its own stream.
    assert list(got) == NODES
    for node in NODES:
        entry = got[node]
        assert isinstance(entry, Unknown) and entry.reason == "missing", entry
        assert t.stream_name_for(FLOW, RUN, node) in entry.detail


async def fail_fast_connect(url: str, reported: list[BaseException] | None = None):
    async def error_cb(error: BaseException) -> None:
        if reported is not None:
            reported.append(error)

    return await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1,
                              reconnect_time_wait=0.1, error_cb=error_cb)


# --------------------------------------------------------------------------------------
# auth
# --------------------------------------------------------------------------------------


@pytest.fixture
def password_server(start_server) -> embedded.EmbeddedServer:
    return start_server(extra_args=("--user", "vf", "--pass", "secret"))


@pytest.fixture
def token_server(start_server) -> embedded.EmbeddedServer:
    return start_server(extra_args=("--auth", "s3cret-token"))


@pytest.fixture
def permissions_server(start_server, tmp_path: Path) -> embedded.EmbeddedServer:
    # A worker that may connect but may not use the JetStream API at all.
    config = tmp_path / "permissions.conf"
    config.write_text(
        "authorization {\n"
        "  users = [\n"
        "    {user: admin, password: adminpw}\n"
        '    {user: worker, password: workerpw, permissions: {publish: {deny: ["$JS.API.>"]}}}\n'
        "  ]\n"
        "}\n"
    )
    return start_server(extra_args=("-c", str(config)))


@pytest.mark.parametrize("credentials", [None, "vf:wrong", "nobody:secret"])
def test_refused_credentials_are_auth(password_server, credentials):
    url = password_server.url
    if credentials is not None:
        url = with_credentials(url, credentials)
    started = time.monotonic()
    got = t.read_back_streams(url, FLOW, RUN, NODES, BATCH, timeout=10.0)
    assert time.monotonic() - started < 5.0  # refused at once, not waited out
    unknown = assert_all_unknown(got, "auth")
    assert "Authorization Violation" in unknown.detail


def test_the_right_password_reads_back(password_server):
    # The control: with its credentials the same server gives a definite observation.
    url = with_credentials(password_server.url, "vf:secret")
    got = t.read_back_streams(url, FLOW, RUN, NODES, BATCH, timeout=10.0)
    assert_all_missing(got)


@pytest.mark.parametrize("token", [None, "not-the-token"])
def test_a_missing_or_wrong_token_is_auth(token_server, token):
    url = token_server.url if token is None else with_credentials(token_server.url, token)
    got = t.read_back_streams(url, FLOW, RUN, NODES, BATCH, timeout=10.0)
    assert_all_unknown(got, "auth")
    right = with_credentials(token_server.url, "s3cret-token")
    assert_all_missing(t.read_back_streams(right, FLOW, RUN, NODES, BATCH, timeout=10.0))


def test_a_permissions_violation_on_the_jetstream_api_is_auth_not_timeout(
    permissions_server,
):
    # The connection is accepted; the stream_info request is denied, which the server
    # says only to the error callback while the request itself times out (NATS_FACTS
    # S15). Without what error_cb saw this would read as a slow server.
    admin = with_credentials(permissions_server.url, "admin:adminpw")
    assert_all_missing(t.read_back_streams(admin, FLOW, RUN, NODES, BATCH, timeout=10.0))
    worker = with_credentials(permissions_server.url, "worker:workerpw")
    got = t.read_back_streams(worker, FLOW, RUN, NODES, BATCH, timeout=2.0)
    unknown = assert_all_unknown(got, "auth")
    assert "permissions violation" in unknown.detail.lower()


@pytest.mark.asyncio
async def test_read_back_async_classifies_a_denied_request_by_what_error_cb_saw(
    permissions_server,
):
    reported: list[BaseException] = []
    nc = await fail_fast_connect(
        with_credentials(permissions_server.url, "worker:workerpw"), reported)
    try:
        js = nc.jetstream(timeout=1.0)
        got = await t.read_back_streams_async(js, FLOW, RUN, NODES, BATCH,
                                              reported=reported)
        # Each stream's request was denied on its own; the first is classified from
        # the report that had arrived by then.
        for node in NODES:
            entry = got[node]
            assert isinstance(entry, Unknown) and entry.reason == "auth", entry
        # Without the reports the same failure is indistinguishable from a slow server.
        bare = await t.read_back_streams_async(js, FLOW, RUN, ["a"], BATCH)
        assert isinstance(bare["a"], Unknown) and bare["a"].reason == "timeout"
    finally:
        await nc.close()


# --------------------------------------------------------------------------------------
# unreachable
# --------------------------------------------------------------------------------------


def test_a_closed_port_is_unreachable(closed_port_url):
    started = time.monotonic()
    got = t.read_back_streams(closed_port_url, FLOW, RUN, NODES, BATCH, timeout=10.0)
    assert time.monotonic() - started < 5.0
    assert_all_unknown(got, "unreachable")


def test_a_server_that_has_stopped_is_unreachable(start_server):
    server = start_server()
    url = server.url
    server.stop()
    got = t.read_back_streams(url, FLOW, RUN, NODES, BATCH, timeout=10.0)
    assert_all_unknown(got, "unreachable")


@pytest.mark.asyncio
async def test_a_connection_lost_when_the_server_stops_is_unreachable(start_server):
    server = start_server()
    nc = await fail_fast_connect(server.url)
    try:
        server.stop()
        for _ in range(100):  # without reconnects the client closes once it notices
            if nc.is_closed:
                break
            await asyncio.sleep(0.05)
        assert nc.is_closed
        got = await t.read_back_streams_async(nc.jetstream(), FLOW, RUN, NODES, BATCH)
        assert_all_unknown(got, "unreachable")
    finally:
        await nc.close()


# --------------------------------------------------------------------------------------
# timeout
# --------------------------------------------------------------------------------------


@posix_only
def test_a_server_that_accepts_but_never_answers_is_timeout(nats_server, freeze):
    with freeze(nats_server):
        started = time.monotonic()
        got = t.read_back_streams(nats_server.url, FLOW, RUN, NODES, BATCH, timeout=1.5)
        elapsed = time.monotonic() - started
    # Bounded by the caller's timeout, and not mistaken for a missing server: the
    # socket accepted, the handshake never came.
    assert elapsed < 4.0
    assert_all_unknown(got, "timeout")


@posix_only
@pytest.mark.asyncio
async def test_a_server_that_stops_answering_mid_session_is_timeout(nats_server, freeze):
    nc = await fail_fast_connect(nats_server.url)
    try:
        js = nc.jetstream(timeout=0.5)
        assert_all_missing(await t.read_back_streams_async(js, FLOW, RUN, NODES, BATCH))
        with freeze(nats_server):
            got = await t.read_back_streams_async(js, FLOW, RUN, NODES, BATCH)
        for node in NODES:
            entry = got[node]
            assert isinstance(entry, Unknown) and entry.reason == "timeout", entry
    finally:
        await nc.close()


# --------------------------------------------------------------------------------------
# api: a server without JetStream
# --------------------------------------------------------------------------------------


def test_a_server_without_jetstream_is_api_and_answers_at_once(start_server):
    server = start_server(jetstream=False)
    started = time.monotonic()
    got = t.read_back_streams(server.url, FLOW, RUN, NODES, BATCH, timeout=10.0)
    # No responder on $JS.API is an answer, not silence: nowhere near the timeout.
    assert time.monotonic() - started < 2.0
    unknown = assert_all_unknown(got, "api")
    assert "ServiceUnavailable" in unknown.detail


# --------------------------------------------------------------------------------------
# The EmbeddedServer options these tests rely on
# --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_embedded_server_without_jetstream_keeps_no_store(start_server, tmp_path):
    given = tmp_path / "unused-store"
    server = start_server(store_dir=given, jetstream=False)
    assert not given.exists() and server.store_dir == given
    assert "Starting JetStream" not in server.log_text()
    nc = await fail_fast_connect(server.url)
    try:
        await nc.publish("core.subject", b"plain NATS still works")
        await nc.flush()
    finally:
        await nc.close()
    server.stop()
    assert server.process is None


def test_embedded_server_jetstream_is_the_default(start_server):
    server = start_server()
    assert server.jetstream is True
    assert "Starting JetStream" in server.log_text()
    assert server.store_dir is not None and (server.store_dir / "jetstream").is_dir()


def test_embedded_server_passes_credentials_through_extra_args(password_server):
    assert "Authorization Violation" not in password_server.log_text()
    # Covered end to end above; here only that the flags reached the server.
    assert password_server.process is not None
    assert "--user" in password_server.process.args
