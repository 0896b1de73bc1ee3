"""The processes a `videoflow run` started, read from /proc: its children, and its
replicas, whichever way the engine started them."""

from __future__ import annotations

from pathlib import Path


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for init to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def replica_pids(engine: int) -> list[int]:
    """The engine's replica processes: the forks of its replica server (its child
    running multiprocessing's forkserver), or its children that multiprocessing
    spawned (VIDEOFLOW_START_METHOD=spawn); never its resource tracker, nor the server."""
    found = []
    for pid in children_of(engine):
        line = command_line(pid)
        if b"spawn_main" in line:
            found.append(pid)
        elif b"multiprocessing.forkserver" in line:
            found += children_of(pid)
    return found


def descendants_of(pid: int) -> list[int]:
    """Every process below pid: its children, theirs, and so on."""
    found = []
    for child in children_of(pid):
        found += [child, *descendants_of(child)]
    return found
