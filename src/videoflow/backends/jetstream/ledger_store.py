"""NatsKvRuntimeStore: the FlowRuntime ledger's records on a NATS KV bucket, durable
and shared by every worker of a deployment (RFC 0006 CTRL-4). Its requests ride out
broker outages within the outage budget; a conditional write whose answer was lost is
recognised by its value."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from videoflow.broker.link import (
    Outage,
    broker_known_from_env,
    check_bucket_replicas,
    outage_budget_from_env,
    retry_until,
    transient,
    wait_back,
)
from videoflow.core.runtime_store import DEFAULT_BUCKET, DEFAULT_TIMEOUT_SECONDS, RuntimeStore
from videoflow.errors import BrokerUnavailable, IncompatibleProfile, RevisionConflict

T = TypeVar("T")


class NatsKvRuntimeStore(RuntimeStore):
    """A store on a NATS KV bucket: durable (the bucket's stream) and shared by every
    process that binds the same bucket; revisions are the stream sequences, and
    compare-and-swap is nats-py's kv.create / kv.update(last=revision)
    (NATS_FACTS §9, S13).

    Arguments:
        nats_url: the server to connect to; the store then owns its connection and
            a loop of its own (a LoopRunner). Give this or client.
        bucket: the KV bucket, bound if it exists and created (history 1) if not.
        client: an already connected nats-py client to use instead (not closed by
            close()); runner must then be the LoopRunner whose loop it runs on.
        runner: see client.
        timeout: the bound in seconds on each KV round trip; a round trip that fails
            transiently (a timeout, the broker away or electing a leader) is made again
            within the outage budget.
        outage_budget: seconds the store's own connection waits for a broker that went
            away (None: VIDEOFLOW_OUTAGE_BUDGET, else 60).
        replicas: the copies a clustered broker keeps of the bucket, when this store
            creates it (an existing bucket is bound as it is).

    Raises:
        BrokerUnavailable: the server could not be reached or the bucket neither
            bound nor created.
        IncompatibleProfile: an existing bucket keeps fewer copies than replicas.
        ValueError: neither or both of nats_url and client, or client without runner.
    """

    def __init__(self, nats_url: str | None = None, bucket: str = DEFAULT_BUCKET, *,
                 client: Client | None = None, runner: Any = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 outage_budget: float | None = None, replicas: int = 1) -> None:
        # Imported here: the loop bridge lives with the JetStream adapter, and a
        # memory-only user of the ledger should not need it loaded.
        from videoflow.broker.loop import (
            ErrorLog,
            LoopRunner,
            close_client,
            connect_fail_fast,
        )

        if (nats_url is None) == (client is None):
            raise ValueError("give exactly one of nats_url and client")
        if client is not None and runner is None:
            raise ValueError("a client needs the LoopRunner its loop runs on")
        self.bucket, self.replicas = bucket, replicas
        self._timeout = timeout
        # The store's own connection rides out a broker outage within this budget; a
        # given client's outages are its owner's, and only transient failures are
        # retried on it (TRANSIENT_RETRY_SECONDS).
        self.outage = Outage(outage_budget_from_env() if outage_budget is None
                             else outage_budget, where=str(nats_url or "the broker"),
                             known=broker_known_from_env(), what="the ledger's connection")
        self._close_client = close_client
        self._owns_client = client is None
        if client is None:
            self._runner = LoopRunner(name=f"videoflow-runtime-{bucket}")
            self._runner.start()
            try:
                client = self._runner.run(
                    connect_fail_fast(str(nats_url), timeout, ErrorLog(), self.outage),
                    self.outage.first_connect_bound(timeout * 2))
            except BaseException:
                self._runner.stop()
                raise
        else:
            self._runner = runner
        self._client: Client = client
        try:
            self._kv = self._call(self._bind, f"bind bucket {bucket!r}")
        except BaseException:
            self.close()
            raise

    async def _bind(self) -> Any:
        js = self._client.jetstream(timeout=self._timeout)
        try:
            kv = await js.key_value(self.bucket)
        except nats.js.errors.BucketNotFoundError:
            # Creating with the same config twice is fine (§9), so two processes
            # racing here both end up bound to the one bucket.
            kv = await js.create_key_value(bucket=self.bucket, history=1,
                                           replicas=self.replicas)
        await check_bucket_replicas(js, f"KV_{self.bucket}", self.bucket, self.replicas)
        return kv

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]], what: str,
              landed: Callable[[], T | None] | None = None) -> T:
        """make()'s coroutine run on the store's loop, made again while it fails
        transiently (a timeout, the broker away or between two leaders) within the
        connection's outage budget (broker.link.retry_until).

        Arguments:
            make: makes the request's coroutine (one per attempt).
            what: the request, for error messages.
            landed: for a conditional write: after a retry answered 'wrong last
                sequence', whether the earlier attempt had landed after all (its
                revision, else None) — a timed-out write may have been stored.
        """
        started, retried = time.monotonic(), False
        while True:
            try:
                return self._runner.run(make(), self._timeout * 2)
            except (RevisionConflict, BrokerUnavailable, IncompatibleProfile):
                raise
            except nats.js.errors.KeyWrongLastSequenceError:
                if retried and landed is not None:
                    revision = landed()
                    if revision is not None:
                        return revision
                raise  # mapped by the callers, which know the key and revision
            except nats.js.errors.InvalidKeyError as error:
                # A caller's bug (FlowRuntime escapes its keys), not the broker's state.
                raise ValueError(f"runtime store {self.bucket!r}: {what}: not a KV key") from error
            except (TimeoutError, nats.errors.Error, OSError) as error:
                until = retry_until(self.outage, started)
                if transient(error) and time.monotonic() < until:
                    retried = True
                    wait_back(self._client, self.outage, until)
                    continue
                reason = self.outage.given_up or f"{type(error).__name__}: {error}"
                raise BrokerUnavailable(
                    f"runtime store {self.bucket!r}: {what} failed: {reason}",
                    code=getattr(error, "err_code", None),
                ) from error

    def _holds(self, key: str, value: bytes) -> int | None:
        """The revision of key if it holds exactly value (a write of it landed)."""
        found = self.get(key)
        return found[1] if found is not None and found[0] == bytes(value) else None

    def durable_shared(self) -> bool:
        return True

    def get(self, key: str) -> tuple[bytes, int] | None:
        async def read() -> tuple[bytes, int] | None:
            try:
                entry = await self._kv.get(key)
            except nats.js.errors.KeyNotFoundError:  # absent, or a delete marker
                return None
            return bytes(entry.value or b""), int(entry.revision)

        return self._call(read, f"get {key!r}")

    def create(self, key: str, value: bytes) -> int:
        try:
            return int(self._call(lambda: self._kv.create(key, bytes(value)), f"create {key!r}",
                                  lambda: self._holds(key, value)))
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise RevisionConflict(f"ledger key {key!r} already exists", key=key) from error

    def create_many(self, items: Sequence[tuple[str, bytes]]) -> list[int | None]:
        """All the creates in one round of the loop: each an independent KV publish,
        awaited together, so a batch costs about one round trip, not one each."""
        if not items:
            return []

        async def one(key: str, value: bytes) -> int | None:
            try:
                return int(await self._kv.create(key, value))
            except nats.js.errors.KeyWrongLastSequenceError:
                return None

        async def every() -> list[int | None]:
            return list(await asyncio.gather(*(one(k, bytes(v)) for k, v in items)))

        return self._call(every, f"create {len(items)} keys from {items[0][0]!r}")

    def update(self, key: str, value: bytes, expected_revision: int) -> int:
        if expected_revision <= 0:
            # nats-py turns last=0/None into create-only (S13): never let a bad
            # revision silently become a different operation.
            raise ValueError(f"expected_revision must be > 0, got {expected_revision}")
        try:
            return int(self._call(
                lambda: self._kv.update(key, bytes(value), last=expected_revision),
                f"update {key!r}", lambda: self._holds(key, value)))
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise RevisionConflict(
                f"ledger key {key!r} is no longer at revision {expected_revision}",
                key=key, expected_revision=expected_revision,
            ) from error

    def delete(self, key: str) -> None:
        self._call(lambda: self._kv.delete(key), f"delete {key!r}")

    def keys(self, prefix: str) -> list[str]:
        async def scan() -> list[str]:
            from videoflow.broker.listing import present_keys

            return await present_keys(self._client.jetstream(timeout=self._timeout),
                                      self.bucket, prefix)

        return self._call(scan, f"list {prefix!r}")

    def close(self) -> None:
        if not self._owns_client or not self._runner.running:
            return
        try:
            self._runner.run(self._close_client(self._client), self._timeout * 2)
        except Exception:  # a failed close leaves nothing to do
            pass
        finally:
            self._runner.stop()


__all__ = ["NatsKvRuntimeStore"]
