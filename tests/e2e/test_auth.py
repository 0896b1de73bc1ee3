"""A broker that asks for credentials, with each way videoflow presents them: a creds
file (an operator, account and user JWT made here), an nkey seed, a user and password,
a token, and a nats CLI context. With the right one an operator command and a whole
run (its replicas included) connect; with a wrong one the refusal is one line that
says so, at once; the secret is in no output."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nkeys
import pytest
from auth_keys import Operator, key_pair, public
from test_cli import environment, videoflow

from videoflow import logs
from videoflow.broker import link
from videoflow.broker import server as embedded
from videoflow.broker.options import (
    CONTEXT_ENV,
    CREDS_ENV,
    NKEY_ENV,
    PASSWORD_ENV,
    SETTING_ENV,
    TOKEN_ENV,
    USER_ENV,
    auth_options,
)
from videoflow.errors import CredentialsRefused, MissingDependency

pytestmark = pytest.mark.timeout(120)

METHODS = ("creds", "nkey", "password", "token")


@dataclass
class Secured:
    """A server that takes one way of authenticating, the flags that pass and the
    flags that do not, and every secret that must never be printed."""

    server: embedded.EmbeddedServer
    right: list[str]
    wrong: list[str]
    secrets: list[str]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.server.port}"


def _start(directory: Path, config: str) -> embedded.EmbeddedServer:
    (directory / "auth.conf").write_text(config)
    return embedded.EmbeddedServer(directory / "store",
                                   extra_args=("-c", str(directory / "auth.conf"))).start()


def _seed_file(path: Path, seed: str) -> str:
    path.write_text(seed + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Secured]]:
    """One server per method, for the module."""
    made: dict[str, Secured] = {}
    try:
        directory = tmp_path_factory.mktemp("creds")
        operator = Operator()
        right_seed = operator.user_creds(directory / "right.creds")
        wrong_seed = operator.user_creds(directory / "wrong.creds", signer=Operator().account)
        made["creds"] = Secured(_start(directory, operator.server_config()),
                                ["--creds", str(directory / "right.creds")],
                                ["--creds", str(directory / "wrong.creds")],
                                [right_seed, wrong_seed])

        directory = tmp_path_factory.mktemp("nkey")
        user, right_seed = key_pair(nkeys.PREFIX_BYTE_USER)
        _, wrong_seed = key_pair(nkeys.PREFIX_BYTE_USER)
        made["nkey"] = Secured(
            _start(directory, f"authorization {{\n  users: [ {{nkey: {public(user)}}} ]\n}}\n"),
            ["--nkey", _seed_file(directory / "right.nk", right_seed)],
            ["--nkey", _seed_file(directory / "wrong.nk", wrong_seed)],
            [right_seed, wrong_seed])

        directory = tmp_path_factory.mktemp("password")
        password, wrong = f"pw-{secrets.token_hex(8)}", f"pw-{secrets.token_hex(8)}"
        made["password"] = Secured(
            _start(directory, f'authorization {{\n  user: vf\n  password: "{password}"\n}}\n'),
            ["--user", "vf", "--password", password],
            ["--user", "vf", "--password", wrong], [password, wrong])

        directory = tmp_path_factory.mktemp("token")
        token, wrong = f"tok-{secrets.token_hex(8)}", f"tok-{secrets.token_hex(8)}"
        made["token"] = Secured(
            _start(directory, f'authorization {{\n  token: "{token}"\n}}\n'),
            ["--token", token], ["--token", wrong], [token, wrong])
        yield made
    finally:
        for each in made.values():
            each.server.stop()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The commands' environment: no credentials of the caller's, and a configuration
    directory of the test's own (no nats context of the developer's applies)."""
    values = environment(tmp_path, count=10)
    for variable in (*SETTING_ENV.values(), CONTEXT_ENV, "VIDEOFLOW_NATS_URL"):
        values.pop(variable, None)
    values["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return values


def assert_no_secret(done: subprocess.CompletedProcess[str], secured: Secured) -> None:
    for secret in secured.secrets:
        assert secret not in done.stdout and secret not in done.stderr


def assert_refused_in_one_line(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("videoflow: error: the broker at nats://")
    assert "refused the credentials" in lines[0]


@pytest.mark.parametrize("method", METHODS)
def test_an_operator_command_connects_with_the_right_credentials(
        secured: dict[str, Secured], method: str, env: dict[str, str]) -> None:
    broker = secured[method]
    done = videoflow("ls", "--nats-url", broker.url, *broker.right, "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)  # the module's runs may be listed
    assert_no_secret(done, broker)


@pytest.mark.parametrize("method", METHODS)
def test_wrong_credentials_are_refused_at_once_in_one_line(
        secured: dict[str, Secured], method: str, env: dict[str, str]) -> None:
    broker = secured[method]
    started = time.monotonic()
    done = videoflow("status", "--flow", "cli", "--run", "r1", "--nats-url", broker.url,
                     *broker.wrong, "-v", env=env)
    assert time.monotonic() - started < 15  # not a timeout waited out
    assert_refused_in_one_line(done)
    assert_no_secret(done, broker)


def test_no_credentials_at_all_are_refused_and_say_so(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    done = videoflow("ls", "--nats-url", secured["token"].url, env=env)
    assert_refused_in_one_line(done)
    assert "presented: no credentials" in done.stderr


@pytest.mark.parametrize("method", METHODS)
def test_a_run_and_its_replicas_connect_with_the_right_credentials(
        secured: dict[str, Secured], method: str, env: dict[str, str]) -> None:
    broker = secured[method]
    done = videoflow("run", "flows:chain", "--nats-url", broker.url, "--json", *broker.right,
                     env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "completed"
    assert report["nodes"]["record"]["processed"] == 10
    assert_no_secret(done, broker)


def test_a_run_with_a_wrong_password_is_refused_in_one_line_not_after_the_provision_timeout(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    broker = secured["password"]
    started = time.monotonic()
    done = videoflow("run", "flows:chain", "--nats-url", broker.url, "--json",
                     *broker.wrong, env=env)
    assert time.monotonic() - started < 20  # provisioning would wait 30 s
    assert_refused_in_one_line(done)
    assert "presented: user 'vf' and a password" in done.stderr
    assert_no_secret(done, broker)


def test_a_secret_in_the_url_is_refused_and_masked(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    broker = secured["token"]
    wrong = broker.secrets[1]
    done = videoflow("ls", "--nats-url", f"nats://{wrong}@127.0.0.1:{broker.server.port}",
                     env=env)
    assert_refused_in_one_line(done)
    assert "nats://***@127.0.0.1" in done.stderr
    assert_no_secret(done, broker)


def test_the_library_runs_a_flow_with_credentials_from_the_environment(
        secured: dict[str, Secured], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import flows

    broker = secured["nkey"]
    monkeypatch.setenv(NKEY_ENV, broker.right[1])
    monkeypatch.setenv("VF_TEST_OUT", str(tmp_path))
    monkeypatch.setenv("VF_TEST_COUNT", "10")
    report = flows.chain().run(broker.url, view=False)
    assert report.outcome == "completed"
    assert report.nodes["record"].processed == 10


@pytest.mark.asyncio
async def test_the_library_connect_raises_credentials_refused(
        secured: dict[str, Secured], monkeypatch: pytest.MonkeyPatch) -> None:
    broker = secured["password"]

    async def quiet(_error: BaseException) -> None:
        return None

    monkeypatch.setenv(USER_ENV, "vf")
    monkeypatch.setenv(PASSWORD_ENV, broker.secrets[1])
    with pytest.raises(CredentialsRefused, match="refused the credentials") as refused:
        await link.connect(broker.url, 5.0, quiet)
    assert not refused.value.retryable
    assert broker.secrets[1] not in str(refused.value)
    monkeypatch.setenv(PASSWORD_ENV, broker.secrets[0])
    client = await link.connect(broker.url, 5.0, quiet, link.Outage(budget=0))
    assert client.is_connected
    await client.close()


def test_a_way_given_by_flags_wins_over_another_in_the_environment(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    broker = secured["password"]
    right, wrong = broker.secrets
    done = videoflow("ls", "--nats-url", broker.url, "--user", "vf", "--password", right,
                     "--json", env={**env, TOKEN_ENV: wrong})
    assert done.returncode == 0, done.stderr
    # The flag and the variable of one way combine.
    done = videoflow("ls", "--nats-url", broker.url, "--user", "vf", "--json",
                     env={**env, PASSWORD_ENV: right})
    assert done.returncode == 0, done.stderr
    # Two ways in the environment alone are refused.
    done = videoflow("ls", "--nats-url", broker.url,
                     env={**env, USER_ENV: "vf", PASSWORD_ENV: right, TOKEN_ENV: wrong})
    assert done.returncode == 2 and "conflicting broker credentials" in done.stderr
    assert_no_secret(done, broker)


# ------------------------------------------------------------------------ contexts


def write_context(env: dict[str, str], name: str, **fields: str) -> None:
    directory = Path(env["XDG_CONFIG_HOME"]) / "nats" / "context"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps({"description": "test", **fields}))


def test_a_context_gives_the_url_and_the_credentials(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    broker = secured["password"]
    right, wrong = broker.secrets
    write_context(env, "secured", url=broker.url, user="vf", password=wrong)
    done = videoflow("ls", "--context", "secured", env=env)
    assert_refused_in_one_line(done)  # the context's URL: that broker refused
    assert f"the broker at {broker.url} refused" in done.stderr
    assert_no_secret(done, broker)
    write_context(env, "secured", url=broker.url, user="vf", password=right)
    done = videoflow("ls", "--context", "secured", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)


def test_a_run_takes_its_credentials_from_a_context_in_the_environment(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    broker = secured["nkey"]
    write_context(env, "nk", url=broker.url, nkey=broker.right[1])
    done = videoflow("run", "flows:chain", "--json", env={**env, CONTEXT_ENV: "nk"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nodes"]["record"]["processed"] == 10


def test_flags_given_win_over_the_context(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    broker = secured["password"]
    right, wrong = broker.secrets
    write_context(env, "stale", url="nats://127.0.0.1:1", user="vf", password=wrong)
    done = videoflow("ls", "--context", "stale", "--nats-url", broker.url, "--user", "vf",
                     "--password", right, "--json", env=env)
    assert done.returncode == 0, done.stderr
    done = videoflow("ls", "--context", "stale", "--nats-url", broker.url, env=env)
    assert_refused_in_one_line(done)
    assert "from the nats context 'stale'" in done.stderr
    assert_no_secret(done, broker)


def test_the_nats_cli_selected_context_is_not_applied_unasked(
        secured: dict[str, Secured], env: dict[str, str]) -> None:
    broker = secured["token"]
    write_context(env, "chosen", url=broker.url, token=broker.secrets[0])
    (Path(env["XDG_CONFIG_HOME"]) / "nats" / "context.txt").write_text("chosen")
    done = videoflow("ls", "--nats-url", broker.url, env=env)
    assert_refused_in_one_line(done)
    assert "presented: no credentials" in done.stderr


def test_an_unknown_context_is_one_line(env: dict[str, str]) -> None:
    done = videoflow("ls", "--context", "nowhere", env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"videoflow: error: no nats context 'nowhere' (no file "
        f"{env['XDG_CONFIG_HOME']}/nats/context/nowhere.json)"]


# ---------------------------------------------------------- refused before connecting


@pytest.mark.parametrize("flags, words", [
    (["--creds", "CREDS", "--nkey", "NKEY"], "a creds file .* and an nkey seed"),
    (["--token", "t0ken-x", "--user", "vf", "--password", "pw-x"],
     "a user and password .* and a token"),
    (["--user", "vf"], "a user and its password go together"),
    (["--password", "pw-lonely"], "a user and its password go together"),
])
def test_conflicting_credentials_are_refused_before_connecting(
        secured: dict[str, Secured], env: dict[str, str], flags: list[str],
        words: str) -> None:
    files = {"CREDS": secured["creds"].right[1], "NKEY": secured["nkey"].right[1]}
    done = videoflow("ls", "--nats-url", "nats://127.0.0.1:1",
                     *(files.get(flag, flag) for flag in flags), env=env)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("videoflow: error:"), done.stderr
    assert re.search(words, lines[0]), lines[0]
    assert "pw-x" not in done.stderr and "t0ken-x" not in done.stderr
    assert "pw-lonely" not in done.stderr


def test_credentials_in_the_url_and_a_flag_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in SETTING_ENV.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv(CONTEXT_ENV, raising=False)
    monkeypatch.setenv(TOKEN_ENV, "a-token")
    with pytest.raises(ValueError, match="a token .* and credentials in the URL"):
        auth_options("nats://u:p@127.0.0.1:4222")
    assert auth_options("nats://127.0.0.1:4222") == {"token": "a-token"}


def test_a_file_that_is_not_a_seed_or_creds_is_refused_without_quoting_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in SETTING_ENV.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv(CONTEXT_ENV, raising=False)
    junk = tmp_path / "junk"
    junk.write_text("SUsomething-secret-looking\n")
    monkeypatch.setenv(NKEY_ENV, str(junk))
    with pytest.raises(ValueError, match="does not hold an nkey seed") as refused:
        auth_options()
    assert "secret-looking" not in str(refused.value)
    monkeypatch.delenv(NKEY_ENV)
    monkeypatch.setenv(CREDS_ENV, str(junk))
    with pytest.raises(ValueError, match="is not a NATS creds file"):
        auth_options()


def test_without_the_nkeys_package_a_seed_names_the_package_to_install(
        secured: dict[str, Secured], monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in SETTING_ENV.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv(CONTEXT_ENV, raising=False)
    monkeypatch.setenv(NKEY_ENV, secured["nkey"].right[1])
    monkeypatch.setitem(sys.modules, "nkeys", None)  # `import nkeys` raises ImportError
    with pytest.raises(MissingDependency,
                       match=r"^a creds file or an nkey seed needs the nkeys package: "
                             r"pip install nkeys$"):
        auth_options()


def test_a_password_given_apart_from_a_url_is_masked_in_logs() -> None:
    secret = f"pw-{secrets.token_hex(6)}"
    logs.keep_secret(secret)
    assert logs.redact_text(f"auth {secret} failed; nats://tok3n@h:1") == (
        "auth *** failed; nats://***@h:1")


def test_the_connect_refusal_is_not_waited_on_by_a_retrying_provision(
        secured: dict[str, Secured], monkeypatch: pytest.MonkeyPatch) -> None:
    """provision_flow_connect retries a broker that is not there for ever; a refusal of
    the credentials ends it at once."""
    from videoflow.messaging.topology import provision_flow_connect

    monkeypatch.setenv(TOKEN_ENV, secured["token"].secrets[1])

    async def provision() -> None:
        await asyncio.wait_for(
            provision_flow_connect(secured["token"].url, [], "f", "r1", "batch"), 10)

    with pytest.raises(CredentialsRefused, match="presented: a token"):
        asyncio.run(provision())
