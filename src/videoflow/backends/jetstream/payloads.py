"""NatsObjectPayloadStore: the payload store of workers spread over hosts, a JetStream
object store for the bytes and a KV bucket for the obligation records, shared by every
worker on the broker (BLOB-14, PAY-004, PAY-006). Its requests ride out broker outages
within the outage budget, as every connection of videoflow does."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar, cast

import nats
import nats.errors
import nats.js.errors
from nats.js.api import ObjectStoreConfig
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from videoflow.backends.jetstream.objects import (
    chunk_bytes,
    chunk_subject,
    get_object,
    object_info,
    put_object,
)
from videoflow.backends.payload import (
    REF_PATTERN,
    Change,
    PayloadRecord,
    PayloadStore,
    apply_change,
)
from videoflow.broker.failures import JSErrorCode
from videoflow.broker.link import (
    Outage,
    broker_known_from_env,
    check_bucket_replicas,
    connect,
    outage_budget_from_env,
    redact_url,
    retry_until,
    transient,
    wait_back,
)
from videoflow.broker.listing import present_keys, present_objects
from videoflow.broker.loop import ErrorLog, LoopRunner
from videoflow.errors import BrokerUnavailable, UnobservableState

T = TypeVar("T")

_CAS_ATTEMPTS: Final = 64
_WRONG_LAST_CODES: Final = (JSErrorCode.WRONG_LAST_SEQUENCE,
                             JSErrorCode.WRONG_LAST_SEQUENCE_CONSTANT)


class NatsObjectPayloadStore(PayloadStore):
    """A PayloadStore on a NATS JetStream broker: bytes in the object store
    ``<bucket>``, records in the KV bucket ``<bucket>-obligations``.

    Record changes are compare-and-swap on the KV revision (NATS_FACTS §9: ``update``
    with ``last``, ``create`` for a new key, ``delete`` with ``last``), so workers on
    any host sharing the broker never lose a release nor reclaim twice. nats-py is
    asyncio only: the store keeps its own loop (a LoopRunner, which the waiting
    caller's thread runs) and every public method waits for its call there, bounded
    by timeout.

    Arguments:
        nats_url: e.g. ``nats://127.0.0.1:4222``.
        bucket: the object store's name ([A-Za-z0-9_-]).
        timeout: seconds each call may take (a 25 MB put is ~200 chunk publishes); a
            call that fails transiently (a timeout, the broker away or electing a
            leader) is made again within the connection's outage budget.
        replicas: the copies a clustered broker keeps of the buckets, when this store
            creates them (existing ones are bound as they are).
        outage_budget: seconds the connection waits for a broker that went away (None:
            VIDEOFLOW_OUTAGE_BUDGET, else 60).
        **options: PayloadStore's (flow_type, ttl_seconds, clock).

    Raises:
        BrokerUnavailable: no connection within timeout, or JetStream refused to
            create the buckets.
        IncompatibleProfile: an existing bucket keeps fewer copies than replicas.
    """

    def __init__(
        self,
        nats_url: str,
        bucket: str = "videoflow-payloads",
        *,
        timeout: float = 30.0,
        replicas: int = 1,
        outage_budget: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.bucket, self.replicas = bucket, replicas
        self.timeout = timeout
        self.outage = Outage(outage_budget_from_env() if outage_budget is None
                             else outage_budget, where=nats_url,
                             known=broker_known_from_env(),
                             what="the payload store's connection")
        self._errors = ErrorLog()
        self._runner = LoopRunner(name=f"videoflow-payload-{bucket}")
        self._runner.start()
        try:
            # Fail fast on the first connect (NATS_FACTS S4), then ride out outages.
            self._nc = self._runner.run(
                connect(nats_url, min(timeout, 5.0), self._errors.record, self.outage),
                self.outage.first_connect_bound(timeout))
        except (OSError, asyncio.TimeoutError, nats.errors.Error, BrokerUnavailable) as error:
            self._runner.stop()
            raise BrokerUnavailable(
                f"payload store could not open {bucket!r} on {redact_url(nats_url)}: {error!r} "
                f"(reported: {self._errors.texts()})",
                code=getattr(error, "err_code", None),
            ) from error
        try:
            # Connected, the buckets are bound as every request here is made: again while
            # it fails transiently, a cluster electing its meta leader included (its
            # JetStream API does not answer until the others elect one). For as long as
            # the outage budget, as a broker away would be waited for: on a loaded host
            # an election outlasted the TRANSIENT_RETRY_SECONDS of a single request.
            self._objects, self._kv = self._call(self._buckets, f"open of bucket {bucket!r}",
                                                 patience=self.outage.budget)
        except BaseException:
            self.close()
            raise

    async def _buckets(self) -> tuple[ObjectStore, KeyValue]:
        js = self._nc.jetstream()
        # S19: the bucket name goes positionally.
        objects = await js.create_object_store(
            self.bucket, config=ObjectStoreConfig(replicas=self.replicas))
        kv = await js.create_key_value(bucket=f"{self.bucket}-obligations", history=1,
                                       replicas=self.replicas)
        await check_bucket_replicas(js, f"OBJ_{self.bucket}", self.bucket, self.replicas)
        await check_bucket_replicas(js, f"KV_{self.bucket}-obligations",
                                    f"{self.bucket}-obligations", self.replicas)
        return objects, kv

    @property
    def max_payload(self) -> int:
        """The connected server's max_payload (from its INFO), for inline_threshold."""
        return int(self._nc.max_payload)

    def close(self) -> None:
        if not self._runner.running:
            return
        with contextlib.suppress(TimeoutError, nats.errors.Error, BrokerUnavailable):
            self._runner.run(self._nc.close(), self.timeout)
        self._runner.stop()

    def _call(self, make: Callable[[], Coroutine[Any, Any, T]], what: str,
              patience: float = 0.0) -> T:
        """Runs make()'s coroutine on the store's loop, made again while it fails
        transiently within the outage budget, or patience seconds from the first try
        when that is longer (every call here is a read, an idempotent write or a
        compare-and-swap that reads first); every other failure becomes a typed,
        retryable error (a timed-out change may still have happened: its outcome is
        unknown)."""
        started = time.monotonic()
        while True:
            try:
                return self._call_once(make(), what)
            except (UnobservableState, BrokerUnavailable) as error:
                until = retry_until(self.outage, started)
                if until:  # 0.0: the connection was given up
                    until = max(until, started + patience)
                cause = error.__cause__
                if (cause is None or not transient(cause)) or time.monotonic() >= until:
                    raise
                wait_back(self._nc, self.outage, until)

    def _call_once(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        try:
            return self._runner.run(coro, self.timeout)
        except TimeoutError as error:
            raise UnobservableState(
                f"payload store: {what} did not finish within {self.timeout}s",
                reason="timeout",
                detail=str(error),
            ) from error
        except (nats.errors.ConnectionClosedError, nats.errors.NoServersError) as error:
            raise BrokerUnavailable(f"payload store: {what}: {error!r}") from error
        except nats.js.errors.APIError as error:
            raise UnobservableState(
                f"payload store: {what} refused by JetStream",
                reason="api",
                detail=f"{error!r} code={error.err_code}",
            ) from error
        except nats.errors.Error as error:
            raise BrokerUnavailable(f"payload store: {what}: {error!r}") from error

    async def _get_entry(self, ref: str) -> tuple[PayloadRecord | None, int]:
        try:
            entry = await self._kv.get(ref)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        if entry.value is None:
            return None, 0
        return PayloadRecord.from_json(entry.value, ref), int(entry.revision or 0)

    async def _transact_async(self, ref: str, change: Change[T]) -> tuple[T, bool]:
        for _ in range(_CAS_ATTEMPTS):
            old, revision = await self._get_entry(ref)
            new, result, write = apply_change(old, change)
            if not write:
                return result, False
            try:
                if new is None:
                    await self._kv.delete(ref, last=revision)
                elif old is None:
                    await self._kv.create(ref, new.to_json())
                else:
                    await self._kv.update(ref, new.to_json(), last=revision)
            except nats.js.errors.BadRequestError as error:
                if isinstance(error, nats.js.errors.KeyWrongLastSequenceError) or (
                    error.err_code in _WRONG_LAST_CODES
                ):
                    continue  # someone else changed the record first: read it again
                raise
            return result, new is None
        raise UnobservableState(
            f"payload {ref}: record still contended after {_CAS_ATTEMPTS} attempts",
            reason="api",
        )

    def _transact(self, ref: str, change: Change[T]) -> tuple[T, bool]:
        return self._call(lambda: self._transact_async(ref, change), f"record change of {ref}")

    def _read_record(self, ref: str) -> PayloadRecord | None:
        return self._call(lambda: self._get_entry(ref), f"record read of {ref}")[0]

    def _write_blob(self, ref: str, data: bytes) -> None:
        js, attempts = self._nc.jetstream(timeout=self.timeout), itertools.count()
        chunk = chunk_bytes(self.max_payload)

        async def put() -> None:
            # A retry may follow a put whose meta message was written after all: its
            # chunks go once the new ones are in place, as nats-py's put does.
            earlier = await object_info(js, self.bucket, ref) if next(attempts) else None
            await put_object(js, self.bucket, ref, data, chunk, self.timeout)
            if earlier is not None and earlier.nuid:
                await js.purge_stream(f"OBJ_{self.bucket}",
                                      subject=chunk_subject(self.bucket, earlier.nuid))

        self._call(put, f"put of {ref}")

    def _read_blob(self, ref: str) -> bytes | None:
        js = self._nc.jetstream(timeout=self.timeout)
        # One buffer filled in place (a read-only view of it is what view() hands out):
        # no copy beyond the one off the socket.
        read = self._call(lambda: get_object(js, self.bucket, ref, self.timeout),
                          f"get of {ref}")
        return cast("bytes | None", read)  # a bytearray: bytes-like, wrapped as it is

    def _drop_blob(self, ref: str) -> None:
        async def drop() -> None:
            with contextlib.suppress(nats.js.errors.ObjectNotFoundError):
                await self._objects.delete(ref)

        self._call(drop, f"delete of {ref}")

    def _list_refs(self) -> list[str]:
        async def keys() -> list[str]:
            # Not kv.keys(): its watcher can miss keys (videoflow.broker.listing).
            return await present_keys(self._nc.jetstream(timeout=self.timeout),
                                      f"{self.bucket}-obligations")

        return [ref for ref in self._call(keys, "listing refs") if REF_PATTERN.match(ref)]

    def _list_blobs(self) -> list[str]:
        async def names() -> list[str]:
            # Not objects.list(): its watcher can miss objects (broker.listing). A
            # deleted object keeps its metadata, flagged (NATS_FACTS §9).
            return await present_objects(self._nc.jetstream(timeout=self.timeout),
                                         self.bucket)

        return self._call(names, "listing blobs")


__all__ = ["NatsObjectPayloadStore"]
