-- Payloads travel as text and are cast here, so an application's own jsonb codec on
-- its pool never double-encodes them.
-- Every runtime query pgfleet sends, named, with its result shape.
-- Loaded and checked once at import by pgfleet/db/queries.py; nothing else in the
-- package writes SQL. Shapes: :one (a row or none), :many (rows), :val (one value),
-- :exec (a status string).
-- The notification channel is the literal 'pgfleet_jobs' (pgfleet.db.CHANNEL).

-- ---------------------------------------------------------------- enqueue

-- name: job_insert :exec
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, run_at)
VALUES ($1, $2, $3::text::jsonb, $4, $5, $6,
        COALESCE($7::timestamptz, now() + make_interval(secs => $8::float8)));

-- name: job_insert_notify :exec
WITH inserted AS (
    INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, run_at)
    VALUES ($1, $2, $3::text::jsonb, $4, $5, $6,
            COALESCE($7::timestamptz, now() + make_interval(secs => $8::float8)))
    RETURNING 1
)
SELECT pg_notify('pgfleet_jobs', '') FROM inserted;

-- name: job_insert_many_plain :exec
-- The common batch: default options for every job. Payloads arrive as one JSON
-- array (one encode call on the client, one parse here), zipped to the ids and names.
INSERT INTO pgfleet.jobs (id, name, payload, max_attempts)
SELECT id, name, payload, $4
FROM ROWS FROM (unnest($1::uuid[]), unnest($2::text[]), jsonb_array_elements($3::text::jsonb))
     AS t(id, name, payload);

-- name: job_insert_many :exec
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, run_at)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::timestamptz[], $8::float8[])
     AS t(id, name, payload, priority, max_attempts, queue_name, run_at, delay);

-- name: job_insert_keyed_dedupe :many
-- Keeps an existing queued or running job with the same key; returns only the
-- rows it inserted (the caller looks the others up by key).
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, job_key, run_at)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name, job_key,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::text[], $8::timestamptz[], $9::float8[])
     AS t(id, name, payload, priority, max_attempts, queue_name, job_key, run_at, delay)
ON CONFLICT (job_key) WHERE job_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id, job_key;

-- name: job_insert_keyed_replace :many
-- Overwrites a queued job with the same key, run_at included (debounce). A running
-- job is left untouched and not returned.
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, job_key, run_at)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name, job_key,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::text[], $8::timestamptz[], $9::float8[])
     AS t(id, name, payload, priority, max_attempts, queue_name, job_key, run_at, delay)
ON CONFLICT (job_key) WHERE job_key IS NOT NULL AND status IN ('queued', 'running') DO UPDATE
    SET name = EXCLUDED.name, payload = EXCLUDED.payload, priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts, queue_name = EXCLUDED.queue_name,
        run_at = EXCLUDED.run_at
    WHERE pgfleet.jobs.status = 'queued'
RETURNING id, job_key;

-- name: job_insert_keyed_preserve_run_at :many
-- Overwrites a queued job with the same key but keeps its run_at.
INSERT INTO pgfleet.jobs (id, name, payload, priority, max_attempts, queue_name, job_key, run_at)
SELECT id, name, payload::jsonb, priority, max_attempts, queue_name, job_key,
       COALESCE(run_at, now() + make_interval(secs => delay))
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::integer[], $6::text[],
            $7::text[], $8::timestamptz[], $9::float8[])
     AS t(id, name, payload, priority, max_attempts, queue_name, job_key, run_at, delay)
ON CONFLICT (job_key) WHERE job_key IS NOT NULL AND status IN ('queued', 'running') DO UPDATE
    SET name = EXCLUDED.name, payload = EXCLUDED.payload, priority = EXCLUDED.priority,
        max_attempts = EXCLUDED.max_attempts, queue_name = EXCLUDED.queue_name
    WHERE pgfleet.jobs.status = 'queued'
RETURNING id, job_key;

-- name: job_ids_by_active_key :many
SELECT job_key, id FROM pgfleet.jobs
WHERE job_key = ANY($1::text[]) AND status IN ('queued', 'running');

-- name: notify_jobs :exec
SELECT pg_notify('pgfleet_jobs', '');

-- ---------------------------------------------------------------- reading jobs

-- name: job_get :one
SELECT * FROM pgfleet.jobs WHERE id = $1;

-- name: job_status_get :val
SELECT status::text FROM pgfleet.jobs WHERE id = $1;

-- name: job_list_recent :many
-- Newest first: ids are UUIDv7, so the primary key orders by creation.
SELECT * FROM pgfleet.jobs
WHERE ($1::pgfleet.job_status IS NULL OR status = $1)
  AND ($2::text IS NULL OR name = $2)
ORDER BY id DESC
LIMIT $3;

-- name: job_count_by_status :many
SELECT status::text AS status, count(*) AS n FROM pgfleet.jobs GROUP BY status;

-- name: job_count_queued :val
-- Runnable backlog (optionally of one job name) for admission control.
SELECT count(*) FROM pgfleet.jobs
WHERE status = 'queued' AND run_at <= now() AND ($1::text IS NULL OR name = $1);

-- ---------------------------------------------------------------- management

-- name: job_cancel :one
UPDATE pgfleet.jobs SET status = 'cancelled', finished_at = now()
WHERE id = $1 AND status = 'queued'
RETURNING *;

-- name: job_retry :one
UPDATE pgfleet.jobs
SET status = 'queued', attempt = 0, run_at = now(), started_at = NULL, finished_at = NULL,
    last_error = NULL
WHERE id = $1 AND status IN ('failed', 'cancelled')
RETURNING *;

-- name: job_reschedule :one
UPDATE pgfleet.jobs
SET run_at = COALESCE($2::timestamptz, now() + make_interval(secs => $3::float8))
WHERE id = $1 AND status = 'queued'
RETURNING *, run_at <= now() AS due;

-- name: job_permanently_fail :one
-- Releases the lock of a running job: its handler's eventual outcome is discarded.
UPDATE pgfleet.jobs
SET status = 'failed', finished_at = now(), last_error = $2, locked_by = NULL, lock_token = NULL
WHERE id = $1 AND status IN ('queued', 'running')
RETURNING *;

-- name: job_complete :one
UPDATE pgfleet.jobs
SET status = 'succeeded', finished_at = now(), locked_by = NULL, lock_token = NULL
WHERE id = $1 AND status IN ('queued', 'running')
RETURNING *;

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
    UPDATE pgfleet.jobs
    SET status = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'queued' END::pgfleet.job_status,
        run_at = now(),
        finished_at = CASE WHEN attempt >= max_attempts THEN now() END,
        last_error = 'worker ' || $1::text || ' was force-unlocked during attempt ' || attempt,
        locked_by = NULL, lock_token = NULL
    WHERE status = 'running' AND locked_by = $1
    RETURNING status
), gone AS (
    DELETE FROM pgfleet.workers WHERE id = $1 RETURNING 1
)
SELECT (SELECT count(*) FROM released WHERE status = 'queued') AS requeued,
       (SELECT count(*) FROM released WHERE status = 'failed') AS failed,
       EXISTS (SELECT 1 FROM gone) AS deregistered;
