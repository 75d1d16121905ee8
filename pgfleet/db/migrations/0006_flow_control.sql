-- pgfleet 0006: flow control. Concurrency and rate limits per job name (for the
-- whole name or for each limit key), fair turns between the keys of a name, and
-- pauses of job names and named queues. Names without a limit, a pause or keyed
-- jobs stay on the claim's fast path; the others are claimed by
-- pgfleet.claim_flow() below, under a lock on the name's row.

-- The key a job's limits and turns count it under (a tenant, an account).
ALTER TABLE pgfleet.jobs ADD COLUMN limit_key text
    CHECK (char_length(limit_key) BETWEEN 1 AND 512);
-- Under flow control: set at enqueue when the job has a limit key or its name has
-- a row in pgfleet.limits (a limit or a pause), and on the queued and running jobs
-- of a name when it gets one. The claim's fast path walks only the other jobs
-- (jobs_free), so a limited or paused backlog never stands in its way; claim_flow
-- walks these (jobs_flow_queued) and counts the running ones (jobs_limited_running).
ALTER TABLE pgfleet.jobs ADD COLUMN limited boolean NOT NULL DEFAULT false;

CREATE INDEX jobs_free ON pgfleet.jobs (priority, run_at, id)
    WHERE status = 'queued' AND NOT limited;
CREATE INDEX jobs_flow_queued ON pgfleet.jobs (name, limit_key, priority, run_at, id)
    WHERE status = 'queued' AND limited;
CREATE INDEX jobs_limited_running ON pgfleet.jobs (name, limit_key)
    WHERE status = 'running' AND limited;

-- One row per job name with a limit or a pause. source: 'code' (a default declared
-- with Registry.job, rewritten by workers) or 'operator' (never overwritten by code).
CREATE TABLE pgfleet.limits (
    name        text        PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 128),
    concurrency integer     CHECK (concurrency BETWEEN 1 AND 1000000),
    rate        integer     CHECK (rate BETWEEN 1 AND 1000000),
    per         float8      NOT NULL DEFAULT 1 CHECK (per >= 0.001 AND per <= 86400),
    per_key     boolean     NOT NULL DEFAULT false,
    source      text        NOT NULL DEFAULT 'operator' CHECK (source IN ('code', 'operator')),
    paused_at   timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT limits_something CHECK (concurrency IS NOT NULL OR rate IS NOT NULL
                                       OR paused_at IS NOT NULL)
);

-- The paused names, for the claim's probe (an index, as every claim-path read).
CREATE INDEX limits_paused ON pgfleet.limits (name) WHERE paused_at IS NOT NULL;

-- Paused named queues.
CREATE TABLE pgfleet.queue_pauses (
    queue_name text        PRIMARY KEY CHECK (char_length(queue_name) BETWEEN 1 AND 128),
    paused_at  timestamptz NOT NULL DEFAULT now()
);

-- A name's turn state: the last key served (turns carry across rounds) and the row
-- whose lock serialises the claims of the name fleet-wide.
CREATE TABLE pgfleet.flow_turns (
    name     text PRIMARY KEY,
    last_key text
);

-- Attempt starts of rate-limited names, kept for the longest window.
CREATE TABLE pgfleet.limit_starts (
    name       text        NOT NULL,
    limit_key  text,
    started_at timestamptz NOT NULL
);
CREATE INDEX limit_starts_window ON pgfleet.limit_starts (name, limit_key, started_at);

-- Claims up to p_n jobs (the first p_start of them to start now, the rest held
-- ahead, started_at NULL) for worker p_worker among the job names p_names (and
-- named queues p_queues, NULL: any) that are limited or have keyed jobs. Each
-- name's turn row is locked (SKIP LOCKED: a name another worker is claiming right
-- now waits for the next round, so a hung connection holding it blocks nobody);
-- every statement after the lock takes a fresh snapshot, so the running jobs and
-- starts it counts include every claim committed before. A rate-limited name's
-- jobs are only claimed to start now (a rate counts attempt starts). Keys are
-- served in passes of one job per key, in key order from the key after the last
-- one served (a loose scan of the keyed index: one probe per key), wrapping
-- round; jobs without a key take one turn at each wrap.
CREATE FUNCTION pgfleet.claim_flow(p_worker uuid, p_names text[], p_queues text[],
                                   p_n integer, p_start integer)
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
BEGIN
    IF budget <= 0 THEN
        RETURN;
    END IF;
    -- Names in play: limited and not paused, or unlimited with due flagged jobs
    -- (keyed ones, or left from a limit since cleared).
    INSERT INTO pgfleet.flow_turns (name)
    SELECT u.n FROM unnest(p_names) AS u(n)
    WHERE EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = u.n AND l.paused_at IS NULL)
       OR (NOT EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = u.n)
           AND EXISTS (SELECT 1 FROM pgfleet.jobs j
                       WHERE j.status = 'queued' AND j.limited AND j.name = u.n
                         AND j.run_at <= now()))
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
                -- of the keyed index), the head job of each, in one statement.
                want := cap - got;
                WITH RECURSIVE ks(k, i) AS (
                    SELECT (SELECT j.limit_key FROM pgfleet.jobs j
                            WHERE j.status = 'queued' AND j.limited AND j.limit_key IS NOT NULL
                              AND j.name = f.name AND j.limit_key > COALESCE(cur, '')
                            ORDER BY j.limit_key LIMIT 1), 1
                    UNION ALL
                    SELECT (SELECT j.limit_key FROM pgfleet.jobs j
                            WHERE j.status = 'queued' AND j.limited AND j.limit_key IS NOT NULL
                              AND j.name = f.name AND j.limit_key > ks.k
                            ORDER BY j.limit_key LIMIT 1), ks.i + 1
                    FROM ks WHERE ks.k IS NOT NULL AND ks.i < want
                ), pick AS (
                    SELECT h.id, ks.i FROM ks CROSS JOIN LATERAL (
                        SELECT c.id FROM pgfleet.jobs c
                        WHERE c.status = 'queued' AND c.limited AND c.name = f.name AND c.limit_key = ks.k
                          AND c.run_at <= now()
                          AND (p_queues IS NULL OR c.queue_name = ANY (p_queues))
                          AND (c.queue_name IS NULL OR (
                                NOT EXISTS (SELECT 1 FROM pgfleet.queue_pauses qp
                                            WHERE qp.queue_name = c.queue_name)
                                AND NOT EXISTS (SELECT 1 FROM pgfleet.jobs r
                                                WHERE r.queue_name = c.queue_name
                                                  AND r.status = 'running')
                                -- one job per named queue: its head, and none running
                                AND c.id = (SELECT hq.id FROM pgfleet.jobs hq
                                            WHERE hq.queue_name = c.queue_name AND hq.status = 'queued'
                                              AND hq.run_at <= now()
                                            ORDER BY hq.priority, hq.run_at, hq.id LIMIT 1)))
                          AND (NOT f.per_key OR f.concurrency IS NULL OR (
                                SELECT count(*) FROM pgfleet.jobs r
                                WHERE r.status = 'running' AND r.limited AND r.name = f.name
                                  AND r.limit_key = ks.k) < f.concurrency)
                          AND (NOT f.per_key OR f.rate IS NULL OR (
                                SELECT count(*) FROM pgfleet.limit_starts st
                                WHERE st.name = f.name AND st.limit_key = ks.k
                                  AND st.started_at > ts - make_interval(secs => f.per))
                                < f.rate)
                        ORDER BY c.priority, c.run_at, c.id
                        LIMIT 1
                        FOR UPDATE SKIP LOCKED) h
                    WHERE ks.k IS NOT NULL
                ), numbered AS (
                    SELECT p.id, row_number() OVER (ORDER BY p.i) AS rn FROM pick p
                ), claimed AS (
                    UPDATE pgfleet.jobs j
                    SET status = 'running', attempt = j.attempt + 1,
                        started_at = CASE WHEN m.rn <= starts THEN ts END,
                        locked_by = p_worker, lock_token = gen_random_uuid(), limited = true
                    FROM numbered m WHERE j.id = m.id
                    RETURNING j AS job
                ), counted AS (
                    INSERT INTO pgfleet.limit_starts (name, limit_key, started_at)
                    SELECT (c.job).name, (c.job).limit_key, ts FROM claimed c
                    WHERE f.rate IS NOT NULL AND (c.job).started_at IS NOT NULL
                )
                SELECT (SELECT array_agg(c.job) FROM claimed c),
                       (SELECT max(ks.k) FROM ks),
                       (SELECT count(*) FROM ks WHERE ks.k IS NOT NULL)
                INTO batch, k, nkeys;
                n := COALESCE(cardinality(batch), 0);
                IF n > 0 THEN
                    RETURN QUERY SELECT * FROM unnest(batch);
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
            RETURN QUERY
            WITH pick AS (
                SELECT c.id FROM pgfleet.jobs c
                WHERE c.status = 'queued' AND c.limited AND c.name = f.name AND c.limit_key IS NULL
                  AND c.run_at <= now()
                  AND (p_queues IS NULL OR c.queue_name = ANY (p_queues))
                  AND (c.queue_name IS NULL OR (
                        NOT EXISTS (SELECT 1 FROM pgfleet.queue_pauses qp
                                    WHERE qp.queue_name = c.queue_name)
                        AND NOT EXISTS (SELECT 1 FROM pgfleet.jobs r
                                        WHERE r.queue_name = c.queue_name
                                          AND r.status = 'running')
                        -- one job per named queue: its head, and none running
                        AND c.id = (SELECT hq.id FROM pgfleet.jobs hq
                                    WHERE hq.queue_name = c.queue_name AND hq.status = 'queued'
                                      AND hq.run_at <= now()
                                    ORDER BY hq.priority, hq.run_at, hq.id LIMIT 1)))
                ORDER BY c.priority, c.run_at, c.id
                LIMIT want
                FOR UPDATE SKIP LOCKED
            ), numbered AS (
                SELECT p.id, row_number() OVER () AS rn FROM pick p
            ), claimed AS (
                UPDATE pgfleet.jobs j
                SET status = 'running', attempt = j.attempt + 1,
                    started_at = CASE WHEN m.rn <= starts THEN ts END,
                    locked_by = p_worker, lock_token = gen_random_uuid(), limited = true
                FROM numbered m WHERE j.id = m.id
                RETURNING j.*
            ), counted AS (
                INSERT INTO pgfleet.limit_starts (name, limit_key, started_at)
                SELECT c.name, c.limit_key, ts FROM claimed c
                WHERE f.rate IS NOT NULL AND c.started_at IS NOT NULL
            )
            SELECT * FROM claimed;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n > 0 THEN
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
END;
$fn$;
