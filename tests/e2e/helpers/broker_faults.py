"""Faults applied to a running broker from outside, mid-run: SIGKILL and a restart on the
same port and store, SIGSTOP and SIGCONT. A fault strikes once a sink has applied a
given number of groups (read from its output directory), so it lands mid-stream whatever
the machine's speed."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from videoflow.broker import server as embedded
from videoflow.core.node import ProducerNode


def applied_count(out: Path) -> int:
    """How many groups a Record sink has applied so far (one file each, plus its log)."""
    return sum(1 for p in out.iterdir()
               if p.name != "applications.log" and not p.name.endswith(".partial"))


def restartable(store: Path) -> embedded.EmbeddedServer:
    """An embedded server on store whose port stays its own across restarts."""
    return embedded.start(store)


def restart_on_same_port(server: embedded.EmbeddedServer) -> embedded.EmbeddedServer:
    """A new server on the store and port of one that died: clients that reconnect to
    the old URL find it. (The last -p on the command line wins.)"""
    assert server.store_dir is not None
    return embedded.start(server.store_dir, extra_args=("-p", str(_port(server.url))))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@dataclass
class Fault:
    """What happened to the broker, for the test to assert on."""

    struck_at: float | None = None
    recovered_at: float | None = None
    servers: list[embedded.EmbeddedServer] = field(default_factory=list)
    error: BaseException | None = None


@contextlib.contextmanager
def strike_when(out: Path, applied: int, action: Callable[[Fault], None],
                give_up: float = 120.0,
                also: Callable[[], bool] = lambda: True) -> Iterator[Fault]:
    """Run action once the sink writing into out has applied `applied` groups and
    `also` holds (in a thread), and make sure whatever it started is stopped at the
    end."""
    fault = Fault()
    done = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + give_up
        while not done.is_set() and time.monotonic() < deadline:
            if applied_count(out) >= applied and also():
                try:
                    action(fault)
                except BaseException as error:  # reported by the test, not lost
                    fault.error = error
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield fault
    finally:
        done.set()
        thread.join(timeout=give_up)
        for server in fault.servers:
            server.stop()


def kill_and_restart(server: embedded.EmbeddedServer, down: float) -> Callable[[Fault], None]:
    """SIGKILL the server, and start it again on its port and store `down` seconds
    later."""

    def act(fault: Fault) -> None:
        assert server.process is not None
        server.process.kill()
        server.process.wait()
        fault.struck_at = time.monotonic()
        time.sleep(down)
        fault.servers.append(restart_on_same_port(server))
        fault.recovered_at = time.monotonic()

    return act


def freeze(server: embedded.EmbeddedServer, seconds: float) -> Callable[[Fault], None]:
    """SIGSTOP the server for `seconds`, then SIGCONT."""

    def act(fault: Fault) -> None:
        assert server.process is not None
        pid = server.process.pid
        os.kill(pid, signal.SIGSTOP)
        fault.struck_at = time.monotonic()
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        fault.recovered_at = time.monotonic()

    return act


def kill_for_good(server: embedded.EmbeddedServer) -> Callable[[Fault], None]:
    """SIGKILL the server and leave it down."""

    def act(fault: Fault) -> None:
        assert server.process is not None
        server.process.kill()
        server.process.wait()
        fault.struck_at = time.monotonic()

    return act


class CountThenMark(ProducerNode):
    """0 .. count-1 with event times, then a marker file once its stream has ended (the
    fault can wait for it: whatever then goes missing was already on the broker). The
    file is written at close(), which the task calls once the end of stream it published
    after the last next() was accepted -- not at that next(), which comes before."""

    def __init__(self, count: int, marker: str, **options: Any) -> None:
        super().__init__(**options)
        self.count, self.marker, self.i = count, marker, 0

    def close(self) -> None:
        if self.i >= self.count:
            Path(self.marker).write_text("ended")

    def next(self) -> int:
        if self.i >= self.count:
            raise StopIteration
        value, self.i = self.i, self.i + 1
        assert self.context is not None
        self.context.set_event_timestamp(1000.0 + value)
        return value
