"""The FlowRuntime ledger's contract, as plain functions over a runtime factory.

tests/unit/test_flow_runtime.py runs them on the memory store and
tests/integration/test_flow_runtime_kv.py on a NATS KV bucket: where the behaviour
is meant to be the same, the same bodies assert it. A factory is called as
make(node="join", replica_id=0) and returns a fresh, unclaimed FlowRuntime over the
one store under test (for KV: over a fresh connection to the same bucket, so a
second runtime is what a restarted process would see).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from videoflow.core.runtime import FlowRuntime
from videoflow.core.runtime_records import Publication
from videoflow.errors import LedgerError, RevisionConflict, SupersededOwner


class Factory(Protocol):
    def __call__(self, node: str = "join", replica_id: int = 0) -> FlowRuntime: ...


def claimed(make: Factory, node: str = "join", replica_id: int = 0) -> FlowRuntime:
    runtime = make(node=node, replica_id=replica_id)
    runtime.claim_owner()
    return runtime


# Identities a ledger must carry verbatim although the KV key alphabet is
# [-/_=.a-zA-Z0-9]: MSGID-5 ids, dotted trace keys, spaces, escapes, unicode, empty.
ODD_IDS = ["join:3:17", "trace.a.b:4", "has space", "=41", "kamera-ü", "", "a/b_c-d"]


def check_outbox_round_trips(make: Factory) -> None:
    runtime = claimed(make)
    entered = runtime.record_publication("join:1:1", ["ref-a", "ref-b"], ["child", "intent/x"])
    assert entered == Publication("join:1:1", ("ref-a", "ref-b"), ("child", "intent/x"),
                                  "unresolved", None, epoch=1)
    runtime.record_publication("join:1:2", ["ref-c"], ["child"])
    runtime.record_publication("join:1:3")

    # A retried send records nothing new: the first entry stands.
    assert runtime.record_publication("join:1:1", ["other"]) == entered

    accepted = runtime.resolve_publication("join:1:1", stream_seq=42)
    assert (accepted.status, accepted.stream_seq) == ("accepted", 42)
    assert runtime.resolve_publication("join:1:1", stream_seq=42) == accepted
    refused = runtime.resolve_publication("join:1:2", stream_seq=None)
    assert (refused.status, refused.stream_seq) == ("refused", None)

    by_id = {p.publication_id: p for p in runtime.outbox()}
    assert by_id == {"join:1:1": accepted, "join:1:2": refused,
                     "join:1:3": Publication("join:1:3", epoch=1)}
    assert runtime.publication("join:1:3") == by_id["join:1:3"]
    assert runtime.publication("join:9:9") is None

    # A child reads its parent's outbox from the same run ledger (obligations).
    child = make(node="child")
    assert {p.publication_id for p in child.outbox(node="join")} == set(by_id)
    assert child.outbox() == []

    runtime.forget_publication("join:1:3")
    assert [p.publication_id for p in runtime.outbox()] == ["join:1:1", "join:1:2"]


def check_resolution_is_final(make: Factory) -> None:
    runtime = claimed(make)
    runtime.record_publication("p1")
    runtime.resolve_publication("p1", stream_seq=7)
    with pytest.raises(LedgerError, match="already accepted"):
        runtime.resolve_publication("p1", stream_seq=None)
    with pytest.raises(LedgerError, match="already accepted"):
        runtime.resolve_publication("p1", stream_seq=8)
    with pytest.raises(KeyError, match="no publication 'p2'"):
        runtime.resolve_publication("p2", stream_seq=1)
    assert runtime.publication("p1") == Publication("p1", status="accepted", stream_seq=7,
                                                    epoch=1)


def check_a_resolution_someone_else_wrote_first_is_judged_on_a_fresh_read(
        make: Factory) -> None:
    # Replica 0 entered p1 and remembers the revision it wrote; replica 1 refuses it
    # meanwhile (the outbox is the node's, shared by its replicas). Replica 0's
    # resolution must not overwrite that: its revision is stale, and the fresh read
    # finds p1 already refused.
    first, second = claimed(make), make(replica_id=1)
    second.claim_owner()
    first.record_publication("p1", ["ref"], ["child"])
    second.resolve_publication("p1", stream_seq=None)
    with pytest.raises(LedgerError, match="already refused"):
        first.resolve_publication("p1", stream_seq=7)
    assert first.resolve_publication("p1", stream_seq=None).status == "refused"
    assert first.publication("p1") == Publication("p1", ("ref",), ("child",), "refused",
                                                  epoch=1)


def check_attempts_count_and_survive_a_new_runtime(make: Factory) -> None:
    runtime = claimed(make)
    assert runtime.attempts("in-1") == 0
    assert [runtime.count_attempt("in-1") for _ in range(3)] == [1, 2, 3]
    assert runtime.count_attempt("in-2") == 1

    # Attempt counts are the node's, not the replica's: a redelivery may reach any
    # competing replica, which must see the same budget.
    other_replica = claimed(make, replica_id=1)
    assert other_replica.attempts("in-1") == 3
    assert other_replica.count_attempt("in-1") == 4

    restarted = make()
    assert (restarted.attempts("in-1"), restarted.attempts("in-2")) == (4, 1)
    restarted.claim_owner()
    restarted.clear_attempts("in-1")
    assert restarted.attempts("in-1") == 0
    assert restarted.count_attempt("in-1") == 1


def check_store_compare_and_swap_conflicts_are_typed(make: Factory) -> None:
    store = make().store
    first = store.create("cas.key", b"one")
    with pytest.raises(RevisionConflict, match="already exists") as created_twice:
        store.create("cas.key", b"two")
    assert created_twice.value.key == "cas.key"
    second = store.update("cas.key", b"two", first)
    assert second > first
    with pytest.raises(RevisionConflict, match="revision") as stale:
        store.update("cas.key", b"three", first)
    assert stale.value.expected_revision == first
    assert store.get("cas.key") == (b"two", second)
    store.delete("cas.key")
    assert store.get("cas.key") is None
    with pytest.raises(RevisionConflict):
        store.update("cas.key", b"four", second)
    store.create("cas.key", b"again")  # create works again after a delete
    assert store.get("cas.key") is not None
    assert store.keys("cas.") == ["cas.key"]


def check_store_creates_a_batch_and_skips_keys_that_exist(make: Factory) -> None:
    store = make().store
    first = store.create("many.b", b"old")
    made = store.create_many([("many.a", b"1"), ("many.b", b"2"), ("many.c", b"3")])
    assert made[1] is None  # present already: nothing written
    assert made[0] is not None and made[2] is not None and made[0] != made[2]
    assert store.get("many.a") == (b"1", made[0]) and store.get("many.c") == (b"3", made[2])
    assert store.get("many.b") == (b"old", first)
    assert store.create_many([]) == []


def check_store_lists_the_present_keys_under_a_prefix(make: Factory) -> None:
    store = make().store
    for key in ("list.a.1", "list.a.2", "list.ab.1", "list.b.1", "other.1"):
        store.create(key, b"x")
    store.delete("list.a.2")  # a delete marker is not a present key
    store.create("list.a.3", b"y")
    store.delete("list.a.3")
    store.create("list.a.3", b"z")  # present again after a delete
    assert store.keys("list.a.") == ["list.a.1", "list.a.3"]  # a token boundary
    assert store.keys("list.a") == ["list.a.1", "list.a.3", "list.ab.1"]  # not one
    assert store.keys("list.") == ["list.a.1", "list.a.3", "list.ab.1", "list.b.1"]
    assert store.keys("none.") == []


# Every write kind, as (name, call); each must be refused once superseded.
WRITES: list[tuple[str, Callable[[FlowRuntime], Any]]] = [
    ("record_publication", lambda r: r.record_publication("x:1")),
    ("resolve_publication", lambda r: r.resolve_publication("p-old", stream_seq=3)),
    ("forget_publication", lambda r: r.forget_publication("p-old")),
    ("count_attempt", lambda r: r.count_attempt("in")),
    ("clear_attempts", lambda r: r.clear_attempts("in")),
    ("log_terminal", lambda r: r.log_terminal("in", "terminal/in", "poison")),
    ("add_pending_handoff", lambda r: r.add_pending_handoff("in", "cam", "dlq down")),
    ("clear_pending_handoff", lambda r: r.clear_pending_handoff("in")),
    ("record_eos", lambda r: r.record_eos("cam", 0)),
    ("open_group", lambda r: r.open_group("g", {"cam": "m"})),
    ("close_group", lambda r: r.close_group("g")),
    ("set_source_offset", lambda r: r.set_source_offset(9)),
]


def check_a_second_owner_supersedes_the_first(make: Factory) -> None:
    first = make()
    with pytest.raises(LedgerError, match=r"claim_owner\(\) before writing"):
        first.count_attempt("in")
    assert first.claim_owner() == 1
    first.record_publication("p-old")
    second = make()
    assert second.current_epoch() == 1
    assert second.claim_owner() == 2
    assert (first.epoch, second.epoch, first.current_epoch()) == (1, 2, 2)

    refused = []
    for name, write in WRITES:
        with pytest.raises(SupersededOwner, match="epoch 1 was superseded by epoch 2") as err:
            write(first)
        assert (err.value.epoch, err.value.current_epoch) == (1, 2)
        refused.append(name)
    assert len(refused) == len(WRITES)
    # Nothing the superseded owner tried reached the ledger.
    assert second.attempts("in") == 0
    assert [p.publication_id for p in second.outbox()] == ["p-old"]

    for _name, write in WRITES:
        write(second)  # the current owner writes freely

    # Ownership is per replica: claiming replica 1 leaves replica 0's owner alone.
    assert claimed(make, replica_id=1).epoch == 1
    second.count_attempt("in")


def check_terminal_log_and_handoffs_are_listable(make: Factory) -> None:
    runtime = claimed(make)
    assert runtime.terminal_entries() == [] and runtime.pending_handoffs() == []
    runtime.log_terminal("in-1", "dlq/7", "poison")
    runtime.log_terminal("in-2", "terminal/in-2", "best effort")
    kept = runtime.log_terminal("in-1", "dlq/8", "again")  # the first record stands
    assert (kept.record_ref, kept.reason) == ("dlq/7", "poison")
    assert [(e.key, e.record_ref, e.reason, e.epoch) for e in runtime.terminal_entries()] == [
        ("in-1", "dlq/7", "poison", 1), ("in-2", "terminal/in-2", "best effort", 1)
    ]

    runtime.add_pending_handoff("in-3", "cam-a", "dlq publish unknown")
    runtime.add_pending_handoff("in-4", "cam-b", "dlq refused")
    runtime.add_pending_handoff("in-3", "cam-a", "dlq publish timed out")
    assert [(h.key, h.parent, h.reason) for h in runtime.pending_handoffs()] == [
        ("in-3", "cam-a", "dlq publish timed out"), ("in-4", "cam-b", "dlq refused")
    ]
    assert [h.key for h in runtime.pending_handoffs(parent="cam-b")] == ["in-4"]
    runtime.clear_pending_handoff("in-3")
    runtime.clear_pending_handoff("never-added")
    assert [h.key for h in runtime.pending_handoffs()] == ["in-4"]

    # Both logs are the node's: another replica lists the same entries.
    other = make(replica_id=3)
    assert [e.key for e in other.terminal_entries()] == ["in-1", "in-2"]
    assert [h.key for h in other.pending_handoffs()] == ["in-4"]


def check_a_batch_of_terminations_is_logged_and_keeps_first_entries(make: Factory) -> None:
    # DELIV-15 in bulk (a join evicting a burst): every entry logged, in order; one
    # already in the log keeps its first record, as log_terminal does.
    runtime = claimed(make)
    runtime.log_terminal("in-2", "dlq/2", "poison")
    kept = runtime.log_terminals([("in-1", "terminal/in-1", "join expired"),
                                  ("in-2", "terminal/in-2", "join expired"),
                                  ("in-3", "terminal/in-3", "join evicted")])
    assert [(e.key, e.record_ref, e.reason) for e in kept] == [
        ("in-1", "terminal/in-1", "join expired"), ("in-2", "dlq/2", "poison"),
        ("in-3", "terminal/in-3", "join evicted")]
    assert [(e.key, e.record_ref) for e in runtime.terminal_entries()] == [
        ("in-1", "terminal/in-1"), ("in-2", "dlq/2"), ("in-3", "terminal/in-3")]
    assert runtime.log_terminals([]) == []
    # Fenced like every write: a superseded owner logs nothing (RUN-023).
    claimed(make)
    with pytest.raises(SupersededOwner):
        runtime.log_terminals([("in-4", "terminal/in-4", "join expired")])
    assert [e.key for e in runtime.terminal_entries()] == ["in-1", "in-2", "in-3"]


def check_eos_received_sets(make: Factory) -> None:
    runtime = claimed(make)
    assert runtime.eos_received("cam-a") == {}
    assert runtime.record_eos("cam-a", 0) is True
    assert runtime.record_eos("cam-a", 0) is False  # a redelivered marker
    assert runtime.record_eos("cam-a", 2, aborted=True) is True
    assert runtime.record_eos("cam-a", 2) is False  # an abort stays an abort
    assert runtime.record_eos("cam-a.b", 1) is True  # a dotted parent is its own
    assert runtime.eos_received("cam-a") == {0: "stop", 2: "abort"}
    assert runtime.eos_received("cam-a.b") == {1: "stop"}
    assert runtime.eos_received("cam") == {}
    # Received sets are the replica's (each replica has its own EOS consumer).
    assert make(replica_id=1).eos_received("cam-a") == {}


def check_open_groups_round_trip(make: Factory) -> None:
    runtime = claimed(make)
    runtime.open_group("t1:5", {"cam-a": "t1:5@a"})
    runtime.open_group("t1:5", {"cam-a": "t1:5@a", "cam-b": "t1:5@b"})
    runtime.open_group("t2:6", {"cam-b": "t2:6@b"})
    assert runtime.open_groups() == {
        "t1:5": {"cam-a": "t1:5@a", "cam-b": "t1:5@b"}, "t2:6": {"cam-b": "t2:6@b"}
    }
    runtime.close_group("t1:5")
    runtime.close_group("absent")
    assert runtime.open_groups() == {"t2:6": {"cam-b": "t2:6@b"}}
    assert make(replica_id=1).open_groups() == {}


def check_source_offset_only_moves_forward(make: Factory) -> None:
    runtime = claimed(make)
    assert runtime.source_offset() == 0
    assert runtime.set_source_offset(10) == 10
    assert runtime.set_source_offset(7) == 10  # confirmed out of order
    assert runtime.set_source_offset(11) == 11
    assert make().source_offset() == 11
    with pytest.raises(ValueError, match="source offset is >= 0"):
        runtime.set_source_offset(-1)


def check_odd_identities_round_trip(make: Factory) -> None:
    runtime = claimed(make)
    for ident in ODD_IDS:
        runtime.record_publication(ident)
        runtime.open_group(ident, {ident: ident})
        runtime.log_terminal(ident, f"terminal/{ident}", "why")
        assert runtime.count_attempt(ident) == 1
    assert sorted(p.publication_id for p in runtime.outbox()) == sorted(ODD_IDS)
    assert runtime.open_groups() == {i: {i: i} for i in ODD_IDS}
    assert sorted(e.key for e in runtime.terminal_entries()) == sorted(ODD_IDS)


def check_a_restarted_runtime_sees_everything(make: Factory) -> None:
    runtime = claimed(make)
    runtime.record_publication("join:1:1", ["ref"], ["child"])
    runtime.resolve_publication("join:1:1", stream_seq=5)
    runtime.count_attempt("in-1")
    runtime.log_terminal("in-2", "dlq/1", "poison")
    runtime.add_pending_handoff("in-3", "cam", "dlq down")
    runtime.record_eos("cam", 0)
    runtime.open_group("g1", {"cam": "in-4"})
    runtime.set_source_offset(12)

    restarted = make()
    assert restarted.current_epoch() == 1
    assert restarted.outbox() == runtime.outbox()
    assert restarted.outbox()[0].stream_seq == 5
    assert restarted.attempts("in-1") == 1
    assert restarted.terminal_entries() == runtime.terminal_entries()
    assert restarted.pending_handoffs() == runtime.pending_handoffs()
    assert restarted.eos_received("cam") == {0: "stop"}
    assert restarted.open_groups() == {"g1": {"cam": "in-4"}}
    assert restarted.source_offset() == 12
    assert restarted.claim_owner() == 2


def check_concurrent_counts_never_lose_an_increment(make: Factory, per_thread: int) -> None:
    runtimes = [claimed(make, replica_id=1), make(replica_id=2)]
    runtimes[1].claim_owner()
    start = threading.Barrier(len(runtimes))
    seen: list[list[int]] = [[] for _ in runtimes]
    errors: list[BaseException] = []

    def count(index: int) -> None:
        try:
            start.wait()
            for _ in range(per_thread):
                seen[index].append(runtimes[index].count_attempt("shared-input"))
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=count, args=(i,)) for i in range(len(runtimes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    total = per_thread * len(runtimes)
    assert runtimes[0].attempts("shared-input") == total
    # Every increment returned a distinct count: no two writers won the same one.
    assert sorted(seen[0] + seen[1]) == list(range(1, total + 1))


SHARED: list[Callable[[Factory], None]] = [
    check_outbox_round_trips,
    check_resolution_is_final,
    check_a_resolution_someone_else_wrote_first_is_judged_on_a_fresh_read,
    check_attempts_count_and_survive_a_new_runtime,
    check_store_compare_and_swap_conflicts_are_typed,
    check_store_creates_a_batch_and_skips_keys_that_exist,
    check_store_lists_the_present_keys_under_a_prefix,
    check_a_second_owner_supersedes_the_first,
    check_terminal_log_and_handoffs_are_listable,
    check_a_batch_of_terminations_is_logged_and_keeps_first_entries,
    check_eos_received_sets,
    check_open_groups_round_trip,
    check_source_offset_only_moves_forward,
    check_odd_identities_round_trip,
    check_a_restarted_runtime_sees_everything,
]
