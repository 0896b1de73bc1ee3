"""`videoflow -v --log-format json run` with its broker SIGKILLed and started again on
the same port and store mid-run: the run completes, and the replica processes' own
connections say on the command's stderr, as JSON lines, that they lost the broker and
that it came back (videoflow.broker.link; tests/integration/test_link_logs.py holds
the same for one connection, record by record)."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from broker_faults import Fault, strike_when
from test_cli import HELPERS, command, environment

from videoflow.broker import server as embedded

PASSWORD = "outage-pw-7"
CREDENTIALS = ("--user", "flow", "--pass", PASSWORD)
COUNT = 1500


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def kill_and_restart_guarded(server: embedded.EmbeddedServer, port: int,
                             down: float) -> Callable[[Fault], None]:
    """SIGKILL the server, and start it again `down` seconds later on its port and
    store, taking the same credentials."""

    def act(fault: Fault) -> None:
        assert server.process is not None and server.store_dir is not None
        server.process.kill()
        server.process.wait()
        fault.struck_at = time.monotonic()
        time.sleep(down)
        fault.servers.append(embedded.start(server.store_dir,
                                            extra_args=(*CREDENTIALS, "-p", str(port))))
        fault.recovered_at = time.monotonic()

    return act


@pytest.mark.timeout(180)
def test_a_broker_restarted_mid_run_is_logged_lost_and_back_by_each_replica_as_json(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    server = embedded.start(tmp_path / "store", extra_args=CREDENTIALS)
    port = _port(server.url)
    url = f"nats://flow:{PASSWORD}@127.0.0.1:{port}"
    # The producer is paced (about 3 s in all) so that it, too, is mid-stream when the
    # broker goes.
    env = environment(out, count=COUNT, pace=0.002)
    try:
        with strike_when(out, 200, kill_and_restart_guarded(server, port, 3.0)) as fault:
            engine = subprocess.Popen(
                command("-v", "--log-format", "json", "run", "flows:chain", "--nats-url",
                        url, "--json"),
                cwd=HELPERS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            stdout, stderr = engine.communicate(timeout=150)
    finally:
        server.stop()
    assert fault.error is None and fault.recovered_at is not None
    assert engine.returncode == 0, stderr
    assert json.loads(stdout)["outcome"] == "completed"
    assert PASSWORD not in stderr

    records: list[dict[str, Any]] = [json.loads(line) for line in stderr.splitlines()
                                     if line.strip()]  # every line is one JSON record
    link = [r for r in records if r["logger"] == "videoflow.broker.link"]
    where = f"nats://flow:***@127.0.0.1:{port}"
    lost = [r for r in link if r["message"].startswith("lost ")]
    back = [r for r in link if " is back after " in r["message"]]
    # Nothing else, but a request retried once the broker is back and JetStream not yet
    # ready (at most one line per connection, not seen in practice): no error.
    others = [r for r in link if r not in lost and r not in back]
    assert all(r["message"].startswith(f"a request to the broker at {where} failed with "
                                       "the connection up") for r in others), others
    assert all(r["level"] == "WARNING" for r in link), link
    # Each names which of its process's connections it is about.
    named = ("the messaging connection", "the payload store's connection",
             "the ledger's connection")
    assert all(r["message"] in [f"lost {what} to the broker at {where}; reconnecting for up "
                                "to 60 s (the outage budget)" for what in named]
               for r in lost), lost
    assert all(any(r["message"].startswith(f"{what} to the broker at {where} is back after ")
                   for what in named) for r in back), back
    assert any(r["message"].startswith("lost the messaging connection") for r in lost), lost
    # Logged in the replicas' processes (the producer, the scaler and the sink), one
    # line per connection and transition: each connection lost is back once.
    by_pid_lost, by_pid_back = Counter(r["pid"] for r in lost), Counter(r["pid"] for r in back)
    assert len(by_pid_lost) >= 2, lost
    assert engine.pid not in by_pid_lost
    assert by_pid_lost == by_pid_back
    assert all(n <= 3 for n in by_pid_lost.values()), by_pid_lost
    # Each record names the replica whose process logged it, one replica per process.
    replicas = {(r["pid"], r["replica"]) for r in lost + back}
    assert {replica for _, replica in replicas} <= {"numbers[0]", "scale[0]", "record[0]"}
    assert len(replicas) == len(by_pid_lost), replicas
    # And no connection says it twice: one line per connection and change.
    assert len({(r["pid"], r["message"]) for r in lost}) == len(lost), lost
