"""Hosts on this machine, for the tests of flows that span hosts (issue 44): each a
network namespace with an address of its own on a private subnet, joined to the others
by a bridge in a namespace of its own, and a mount namespace with a private /dev/shm,
so neither a socket nor a shared-memory file crosses from one host to another except
over that network. Nothing is routed outside it, and everything made is undone on
exit: processes killed, namespaces (and with them their links) deleted.

Making namespaces needs root and iproute2 (CI runs as root); where they cannot be made,
unavailable() says why, for the tests to skip with.

A host runs commands through nsenter into a holder process (sleep), which keeps its
mount namespace and /dev/shm alive for as long as the host is up, at a lower priority
than the rest of the machine (NICENESS).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

SUBNET = "10.213.{}"
"""The hosts' /24, its third part drawn per Hosts: a private range, only ever assigned
inside the namespaces made here."""


NICENESS = 15
"""What runs on a host runs at this niceness: three hosts' servers and workers are a
machine's worth of processes, and the suite's other tests, timing real-time cameras
beside them on the same cores, go first. A host's flow only takes longer."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def unavailable() -> str | None:
    """Why hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    name = f"vfprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class Host:
    """One host: its name, its address, and how to run a command on it."""

    def __init__(self, name: str, netns: str, address: str) -> None:
        self.name, self.netns, self.address = name, netns, address
        self.holder: subprocess.Popen[str] | None = None
        self.processes: list[subprocess.Popen[Any]] = []

    def start(self) -> None:
        # The holder mounts a fresh tmpfs on /dev/shm in a mount namespace of its own
        # (inside the host's network namespace), then waits: what runs through it sees
        # that /dev/shm, and no other host's.
        self.holder = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation",
             "private", "sh", "-c",
             "mount -t tmpfs -o size=1g tmpfs /dev/shm && echo ready && exec sleep infinity"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"host {self.name} did not start: "
                               f"{self.holder.stderr.read() if self.holder.stderr else ''}")

    def command(self, *args: str, cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """args as run on this host (its network and its /dev/shm), in cwd (entering a
        mount namespace leaves the directory at its root otherwise)."""
        assert self.holder is not None
        return ["nsenter", "-t", str(self.holder.pid), "-m", "-n",
                f"--wd={Path(cwd or os.getcwd()).resolve()}", "nice", "-n", str(NICENESS),
                *args]

    def popen(self, *args: str, cwd: str | os.PathLike[str] | None = None,
              **options: Any) -> subprocess.Popen[Any]:
        """Start args on this host; killed when the hosts are torn down."""
        process = subprocess.Popen(self.command(*args, cwd=cwd), **options)
        self.processes.append(process)
        return process

    def run(self, *args: str, timeout: float = 60, cwd: str | os.PathLike[str] | None = None,
            **options: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args, cwd=cwd), capture_output=True, text=True,
                              timeout=timeout, **options)

    def stop(self) -> None:
        for process in [*self.processes, *([self.holder] if self.holder else [])]:
            if process.poll() is None:
                process.kill()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.processes = []
        self.holder = None


class Hosts:
    """count hosts (a, b, c, ...) on a bridge; a context manager.

    Attributes:
        hosts: by name.
        tag: the prefix of every namespace and link made (for the teardown check).
    """

    def __init__(self, count: int = 3) -> None:
        self.tag = f"vf{secrets.token_hex(2)}"
        self.subnet = SUBNET.format(secrets.randbelow(200) + 20)
        self.switch = f"{self.tag}s"
        self.hosts = {chr(ord("a") + i): Host(chr(ord("a") + i), f"{self.tag}{chr(97 + i)}",
                                              f"{self.subnet}.{i + 1}") for i in range(count)}

    def __enter__(self) -> Hosts:
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts.values():
                inside, outside = f"{host.netns}e", f"{host.netns}p"
                _ip("netns", "add", host.netns)
                _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
                _ip("link", "set", inside, "netns", host.netns)
                _ip("link", "set", outside, "netns", self.switch)
                _ip("-n", self.switch, "link", "set", outside, "master", "br0", "up")
                _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", inside)
                _ip("-n", host.netns, "link", "set", inside, "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
                host.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        for host in self.hosts.values():
            host.stop()
        for name in [*(h.netns for h in self.hosts.values()), self.switch]:
            _ip("netns", "del", name, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this Hosts still there (none after close)."""
        found = [line for line in _ip("netns", "list", check=False).stdout.splitlines()
                 if line.startswith(self.tag)]
        found += [line for line in _ip("-o", "link", check=False).stdout.splitlines()
                  if self.tag in line]
        return found


def nats_server_config(host: Host, peers: list[Host], store: Path) -> str:
    """A cluster node's configuration: clients and routes on the host's address,
    routes to every peer, JetStream on store, frame-sized messages."""
    routes = ", ".join(f"nats-route://{peer.address}:6222" for peer in peers)
    return (f"server_name: {host.name}\n"
            f"listen: {host.address}:4222\n"
            f"max_payload: 8MB\n"
            f"jetstream {{ store_dir: \"{store}\" }}\n"
            f"cluster {{ name: vf, listen: {host.address}:6222, routes: [{routes}] }}\n")


def start_cluster(hosts: Hosts, root: Path, binary: str) -> dict[str, subprocess.Popen[Any]]:
    """One nats-server per host, routed to the others; returns them by host name once
    each logs that it is ready (JetStream's meta leader comes after: wait_jetstream)."""
    servers = {}
    all_hosts = list(hosts.hosts.values())
    for host in all_hosts:
        config = root / f"{host.name}.conf"
        config.write_text(nats_server_config(
            host, [p for p in all_hosts if p is not host], root / f"store-{host.name}"))
        log = open(root / f"{host.name}.log", "w")  # noqa: SIM115 - the server's for good
        servers[host.name] = host.popen(binary, "-c", str(config), stdout=log,
                                        stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    for host in all_hosts:
        log_path = root / f"{host.name}.log"
        while "Server is ready" not in log_path.read_text():
            if time.monotonic() > deadline or servers[host.name].poll() is not None:
                raise RuntimeError(f"nats-server on {host.name}: {log_path.read_text()[-800:]}")
            time.sleep(0.05)
    return servers


def cluster_url(hosts: Hosts) -> str:
    return ",".join(f"nats://{h.address}:4222" for h in hosts.hosts.values())
