"""A broker that speaks only TLS and verifies its clients' certificates: the videoflow
command's --tls-ca / --tls-cert / --tls-key reach every connection it makes, and those
of the replicas a run starts; without a client certificate the broker refuses, in one
line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import environment, videoflow

from videoflow.broker import server as embedded
from videoflow.broker.options import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, tls_options


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def certificate(directory: Path, name: str, subject: str, extensions: str) -> None:
    """name.pem and name.key, signed by the CA in directory."""
    (directory / f"{name}.ext").write_text(extensions + "\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", subject, cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
            f"{name}.ext", cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a certificate for the broker on 127.0.0.1, and one for a client."""
    directory = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=videoflow test CA", cwd=directory)
    certificate(directory, "server", "/CN=localhost",
                "subjectAltName=IP:127.0.0.1,DNS:localhost")
    certificate(directory, "client", "/CN=videoflow client",
                "extendedKeyUsage=clientAuth")
    return directory


@pytest.fixture
def tls_server(pki: Path, tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:
    config = tmp_path / "tls.conf"
    config.write_text(
        "tls {\n"
        f'  cert_file: "{pki / "server.pem"}"\n'
        f'  key_file: "{pki / "server.key"}"\n'
        f'  ca_file: "{pki / "ca.pem"}"\n'
        "  verify: true\n"
        "  timeout: 5\n"
        "}\n")
    server = embedded.EmbeddedServer(tmp_path / "store", extra_args=("-c", str(config)))
    with server.start():
        yield server


def tls_flags(pki: Path) -> list[str]:
    return ["--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "client.pem"),
            "--tls-key", str(pki / "client.key")]


def test_an_operator_command_connects_with_the_client_certificate(
        tls_server: embedded.EmbeddedServer, pki: Path, tmp_path: Path) -> None:
    url = f"tls://127.0.0.1:{tls_server.port}"
    done = videoflow("ls", "--nats-url", url, *tls_flags(pki), "--json",
                     env=environment(tmp_path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_without_a_client_certificate_the_broker_refuses_in_one_line(
        tls_server: embedded.EmbeddedServer, pki: Path, tmp_path: Path) -> None:
    url = f"tls://127.0.0.1:{tls_server.port}"
    done = videoflow("ls", "--nats-url", url, "--tls-ca", str(pki / "ca.pem"),
                     "--timeout", "3", env=environment(tmp_path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("videoflow: error:"), done.stderr


def test_a_run_and_its_replicas_connect_over_tls(
        tls_server: embedded.EmbeddedServer, pki: Path, tmp_path: Path) -> None:
    url = f"tls://127.0.0.1:{tls_server.port}"
    done = videoflow("run", "flows:chain", "--nats-url", url, *tls_flags(pki), "--json",
                     env=environment(tmp_path, count=20))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "completed"
    assert report["nodes"]["record"]["processed"] == 20


def test_tls_options_read_the_environment(pki: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    assert tls_options() == {}
    monkeypatch.setenv(TLS_CERT_ENV, str(pki / "client.pem"))
    with pytest.raises(ValueError, match="go together"):
        tls_options()
    monkeypatch.setenv(TLS_KEY_ENV, str(pki / "client.key"))
    monkeypatch.setenv(TLS_CA_ENV, str(pki / "ca.pem"))
    context = tls_options()["tls"]
    assert context.verify_mode.name == "CERT_REQUIRED" and context.check_hostname


def test_a_nats_context_gives_the_tls_files(
        tls_server: embedded.EmbeddedServer, pki: Path, tmp_path: Path) -> None:
    env = environment(tmp_path)
    for name in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV):
        env.pop(name, None)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    contexts = tmp_path / "config" / "nats" / "context"
    contexts.mkdir(parents=True)
    (contexts / "tls.json").write_text(json.dumps({
        "url": f"tls://127.0.0.1:{tls_server.port}", "ca": str(pki / "ca.pem"),
        "cert": str(pki / "client.pem"), "key": str(pki / "client.key")}))
    done = videoflow("ls", "--context", "tls", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
