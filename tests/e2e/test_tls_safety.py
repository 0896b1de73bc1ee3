"""TLS asked for is TLS or nothing: a tls:// URL or TLS files given to a broker that
does not offer TLS are refused before anything is sent (a relay records what the
client wrote: no CONNECT, no credential), also when a connection that was secured
reconnects to a server that is not; an untrusted certificate and a server asking for
a client certificate are named at once, not retried; bad TLS files get one line that
names the file."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import environment, videoflow
from test_tls import certificate, openssl, pki  # noqa: F401  (pki: a fixture)

from videoflow.broker import link
from videoflow.broker import server as embedded
from videoflow.broker.options import SETTING_ENV, TOKEN_ENV

pytestmark = pytest.mark.timeout(120)

TOKEN = "t0ken-QQQ-secret"
PASSWORD = "pw-QQQ-secret"


class Relay:
    """A TCP relay on 127.0.0.1 (an OS-chosen port) to target's port, which records
    every byte the clients send; target can be changed, and drop() cuts every
    connection (their clients reconnect through it to the new target)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.sent = bytearray()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                upstream = socket.create_connection(("127.0.0.1", relay.target))
                with relay.lock:
                    relay.sockets += [self.request, upstream]
                back = threading.Thread(target=relay.pipe, args=(upstream, self.request,
                                                                 False), daemon=True)
                back.start()
                relay.pipe(self.request, upstream, True)
                back.join()

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if record:
                    with self.lock:
                        self.sent += data
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        with self.lock:
            ends, self.sockets = self.sockets, []
        for end in ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def recorded(self) -> bytes:
        with self.lock:
            return bytes(self.sent)

    def close(self) -> None:
        self.drop()
        self.server.shutdown()
        self.server.server_close()


def _server(directory: Path, config: str) -> embedded.EmbeddedServer:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "server.conf").write_text(config)
    return embedded.EmbeddedServer(directory / "store",
                                   extra_args=("-c", str(directory / "server.conf")))


@pytest.fixture
def plain_server(tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:
    """A broker without TLS that takes user vf with PASSWORD."""
    server = _server(tmp_path / "plain", "authorization {\n"
                     f'  user: vf\n  password: "{PASSWORD}"\n}}\n')
    with server.start():
        yield server


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:
    server = _server(tmp_path / "token", f'authorization {{\n  token: "{TOKEN}"\n}}\n')
    with server.start():
        yield server


def _tls_server(directory: Path, certs: Path, before: str = "", cert: str = "server",
                inside: str = "", token: bool = True) -> embedded.EmbeddedServer:
    """A broker that speaks TLS with certs/<cert>.pem (no client certificate asked, but
    as `inside` its tls block says) and takes TOKEN (unless not token)."""
    return _server(directory, f"{before}tls {{\n"
                   f'  cert_file: "{certs / f"{cert}.pem"}"\n'
                   f'  key_file: "{certs / f"{cert}.key"}"\n{inside}  timeout: 5\n}}\n'
                   + (f'authorization {{\n  token: "{TOKEN}"\n}}\n' if token else ""))


@pytest.fixture
def tls_token_server(pki: Path, tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:  # noqa: F811
    with _tls_server(tmp_path / "tls", pki).start() as server:
        yield server


@pytest.fixture
def tls_optional_server(pki: Path, tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:  # noqa: F811
    """One that takes plain clients too (allow_non_tls: its INFO says tls_available,
    not tls_required)."""
    with _tls_server(tmp_path / "optional", pki, "allow_non_tls: true\n").start() as server:
        yield server


@pytest.fixture
def relay_to() -> Iterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for relay in made:
        relay.close()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    values = environment(tmp_path)
    for variable in (*SETTING_ENV.values(), "VIDEOFLOW_NATS_CONTEXT", "VIDEOFLOW_NATS_URL"):
        values.pop(variable, None)
    values["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return values


def assert_one_line(stderr: str, starts: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"videoflow: error: {starts}"), stderr
    return lines[0]


@pytest.mark.parametrize("given", ["token", "user", "url", "none"])
def test_tls_asked_of_a_broker_without_it_is_refused_before_anything_is_sent(
        plain_server: embedded.EmbeddedServer, relay_to: list[Relay], pki: Path,  # noqa: F811
        env: dict[str, str], given: str) -> None:
    relay = Relay(plain_server.port)
    relay_to.append(relay)
    url, flags = f"tls://127.0.0.1:{relay.port}", ["--tls-ca", str(pki / "ca.pem")]
    if given == "token":
        flags += ["--token", TOKEN]
    elif given == "user":
        flags += ["--user", "vf", "--password", PASSWORD]
    elif given == "url":
        url = f"tls://vf:{PASSWORD}@127.0.0.1:{relay.port}"
    started = time.monotonic()
    done = videoflow("ls", "--nats-url", url, *flags, "--timeout", "10", env=env)
    assert done.returncode == 1, done.stderr
    line = assert_one_line(done.stderr, "secure connection required")
    assert "does not offer TLS; nothing was sent to it" in line
    assert time.monotonic() - started < 8  # not retried until the bound
    sent = relay.recorded()
    assert b"CONNECT" not in sent and TOKEN.encode() not in sent
    assert PASSWORD.encode() not in sent, sent
    assert PASSWORD not in done.stderr and TOKEN not in done.stderr


def test_tls_asked_of_a_broker_that_offers_it_without_requiring_it_is_tls(
        tls_optional_server: embedded.EmbeddedServer, relay_to: list[Relay], pki: Path,  # noqa: F811
        env: dict[str, str]) -> None:
    # nats-py upgrades only when the server requires TLS: this one, which offers it,
    # was refused as one that "does not offer TLS".
    relay = Relay(tls_optional_server.port)
    relay_to.append(relay)
    done = videoflow("ls", "--nats-url", f"tls://127.0.0.1:{relay.port}", "--tls-ca",
                     str(pki / "ca.pem"), "--token", TOKEN, "--json", env=env)
    assert done.returncode == 0, done.stderr
    sent = relay.recorded()
    assert sent and b"CONNECT" not in sent and TOKEN.encode() not in sent  # all in TLS
    # Asked for no TLS, the same broker is reached in the clear (the relay sees it).
    plain = videoflow("ls", "--nats-url", f"nats://127.0.0.1:{relay.port}", "--token",
                      TOKEN, "--json", env=env)
    assert plain.returncode == 0 and TOKEN.encode() in relay.recorded(), plain.stderr


def test_a_token_with_a_tls_file_to_a_broker_without_tls_never_leaves(
        token_server: embedded.EmbeddedServer, relay_to: list[Relay], pki: Path,  # noqa: F811
        env: dict[str, str]) -> None:
    # The audit's repro: the token given by its variable, a plain URL, a CA file.
    relay = Relay(token_server.port)
    relay_to.append(relay)
    env[TOKEN_ENV] = TOKEN
    done = videoflow("ls", "--nats-url", f"nats://127.0.0.1:{relay.port}", "--tls-ca",
                     str(pki / "ca.pem"), env=env)
    assert done.returncode == 1, done.stderr
    assert_one_line(done.stderr, "secure connection required (by the TLS ca file given)")
    assert TOKEN.encode() not in relay.recorded() and b"CONNECT" not in relay.recorded()
    # The same broker, asked for no TLS, is reached with the token (the relay works).
    plain = videoflow("ls", "--nats-url", f"nats://127.0.0.1:{relay.port}", "--json",
                      env=env)
    assert TOKEN.encode() in relay.recorded(), plain.stderr


@pytest.mark.asyncio
async def test_a_secured_connection_that_reconnects_to_a_broker_without_tls_sends_nothing(
        tls_token_server: embedded.EmbeddedServer, token_server: embedded.EmbeddedServer,
        relay_to: list[Relay], pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    for variable in SETTING_ENV.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(SETTING_ENV["ca"], str(pki / "ca.pem"))
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    relay = Relay(tls_token_server.port)
    relay_to.append(relay)
    seen: list[BaseException] = []

    async def record(error: BaseException) -> None:
        seen.append(error)

    client = await link.connect(f"tls://127.0.0.1:{relay.port}", 5.0, record,
                                link.Outage(budget=30))
    try:
        assert client.is_connected
        before = len(relay.recorded())
        relay.target = token_server.port  # a man in the middle, now: no TLS offered
        relay.drop()
        deadline = time.monotonic() + 10
        while not any("secure connection required" in str(e) for e in seen):
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.1)
        after = relay.recorded()[before:]
        assert b"CONNECT" not in after and TOKEN.encode() not in after, after
        assert not client.is_connected
    finally:
        await client.close()


def test_an_untrusted_certificate_is_named_at_once(
        tls_token_server: embedded.EmbeddedServer, tmp_path: Path,
        env: dict[str, str]) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key",
            "-out", "other.pem", "-days", "2", "-subj", "/CN=another CA", cwd=tmp_path)
    env[TOKEN_ENV] = TOKEN
    started = time.monotonic()
    done = videoflow("ls", "--nats-url", f"tls://127.0.0.1:{tls_token_server.port}",
                     "--tls-ca", str(tmp_path / "other.pem"), "--timeout", "10", env=env)
    assert done.returncode == 1, done.stderr
    line = assert_one_line(done.stderr, f"the broker at tls://127.0.0.1:{tls_token_server.port}"
                                        " presented a certificate that is not trusted")
    assert "--tls-ca" in line and "timeout" not in line
    assert time.monotonic() - started < 8, "retried until the bound"


def ls_over_tls(server: embedded.EmbeddedServer, certs: Path, env: dict[str, str],
                ) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`videoflow ls` of the server, over TLS with certs' CA, once it failed (exit 1)."""
    with server.start():
        url = f"tls://127.0.0.1:{server.port}"
        done = videoflow("ls", "--nats-url", url, "--tls-ca", str(certs / "ca.pem"),
                         "--timeout", "10", env=env)
    assert done.returncode == 1, done.stderr
    return url, done


def test_a_broker_asking_for_a_client_certificate_says_so_at_once(
        pki: Path, tmp_path: Path, env: dict[str, str]) -> None:  # noqa: F811
    url, done = ls_over_tls(_tls_server(
        tmp_path / "verify", pki, token=False,
        inside=f'  ca_file: "{pki / "ca.pem"}"\n  verify: true\n'), pki, env)
    line = assert_one_line(done.stderr, f"the broker at {url} asks for a client "
                                        "certificate")
    assert "--tls-cert" in line and "NoServersError" not in line


def _bad_files(pki: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:  # noqa: F811
    junk = tmp_path / "junk.txt"
    junk.write_text("not a certificate\n")
    ca, cert, key = (str(pki / name) for name in ("ca.pem", "client.pem", "client.key"))
    return {
        "ca": (["--tls-ca", str(junk)], f"the CA file '{junk}'"),
        "cert": (["--tls-ca", ca, "--tls-cert", str(junk), "--tls-key", key],
                 f"the client certificate '{junk}'"),
        "key": (["--tls-ca", ca, "--tls-cert", cert, "--tls-key", str(junk)],
                f"the client key '{junk}'"),
        "mismatch": (["--tls-ca", ca, "--tls-cert", cert, "--tls-key",
                      str(pki / "server.key")],
                     f"the client key '{pki / 'server.key'}' (VIDEOFLOW_NATS_TLS_KEY, "
                     f"--tls-key) is not the key of the certificate '{cert}'"),
    }


@pytest.mark.parametrize("bad", ["ca", "cert", "key", "mismatch"])
def test_a_bad_tls_file_gets_one_line_naming_it(
        pki: Path, tmp_path: Path, env: dict[str, str], bad: str) -> None:  # noqa: F811
    flags, named = _bad_files(pki, tmp_path)[bad]
    done = videoflow("ls", "--nats-url", "tls://127.0.0.1:1", *flags, env=env)
    assert done.returncode == 2, done.stderr
    assert_one_line(done.stderr, named)
    assert "Traceback" not in done.stderr


def test_a_hostname_the_certificate_does_not_hold_is_named(
        pki: Path, tmp_path: Path, env: dict[str, str]) -> None:  # noqa: F811
    certificate(pki, "elsewhere", "/CN=elsewhere", "subjectAltName=DNS:elsewhere.test")
    url, done = ls_over_tls(_tls_server(tmp_path / "elsewhere", pki, cert="elsewhere",
                                        token=False), pki, env)
    line = assert_one_line(done.stderr, f"the broker at {url} presented a certificate "
                                        "that is not trusted")
    assert "a name or address its certificate holds" in line
