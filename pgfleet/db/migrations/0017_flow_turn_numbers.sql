-- pgfleet 0017: keys take turns by number (issue #24).
--
-- Every flagged job (limited: keyed, of a limited name, or in a named queue) gets
-- a turn when it is inserted: one more than the last turn its key (limit_key; the
-- jobs without a key are one key of their own) holds among its name's queued jobs
-- of the same priority, and never less than that name and priority's front (the
-- highest turn a claim has taken, pgfleet.flow_fronts). claim_flow takes a name's
-- due jobs in (priority, turn, run_at, id) order from one index range: each key's
-- first job, then each key's second, and so on, with no descent per key. A key
-- that had nothing queued starts at the front, so it waits no more than one pass
-- of the keys ahead of it; a key with a backlog keeps its place behind its own
-- jobs. Turns carry across claim rounds of any size.
--
-- Within a key, its jobs of one priority run in the order they were enqueued.
-- Across keys, priority comes first, as it does for jobs without flow control.
--
-- A name with a per-key limit keeps 0015's claim (one descent per key, starting
-- after the last key served): it must find the keys with room, and an ordered
-- scan would walk every job of the keys at their limit. Its keys' heads are now
-- found in turn order too.
--
-- A job that is not due when it is enqueued, a retried or snoozed one, one moved
-- later, and one inserted without a turn (by hand, or flagged when its name got a
-- limit) has none: once due it goes first in its priority, as the oldest work, and
-- until then no claim walks past it (it is not in jobs_flow_turns). Queued flagged
-- jobs that are due get turns here, numbered within their key and priority in
-- run_at order.
--
-- What it locks: the new column is nullable without a default (no rewrite, on
-- pgfleet.jobs and every history partition); the three index builds take SHARE on
-- pgfleet.jobs (inserts and updates wait; they cover only queued flagged jobs);
-- the numbering updates the queued flagged jobs (claims skip them while it runs).
-- Workers of the previous version keep working: their claim_flow is replaced
-- with this one and their inserts are numbered by the trigger.

ALTER TABLE pgfleet.jobs ADD COLUMN turn bigint;
ALTER TABLE pgfleet.jobs_history ADD COLUMN turn bigint;
-- 0016's sampling: a claim-order column.
ALTER TABLE pgfleet.jobs ALTER COLUMN turn SET STATISTICS 10;

CREATE OR REPLACE VIEW pgfleet.jobs_all AS
    SELECT * FROM pgfleet.jobs
    UNION ALL
    SELECT * FROM pgfleet.jobs_history;

-- The highest turn claimed, per name and priority.
CREATE TABLE pgfleet.flow_fronts (
    name     text     NOT NULL,
    priority smallint NOT NULL,
    turn     bigint   NOT NULL,
    PRIMARY KEY (name, priority)
);

-- The claim order of a name's flagged jobs that have turns (claim_flow), and its front.
CREATE INDEX jobs_flow_turns ON pgfleet.jobs (name, priority, turn, run_at, id)
    WHERE status = 'queued' AND limited AND turn IS NOT NULL;
-- A name's flagged jobs without a turn (scheduled, retried, snoozed, or inserted
-- without one), by run time: a claim reads only the due ones.
CREATE INDEX jobs_flow_scheduled ON pgfleet.jobs (name, run_at)
    WHERE status = 'queued' AND limited AND turn IS NULL;
-- A key's jobs: its last turn (the insert trigger), its head (a per-key claim),
-- whether it has any (the rate pace).
DROP INDEX pgfleet.jobs_flow_queued;
CREATE INDEX jobs_flow_queued ON pgfleet.jobs (name, limit_key, priority, turn NULLS FIRST, id)
    WHERE status = 'queued' AND limited;

UPDATE pgfleet.jobs j SET turn = n.turn
FROM (SELECT q.id, row_number() OVER (PARTITION BY q.name, q.limit_key, q.priority
                                      ORDER BY q.run_at, q.id) - 1 AS turn
      FROM pgfleet.jobs q WHERE q.status = 'queued' AND q.limited AND q.run_at <= now()) n
WHERE j.id = n.id;

-- The next turn of key p_key (NULL: the jobs without a key) of name p_name at
-- priority p_priority: one more than the key's last queued turn, and not before
-- the front. Enqueues number a batch's jobs of one key from it.
CREATE FUNCTION pgfleet.next_turn(p_name text, p_key text, p_priority smallint)
RETURNS bigint LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    front bigint;
    last bigint;
BEGIN
    SELECT f.turn INTO front FROM pgfleet.flow_fronts f
    WHERE f.name = p_name AND f.priority = p_priority;
    -- Two statements: each descends jobs_flow_queued to the key's last turn (a
    -- NULL key's through its IS NULL, which no parameter could say).
    IF p_key IS NULL THEN
        SELECT j.turn INTO last FROM pgfleet.jobs j
        WHERE j.status = 'queued' AND j.limited AND j.name = p_name
          AND j.limit_key IS NULL AND j.priority = p_priority AND j.turn IS NOT NULL
        ORDER BY j.limit_key DESC, j.priority DESC, j.turn DESC NULLS LAST, j.id DESC
        LIMIT 1;
    ELSE
        SELECT j.turn INTO last FROM pgfleet.jobs j
        WHERE j.status = 'queued' AND j.limited AND j.name = p_name
          AND j.limit_key = p_key AND j.priority = p_priority AND j.turn IS NOT NULL
        ORDER BY j.limit_key DESC, j.priority DESC, j.turn DESC NULLS LAST, j.id DESC
        LIMIT 1;
    END IF;
    RETURN GREATEST(front, last + 1, 0);
END;
$fn$;

-- A flagged job inserted without a turn (by hand, by an earlier version) gets the
-- next one. A row trigger sees the rows its statement inserted before this one.
CREATE FUNCTION pgfleet.jobs_number_turn() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.run_at <= now() THEN
        NEW.turn := pgfleet.next_turn(NEW.name, NEW.limit_key, NEW.priority);
    END IF;
    RETURN NEW;
END;
$fn$;

-- Named after jobs_named_queue_flow, which flags a named queue's jobs first (BEFORE
-- triggers fire in name order).
CREATE TRIGGER jobs_turn BEFORE INSERT ON pgfleet.jobs
    FOR EACH ROW WHEN (NEW.limited AND NEW.turn IS NULL)
    EXECUTE FUNCTION pgfleet.jobs_number_turn();

CREATE OR REPLACE FUNCTION pgfleet.claim_flow(p_worker uuid, p_names text[], p_queues text[],
                                              p_n integer, p_start integer, p_done uuid[])
RETURNS SETOF pgfleet.jobs
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    f record;
    budget integer := p_n;      -- jobs still wanted, held ahead included
    starts integer := p_start;  -- of those, jobs still to start now
    cap integer;
    got integer;
    n integer;
    cur text;
    k text;
    progress boolean;
    paused boolean;
    any_keys boolean;
    ts timestamptz;
    nrun bigint;
    nstart bigint;
    want integer;
    nkeys bigint;
    batch pgfleet.jobs[];
    claimed_all pgfleet.jobs[] := '{}';
    in_queues uuid[] := '{}';
    beaten uuid[];
    freed text[] := '{}';
BEGIN
    IF budget <= 0 THEN
        RETURN;
    END IF;
    -- Only a job of a named queue is kept from a queue this round freed: without
    -- any queued one (one probe of jobs_queue_head), there is nothing to keep.
    IF cardinality(p_done) > 0
       AND EXISTS (SELECT 1 FROM pgfleet.jobs q
                   WHERE q.status = 'queued' AND q.queue_name IS NOT NULL) THEN
        freed := ARRAY (SELECT DISTINCT d.queue_name FROM pgfleet.jobs d
                        WHERE d.id = ANY (p_done) AND d.queue_name IS NOT NULL);
    END IF;
    -- Names in play: limited and not paused, or unlimited with due flagged jobs
    -- (keyed ones, or left from a limit since cleared).
    INSERT INTO pgfleet.flow_turns (name)
    SELECT u.n FROM unnest(p_names) AS u(n)
    WHERE EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = u.n AND l.paused_at IS NULL)
       OR (NOT EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = u.n)
           -- a due flagged job: with a turn (due when numbered), or due without
           AND (EXISTS (SELECT 1 FROM pgfleet.jobs j
                        WHERE j.status = 'queued' AND j.limited AND j.turn IS NOT NULL
                          AND j.name = u.n AND j.run_at <= now())
                OR EXISTS (SELECT 1 FROM pgfleet.jobs j
                           WHERE j.status = 'queued' AND j.limited AND j.turn IS NULL
                             AND j.name = u.n AND j.run_at <= now())))
    ON CONFLICT (name) DO NOTHING;
    FOR f IN
        SELECT t.name, t.last_key, l.concurrency, l.rate, l.per,
               COALESCE(l.per_key, false) AS per_key
        FROM pgfleet.flow_turns t LEFT JOIN pgfleet.limits l ON l.name = t.name
        WHERE t.name = ANY (p_names) AND (l.name IS NULL OR l.paused_at IS NULL)
        -- A random order: no name takes every free slot round after round.
        ORDER BY random()
        FOR UPDATE OF t SKIP LOCKED
    LOOP
        EXIT WHEN budget <= 0;
        -- Read again under the lock (a fresh snapshot): paused or changed since.
        SELECT l.concurrency, l.rate, l.per, l.per_key, l.paused_at IS NOT NULL
        INTO f.concurrency, f.rate, f.per, f.per_key, paused
        FROM pgfleet.limits l WHERE l.name = f.name;
        IF FOUND AND paused THEN
            CONTINUE;
        END IF;
        IF NOT FOUND THEN
            f.concurrency := NULL; f.rate := NULL; f.per_key := false;
        END IF;
        ts := clock_timestamp();
        cap := budget;
        IF f.rate IS NOT NULL THEN
            cap := least(cap, starts);
            DELETE FROM pgfleet.limit_starts s
            WHERE s.name = f.name AND s.started_at <= ts - make_interval(secs => f.per);
        END IF;
        IF NOT f.per_key THEN
            IF f.concurrency IS NOT NULL THEN
                SELECT count(*) INTO nrun FROM pgfleet.jobs r
                WHERE r.status = 'running' AND r.limited AND r.name = f.name;
                cap := least(cap, f.concurrency - nrun);
            END IF;
            IF f.rate IS NOT NULL THEN
                SELECT count(*) INTO nstart FROM pgfleet.limit_starts s
                WHERE s.name = f.name AND s.started_at > ts - make_interval(secs => f.per);
                cap := least(cap, f.rate - nstart);
            END IF;
        END IF;
        CONTINUE WHEN cap <= 0;
        IF NOT f.per_key THEN
            -- Keys take turns by number (0017): the name's due jobs in claim
            -- order, from one range of jobs_flow_turns (and jobs_flow_scheduled).
            -- Due jobs without a turn (their time came: they go first in their
            -- priority), then the jobs with turns; each side locks at most cap.
            WITH due AS MATERIALIZED (
                SELECT c.id, c.priority, 0 AS side, 0::bigint AS turn, c.run_at
                  FROM pgfleet.jobs c
                  WHERE c.status = 'queued' AND c.limited AND c.turn IS NULL
                    AND c.name = f.name AND c.run_at <= now()
                    AND (p_queues IS NULL OR c.queue_name = ANY (p_queues))
                    AND (c.queue_name IS NULL OR (
                         c.queue_name <> ALL (freed)
                         AND NOT EXISTS (SELECT 1 FROM pgfleet.queue_pauses qp
                                     WHERE qp.queue_name = c.queue_name)
                         AND NOT EXISTS (SELECT 1 FROM pgfleet.jobs r
                                         WHERE r.queue_name = c.queue_name
                                           AND r.status = 'running')
                         -- one job per named queue: its head, and none running
                         AND c.id = (SELECT hq.id FROM pgfleet.jobs hq
                                     WHERE hq.queue_name = c.queue_name AND hq.status = 'queued'
                                       AND hq.run_at <= now()
                                     ORDER BY hq.priority, hq.run_at, hq.id LIMIT 1)
                         -- and no other claim of the queue under way
                         AND pg_try_advisory_xact_lock(1885824625, hashtext(c.queue_name))))
                  ORDER BY c.priority, c.run_at, c.id
                  LIMIT cap
                  FOR UPDATE SKIP LOCKED
            ), turns AS MATERIALIZED (
                SELECT c.id, c.priority, 1 AS side, c.turn, c.run_at FROM pgfleet.jobs c
                  WHERE c.status = 'queued' AND c.limited AND c.turn IS NOT NULL
                    AND c.name = f.name AND c.run_at <= now()
                    AND (p_queues IS NULL OR c.queue_name = ANY (p_queues))
                    AND (c.queue_name IS NULL OR (
                         c.queue_name <> ALL (freed)
                         AND NOT EXISTS (SELECT 1 FROM pgfleet.queue_pauses qp
                                     WHERE qp.queue_name = c.queue_name)
                         AND NOT EXISTS (SELECT 1 FROM pgfleet.jobs r
                                         WHERE r.queue_name = c.queue_name
                                           AND r.status = 'running')
                         -- one job per named queue: its head, and none running
                         AND c.id = (SELECT hq.id FROM pgfleet.jobs hq
                                     WHERE hq.queue_name = c.queue_name AND hq.status = 'queued'
                                       AND hq.run_at <= now()
                                     ORDER BY hq.priority, hq.run_at, hq.id LIMIT 1)
                         -- and no other claim of the queue under way
                         AND pg_try_advisory_xact_lock(1885824625, hashtext(c.queue_name))))
                  ORDER BY c.priority, c.turn, c.run_at, c.id
                  LIMIT cap
                  FOR UPDATE SKIP LOCKED
            ), pick AS MATERIALIZED (
                SELECT ARRAY (
                    SELECT u.id FROM (SELECT * FROM due UNION ALL SELECT * FROM turns) u
                    ORDER BY u.priority, u.side, u.turn, u.run_at, u.id
                    LIMIT cap) AS ids
            ), claimed AS (
                UPDATE pgfleet.jobs j
                SET status = 'running', attempt = j.attempt + 1,
                    started_at = CASE WHEN j.id = ANY ((SELECT p.ids[1:starts] FROM pick p)::uuid[])
                                      THEN ts END,
                    locked_by = p_worker, lock_token = gen_random_uuid(), limited = true
                WHERE j.id = ANY ((SELECT p.ids FROM pick p)::uuid[])
                RETURNING j AS job
            ), counted AS (
                INSERT INTO pgfleet.limit_starts (name, limit_key, started_at)
                SELECT (c.job).name, (c.job).limit_key, ts FROM claimed c
                WHERE f.rate IS NOT NULL AND (c.job).started_at IS NOT NULL
            )
            SELECT array_agg(c.job) FROM claimed c INTO batch;
            n := COALESCE(cardinality(batch), 0);
            IF n > 0 THEN
                claimed_all := claimed_all || batch;
                starts := greatest(starts - n, 0);
                budget := budget - n;
            END IF;
            CONTINUE;
        END IF;
        got := 0;
        cur := f.last_key;
        SELECT EXISTS (SELECT 1 FROM pgfleet.jobs j
                       WHERE j.status = 'queued' AND j.limited AND j.name = f.name
                         AND j.limit_key IS NOT NULL)
        INTO any_keys;
        progress := true;
        LOOP
            EXIT WHEN got >= cap;
            nkeys := 0;
            IF any_keys THEN
                -- One pass: the next keys after the last one served (a loose scan
                -- of the keyed index, one descent per key), the head job of each,
                -- in one statement. The descent that finds a key finds its first
                -- job in claim order (the index's order within a key): that job is
                -- claimed through its tuple id when it qualifies (t); else (h) the
                -- key's first job that does, as a descent of its own.
                want := cap - got;
                WITH RECURSIVE ks(k, t, i) AS (
                    (SELECT j.limit_key, j.ctid, 1 FROM pgfleet.jobs j
                     WHERE j.status = 'queued' AND j.limited AND j.limit_key IS NOT NULL
                       AND j.name = f.name AND j.limit_key > COALESCE(cur, '')
                     ORDER BY j.limit_key, j.priority, j.turn NULLS FIRST, j.id LIMIT 1)
                    UNION ALL
                    SELECT nk.limit_key, nk.ctid, ks.i + 1 FROM ks CROSS JOIN LATERAL (
                        SELECT j.limit_key, j.ctid FROM pgfleet.jobs j
                        WHERE j.status = 'queued' AND j.limited AND j.limit_key IS NOT NULL
                          AND j.name = f.name AND j.limit_key > ks.k
                        ORDER BY j.limit_key, j.priority, j.turn NULLS FIRST, j.id LIMIT 1) nk
                    WHERE ks.i < want
                ), pick AS MATERIALIZED (
                    SELECT ARRAY (
                        SELECT COALESCE(t.id, h.id) FROM ks
                        LEFT JOIN LATERAL (
                            SELECT c.id FROM pgfleet.jobs c
                            WHERE c.ctid = ks.t
                              AND c.status = 'queued' AND c.limited AND c.name = f.name
                              AND c.limit_key = ks.k AND c.run_at <= now()
                              AND (p_queues IS NULL OR c.queue_name = ANY (p_queues))
                              AND (c.queue_name IS NULL OR (
                                    c.queue_name <> ALL (freed)
                                    AND NOT EXISTS (SELECT 1 FROM pgfleet.queue_pauses qp
                                                WHERE qp.queue_name = c.queue_name)
                                    AND NOT EXISTS (SELECT 1 FROM pgfleet.jobs r
                                                    WHERE r.queue_name = c.queue_name
                                                      AND r.status = 'running')
                                    -- one job per named queue: its head, and none running
                                    AND c.id = (SELECT hq.id FROM pgfleet.jobs hq
                                                WHERE hq.queue_name = c.queue_name
                                                  AND hq.status = 'queued' AND hq.run_at <= now()
                                                ORDER BY hq.priority, hq.run_at, hq.id LIMIT 1)
                                    -- and no other claim of the queue under way (last:
                                    -- taken only for the head, held until this claim commits)
                                    AND pg_try_advisory_xact_lock(1885824625, hashtext(c.queue_name))))
                            FOR UPDATE SKIP LOCKED) t ON true
                        LEFT JOIN LATERAL (
                            SELECT c.id FROM pgfleet.jobs c
                            WHERE t.id IS NULL
                              AND c.status = 'queued' AND c.limited AND c.name = f.name
                              AND c.limit_key = ks.k AND c.run_at <= now()
                              AND (p_queues IS NULL OR c.queue_name = ANY (p_queues))
                              AND (c.queue_name IS NULL OR (
                                    c.queue_name <> ALL (freed)
                                    AND NOT EXISTS (SELECT 1 FROM pgfleet.queue_pauses qp
                                                WHERE qp.queue_name = c.queue_name)
                                    AND NOT EXISTS (SELECT 1 FROM pgfleet.jobs r
                                                    WHERE r.queue_name = c.queue_name
                                                      AND r.status = 'running')
                                    AND c.id = (SELECT hq.id FROM pgfleet.jobs hq
                                                WHERE hq.queue_name = c.queue_name
                                                  AND hq.status = 'queued' AND hq.run_at <= now()
                                                ORDER BY hq.priority, hq.run_at, hq.id LIMIT 1)
                                    AND pg_try_advisory_xact_lock(1885824625, hashtext(c.queue_name))))
                            ORDER BY c.priority, c.turn NULLS FIRST, c.id
                            LIMIT 1
                            FOR UPDATE SKIP LOCKED) h ON true
                        -- A key at its own limit is skipped before either pick runs.
                        WHERE (NOT f.per_key OR f.concurrency IS NULL OR (
                                SELECT count(*) FROM pgfleet.jobs r
                                WHERE r.status = 'running' AND r.limited AND r.name = f.name
                                  AND r.limit_key = ks.k) < f.concurrency)
                          AND (NOT f.per_key OR f.rate IS NULL OR (
                                SELECT count(*) FROM pgfleet.limit_starts st
                                WHERE st.name = f.name AND st.limit_key = ks.k
                                  AND st.started_at > ts - make_interval(secs => f.per))
                                < f.rate)
                          AND COALESCE(t.id, h.id) IS NOT NULL
                        ORDER BY ks.i) AS ids
                ), claimed AS (
                    -- Through the primary key, from the array (the first `starts`
                    -- in turn order start now).
                    UPDATE pgfleet.jobs j
                    SET status = 'running', attempt = j.attempt + 1,
                        started_at = CASE WHEN j.id = ANY ((SELECT p.ids[1:starts] FROM pick p)::uuid[])
                                          THEN ts END,
                        locked_by = p_worker, lock_token = gen_random_uuid(), limited = true
                    WHERE j.id = ANY ((SELECT p.ids FROM pick p)::uuid[])
                    RETURNING j AS job
                ), counted AS (
                    INSERT INTO pgfleet.limit_starts (name, limit_key, started_at)
                    SELECT (c.job).name, (c.job).limit_key, ts FROM claimed c
                    WHERE f.rate IS NOT NULL AND (c.job).started_at IS NOT NULL
                )
                SELECT (SELECT array_agg(c.job) FROM claimed c),
                       (SELECT max(ks.k) FROM ks),
                       (SELECT count(*) FROM ks)
                INTO batch, k, nkeys;
                n := COALESCE(cardinality(batch), 0);
                IF n > 0 THEN
                    claimed_all := claimed_all || batch;
                    got := got + n;
                    starts := greatest(starts - n, 0);
                    progress := true;
                END IF;
                IF k IS NOT NULL THEN
                    cur := k;
                END IF;
                -- The scan found as many keys as it wanted: go on from there.
                CONTINUE WHEN nkeys >= want;
            END IF;
            -- A wrap: the jobs without a key take their turn (all of what is
            -- left when the name has no keyed jobs), then the keys start over.
            EXIT WHEN NOT progress;
            progress := false;
            cur := NULL;
            want := CASE WHEN any_keys THEN 1 ELSE cap - got END;
            IF f.per_key THEN
                -- The jobs without a key are one key of their own.
                IF f.concurrency IS NOT NULL THEN
                    SELECT count(*) INTO nrun FROM pgfleet.jobs r
                    WHERE r.status = 'running' AND r.limited AND r.name = f.name
                      AND r.limit_key IS NULL;
                    want := least(want, f.concurrency - nrun);
                END IF;
                IF f.rate IS NOT NULL THEN
                    SELECT count(*) INTO nstart FROM pgfleet.limit_starts s
                    WHERE s.name = f.name AND s.limit_key IS NULL
                      AND s.started_at > ts - make_interval(secs => f.per);
                    want := least(want, f.rate - nstart);
                END IF;
                CONTINUE WHEN want <= 0;
            END IF;
            WITH pick AS MATERIALIZED (
                SELECT ARRAY (
                    SELECT c.id FROM pgfleet.jobs c
                    WHERE c.status = 'queued' AND c.limited AND c.name = f.name
                      AND c.limit_key IS NULL AND c.run_at <= now()
                      AND (p_queues IS NULL OR c.queue_name = ANY (p_queues))
                      AND (c.queue_name IS NULL OR (
                            c.queue_name <> ALL (freed)
                            AND NOT EXISTS (SELECT 1 FROM pgfleet.queue_pauses qp
                                        WHERE qp.queue_name = c.queue_name)
                            AND NOT EXISTS (SELECT 1 FROM pgfleet.jobs r
                                            WHERE r.queue_name = c.queue_name
                                              AND r.status = 'running')
                            -- one job per named queue: its head, and none running
                            AND c.id = (SELECT hq.id FROM pgfleet.jobs hq
                                        WHERE hq.queue_name = c.queue_name AND hq.status = 'queued'
                                          AND hq.run_at <= now()
                                        ORDER BY hq.priority, hq.run_at, hq.id LIMIT 1)
                            -- and no other claim of the queue under way
                            AND pg_try_advisory_xact_lock(1885824625, hashtext(c.queue_name))))
                    ORDER BY c.priority, c.turn NULLS FIRST, c.id
                    LIMIT want
                    FOR UPDATE SKIP LOCKED) AS ids
            ), claimed AS (
                UPDATE pgfleet.jobs j
                SET status = 'running', attempt = j.attempt + 1,
                    started_at = CASE WHEN j.id = ANY ((SELECT p.ids[1:starts] FROM pick p)::uuid[])
                                      THEN ts END,
                    locked_by = p_worker, lock_token = gen_random_uuid(), limited = true
                WHERE j.id = ANY ((SELECT p.ids FROM pick p)::uuid[])
                RETURNING j AS job
            ), counted AS (
                INSERT INTO pgfleet.limit_starts (name, limit_key, started_at)
                SELECT (c.job).name, (c.job).limit_key, ts FROM claimed c
                WHERE f.rate IS NOT NULL AND (c.job).started_at IS NOT NULL
            )
            SELECT array_agg(c.job) FROM claimed c INTO batch;
            n := COALESCE(cardinality(batch), 0);
            IF n > 0 THEN
                claimed_all := claimed_all || batch;
                got := got + n;
                starts := greatest(starts - n, 0);
                progress := true;
            END IF;
        END LOOP;
        IF cur IS DISTINCT FROM f.last_key THEN
            UPDATE pgfleet.flow_turns SET last_key = cur WHERE name = f.name;
        END IF;
        budget := budget - got;
    END LOOP;
    -- A named queue runs one job at a time. The claim of its head took the queue's
    -- lock (above), so no other claim of it is under way; but that pick's snapshot
    -- may predate the commit of a claim of another of its jobs. This statement's
    -- snapshot is newer than the lock, so it sees every such claim: a job that lost
    -- the race goes back, unclaimed (its attempt uncounted), and is not returned.
    SELECT array_agg(b.id) INTO in_queues FROM unnest(claimed_all) b
    WHERE b.queue_name IS NOT NULL;
    IF in_queues IS NOT NULL THEN
        WITH back AS (
            UPDATE pgfleet.jobs j
            SET status = 'queued', attempt = greatest(j.attempt - 1, 0), started_at = NULL,
                locked_by = NULL, lock_token = NULL
            WHERE j.id = ANY (in_queues) AND j.status = 'running' AND j.locked_by = p_worker
              AND EXISTS (SELECT 1 FROM pgfleet.jobs r
                          WHERE r.queue_name = j.queue_name AND r.status = 'running'
                            AND r.id <> j.id)
            RETURNING j.id
        )
        SELECT array_agg(back.id) INTO beaten FROM back;
    END IF;
    -- Each name and priority's front: the highest turn claimed (0017).
    IF cardinality(claimed_all) > 0 THEN
        INSERT INTO pgfleet.flow_fronts AS ff (name, priority, turn)
        SELECT b.name, b.priority, max(b.turn) FROM unnest(claimed_all) b
        WHERE b.turn IS NOT NULL
        GROUP BY b.name, b.priority
        ON CONFLICT (name, priority) DO UPDATE SET turn = EXCLUDED.turn
            WHERE ff.turn < EXCLUDED.turn;
    END IF;
    RETURN QUERY SELECT * FROM unnest(claimed_all) b
    WHERE beaten IS NULL OR b.id <> ALL (beaten);
END;
$fn$;
