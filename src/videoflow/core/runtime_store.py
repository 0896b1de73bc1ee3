"""Where a FlowRuntime's records (CTRL-4) live: a small key/revision store with
compare-and-swap (RuntimeStore), here in memory; on a NATS KV bucket it is
videoflow.backends.jetstream.ledger_store.NatsKvRuntimeStore.

A store knows nothing about ledgers: it holds opaque bytes under keys, each write gets a
revision, and a write can be made conditional on the revision last read — which is all
the ledger needs for owner epochs, counters and checkpoints that two processes may race
on. Keys are dot-separated tokens of the NATS KV alphabet (``[-/_=a-zA-Z0-9]``); the
ledger escapes its own identities into that alphabet (runtime_records.key_token).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Final, TypeVar

from videoflow.errors import RevisionConflict

T = TypeVar("T")

DEFAULT_BUCKET: Final = "vf-runtime"
"""The KV bucket runtimes share when none is named: one per deployment, since keys
carry flow, run and node, and a node's ledger must be readable by its children
(their obligation ledgers read its outbox)."""

DEFAULT_TIMEOUT_SECONDS: Final = 5.0
"""The bound on one KV round trip (connect included) before it is reported as
BrokerUnavailable."""


class RuntimeStore(ABC):
    """Opaque values under keys, each write stamped with a store-wide increasing
    revision; the contract both stores keep identically."""

    @abstractmethod
    def durable_shared(self) -> bool:
        """Whether records outlive this process and are visible to other processes."""

    @abstractmethod
    def get(self, key: str) -> tuple[bytes, int] | None:
        """The value under key and its revision, or None when absent (or deleted).

        Raises:
            BrokerUnavailable: the store could not be read.
        """

    @abstractmethod
    def create(self, key: str, value: bytes) -> int:
        """Write value under key only if key is absent.

        Returns:
            the new revision.

        Raises:
            RevisionConflict: key already holds a value.
            BrokerUnavailable: the store could not be reached; the write may or may
                not have landed.
        """

    def create_many(self, items: Sequence[tuple[str, bytes]]) -> list[int | None]:
        """create() for each (key, value), as one batch where the store can: the keys
        are independent, so none waits for another's answer.

        Returns:
            per item, in order, the new revision, or None where the key already held
            a value (nothing written).

        Raises:
            BrokerUnavailable: the store could not be reached; any of the writes may
                or may not have landed.
        """
        made: list[int | None] = []
        for key, value in items:
            try:
                made.append(self.create(key, value))
            except RevisionConflict:
                made.append(None)
        return made

    @abstractmethod
    def update(self, key: str, value: bytes, expected_revision: int) -> int:
        """Replace key's value only if its current revision is expected_revision.

        Returns:
            the new revision.

        Raises:
            RevisionConflict: key was written (or deleted) since that revision.
            BrokerUnavailable: as for create.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove key; absent keys are fine.

        Raises:
            BrokerUnavailable: as for create.
        """

    @abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every present key that starts with prefix, sorted.

        Raises:
            BrokerUnavailable: the store could not be listed.
        """

    def close(self) -> None:  # noqa: B027 - a store with nothing to release keeps this
        """Release connections; the store is unusable afterwards. Idempotent."""


class MemoryRuntimeStore(RuntimeStore):
    """A thread-safe in-process store: records die with the process, so
    durable_shared() is False and the ledger refuses durability-promising writes on it
    (RUN-022)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, tuple[bytes, int]] = {}
        self._revision = 0

    def durable_shared(self) -> bool:
        return False

    def get(self, key: str) -> tuple[bytes, int] | None:
        with self._lock:
            return self._values.get(key)

    def _put(self, key: str, value: bytes) -> int:
        # Caller holds the lock. One sequence over all keys, as a KV stream has.
        self._revision += 1
        self._values[key] = (bytes(value), self._revision)
        return self._revision

    def create(self, key: str, value: bytes) -> int:
        with self._lock:
            if key in self._values:
                raise RevisionConflict(f"ledger key {key!r} already exists", key=key)
            return self._put(key, value)

    def update(self, key: str, value: bytes, expected_revision: int) -> int:
        with self._lock:
            current = self._values.get(key)
            if current is None or current[1] != expected_revision:
                found = None if current is None else current[1]
                raise RevisionConflict(
                    f"ledger key {key!r} is at revision {found}, not {expected_revision}",
                    key=key, expected_revision=expected_revision,
                )
            return self._put(key, value)

    def delete(self, key: str) -> None:
        with self._lock:
            self._values.pop(key, None)

    def keys(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(k for k in self._values if k.startswith(prefix))


__all__ = [
    "DEFAULT_BUCKET",
    "MemoryRuntimeStore",
    "RuntimeStore",
]
