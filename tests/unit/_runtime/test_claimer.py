"""The claim loop's branches, driven by a scripted fake database (claim_fakes):
each test names the branch it drives. The same behaviour against a real
PostgreSQL: tests/integration/test_stall_free.py, test_prefetch.py, test_worker.py."""

from __future__ import annotations

import asyncio

from tests.unit._runtime.claim_fakes import (
    FakeDatabase,
    Handlers,
    answer,
    answer_then_lose,
    claim_loop,
    gated,
    hang,
    jobs,
    lose_connection,
    refuse,
    soon,
)


async def test_a_round_writes_the_outcomes_and_claims_for_the_free_slots() -> None:
    a, b, c = jobs(3)
    db = FakeDatabase([a, b, c])
    claims, _ = claim_loop(db, Handlers(), concurrency=2)
    await claims.run()
    assert [call.limit for call in db.calls[:2]] == [2, 2]
    assert db.written == {a.id: "succeeded", b.id: "succeeded", c.id: "succeeded"}
    assert claims.stats.succeeded == 3 and claims.stats.claimed == 3
    assert db.sessions == [("begin", 0), ("end", 0)]  # one connection, session reset
    assert db.pool.connections[0].released and not db.pool.connections[0].terminated


async def test_with_removal_a_succeeded_outcome_goes_out_as_remove_and_counts_as_succeeded() -> (
    None
):
    """remove_succeeded_jobs: the statement decides which rows it may delete (see
    tests/integration/test_removal.py); the loop only asks, and counts as before."""
    a, b = jobs(2)
    db = FakeDatabase([a, b])
    claims, _ = claim_loop(db, Handlers(), concurrency=2, remove_succeeded=True)
    await claims.run()
    assert db.written == {a.id: "remove", b.id: "remove"}
    assert claims.stats.succeeded == 2 and claims.stats.claimed == 2


async def test_a_pipelined_round_goes_out_before_the_previous_answer_starts_its_jobs() -> None:
    # Round 2 carries a's outcome and claims c; b finishes while it is out, so
    # round 3 (b's outcome) is sent before c is launched, and c still runs.
    a, b, c = jobs(3)
    db = FakeDatabase([a, b, c])
    handlers = Handlers()
    handlers.block(a, b)
    round_two_out = asyncio.Event()
    db.script.extend([answer, gated(round_two_out)])
    claims, _ = claim_loop(db, handlers, concurrency=2)
    loop = asyncio.create_task(claims.run())
    await soon(lambda: handlers.started == [a.id, b.id], "a and b to start")
    handlers.finish(a)
    await soon(lambda: len(db.calls) == 2, "round 2 to go out")
    handlers.finish(b)
    await soon(lambda: claims.outcomes, "b's outcome to wait for the next round")
    round_two_out.set()
    await loop
    round_three = db.calls[2]
    assert round_three.ids == [b.id]
    assert c.id not in round_three.running  # sent before round 2's job started
    assert db.written == {a.id: "succeeded", b.id: "succeeded", c.id: "succeeded"}
    assert db.misuse == []


async def test_a_refused_round_writes_its_outcomes_one_by_one_so_one_bad_outcome_holds_back_no_other() -> (
    None
):
    a, b = jobs(2)
    db = FakeDatabase([a, b])
    db.refused.add(a.id)  # the database refuses a's outcome (not a failure of a)
    claims, _ = claim_loop(db, Handlers(), concurrency=2)
    await claims.run()
    assert db.written == {a.id: "failed", b.id: "succeeded"}
    assert "could not record this attempt's succeeded outcome" in (db.errors[a.id] or "")
    assert claims.stats.failed == 1 and claims.stats.succeeded == 1
    assert claims.pauses == [0.1]  # a refusal backs off, on the same connection
    assert len(db.pool.connections) == 1 and claims.health() is None


async def test_a_refused_round_without_outcomes_backs_off_longer_each_time() -> None:
    db = FakeDatabase(jobs(1))
    db.script.extend([refuse, refuse, refuse])
    claims, _ = claim_loop(db, Handlers())
    await claims.run()
    assert claims.pauses == [0.1, 0.2, 0.4]
    assert claims.stats.succeeded == 1


async def test_a_connection_lost_mid_round_resends_its_outcomes_on_a_new_one() -> None:
    (a,) = jobs(1)
    db = FakeDatabase([a])
    health_while_failing: list[str | None] = []

    async def reconnected(db_: FakeDatabase, call: object) -> list[tuple[object, ...]]:
        health_while_failing.append(claims.health())
        return await answer(db_, call)  # type: ignore[arg-type]

    db.script.extend([answer, lose_connection, reconnected])
    claims, _ = claim_loop(db, Handlers())
    await claims.run()
    first, second = db.pool.connections
    assert first.closed and not first.released
    assert second.released
    assert [call.connection.number for call in db.calls] == [0, 0, 1]
    assert db.calls[2].ids == [a.id]  # resent
    # Before the resend, jobs claimed by the lost round's answer are released.
    assert db.release_unknown == [[a.id]]
    assert db.written == {a.id: "succeeded"} and claims.stats.succeeded == 1
    assert claims.pauses == [0.05]  # a connection that was working: replaced at once
    assert health_while_failing == ["claim loop cannot reach the database (1 failed rounds)"]
    assert claims.health() is None


async def test_a_connection_lost_in_the_loop_turn_of_the_previous_answer_is_never_called() -> None:
    # As the pipelined round, but a reset arrives right behind round 2's answer,
    # before the pipelined round 3's task first runs.
    a, b, c = jobs(3)
    db = FakeDatabase([a, b, c])
    handlers = Handlers()
    handlers.block(a, b)
    round_two_out = asyncio.Event()
    db.script.extend([answer, gated(round_two_out, answer_then_lose)])
    claims, _ = claim_loop(db, handlers, concurrency=2)
    loop = asyncio.create_task(claims.run())
    await soon(lambda: handlers.started == [a.id, b.id], "a and b to start")
    handlers.finish(a)
    await soon(lambda: len(db.calls) == 2, "round 2 to go out")
    handlers.finish(b)
    await soon(lambda: claims.outcomes, "b's outcome to wait for the next round")
    round_two_out.set()
    await loop
    assert db.misuse == []
    assert [call.connection.number for call in db.calls[2:]] == [1] * len(db.calls[2:])
    # b's outcome goes out on the new connection (with c's: c, claimed by the round
    # whose answer came just before the reset, reports as it ends).
    assert db.calls[2].ids[0] == b.id and set(db.calls[2].ids) <= {b.id, c.id}
    assert db.written == {a.id: "succeeded", b.id: "succeeded", c.id: "succeeded"}
    assert handlers.started == [a.id, b.id, c.id]


async def test_a_round_without_an_answer_in_time_drops_its_connection_and_is_resent() -> None:
    (a,) = jobs(1)
    db = FakeDatabase([a])
    db.script.extend([answer, hang])
    claims, _ = claim_loop(db, Handlers(), timeout=0.05)
    await claims.run()
    first, second = db.pool.connections
    assert first.terminated and not first.released
    assert db.hangs == ["claim round"]
    assert db.calls[2].ids == [a.id] and db.calls[2].connection is second
    assert claims.pauses == [0.1]  # not reached: the backoff grows
    assert db.written == {a.id: "succeeded"} and claims.health() is None


async def test_stopping_with_outcomes_pending_writes_them_claims_nothing_and_returns() -> None:
    a, b = jobs(2)
    db = FakeDatabase([a, b])
    handlers = Handlers()
    out = asyncio.Event()
    db.script.append(gated(out))
    claims, _ = claim_loop(db, handlers, burst=False)
    loop = asyncio.create_task(claims.run())
    await soon(lambda: db.calls, "round 1 to go out")
    claims.stopping = True  # the drain begins while the round claims a and b
    out.set()
    await loop
    assert handlers.started == []
    assert db.written == {a.id: "aborted", b.id: "aborted"}
    assert [call.limit for call in db.calls] == [2, 0]
    assert claims.outcomes == []


async def test_a_job_held_ahead_too_long_is_handed_back_unstarted() -> None:
    running, ahead = jobs(2)
    db = FakeDatabase()
    handlers = Handlers()
    handlers.block(running)
    claims, runner = claim_loop(db, handlers, concurrency=1, hold=0.02)
    runner.launch([running], [ahead])  # no free slot: `ahead` is held
    assert runner.held == 1
    loop = asyncio.create_task(claims.run())
    await soon(lambda: ahead.id in db.written, "the held job to be handed back")
    assert db.written[ahead.id] == "aborted" and runner.held == 0
    assert claims.stats.released == 1
    handlers.finish(running)
    await loop
    assert handlers.started == [running.id]
    assert db.written[running.id] == "succeeded"


async def test_behind_a_pooler_a_refused_round_is_rolled_back_before_its_outcomes_are_isolated() -> (
    None
):
    (a,) = jobs(1)
    db = FakeDatabase([a])
    db.script.extend([answer, refuse])
    claims, _ = claim_loop(db, Handlers(), pooled=True)
    await claims.run()
    assert db.rollbacks == 1
    assert db.sessions == []  # the settings go with each transaction, not the session
    assert db.written == {a.id: "succeeded"}


async def test_the_loop_is_unready_while_rounds_fail_and_ready_again_once_one_is_answered() -> None:
    (a,) = jobs(1)
    db = FakeDatabase([a])
    seen: list[str | None] = []

    async def look(db_: FakeDatabase, call: object) -> list[tuple[object, ...]]:
        seen.append(claims.health())
        return await answer(db_, call)  # type: ignore[arg-type]

    db.script.extend([look, lose_connection, lose_connection, look])
    claims, _ = claim_loop(db, Handlers())
    await claims.run()
    # Ready before the outage; unready during it (the round that ends it is still
    # out); ready once it is answered.
    assert seen == [None, "claim loop cannot reach the database (2 failed rounds)"]
    assert claims.health() is None
