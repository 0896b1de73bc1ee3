"""A new run's claim on its id (videoflow.ops.run_records.claim_run) against a real
nats-server: of runs that claim one id at once, exactly one gets it and the others
RunExists (issue 46: the stream check alone let both through); a run holds its id until
its record ends, and a teardown ends the record an engine that died never did."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from nats.js.kv import KeyValue

from videoflow import ConsumerNode, Flow, ProducerNode, ops
from videoflow.backends.messaging import Known
from videoflow.broker import server as embedded
from videoflow.core.compiler import NodeSpec
from videoflow.core.constants import BATCH
from videoflow.errors import RevisionConflict, RunExists
from videoflow.messaging.topology import provision_flow_sync
from videoflow.ops import run_records
from videoflow.ops.runs import list_flows

pytestmark = pytest.mark.timeout(120)

FLOW = "claims"
ROUNDS = 50
"""How many times two claims race for one id: a claim is a connect and two requests,
so a round costs a few milliseconds."""


class Nothing(ProducerNode):
    def next(self) -> int:
        raise StopIteration


class Drop(ConsumerNode):
    def consume(self, item: Any) -> None:
        pass


def claim(url: str, run_id: str) -> int:
    return run_records.claim_run(url, run_records.started_record(FLOW, run_id), timeout=10)


def claimed(url: str, run_id: str) -> tuple[run_records.RunRecord, int]:
    """A new run's record, claimed: (the record, the revision it was written at)."""
    record = run_records.started_record(FLOW, run_id)
    return record, run_records.claim_run(url, record, timeout=5)


def ended(record: run_records.RunRecord, outcome: str = "completed") -> run_records.RunRecord:
    return run_records.ended_record(record, outcome, True, "")


def end(url: str, record: run_records.RunRecord, revision: int,
        outcome: str = "completed") -> int:
    """record's run ended, written over the revision its claim took."""
    return run_records.record_run(url, ended(record, outcome), last=revision, timeout=5)


def at_once(*calls: Callable[[], int]) -> list[int | RunExists]:
    """calls, each on a thread of its own, released together by a barrier: what each
    returned, or the RunExists it raised."""
    barrier = threading.Barrier(len(calls))

    def one(call: Callable[[], int]) -> int | RunExists:
        barrier.wait(timeout=10)
        try:
            return call()
        except RunExists as refused:
            return refused

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(one, calls))


def one_winner(results: list[int | RunExists]) -> RunExists:
    """The refusal of the race's loser, once exactly one claim won."""
    won = [r for r in results if isinstance(r, int)]
    lost = [r for r in results if isinstance(r, RunExists)]
    assert len(won) == 1 and len(lost) == len(results) - 1, results
    return lost[0]


def how_lost(refused: RunExists) -> str:
    return "at the same moment" if "same moment" in str(refused) else "held"


def test_of_two_claims_on_one_new_run_id_at_once_exactly_one_gets_it(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    seen: Counter[str] = Counter()
    for n in range(ROUNDS):
        run_id = f"new-{n}"
        race = functools.partial(claim, url, run_id)
        refused = one_winner(at_once(race, race))
        assert f"run {run_id!r} of flow {FLOW!r}" in str(refused)
        seen[how_lost(refused)] += 1
        record = run_records.run_record(url, FLOW, run_id, timeout=5)
        assert isinstance(record, run_records.RunRecord) and record.ended_at is None
    print(f"{ROUNDS} rounds, the loser refused: {dict(seen)}")


def test_of_two_claims_on_an_ended_runs_id_at_once_exactly_one_gets_it(
    nats_server: embedded.EmbeddedServer,
) -> None:
    # An ended run's id is free again (its streams gone): taking it over is a
    # compare-and-set on that record's revision, which only one claim passes.
    url = nats_server.url
    for n in range(ROUNDS):
        run_id = f"ended-{n}"
        end(url, *claimed(url, run_id))
        race = functools.partial(claim, url, run_id)
        one_winner(at_once(race, race))
        record = run_records.run_record(url, FLOW, run_id, timeout=5)
        assert isinstance(record, run_records.RunRecord) and record.ended_at is None


@pytest.mark.parametrize("ended_before", [False, True], ids=["new-id", "ended-id"])
def test_two_claims_that_both_read_the_id_free_still_give_it_to_one(
    nats_server: embedded.EmbeddedServer, monkeypatch: pytest.MonkeyPatch,
    ended_before: bool,
) -> None:
    # The interleaving a check-then-write loses to, forced: both claims have read the
    # id's record (none, or an ended one) before either writes.
    url, run_id = nats_server.url, "both-read"
    if ended_before:
        end(url, *claimed(url, run_id), outcome="failed")
    both_read = threading.Barrier(2)
    read = KeyValue.get

    async def read_then_wait(self: KeyValue, key: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await read(self, key, *args, **kwargs)
        finally:
            await asyncio.to_thread(both_read.wait, 10)

    monkeypatch.setattr(KeyValue, "get", read_then_wait)
    race = functools.partial(claim, url, run_id)
    refused = one_winner(at_once(race, race))
    assert str(refused) == (f"run {run_id!r} of flow {FLOW!r} was taken by another run "
                            "started at the same moment: a new run needs an id of its own")


def test_a_run_holds_its_id_until_its_record_ends(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    started, revision = claimed(url, "held")
    with pytest.raises(RunExists, match=(
            "run 'held' of flow 'claims' is held by a run that started .* UTC and has not "
            "ended .* once that engine is gone, `videoflow teardown --flow claims --run "
            "held` ends it")):
        claim(url, "held")
    end(url, started, revision)
    assert claim(url, "held") > revision


def test_a_teardown_ends_the_record_an_engine_that_died_left_and_frees_its_id(
    nats_server: embedded.EmbeddedServer,
) -> None:
    # An engine killed mid-run leaves its streams and a record that says 'running':
    # its id stays held (RunExists names the teardown) until a teardown ends it.
    url = nats_server.url
    specs = [NodeSpec("cam", "producer"), NodeSpec("sink", "consumer", parents=("cam",))]
    claim(url, "killed")
    provision_flow_sync(url, specs, FLOW, "killed", BATCH, timeout=30)
    with pytest.raises(RunExists, match="videoflow teardown --flow claims --run killed"):
        claim(url, "killed")
    assert ops.teardown(url, FLOW, "killed", timeout=10).complete
    lost = run_records.run_record(url, FLOW, "killed", timeout=5)
    assert isinstance(lost, run_records.RunRecord)
    assert (lost.outcome, lost.torn_down) == (run_records.LOST, True)
    assert lost.ended_at is not None and lost.ended_at >= lost.started_at
    assert lost.describe(False)[0].endswith(
        "; its engine ended without recording its end, and it was torn down "
        f"{run_records.utc_text(lost.ended_at)}")
    (listed,) = [r for f in list_flows(url, flow_id=FLOW, timeout=5) for r in f.runs]
    assert listed.state == Known("ended") and listed.record == lost
    # A teardown again, and the engine's own teardown, leave an ended record alone.
    assert ops.teardown(url, FLOW, "killed", timeout=10).complete
    assert run_records.run_record(url, FLOW, "killed", timeout=5) == lost
    claim(url, "killed")


def test_the_end_of_a_run_whose_id_was_taken_since_is_not_written_over_its_new_holder(
    nats_server: embedded.EmbeddedServer,
) -> None:
    # `videoflow teardown --force` under a live engine ends its record, and a new run
    # may take the id: the old engine's end must not make the new run's record ended.
    url = nats_server.url
    old, revision = claimed(url, "taken")
    assert ops.teardown(url, FLOW, "taken", timeout=10).complete
    claim(url, "taken")
    held = run_records.run_record(url, FLOW, "taken", timeout=5)
    with pytest.raises(RevisionConflict, match="changed since this run wrote it: a "
                                               "teardown ended it"):
        end(url, old, revision)
    assert run_records.keep_record(url, ended(old), last=revision) is None
    assert run_records.run_record(url, FLOW, "taken", timeout=5) == held


def test_the_engine_s_own_teardown_leaves_its_record_to_the_engine(
    nats_server: embedded.EmbeddedServer,
) -> None:
    url = nats_server.url
    started, _ = claimed(url, "engine")
    assert ops.teardown(url, FLOW, "engine", end_record=False, timeout=10).complete
    kept = ops.teardown_processed(url, FLOW, "engine", end_record=False, timeout=10)
    assert kept.torn_down
    assert run_records.run_record(url, FLOW, "engine", timeout=5) == started


def test_a_run_that_fails_after_its_claim_and_before_it_starts_frees_its_id(
    nats_server: embedded.EmbeddedServer,
) -> None:
    # A bad payloads option is found once the id is claimed: the run ends 'failed',
    # having made nothing, and the id is not left held.
    source = Nothing()
    flow = Flow([source], [Drop()(source)], name=FLOW)
    with pytest.raises(ValueError, match="payloads must be"):
        flow.run(nats_server.url, run_id="bad", payloads="disk", view=False)
    record = run_records.run_record(nats_server.url, FLOW, "bad", timeout=5)
    assert isinstance(record, run_records.RunRecord)
    assert (record.outcome, record.torn_down) == ("failed", False)
    assert record.ended_at is not None
    assert ops.run_status(nats_server.url, FLOW, "bad", timeout=5).streams == ()
    claim(nats_server.url, "bad")
