-- Every runtime query pgfleet sends, named, with its result shape.
-- Loaded and checked once at import by pgfleet/db/queries.py; nothing else in the
-- package writes SQL. Shapes: :one (a row or none), :many (rows), :val (one value),
-- :exec (a status string).
-- The notification channel is the literal 'pgfleet_jobs' (pgfleet.db.CHANNEL).
-- Payloads travel as text and are cast here, so an application's own jsonb codec on
-- its pool never double-encodes them.

-- ---------------------------------------------------------------- enqueue

-- name: job_insert :exec
-- $9: the enqueue's trace context (JSON text), or NULL; $10: the limit key.
-- limited: the job is under flow control (a limit key, a named queue: 0009, or a
-- name with a limit or a pause); a trigger sets it for a named queue's job as well.
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, run_at,
                          trace_context, limit_key, limited)
VALUES ($1, $2::text, $3::text::jsonb, $4, $5::integer, $6::text,
        COALESCE($7::timestamptz, now() + make_interval(secs => $8::float8)), $9::text::jsonb,
        $10::text,
        $10::text IS NOT NULL OR $6::text IS NOT NULL
        OR EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = $2::text));

-- name: job_insert_notify :exec
-- The wakeup rides in the RETURNING list: queued only if the row was inserted, and
-- cheaper for Postgres to run than a data-modifying CTE around the insert.
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, run_at,
                          trace_context, limit_key, limited)
VALUES ($1, $2::text, $3::text::jsonb, $4, $5::integer, $6::text,
        COALESCE($7::timestamptz, now() + make_interval(secs => $8::float8)), $9::text::jsonb,
        $10::text,
        $10::text IS NOT NULL OR $6::text IS NOT NULL
        OR EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = $2::text))
RETURNING pg_notify('pgfleet_jobs', '');

-- name: job_insert_plain :exec
-- The common single enqueue: default options, so only four parameters travel.
INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, limited)
VALUES ($1, $2::text, $3::text::jsonb, $4::integer,
        EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = $2::text));

-- name: job_insert_plain_notify :exec
INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, limited)
VALUES ($1, $2::text, $3::text::jsonb, $4::integer,
        EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = $2::text))
RETURNING pg_notify('pgfleet_jobs', '');

-- name: job_insert_many_plain :exec
-- The common batch: default options for every job. Payloads arrive as one JSON
-- array (one encode call on the client, one parse here), zipped to the ids and names.
-- A limited name's jobs get their turns here, numbered from the name's next
-- turn in batch order (0017), not one by one by the insert trigger.
WITH base AS (
    SELECT l.name, pgfleet.next_turn(l.name, NULL, 0::smallint) AS turn
    FROM pgfleet.limits l WHERE l.name = ANY ($2::text[])
)
INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, limited, turn)
SELECT t.id, t.name, t.payload, $4::integer, b.name IS NOT NULL,
       b.turn + row_number() OVER (PARTITION BY b.name ORDER BY t.ord) - 1
FROM ROWS FROM (unnest($1::uuid[]), unnest($2::text[]), jsonb_array_elements($3::text::jsonb))
     WITH ORDINALITY AS t(id, name, payload, ord)
LEFT JOIN base b ON b.name = t.name;

-- name: job_insert_many :exec
-- $9: the enqueue's trace context (JSON text) for every job, or NULL; $10: limit keys.
-- Flagged jobs due now get their turns here, each key's numbered from its next
-- turn in batch order (0017; '' stands for no key: a limit key is never empty); a
-- scheduled one gets none (it goes first when due).
WITH t AS (
    SELECT u.*, (u.limit_key IS NOT NULL OR u.queue_name IS NOT NULL
                 OR u.name IN (SELECT l.name FROM pgfleet.limits l))
                AND COALESCE(u.run_at, now() + make_interval(secs => u.delay)) <= now()
                AS numbered,
           u.limit_key IS NOT NULL OR u.queue_name IS NOT NULL
           OR u.name IN (SELECT l.name FROM pgfleet.limits l) AS flagged
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
                $7::timestamptz[], $8::float8[], $10::text[])
         WITH ORDINALITY AS u(id, name, payload, priority, max_attempts, queue_name, run_at,
                              delay, limit_key, ord)
), base AS (
    -- pgfleet.next_turn, inline: a descent of jobs_flow_queued per key, no call.
    SELECT g.name, g.k, g.priority,
           GREATEST((SELECT f.turn FROM pgfleet.flow_fronts f
                     WHERE f.name = g.name AND f.priority = g.priority),
                    CASE WHEN g.limit_key IS NULL THEN
                        (SELECT j.turn + 1 FROM pgfleet.jobs j
                         WHERE j.status = 'queued' AND j.limited AND j.name = g.name
                           AND j.limit_key IS NULL AND j.priority = g.priority
                           AND j.turn IS NOT NULL
                         ORDER BY j.limit_key DESC, j.priority DESC, j.turn DESC NULLS LAST,
                                  j.id DESC
                         LIMIT 1)
                    ELSE
                        (SELECT j.turn + 1 FROM pgfleet.jobs j
                         WHERE j.status = 'queued' AND j.limited AND j.name = g.name
                           AND j.limit_key = g.limit_key AND j.priority = g.priority
                           AND j.turn IS NOT NULL
                         ORDER BY j.limit_key DESC, j.priority DESC, j.turn DESC NULLS LAST,
                                  j.id DESC
                         LIMIT 1) END,
                    0) AS turn
    FROM (SELECT DISTINCT t.name, t.limit_key, COALESCE(t.limit_key, '') AS k, t.priority
          FROM t WHERE t.numbered) g
)
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, run_at,
                          trace_context, limit_key, limited, turn)
SELECT t.id, t.name, t.payload::jsonb, t.priority, t.max_attempts, t.queue_name,
       COALESCE(t.run_at, now() + make_interval(secs => t.delay)), $9::text::jsonb,
       t.limit_key, t.flagged,
       CASE WHEN t.numbered THEN
           b.turn + row_number() OVER (PARTITION BY t.numbered, t.name, b.k, t.priority
                                       ORDER BY t.ord) - 1 END
FROM t LEFT JOIN base b
    ON b.name = t.name AND b.k = COALESCE(t.limit_key, '') AND b.priority = t.priority;

-- name: job_insert_keyed_dedupe :many
-- $10 (all three keyed inserts): the enqueue's trace context, or NULL; $11: limit keys.
-- Keeps an existing queued or running job with the same key; returns only the
-- rows it inserted (the caller looks the others up by key).
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, job_key, run_at,
                          trace_context, limit_key, limited)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name, job_key,
       COALESCE(run_at, now() + make_interval(secs => delay)), $10::text::jsonb, limit_key,
       limit_key IS NOT NULL OR queue_name IS NOT NULL
       OR name IN (SELECT l.name FROM pgfleet.limits l)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::text[], $8::timestamptz[], $9::float8[], $11::text[])
     AS t(id, name, payload, priority, max_attempts, queue_name, job_key, run_at, delay,
          limit_key)
ON CONFLICT (job_key) WHERE job_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id, job_key;

-- name: job_insert_keyed_replace :many
-- Overwrites a queued job with the same key, run_at included (debounce). A running
-- job is left untouched and not returned.
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, job_key, run_at,
                          trace_context, limit_key, limited)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name, job_key,
       COALESCE(run_at, now() + make_interval(secs => delay)), $10::text::jsonb, limit_key,
       limit_key IS NOT NULL OR queue_name IS NOT NULL
       OR name IN (SELECT l.name FROM pgfleet.limits l)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::text[], $8::timestamptz[], $9::float8[], $11::text[])
     AS t(id, name, payload, priority, max_attempts, queue_name, job_key, run_at, delay,
          limit_key)
ON CONFLICT (job_key) WHERE job_key IS NOT NULL AND status IN ('queued', 'running') DO UPDATE
    SET name = EXCLUDED.name, payload = EXCLUDED.payload, priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts, queue_name = EXCLUDED.queue_name,
        run_at = EXCLUDED.run_at, trace_context = EXCLUDED.trace_context,
        limit_key = EXCLUDED.limit_key, limited = EXCLUDED.limited,
        -- the new run_at's turn (0017's trigger: none when it is not due)
        turn = EXCLUDED.turn
    WHERE pgfleet.jobs.status = 'queued'
RETURNING id, job_key;

-- name: job_insert_keyed_preserve_run_at :many
-- Overwrites a queued job with the same key but keeps its run_at.
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, job_key, run_at,
                          trace_context, limit_key, limited)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name, job_key,
       COALESCE(run_at, now() + make_interval(secs => delay)), $10::text::jsonb, limit_key,
       limit_key IS NOT NULL OR queue_name IS NOT NULL
       OR name IN (SELECT l.name FROM pgfleet.limits l)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::text[], $8::timestamptz[], $9::float8[], $11::text[])
     AS t(id, name, payload, priority, max_attempts, queue_name, job_key, run_at, delay,
          limit_key)
ON CONFLICT (job_key) WHERE job_key IS NOT NULL AND status IN ('queued', 'running') DO UPDATE
    SET name = EXCLUDED.name, payload = EXCLUDED.payload, priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts, queue_name = EXCLUDED.queue_name,
        trace_context = EXCLUDED.trace_context, limit_key = EXCLUDED.limit_key,
        limited = EXCLUDED.limited
    WHERE pgfleet.jobs.status = 'queued'
RETURNING id, job_key;

-- name: job_ids_by_active_key :many
SELECT job_key, id FROM pgfleet.jobs
WHERE job_key = ANY($1::text[]) AND status IN ('queued', 'running');

-- name: notify_jobs :exec
-- Inside a transaction that wrote jobs: delivered when (and if) it commits.
SELECT pg_notify('pgfleet_jobs', '');

-- name: notify_wakeup :exec
-- A wakeup on its own, after the jobs it announces committed. NOTIFY takes a
-- transaction id, so this commit would otherwise wait for a WAL flush of its own: a
-- second fsync per enqueue for a lone producer. Nothing durable rides on it (a lost
-- wakeup delays pickup until the next poll), so it commits asynchronously.
SELECT pg_notify('pgfleet_jobs', ''), set_config('synchronous_commit', 'off', true);

-- ---------------------------------------------------------------- reading jobs

-- Reads of jobs go through pgfleet.jobs_all (jobs and their history, one snapshot):
-- a job moving to history is seen in exactly one of them.

-- name: job_get :one
SELECT * FROM pgfleet.jobs_all WHERE id = $1;

-- name: job_status_get :val
SELECT status::text FROM pgfleet.jobs_all WHERE id = $1;

-- name: job_status_many :many
SELECT id, status::text AS status FROM pgfleet.jobs_all WHERE id = ANY($1::uuid[]);

-- name: job_list_recent :many
-- Newest first: ids are UUIDv7, so the primary key orders by creation.
SELECT * FROM pgfleet.jobs_all
WHERE ($1::pgfleet.job_status IS NULL OR status = $1)
  AND ($2::text IS NULL OR name = $2)
ORDER BY id DESC
LIMIT $3;

-- name: job_count_by_status :many
SELECT status::text AS status, count(*) AS n FROM pgfleet.jobs_all GROUP BY status;

-- name: job_count_queued :val
-- Runnable backlog (optionally of one job name) for admission control, counted up
-- to $2 rows (NULL: all) so that a check against a cap costs at most the cap. Jobs
-- due within the next $3 seconds count too (0: due now only), so that jobs
-- scheduled a little ahead cannot pile up past the cap.
SELECT count(*) FROM (
    SELECT 1 FROM pgfleet.jobs
    WHERE status = 'queued' AND run_at <= now() + make_interval(secs => $3::float8)
      AND ($1::text IS NULL OR name = $1)
    LIMIT $2::bigint
) AS runnable;

-- name: job_count_queued_by_names :many
-- The runnable backlog of each of several job names, each counted up to $2 rows,
-- with the jobs due within the next $3 seconds.
SELECT k.name, (
    SELECT count(*) FROM (
        SELECT 1 FROM pgfleet.jobs j
        WHERE j.status = 'queued' AND j.name = k.name
          AND j.run_at <= now() + make_interval(secs => $3::float8)
        LIMIT $2::bigint
    ) AS runnable
) AS n
FROM unnest($1::text[]) AS k(name);

-- ---------------------------------------------------------------- management

-- name: job_cancel :one
-- A queued or waiting job (one with parents; its own children follow) ends
-- cancelled at once. A running one keeps running: the request is recorded (the
-- first one's time and who asked, $2) and its worker told on the cancel channel
-- (its heartbeat finds the request when the notification is lost); its worker's
-- outcome then ends it cancelled, unless the handler succeeded first.
WITH target AS (
    UPDATE pgfleet.jobs
    SET status = CASE WHEN status IN ('queued', 'waiting') THEN 'cancelled'
                      ELSE status END::pgfleet.job_status,
        finished_at = CASE WHEN status IN ('queued', 'waiting') THEN now() END,
        cancel_requested_at = CASE WHEN status = 'running'
                                   THEN COALESCE(cancel_requested_at, now()) END,
        cancelled_by = COALESCE(cancelled_by, $2::text)
    WHERE id = $1 AND status IN ('queued', 'waiting', 'running')
    RETURNING *
), told AS (
    SELECT pg_notify(CASE WHEN t.status = 'running' THEN 'pgfleet_cancel' ELSE 'pgfleet_done' END,
                     t.id::text)
    FROM target t WHERE t.status = 'running' OR t.awaited IS TRUE
)
SELECT t.* FROM target t CROSS JOIN (SELECT count(*) FROM told) n;

-- name: job_await :many
-- Someone waits for these jobs (Queue.wait): finishing them notifies the done
-- channel. The caller reads their status afterwards, in a snapshot of its own.
-- A row locked by another transaction is skipped, never waited for: a claim round
-- holding it may be about to update a row this statement marked (its held jobs
-- marked started, its outcomes written), and each would wait for the other until
-- the deadlock detector aborted one. Returns the unfinished jobs left unmarked
-- (this statement's snapshot): the caller marks them again shortly.
WITH marked AS (
    UPDATE pgfleet.jobs j SET awaited = true
    WHERE j.id IN (SELECT c.id FROM pgfleet.jobs c
                   WHERE c.id = ANY($1::uuid[]) AND c.status IN ('queued', 'running')
                     AND c.awaited IS NOT TRUE
                   FOR UPDATE SKIP LOCKED)
    RETURNING j.id
)
SELECT c.id FROM pgfleet.jobs c
WHERE c.id = ANY($1::uuid[]) AND c.status IN ('queued', 'running') AND c.awaited IS NOT TRUE
  AND c.id NOT IN (SELECT m.id FROM marked m);

-- name: job_get_many :many
SELECT * FROM pgfleet.jobs_all WHERE id = ANY($1::uuid[]);

-- name: job_cancels_of_worker :many
-- The running jobs of worker $1 someone asked to cancel: the heartbeat's check,
-- for cancel notifications that were lost.
SELECT id FROM pgfleet.jobs
WHERE status = 'running' AND locked_by = $1 AND cancel_requested_at IS NOT NULL;

-- name: jobs_history_restore :val
-- Jobs $1 (failed or cancelled), and every dead job named $2, moved back from
-- history to pgfleet.jobs in one statement, so that the change that follows in the
-- same transaction (a retry) finds them there; how many moved.
WITH back AS (
    DELETE FROM pgfleet.jobs_history h
    WHERE (h.id = ANY($1::uuid[]) AND h.status IN ('failed', 'cancelled'))
       OR (h.status = 'failed' AND h.name = $2::text)
    RETURNING h.*
), restored AS (
    INSERT INTO pgfleet.jobs SELECT * FROM back RETURNING 1
)
SELECT count(*) FROM restored;

-- name: job_retry :one
-- The error history stays: it tells what the earlier runs met. Queued again, the
-- job is under flow control as an enqueue would put it (a limit key, a named queue,
-- a name with a limit or a pause now): a job that finished before its name got a
-- limit, or before 0009, is not left on the fast path (0012's check).
UPDATE pgfleet.jobs
SET status = 'queued', attempt = 0, run_at = now(), started_at = NULL, finished_at = NULL,
    last_error = NULL, result = NULL, result_json = NULL, snoozes = NULL,
    cancel_requested_at = NULL, cancelled_by = NULL,
    limited = limited OR limit_key IS NOT NULL OR queue_name IS NOT NULL
              OR EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = pgfleet.jobs.name)
WHERE id = $1 AND status IN ('failed', 'cancelled')
RETURNING *;

-- name: job_reschedule :one
-- A flagged job moved later gives up its turn (it goes first when due: 0017).
UPDATE pgfleet.jobs
SET run_at = COALESCE($2::timestamptz, now() + make_interval(secs => $3::float8)),
    turn = CASE WHEN COALESCE($2::timestamptz, now() + make_interval(secs => $3::float8))
                     <= now() THEN turn END
WHERE id = $1 AND status = 'queued'
RETURNING *, run_at <= now() AS due;

-- name: job_permanently_fail :one
-- Releases the lock of a running job: its handler's eventual outcome is discarded.
WITH target AS (
    UPDATE pgfleet.jobs
    SET status = 'failed', finished_at = now(), last_error = $2, locked_by = NULL,
        lock_token = NULL
    WHERE id = $1 AND status IN ('queued', 'running')
    RETURNING *
), told AS (
    SELECT pg_notify('pgfleet_done', t.id::text) FROM target t WHERE t.awaited IS TRUE
)
SELECT t.* FROM target t CROSS JOIN (SELECT count(*) FROM told) n;

-- name: job_complete :one
WITH target AS (
    UPDATE pgfleet.jobs
    SET status = 'succeeded', finished_at = now(), locked_by = NULL, lock_token = NULL
    WHERE id = $1 AND status IN ('queued', 'running')
    RETURNING *
), told AS (
    SELECT pg_notify('pgfleet_done', t.id::text) FROM target t WHERE t.awaited IS TRUE
)
SELECT t.* FROM target t CROSS JOIN (SELECT count(*) FROM told) n;

-- name: jobs_history_move :val
-- One batch of jobs finished more than $1 seconds ago moved to history, in one
-- statement (readers see each job in exactly one table). Jobs with parents
-- (waiting_on is set) stay: deleting one deletes its edges (0014's trigger), which
-- its parents' and its batch's readers still need.
WITH doomed AS (
    SELECT id FROM pgfleet.jobs j
    WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => $1::float8)
      AND waiting_on IS NULL
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM pgfleet.jobs j USING doomed WHERE j.id = doomed.id RETURNING j.*
), kept AS (
    INSERT INTO pgfleet.jobs_history SELECT * FROM moved RETURNING 1
)
SELECT count(*) FROM kept;

-- name: jobs_history_prepare :val
-- History's missing day partitions created, from the day of the oldest finished job
-- still in pgfleet.jobs (but not before the retention's cutoff, $2 seconds ago;
-- NULL: no retention) or today, to $1 days ahead; how many were created.
SELECT pgfleet.jobs_history_prepare(
    (SELECT CASE WHEN min(finished_at) IS NOT NULL THEN
                GREATEST((min(finished_at) AT TIME ZONE 'UTC')::date,
                         ((now() - make_interval(secs => $2::float8)) AT TIME ZONE 'UTC')::date)
            END
     FROM pgfleet.jobs WHERE status IN ('succeeded', 'failed', 'cancelled')),
    $1::integer);

-- name: jobs_history_drop :many
-- Whole days of history finished more than $1 seconds ago dropped, waiting at most
-- $2 (a lock_timeout) for the table's lock; their rows estimated, or counted when $3.
SELECT partition, n
FROM pgfleet.jobs_history_drop(now() - make_interval(secs => $1::float8), $2::text,
                               $3::boolean);

-- name: jobs_history_prune :val
-- One bounded batch of history's rows finished more than $1 seconds ago, deleted:
-- what is left of a day that is not yet wholly past the cutoff (Queue.prune_finished;
-- the leader's retention only drops whole days).
WITH doomed AS (
    SELECT id, finished_at FROM pgfleet.jobs_history
    WHERE finished_at < now() - make_interval(secs => $1::float8)
    LIMIT $2
), deleted AS (
    DELETE FROM pgfleet.jobs_history h USING doomed
    WHERE h.id = doomed.id AND h.finished_at = doomed.finished_at RETURNING 1
)
SELECT count(*) FROM deleted;

-- name: job_prune_finished :val
-- One bounded batch of finished jobs older than the cutoff.
WITH doomed AS (
    SELECT id FROM pgfleet.jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => $1::float8)
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM pgfleet.jobs j USING doomed WHERE j.id = doomed.id RETURNING 1
)
SELECT count(*) FROM deleted;

-- ---------------------------------------------------------------- flow control

-- name: limits_set :one
-- An operator's limits for job name $1 (a pause on it is kept). The running jobs
-- of the name count against it from now on (claim_flow counts flagged rows).
WITH upsert AS (
    INSERT INTO pgfleet.limits AS l (name, concurrency, rate, per, per_key, source)
    VALUES ($1::text, $2::integer, $3::integer, $4::float8, $5::boolean, 'operator')
    ON CONFLICT (name) DO UPDATE
        SET concurrency = EXCLUDED.concurrency, rate = EXCLUDED.rate, per = EXCLUDED.per,
            per_key = EXCLUDED.per_key, source = 'operator', updated_at = now()
    RETURNING l.*
), flagged AS (
    UPDATE pgfleet.jobs j SET limited = true
    WHERE j.status IN ('queued', 'running') AND j.name = $1::text AND NOT j.limited
), wake AS (
    SELECT pg_notify('pgfleet_jobs', '')
)
SELECT u.*, (SELECT count(*) FROM wake) AS woken FROM upsert u;

-- name: limits_set_default :one
-- A limit declared in code (Registry.job) for job name $1: written when no
-- operator value exists (a row holding only a pause has none). Returns the stored
-- row and whether this call wrote it.
WITH written AS (
    INSERT INTO pgfleet.limits AS l (name, concurrency, rate, per, per_key, source)
    VALUES ($1::text, $2::integer, $3::integer, $4::float8, $5::boolean, 'code')
    ON CONFLICT (name) DO UPDATE
        SET concurrency = EXCLUDED.concurrency, rate = EXCLUDED.rate, per = EXCLUDED.per,
            per_key = EXCLUDED.per_key, source = 'code', updated_at = now()
        WHERE (l.source = 'code' OR (l.concurrency IS NULL AND l.rate IS NULL))
          AND (l.concurrency, l.rate, l.per, l.per_key, l.source)
              IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.rate, EXCLUDED.per,
                                EXCLUDED.per_key, 'code')
    RETURNING l.*
), flagged AS (
    UPDATE pgfleet.jobs j SET limited = true
    WHERE EXISTS (SELECT 1 FROM written)
      AND j.status IN ('queued', 'running') AND j.name = $1::text AND NOT j.limited
)
SELECT w.*, true AS wrote FROM written w
UNION ALL
SELECT l.*, false FROM pgfleet.limits l
WHERE l.name = $1::text AND NOT EXISTS (SELECT 1 FROM written);

-- name: limits_clear :val
-- Removes job name $1's limits (a pause on it stays); true when there were some.
WITH dropped AS (
    DELETE FROM pgfleet.limits
    WHERE name = $1::text AND paused_at IS NULL
    RETURNING 1
), kept AS (
    UPDATE pgfleet.limits SET concurrency = NULL, rate = NULL, per_key = false,
                              source = 'operator', updated_at = now()
    WHERE name = $1::text AND paused_at IS NOT NULL
      AND (concurrency IS NOT NULL OR rate IS NOT NULL)
    RETURNING 1
), wake AS (
    SELECT pg_notify('pgfleet_jobs', '') FROM (SELECT 1 FROM dropped UNION ALL SELECT 1 FROM kept) x
    LIMIT 1
)
SELECT EXISTS (SELECT 1 FROM dropped) OR EXISTS (SELECT 1 FROM kept)
       OR (SELECT count(*) FROM wake) < 0;

-- name: limits_list :many
SELECT name, concurrency, rate, per, per_key, source, paused_at, updated_at
FROM pgfleet.limits ORDER BY name;

-- name: pause_name :val
-- Nothing new of job name $1 starts; returns when it was paused (the first pause).
-- Its queued jobs move under flow control (off the fast path's index).
WITH paused AS (
    INSERT INTO pgfleet.limits AS l (name, paused_at) VALUES ($1::text, now())
    ON CONFLICT (name) DO UPDATE SET paused_at = COALESCE(l.paused_at, now()),
                                     updated_at = now()
    RETURNING l.paused_at
), flagged AS (
    UPDATE pgfleet.jobs j SET limited = true
    WHERE j.status IN ('queued', 'running') AND j.name = $1::text AND NOT j.limited
)
SELECT paused_at FROM paused;

-- name: pause_queue :val
-- Its queued jobs move under flow control (off the fast path's index).
WITH paused AS (
    INSERT INTO pgfleet.queue_pauses AS q (queue_name) VALUES ($1::text)
    ON CONFLICT (queue_name) DO UPDATE SET paused_at = q.paused_at
    RETURNING q.paused_at
), flagged AS (
    UPDATE pgfleet.jobs j SET limited = true
    WHERE j.status = 'queued' AND j.queue_name = $1::text AND NOT j.limited
)
SELECT paused_at FROM paused;

-- name: resume_name :val
-- True when job name $1 was paused. A row that held only the pause goes.
WITH dropped AS (
    DELETE FROM pgfleet.limits
    WHERE name = $1::text AND paused_at IS NOT NULL AND concurrency IS NULL AND rate IS NULL
    RETURNING 1
), kept AS (
    UPDATE pgfleet.limits SET paused_at = NULL, updated_at = now()
    WHERE name = $1::text AND paused_at IS NOT NULL
      AND (concurrency IS NOT NULL OR rate IS NOT NULL)
    RETURNING 1
), wake AS (
    SELECT pg_notify('pgfleet_jobs', '') FROM (SELECT 1 FROM dropped UNION ALL SELECT 1 FROM kept) x
    LIMIT 1
)
SELECT EXISTS (SELECT 1 FROM dropped) OR EXISTS (SELECT 1 FROM kept)
       OR (SELECT count(*) FROM wake) < 0;

-- name: resume_queue :val
WITH dropped AS (
    DELETE FROM pgfleet.queue_pauses WHERE queue_name = $1::text RETURNING 1
), wake AS (
    SELECT pg_notify('pgfleet_jobs', '') FROM dropped
)
SELECT EXISTS (SELECT 1 FROM dropped) OR (SELECT count(*) FROM wake) < 0;

-- name: paused_list :many
SELECT 'name' AS kind, name, paused_at FROM pgfleet.limits WHERE paused_at IS NOT NULL
UNION ALL
SELECT 'queue', queue_name, paused_at FROM pgfleet.queue_pauses
ORDER BY 1, 2;

-- name: jobs_waiting_on_limit :many
-- Due queued jobs that wait on flow control, by job name and reason: 'paused'
-- (the name or its queue is paused), 'concurrency' (the name is at its concurrency
-- limit), 'rate' (at its rate limit). Per-key limits count a name's whole backlog
-- under the reason when any key is at its limit.
WITH due AS (
    SELECT j.name, j.queue_name, count(*) AS n FROM pgfleet.jobs j
    WHERE j.status = 'queued' AND j.run_at <= now()
      AND (j.name IN (SELECT l.name FROM pgfleet.limits l)
           OR j.queue_name IN (SELECT q.queue_name FROM pgfleet.queue_pauses q))
    GROUP BY j.name, j.queue_name
), state AS (
    SELECT l.name, l.paused_at IS NOT NULL AS paused,
           l.concurrency IS NOT NULL AND EXISTS (
               SELECT 1 FROM pgfleet.jobs r
               WHERE r.status = 'running' AND r.limited AND r.name = l.name
               GROUP BY CASE WHEN l.per_key THEN r.limit_key END
               HAVING count(*) >= l.concurrency) AS at_concurrency,
           l.rate IS NOT NULL AND EXISTS (
               SELECT 1 FROM pgfleet.limit_starts s
               WHERE s.name = l.name AND s.started_at > now() - make_interval(secs => l.per)
               GROUP BY CASE WHEN l.per_key THEN s.limit_key END
               HAVING count(*) >= l.rate) AS at_rate
    FROM pgfleet.limits l
)
SELECT w.name, w.reason, sum(w.n)::bigint AS n FROM (
    SELECT d.name,
           CASE WHEN COALESCE(s.paused, false)
                     OR d.queue_name IN (SELECT q.queue_name FROM pgfleet.queue_pauses q)
                THEN 'paused'
                WHEN s.at_concurrency THEN 'concurrency'
                WHEN s.at_rate THEN 'rate' END AS reason,
           d.n
    FROM due d LEFT JOIN state s USING (name)
) w
WHERE w.reason IS NOT NULL
GROUP BY w.name, w.reason
ORDER BY w.name, w.reason;

-- ---------------------------------------------------------------- workers

-- name: worker_list :many
SELECT w.*, w.expires_at > now() AS alive,
       (SELECT count(*) FROM pgfleet.jobs j
         WHERE j.status = 'running' AND j.locked_by = w.id) AS running_jobs,
       (SELECT l.worker_id = w.id FROM pgfleet.leader l WHERE l.expires_at > now()) AS is_leader
FROM pgfleet.workers w
ORDER BY w.started_at;

-- name: worker_force_unlock :one
-- Requeues everything a gone worker holds (burying jobs out of attempts) and
-- deregisters it, in one statement.
WITH released AS (
    -- A job held ahead that never started (started_at NULL) is requeued in place,
    -- its attempt not counted.
    UPDATE pgfleet.jobs
    SET status = CASE WHEN started_at IS NOT NULL AND attempt >= max_attempts THEN 'failed'
                      ELSE 'queued' END::pgfleet.job_status,
        run_at = CASE WHEN started_at IS NULL THEN run_at ELSE now() END,
        attempt = CASE WHEN started_at IS NULL THEN greatest(attempt - 1, 0) ELSE attempt END,
        finished_at = CASE WHEN started_at IS NOT NULL AND attempt >= max_attempts THEN now() END,
        last_error = CASE WHEN started_at IS NULL THEN last_error
            ELSE 'worker ' || $1::text || ' was force-unlocked during attempt ' || attempt END,
        locked_by = NULL, lock_token = NULL
    WHERE status = 'running' AND locked_by = $1
    RETURNING status
), gone AS (
    DELETE FROM pgfleet.workers WHERE id = $1 RETURNING 1
)
SELECT (SELECT count(*) FROM released WHERE status = 'queued') AS requeued,
       (SELECT count(*) FROM released WHERE status = 'failed') AS failed,
       EXISTS (SELECT 1 FROM gone) AS deregistered;

-- ---------------------------------------------------------------- worker runtime

-- fragment: completion_ctes
-- The completion half of both claim statements (job_complete_and_claim and
-- job_complete_and_claim_lean include it): the outcomes written, the held jobs
-- marked started, the wakeup and the waiters told. Its CTEs are outcome, gone,
-- done, finished, marked, wake and tell; the statement goes on with ', next AS (...)'.
-- Action 'remove' (a worker with remove_succeeded_jobs) is 'succeeded' with the
-- row deleted instead of updated when nothing needs it (gone); done writes every
-- other outcome (those gone did not delete), so each is written once.
WITH outcome AS (
    SELECT o.id, o.token,
           CASE WHEN o.action = 'remove' THEN 'succeeded' ELSE o.action END AS action,
           o.action = 'remove' AS remove, o.delay, o.error, o.ran, o.result
    -- $3 holds one action when every outcome has it (unnest pads the other rows'
    -- with NULL); $4, $5, $12 or $13 are NULL when every outcome's is. $13 is the
    -- results as one text, U+001E between them (JSON text as the worker encodes
    -- it never holds one), empty for an outcome without: one parameter instead of
    -- an array the driver checks and copies element by element.
    FROM (SELECT u.id, u.token, COALESCE(u.action, ($3::text[])[1]) AS action, u.delay,
                 u.error, u.ran, u.result
          FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::text[],
                      $12::float8[], string_to_array($13::text, E'\x1e', ''))
              AS u(id, token, action, delay, error, ran, result)) o
), gone AS (
    -- Removed at completion: a succeeded job nobody waits for (awaited), outside
    -- every workflow (no children to release, no parents: its batch and edges stay
    -- readable), not asked to cancel, and without a result to keep. Its outcome
    -- is final and its row would only be pruned later; the DELETE costs less WAL
    -- and no dead tuple in the finished-jobs index. A named queue or limited
    -- name it frees is work for someone now.
    -- Not from outcome (read once, it is inlined); a one-time test skips it.
    DELETE FROM pgfleet.jobs j
    USING unnest($1::uuid[], $2::uuid[], $3::text[], string_to_array($13::text, E'\x1e', ''))
        AS o(id, token, action, result)
    WHERE 'remove' = ANY ($3::text[])
      AND COALESCE(o.action, ($3::text[])[1]) = 'remove' AND j.id = o.id
      AND j.lock_token = o.token
      AND j.awaited IS NOT TRUE AND j.has_children IS NULL AND j.waiting_on IS NULL
      AND j.cancel_requested_at IS NULL AND o.result IS NULL
    RETURNING j.id, (j.queue_name IS NOT NULL OR j.limited) AS frees, false AS told
), done AS (
    -- A job someone asked to cancel while it ran (cancel_requested_at) ends
    -- cancelled unless its handler succeeded: never retried, snoozed or requeued.
    UPDATE pgfleet.jobs j
    SET status = CASE WHEN o.action = 'succeeded' THEN 'succeeded'
                      WHEN o.action = 'cancelled' OR j.cancel_requested_at IS NOT NULL
                           THEN 'cancelled'
                      WHEN o.action = 'failed' THEN 'failed'
                      ELSE 'queued' END::pgfleet.job_status,
        finished_at = CASE WHEN o.action IN ('succeeded', 'failed', 'cancelled')
                                OR j.cancel_requested_at IS NOT NULL THEN now() END,
        -- An aborted attempt is not counted and the job keeps its run_at: it goes
        -- back to its place in line (and a cron job keeps its occurrence). A
        -- snoozed one is not counted either, and runs again after its delay.
        run_at = CASE WHEN o.action IN ('retry', 'snooze')
                      THEN now() + make_interval(secs => o.delay) ELSE j.run_at END,
        -- Waiting out a delay, a flagged job has no turn: when due, it goes first
        -- (0017's jobs_flow_scheduled), and no claim walks past it meanwhile.
        turn = CASE WHEN o.action IN ('retry', 'snooze') THEN NULL ELSE j.turn END,
        attempt = CASE WHEN o.action IN ('aborted', 'snooze') THEN greatest(j.attempt - 1, 0)
                       ELSE j.attempt END,
        snoozes = CASE WHEN o.action = 'snooze' THEN COALESCE(j.snoozes, 0) + 1 ELSE j.snoozes END,
        last_error = COALESCE(o.error, j.last_error),
        -- Every failed attempt's error, oldest first: the last 10, and a count of
        -- the older ones dropped to make room.
        errors = CASE WHEN o.error IS NULL THEN j.errors
                      ELSE (CASE WHEN jsonb_array_length(COALESCE(j.errors, '[]')) >= 10
                                 THEN j.errors - 0 ELSE COALESCE(j.errors, '[]') END)
                           || jsonb_build_array(jsonb_build_object(
                                'at', now(), 'attempt', j.attempt, 'error', o.error,
                                'worker', $6::uuid)) END,
        errors_omitted = CASE WHEN o.error IS NOT NULL
                                   AND jsonb_array_length(COALESCE(j.errors, '[]')) >= 10
                              THEN COALESCE(j.errors_omitted, 0) + 1
                              ELSE j.errors_omitted END,
        result_json = CASE WHEN o.action = 'succeeded' THEN o.result::json ELSE j.result_json END,
        -- Who cancelled stays only on a job that ended cancelled (a handler that
        -- succeeded before the cancel reached it keeps cancel_requested_at alone).
        cancelled_by = CASE WHEN o.action = 'succeeded' THEN NULL ELSE j.cancelled_by END,
        -- Started from the hold and finished before any round marked it.
        started_at = COALESCE(j.started_at, now() - make_interval(secs => o.ran)),
        locked_by = NULL,
        lock_token = NULL
    FROM outcome o
    -- ANY: a plan made on empty statistics reads only these rows, not all
    WHERE j.id = ANY ($1::uuid[]) AND j.id = o.id AND j.lock_token = o.token
      -- Not deleted by gone (a hashed lookup, built only for a round with removals;
      -- reading gone also runs it first, so the two never touch the same row).
      AND (NOT o.remove OR o.id NOT IN (SELECT g.id FROM gone g))
    -- RETURNING sees the new row: status is the job's new status.
    RETURNING j.id, (j.queue_name IS NOT NULL OR j.limited
                     OR (j.status = 'queued' AND j.run_at <= now())) AS frees,
              j.awaited IS TRUE AND j.status <> 'queued' AS told
), finished AS (
    SELECT d.id, d.frees, d.told FROM done d
    UNION ALL
    SELECT g.id, g.frees, g.told FROM gone g
), marked AS (
    -- Runs whether or not the query reads it (it modifies data). Most rounds mark
    -- nothing: the cardinality test is a one-time filter that then skips the scan
    -- of this worker's running jobs the planner would otherwise make.
    UPDATE pgfleet.jobs j SET started_at = now()
    WHERE cardinality($11::uuid[]) > 0
      AND j.id = ANY ($11::uuid[]) AND j.locked_by = $6 AND j.status = 'running'
      AND j.started_at IS NULL
), wake AS (
    -- A freed named queue or a requeued job is work for someone now.
    SELECT pg_notify('pgfleet_jobs', '') FROM finished WHERE frees LIMIT 1
), tell AS (
    -- The finished jobs someone waits for (Queue.wait), in one notification: their
    -- ids, or '' (look them all up) when they would not fit in one payload.
    SELECT pg_notify('pgfleet_done', CASE WHEN count(*) <= 200
                                          THEN string_agg(id::text, ',') ELSE '' END)
    FROM done WHERE told HAVING count(*) > 0
)

-- fragment: completion_rows
-- The applied outcomes as the first rows of both claim statements' answer (claimed
-- false, only id set); reading wake and tell makes sure they ran.
SELECT false AS claimed, NULL::boolean AS held, d.id, NULL::text AS name, NULL::text AS payload, NULL::integer AS attempt,
       NULL::integer AS max_attempts, NULL::smallint AS priority, NULL::text AS queue_name,
       NULL::text AS job_key, NULL::float8 AS run_at, NULL::float8 AS created_at,
       NULL::float8 AS started_at, NULL::text AS last_error, NULL::uuid AS lock_token,
       NULL::text AS trace_context, NULL::integer AS snoozes, NULL::text AS limit_key
FROM finished d CROSS JOIN (SELECT count(*) FROM wake) w CROSS JOIN (SELECT count(*) FROM tell) t

-- name: job_complete_and_claim :many
-- The claim loop's one round trip: write the outcomes of finished handlers (only
-- where the claim's lock token still matches: a rescued or operator-released job
-- keeps its new state; $12: seconds since the handler started, for a held job that
-- no round marked started; $13: the succeeded handlers' results, JSON text), mark started the held jobs ($11) the worker started
-- since its last round, and claim up to $9 due jobs this worker serves, in priority then
-- run_at order (a named queue's jobs, one at a time, through claim_flow with the
-- other flagged jobs). The first $10 claimed start now; the rest are held ahead (prefetch)
-- and keep started_at NULL until a later round marks them: a rescue tells a job
-- that never started from one that did. Returns the applied outcomes (claimed =
-- false) and the claimed jobs.
-- include: completion_ctes
, gate AS MATERIALIZED (
    -- Flow control (0006), in two probes of (usually empty) indexes: whether any
    -- of this worker's names has a limit or flagged queued jobs (then claim_flow
    -- runs), and whether anything is paused (then the fast path filters on it).
    -- Without either, every flow-control step below is skipped (InitPlans run
    -- only when a CASE branch needs them).
    SELECT EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = ANY($7::text[]))
           OR EXISTS (SELECT 1 FROM pgfleet.jobs k
                      WHERE k.status = 'queued' AND k.limited AND k.name = ANY($7::text[]))
               AS flow,
           EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.paused_at IS NOT NULL) AS pauses
), flow AS MATERIALIZED (
    -- Names with a limit or flagged jobs (keyed, or in a named queue: 0009) are
    -- claimed by claim_flow first (a rate-limited name's only to start now, never
    -- held ahead; a named queue's one at a time, and none whose job this round
    -- finishes: that queue goes to whoever claims first after this commits).
    SELECT f.* FROM pgfleet.claim_flow($6, $7::text[], $8::text[], $9, $10, $1::uuid[]) f
    WHERE (SELECT g.flow FROM gate g)
), held_back AS MATERIALIZED (
    -- What the fast path leaves alone besides flagged jobs: paused names (a job
    -- enqueued as the pause began may be unflagged); and how many jobs claim_flow
    -- claimed.
    SELECT CASE WHEN (SELECT g.pauses FROM gate g)
                THEN ARRAY (SELECT l.name FROM pgfleet.limits l WHERE l.paused_at IS NOT NULL)
                ELSE '{}'::text[] END AS names,
           CASE WHEN (SELECT g.flow FROM gate g)
                THEN (SELECT count(*) FROM flow)::integer ELSE 0 END AS taken,
           CASE WHEN (SELECT g.flow FROM gate g)
                THEN (SELECT count(*) FROM flow f WHERE f.started_at IS NOT NULL)::integer
                ELSE 0 END AS started
), pick AS MATERIALIZED (
    -- The ids come from an InitPlan and the update finds them through the primary
    -- key: there is no join between the pick and the table for a plan to flip to a
    -- hash or merge join over the whole table when the row estimates are stale.
    -- Jobs of named queues are flagged (0009): claim_flow claims them.
    SELECT ARRAY (
        SELECT c.id FROM pgfleet.jobs c
        WHERE c.status = 'queued' AND c.run_at <= now()
          AND c.name = ANY($7::text[])
          AND ($8::text[] IS NULL OR c.queue_name = ANY($8::text[]))
          AND NOT c.limited
          AND c.name <> ALL ((SELECT h.names FROM held_back h)::text[])
        ORDER BY c.priority, c.run_at, c.id
        LIMIT greatest($9 - (SELECT h.taken FROM held_back h), 0)
        FOR UPDATE SKIP LOCKED
    ) AS ids
), claimed AS (
    UPDATE pgfleet.jobs j
    SET status = 'running', attempt = j.attempt + 1,
        started_at = CASE WHEN j.id = ANY ((SELECT p.ids[1:$10 - h.started]
                                            FROM pick p, held_back h)::uuid[])
                          THEN now() END,
        locked_by = $6, lock_token = gen_random_uuid()
    WHERE j.id = ANY ((SELECT p.ids FROM pick p)::uuid[])
    RETURNING j.id, j.name, j.payload, j.attempt, j.max_attempts, j.priority, j.queue_name,
              j.job_key, j.run_at, j.created_at, j.started_at, j.last_error, j.lock_token,
              j.trace_context, j.snoozes, j.limit_key
)
-- Times travel as seconds since the epoch (float8: exact to the microsecond from
-- 1685 to 2255): the client builds a datetime from them in half the time the
-- driver's timestamptz decoder takes, and once per distinct value in a round.
-- include: completion_rows
UNION ALL
SELECT true, c.started_at IS NULL, c.id, c.name, c.payload::text, c.attempt, c.max_attempts,
       c.priority, c.queue_name, c.job_key, date_part('epoch', c.run_at),
       date_part('epoch', c.created_at), date_part('epoch', now()), c.last_error,
       c.lock_token, c.trace_context::text, c.snoozes, c.limit_key
FROM claimed c
UNION ALL
-- The pace of this worker's rate-limited names with due jobs (seconds, in run_at):
-- when the window is full, until its oldest start leaves it; per key, until the
-- window of the first full key with due jobs reopens; else a fiftieth of the
-- window. The loop polls at least that often, so starts follow the window
-- instead of the poll interval. (This statement's snapshot does not see this
-- round's starts: a window this round filled shows up in the next round.)
SELECT false, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       min(w.wait), NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM (
    SELECT CASE WHEN NOT l.per_key AND st.n >= l.rate
                THEN greatest(extract(epoch FROM st.oldest + make_interval(secs => l.per)
                                                 - clock_timestamp())::float8, 0.005)
                WHEN l.per_key AND kt.oldest IS NOT NULL
                THEN greatest(extract(epoch FROM kt.oldest + make_interval(secs => l.per)
                                                 - clock_timestamp())::float8, 0.005)
                ELSE l.per / 50 END AS wait
    FROM pgfleet.limits l
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(s.started_at) AS oldest FROM pgfleet.limit_starts s
        WHERE NOT l.per_key
          AND s.name = l.name AND s.started_at > clock_timestamp() - make_interval(secs => l.per)
    ) st
    CROSS JOIN LATERAL (
        -- The keys at their rate that have due jobs: the earliest one to reopen.
        SELECT min(k.oldest) AS oldest FROM (
            SELECT s.limit_key, min(s.started_at) AS oldest FROM pgfleet.limit_starts s
            WHERE l.per_key
              AND s.name = l.name
              AND s.started_at > clock_timestamp() - make_interval(secs => l.per)
            GROUP BY s.limit_key
            HAVING count(*) >= l.rate
        ) k
        WHERE CASE WHEN k.limit_key IS NULL
                   THEN EXISTS (SELECT 1 FROM pgfleet.jobs j
                                WHERE j.status = 'queued' AND j.limited AND j.name = l.name
                                  AND j.limit_key IS NULL AND j.run_at <= now())
                   ELSE EXISTS (SELECT 1 FROM pgfleet.jobs j
                                WHERE j.status = 'queued' AND j.limited AND j.name = l.name
                                  AND j.limit_key = k.limit_key AND j.run_at <= now()) END
    ) kt
    WHERE (SELECT g.flow FROM gate g)
      AND l.name = ANY($7::text[]) AND l.rate IS NOT NULL AND l.paused_at IS NULL
      -- A due flagged job: one with a turn (due when numbered: 0017), or a due one
      -- without (each probe reads its own small partial index).
      AND (EXISTS (SELECT 1 FROM pgfleet.jobs j
                   WHERE j.status = 'queued' AND j.limited AND j.turn IS NOT NULL
                     AND j.name = l.name AND j.run_at <= now())
           OR EXISTS (SELECT 1 FROM pgfleet.jobs j
                      WHERE j.status = 'queued' AND j.limited AND j.turn IS NULL
                        AND j.name = l.name AND j.run_at <= now()))
) w
HAVING count(*) > 0
UNION ALL
-- Flow control is in play for this worker: the next round is a full one too.
SELECT false, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE (SELECT g.flow FROM gate g)
UNION ALL
SELECT true, f.started_at IS NULL, f.id, f.name, f.payload::text, f.attempt, f.max_attempts,
       f.priority, f.queue_name, f.job_key, date_part('epoch', f.run_at),
       date_part('epoch', f.created_at), date_part('epoch', COALESCE(f.started_at, now())),
       f.last_error,
       f.lock_token, f.trace_context::text, f.snoozes, f.limit_key
FROM flow f;

-- name: job_complete_and_claim_lean :many
-- job_complete_and_claim without flow control's steps, for the rounds of a worker
-- none of whose names has a limit or flagged jobs (the last round said so): jobs
-- under flow control (flagged: keyed, in a named queue, or of a limited or paused name) are
-- left alone, and a row without an id (held false) says when flow control has
-- appeared, so that the next round is a full one. Saves the full statement's
-- per-round cost where nothing is limited.
-- include: completion_ctes
, pick AS MATERIALIZED (
    -- The ids come from an InitPlan and the update finds them through the primary
    -- key: there is no join between the pick and the table for a plan to flip to a
    -- hash or merge join over the whole table when the row estimates are stale.
    -- Jobs of named queues are flagged (0009): claim_flow claims them.
    SELECT ARRAY (
        SELECT c.id FROM pgfleet.jobs c
        WHERE c.status = 'queued' AND c.run_at <= now()
          AND c.name = ANY($7::text[])
          AND NOT c.limited
          AND ($8::text[] IS NULL OR c.queue_name = ANY($8::text[]))
        ORDER BY c.priority, c.run_at, c.id
        LIMIT $9
        FOR UPDATE SKIP LOCKED
    ) AS ids
), claimed AS (
    UPDATE pgfleet.jobs j
    SET status = 'running', attempt = j.attempt + 1,
        started_at = CASE WHEN j.id = ANY ((SELECT p.ids[1:$10] FROM pick p)::uuid[])
                          THEN now() END,
        locked_by = $6, lock_token = gen_random_uuid()
    WHERE j.id = ANY ((SELECT p.ids FROM pick p)::uuid[])
    RETURNING j.id, j.name, j.payload, j.attempt, j.max_attempts, j.priority, j.queue_name,
              j.job_key, j.run_at, j.created_at, j.started_at, j.last_error, j.lock_token,
              j.trace_context, j.snoozes, j.limit_key
)
-- Times travel as seconds since the epoch (float8: exact to the microsecond from
-- 1685 to 2255): the client builds a datetime from them in half the time the
-- driver's timestamptz decoder takes, and once per distinct value in a round.
-- include: completion_rows
UNION ALL
SELECT true, c.started_at IS NULL, c.id, c.name, c.payload::text, c.attempt, c.max_attempts,
       c.priority, c.queue_name, c.job_key, date_part('epoch', c.run_at),
       date_part('epoch', c.created_at), date_part('epoch', now()), c.last_error,
       c.lock_token, c.trace_context::text, c.snoozes, c.limit_key
FROM claimed c
UNION ALL
SELECT false, false, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = ANY($7::text[]))
   OR EXISTS (SELECT 1 FROM pgfleet.jobs k
              WHERE k.status = 'queued' AND k.limited AND k.name = ANY($7::text[]));

-- name: worker_heartbeat :one
-- Registers or refreshes this worker (renewing every lock it holds), and takes or
-- renews the leader lease when it is free, expired or already ours.
WITH beat AS (
    INSERT INTO pgfleet.workers
        (id, hostname, pid, concurrency, job_names, queue_names, version, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8::float8))
    ON CONFLICT (id) DO UPDATE
        SET heartbeat_at = now(), expires_at = EXCLUDED.expires_at
    RETURNING (xmax = 0) AS inserted, started_at
), lead AS (
    INSERT INTO pgfleet.leader (singleton, worker_id, expires_at)
    SELECT true, $1, now() + make_interval(secs => $8::float8) WHERE $9::boolean
    ON CONFLICT (singleton) DO UPDATE
        SET worker_id = EXCLUDED.worker_id,
            expires_at = EXCLUDED.expires_at,
            elected_at = CASE WHEN pgfleet.leader.worker_id = EXCLUDED.worker_id
                              THEN pgfleet.leader.elected_at ELSE now() END
        WHERE pgfleet.leader.worker_id = EXCLUDED.worker_id
           OR pgfleet.leader.expires_at < now()
    RETURNING worker_id
)
SELECT b.inserted, b.started_at, EXISTS (SELECT 1 FROM lead) AS leader
FROM beat b;

-- name: worker_deregister :exec
WITH resign AS (
    DELETE FROM pgfleet.leader WHERE worker_id = $1
)
DELETE FROM pgfleet.workers WHERE id = $1;

-- name: job_rescue :many
-- Leader only: requeue (or bury, when out of attempts) running jobs whose worker
-- stopped heartbeating, and deregister such workers.
WITH expired AS (
    DELETE FROM pgfleet.workers WHERE expires_at < now() RETURNING id
), orphaned AS (
    SELECT j.id, j.locked_by, j.started_at, j.last_error FROM pgfleet.jobs j
    WHERE j.status = 'running'
      AND NOT EXISTS (SELECT 1 FROM pgfleet.workers w
                      WHERE w.id = j.locked_by AND w.expires_at >= now())
    ORDER BY j.id
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
), rescued AS (
    -- A job held ahead that never started (started_at NULL) goes back to its place
    -- in line, its attempt not counted and never buried. Once only in a row: held
    -- twice by workers that died, it is counted like a started one, so a job that
    -- kills its worker at once from the hold is still buried in the end.
    -- A job someone asked to cancel ends cancelled.
    UPDATE pgfleet.jobs j
    SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN NOT o.unstarted AND j.attempt >= j.max_attempts THEN 'failed'
                      ELSE 'queued' END::pgfleet.job_status,
        run_at = CASE WHEN o.unstarted THEN j.run_at ELSE now() END,
        attempt = CASE WHEN o.unstarted THEN greatest(j.attempt - 1, 0) ELSE j.attempt END,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                                OR (NOT o.unstarted AND j.attempt >= j.max_attempts)
                           THEN now() END,
        last_error = CASE WHEN o.unstarted
            THEN 'held unstarted by worker ' || o.locked_by::text
                 || ', which stopped heartbeating; the attempt was not counted'
            ELSE 'worker ' || o.locked_by::text || ' stopped heartbeating during attempt '
                 || j.attempt END,
        -- A started attempt lost with its worker is a failed attempt of the history
        -- (the last 10 kept, as the completion keeps them).
        errors = CASE WHEN o.unstarted THEN j.errors
                      ELSE (CASE WHEN jsonb_array_length(COALESCE(j.errors, '[]')) >= 10
                                 THEN j.errors - 0 ELSE COALESCE(j.errors, '[]') END)
                           || jsonb_build_array(jsonb_build_object(
                                'at', now(), 'attempt', j.attempt,
                                'error', 'worker ' || o.locked_by::text
                                         || ' stopped heartbeating during attempt ' || j.attempt,
                                'worker', o.locked_by)) END,
        errors_omitted = CASE WHEN NOT o.unstarted
                                   AND jsonb_array_length(COALESCE(j.errors, '[]')) >= 10
                              THEN COALESCE(j.errors_omitted, 0) + 1
                              ELSE j.errors_omitted END,
        locked_by = NULL,
        lock_token = NULL
    FROM (SELECT o.id, o.locked_by,
                 o.started_at IS NULL
                 AND COALESCE(o.last_error, '') NOT LIKE 'held unstarted by worker %' AS unstarted
          FROM orphaned o) o
    WHERE j.id = o.id
    RETURNING j.id, j.name, j.status::text AS status, o.locked_by
)
SELECT r.id, r.name, r.status, r.locked_by AS worker_id FROM rescued r
UNION ALL
SELECT NULL, NULL, 'worker_expired', e.id FROM expired e;

-- name: ping :val
SELECT 1;

-- name: claim_session_begin :exec
-- The claim loop's own connection walks the runnable index in claim order whatever
-- the statistics say: a queue table's statistics are stale by nature, and a plan
-- that sorts every runnable row to return one is the difference between 0.1 ms
-- and 5 ms per claim.
-- It plans job_complete_and_claim once (the generic plan) instead of every round:
-- left to choose, Postgres re-plans it each time (about 2 ms of planning for 0.5 ms
-- of execution). And it never JIT-compiles: a generic plan costs its `LIMIT $9` as
-- a tenth of the runnable rows the statistics claim, so stale statistics (a backlog
-- that was analysed and is gone, a TRUNCATE) push its cost over jit_above_cost,
-- and every round then compiled ~60 functions: 50-350 ms per claim, the pickup
-- tail latency that once made the generic plan look unsafe.
-- And a round the worker gave up on (its deadline passed, the connection dropped)
-- ends on the server too: without client_connection_check_interval the backend
-- runs it to the end, holding the row locks of the jobs it claims, and the
-- worker's next connection waits on them (a soak saw a 15 s claim stall the
-- fleet for minutes this way). The check is a poll() per second of a running
-- statement.
SET enable_bitmapscan = off; SET enable_seqscan = off;
SET plan_cache_mode = force_generic_plan; SET jit = off;
SET client_connection_check_interval = '1s';

-- name: claim_session_end :exec
RESET enable_bitmapscan; RESET enable_seqscan; RESET plan_cache_mode; RESET jit;
RESET client_connection_check_interval;

-- name: claim_transaction_begin :exec
-- Behind a transaction-mode pooler no SET may outlive its transaction: the claim
-- round gets claim_session_begin's planner settings in a transaction of its own
-- (its statements are unnamed, so planned each time with their parameters: no
-- plan_cache_mode; jit stays off all the same).
BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off; SET LOCAL jit = off;
SET LOCAL client_connection_check_interval = '1s';

-- name: claim_transaction_commit :exec
COMMIT;

-- name: claim_transaction_rollback :exec
ROLLBACK;

-- name: job_next_due :val
-- Seconds until the next scheduled job this worker serves is due (NULL: none):
-- an idle claim loop sleeps until then instead of a whole poll interval, so
-- delayed jobs, retries and snoozes start on time. Asked each time the loop goes
-- idle, which a worker also does beside a backlog it may not take (waiting on a
-- limit or a pause, or of names it does not serve): so the runnable index is read
-- from now on, one priority at a time (its distinct priorities found by a descent
-- each), never across the due jobs at its head.
WITH RECURSIVE priorities AS (
    (SELECT j.priority FROM pgfleet.jobs j WHERE j.status = 'queued'
     ORDER BY j.priority LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM pgfleet.jobs j
            WHERE j.status = 'queued' AND j.priority > p.priority
            ORDER BY j.priority LIMIT 1)
    FROM priorities p WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM min(n.run_at) - now())::float8
FROM priorities p
CROSS JOIN LATERAL (
    SELECT j.run_at FROM pgfleet.jobs j
    WHERE j.status = 'queued' AND j.priority = p.priority AND j.run_at > now()
      AND j.name = ANY($1::text[])
      AND ($2::text[] IS NULL OR j.queue_name = ANY($2::text[]))
    ORDER BY j.run_at
    LIMIT 1
) n
WHERE p.priority IS NOT NULL;

-- name: job_release_unknown :val
-- After a lost connection the claim loop cannot tell whether its last claim
-- committed. Any job the database says this worker holds but the worker is not
-- running was claimed by a round whose answer never arrived: put it back as if it
-- had never been claimed.
WITH released AS (
    UPDATE pgfleet.jobs
    SET status = 'queued', attempt = greatest(attempt - 1, 0),
        started_at = NULL, locked_by = NULL, lock_token = NULL
    WHERE status = 'running' AND locked_by = $1 AND NOT (id = ANY($2::uuid[]))
    RETURNING 1
), wake AS (
    SELECT pg_notify('pgfleet_jobs', '') FROM released LIMIT 1
)
SELECT (SELECT count(*) FROM released) + 0 * (SELECT count(*) FROM wake);

-- ---------------------------------------------------------------- metrics

-- name: queue_stats :many
-- Queue-level gauges per job name, computed at scrape time from the partial
-- indexes (runnable, running, failed): retained succeeded jobs are never read.
WITH queued AS (
    SELECT name,
           count(*) FILTER (WHERE run_at <= now()) AS queued,
           count(*) FILTER (WHERE run_at > now()) AS scheduled,
           COALESCE(extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now())), 0)
               AS oldest_age
    FROM pgfleet.jobs WHERE status = 'queued' GROUP BY name
), running AS (
    -- Jobs a worker holds ahead (prefetch, started_at still empty) are not running.
    SELECT name, count(*) AS running FROM pgfleet.jobs
    WHERE status = 'running' AND started_at IS NOT NULL GROUP BY name
), dead AS (
    SELECT name, count(*) AS dead FROM pgfleet.jobs_all WHERE status = 'failed' GROUP BY name
)
SELECT name,
       COALESCE(q.queued, 0) AS queued,
       COALESCE(q.scheduled, 0) AS scheduled,
       COALESCE(q.oldest_age, 0)::float8 AS oldest_age,
       COALESCE(r.running, 0) AS running,
       COALESCE(d.dead, 0) AS dead
FROM queued q FULL JOIN running r USING (name) FULL JOIN dead d USING (name);

-- name: workers_alive :val
SELECT count(*) FROM pgfleet.workers WHERE expires_at > now();

-- name: jobs_table_health :one
-- Whether Postgres' autovacuum looks after pgfleet.jobs, and how many dead tuples
-- it carries. A queue turns over every row it holds: without vacuum, dead tuples
-- and index bloat grow without bound.
SELECT current_setting('autovacuum')::boolean
           AND COALESCE((SELECT option_value::boolean FROM pg_options_to_table(c.reloptions)
                         WHERE option_name = 'autovacuum_enabled'), true) AS autovacuum,
       COALESCE(s.n_dead_tup, 0) AS dead_tuples,
       COALESCE(s.n_live_tup, 0) AS live_tuples,
       -- the rows the planner's statistics were taken on (last VACUUM or ANALYZE)
       GREATEST(c.reltuples, 0)::bigint AS analyzed_tuples
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'pgfleet.jobs'::regclass;

-- name: jobs_vacuum :exec
-- SKIP_LOCKED: when autovacuum is vacuuming the table already, the leader does not
-- wait behind it (nor hold the chores' turn that long). TRUNCATE false: the free
-- pages at the table's end are refilled within seconds, and giving them back takes
-- an ACCESS EXCLUSIVE lock that claims queue behind (a soak caught the leader's
-- vacuum waiting for it for 10 s at a time), then extends the table again.
VACUUM (ANALYZE, SKIP_LOCKED, TRUNCATE false) pgfleet.jobs;

-- name: jobs_analyze :exec
-- New statistics for a claim table that grew past twice the rows they were taken
-- on: a cached plan made while the table was small is replanned.
ANALYZE (SKIP_LOCKED) pgfleet.jobs;
-- ---------------------------------------------------------------- cron

-- name: cron_now :val
-- The reference clock of every cron decision.
SELECT now();

-- name: cron_register :one
-- Records a schedule definition. A new id is inserted with $4 as the latest
-- occurrence already handed out. A changed definition (or job name) under an
-- existing id replaces the stored one; its last occurrence only ever moves forward
-- (to $5, the latest occurrence of the new definition), so no occurrence is handed
-- out twice and the new schedule starts from its next occurrence. Returns no row
-- when the stored definition and job name are already these.
WITH prior AS (
    SELECT definition, job_name FROM pgfleet.crons WHERE id = $1
)
INSERT INTO pgfleet.crons AS c (id, job_name, definition, last_occurrence)
VALUES ($1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE
    SET job_name = EXCLUDED.job_name,
        definition = EXCLUDED.definition,
        last_occurrence = CASE WHEN c.definition = EXCLUDED.definition THEN c.last_occurrence
                               ELSE greatest(c.last_occurrence, $5::timestamptz) END,
        updated_at = now()
    WHERE c.definition <> EXCLUDED.definition OR c.job_name <> EXCLUDED.job_name
RETURNING (c.xmax = 0) AS inserted, c.definition, c.last_occurrence,
          (SELECT p.definition FROM prior p) AS previous_definition,
          (SELECT p.job_name FROM prior p) AS previous_job_name;

-- name: cron_get :one
SELECT id, job_name, definition, last_occurrence, last_job_id
FROM pgfleet.crons WHERE id = $1;

-- name: cron_advance :val
-- Hands occurrence $4 of schedule $1 to the calling transaction, which enqueues
-- its job before committing. A compare-and-set on the schedule's row: concurrent
-- callers wait for the row lock and then find last_occurrence no longer earlier
-- than $4, so exactly one transaction per occurrence gets a row back, and a caller
-- with a lagging clock (an earlier $4) never does. Refused as well when the stored
-- definition and job name are not $2 and $3 (another worker runs a changed schedule).
UPDATE pgfleet.crons SET last_occurrence = $4, updated_at = now()
WHERE id = $1 AND definition = $2 AND job_name = $3 AND last_occurrence < $4
RETURNING last_occurrence;

-- name: cron_record_job :val
-- Remembers the job an occurrence went to. True when that job was created by this
-- transaction (false: an earlier job holding the key absorbed the occurrence); a
-- new job wakes the workers.
WITH recorded AS (
    UPDATE pgfleet.crons SET last_job_id = $2 WHERE id = $1
), job AS (
    SELECT j.created_at = now() AS inserted FROM pgfleet.jobs j WHERE j.id = $2
), wake AS (
    SELECT pg_notify('pgfleet_jobs', '') FROM job WHERE inserted
)
SELECT COALESCE((SELECT inserted FROM job), false) AND (SELECT count(*) FROM wake) >= 0;

-- name: lease_acquire :val
-- Take or renew the lease on a role; true when $2 holds it afterwards.
WITH taken AS (
    INSERT INTO pgfleet.leases (role, holder, expires_at)
    VALUES ($1, $2, now() + make_interval(secs => $3::float8))
    ON CONFLICT (role) DO UPDATE
        SET holder = EXCLUDED.holder,
            expires_at = EXCLUDED.expires_at,
            acquired_at = CASE WHEN pgfleet.leases.holder = EXCLUDED.holder
                               THEN pgfleet.leases.acquired_at ELSE now() END
        WHERE pgfleet.leases.holder = EXCLUDED.holder OR pgfleet.leases.expires_at < now()
    RETURNING holder
)
SELECT EXISTS (SELECT 1 FROM taken);

-- name: lease_release :exec
DELETE FROM pgfleet.leases WHERE role = $1 AND holder = $2;

-- ---------------------------------------------------------------- workflows

-- name: job_insert_waiting :exec
-- Jobs enqueued with parents (EnqueueOptions.after): 'waiting', outside every claim
-- path, with $10 the number of distinct parents each waits on. The edges follow in
-- job_dependencies_link, in the same transaction. $9: the trace context, or NULL.
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, run_at,
                          trace_context, status, waiting_on)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name,
       COALESCE(run_at, now() + make_interval(secs => delay)), $9::text::jsonb, 'waiting',
       waiting_on
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::timestamptz[], $8::float8[], $10::integer[])
     AS t(id, name, payload, priority, max_attempts, queue_name, run_at, delay, waiting_on);

-- name: job_dependencies_link :many
-- Records the edges (child $1, parent $2, run anyway $3, batch $4) and marks each
-- parent as having children (true; false, settled, for one already finished).
-- Marking a parent locks its row until this transaction ends, so a parent
-- finishing meanwhile either finished before (its status is returned here, and
-- job_settle_new settles it) or waits, and its trigger then sees these edges. A
-- parent in history (finished) is read there, after the update
-- (pgfleet.job_status_now: a snapshot of its own, so one that moved while the
-- update waited is found). Returns each distinct parent with its status; NULL: no
-- such job.
WITH edge AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::boolean[], $4::boolean[])
        AS e(child_id, parent_id, run_anyway, batch)
), parent AS (
    UPDATE pgfleet.jobs p
    -- true: edges to settle when it finishes (or, finished and still true, when
    -- this statement's trigger settles it); false: finished and settled, so only
    -- the new edges are left, and job_settle_new settles them.
    SET has_children = p.status NOT IN ('succeeded', 'failed', 'cancelled')
                       OR p.has_children IS TRUE
    WHERE p.id IN (SELECT e.parent_id FROM edge e)
    RETURNING p.id, p.status
), linked AS (
    INSERT INTO pgfleet.job_dependencies (child_id, parent_id, run_anyway, batch)
    SELECT e.child_id, e.parent_id, e.run_anyway, e.batch FROM edge e
)
SELECT e.parent_id,
       COALESCE(p.status::text, pgfleet.job_status_now(e.parent_id)::text) AS status
FROM (SELECT DISTINCT parent_id FROM edge) e LEFT JOIN parent p ON p.id = e.parent_id;

-- name: job_settle_new :val
-- Parents ($1) that had already finished (with status $2) when the children $3 were
-- linked to them: settled now for those children only, as their triggers would
-- have. Returns how many children became due.
WITH marked AS MATERIALIZED (
    SELECT sum(pgfleet.job_settle_edges(t.parent_id, t.status::pgfleet.job_status,
                                        $3::uuid[])) AS edges
    FROM unnest($1::uuid[], $2::text[]) AS t(parent_id, status)
)
SELECT pgfleet.job_settle_pending() FROM marked;

-- name: batch_progress :one
-- A batch's members' outcomes so far, read from its callback's edges.
SELECT c.id, c.status::text AS callback_status, count(*) AS size,
       count(*) FILTER (WHERE d.outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE d.outcome = 'failed') AS failed,
       count(*) FILTER (WHERE d.outcome = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE d.outcome IS NULL) AS pending
FROM pgfleet.jobs c JOIN pgfleet.job_dependencies d ON d.child_id = c.id AND d.batch
WHERE c.id = $1
GROUP BY c.id, c.status;

-- name: job_parents :many
-- A job's parents (up to $2): each one's current status, or the outcome recorded
-- when it finished if it was pruned since.
SELECT d.parent_id AS id, p.name, COALESCE(p.status::text, d.outcome::text) AS status,
       d.run_anyway, d.batch
FROM pgfleet.job_dependencies d LEFT JOIN pgfleet.jobs_all p ON p.id = d.parent_id
WHERE d.child_id = $1
ORDER BY d.parent_id
LIMIT $2;

-- name: job_children :many
-- The jobs waiting (or that waited) on a job, up to $2.
SELECT d.child_id AS id, c.name, c.status::text AS status, d.run_anyway, d.batch
FROM pgfleet.job_dependencies d JOIN pgfleet.jobs c ON c.id = d.child_id
WHERE d.parent_id = $1
ORDER BY d.child_id
LIMIT $2;

-- name: job_count_waiting :many
-- Jobs waiting on parents, by name (the metric and the console).
SELECT name, count(*) AS waiting FROM pgfleet.jobs
WHERE waiting_on > 0 AND status = 'waiting'
GROUP BY name;
