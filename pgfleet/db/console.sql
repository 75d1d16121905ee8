-- The operator console's queries (pgfleet/service/console), named like queries.sql
-- and loaded and checked at import by pgfleet/db/console.py. Every one is served by
-- an index: the console must stay fast on a table of millions of retained jobs.
-- The console's pool keeps no prepared statements (statement_cache_size=0), so each
-- statement is planned with its actual parameters and a status filter can pick the
-- partial index of that status.

-- name: console_jobs_page :many
-- One page of jobs, newest first, older than the cursor $4 and not older than $5
-- (UUIDv7 ids: creation time is the id's order). Used when the filters bound the
-- rows to read: no filter (the primary key, walked backwards), or a status whose
-- partial index holds only live work or retained dead jobs (failed: jobs_failed_name;
-- queued: jobs_runnable; running: jobs_running_worker). Payloads are not read.
-- $7: a limit key (a filter like the name and the named queue).
SELECT id, name, status::text AS status, attempt, max_attempts, priority, queue_name,
       job_key, limit_key, run_at, created_at, started_at, finished_at,
       left(last_error, 300) AS last_error, coalesce(snoozes, 0) AS snoozes
FROM pgfleet.jobs_all
WHERE ($1::pgfleet.job_status IS NULL OR status = $1)
  AND ($2::text IS NULL OR name = $2)
  AND ($3::text IS NULL OR queue_name = $3)
  AND ($7::text IS NULL OR limit_key = $7)
  AND id < $4 AND id >= $5
ORDER BY id DESC
LIMIT $6;

-- name: console_jobs_window_end :val
-- Where a bounded search ends: the id $3 rows below the cursor $1 (not below $2),
-- or NULL when fewer remain. An index-only walk of the primary key. When no index
-- serves the filters (a kind or named queue among succeeded or cancelled jobs), a
-- page reads only down to this id and offers to search on from there, so no page
-- ever scans the whole table for a kind that has few jobs.
SELECT id FROM pgfleet.jobs_all
WHERE id < $1 AND id >= $2
ORDER BY id DESC
OFFSET $3
LIMIT 1;

-- name: console_now :val
SELECT now();

-- name: console_leases :many
-- The fleet-wide roles: the maintenance leader and every named lease (metrics).
SELECT 'leader' AS role, worker_id AS holder, elected_at AS acquired_at, expires_at,
       expires_at > now() AS live
FROM pgfleet.leader
UNION ALL
SELECT role, holder, acquired_at, expires_at, expires_at > now() AS live
FROM pgfleet.leases
ORDER BY role;

-- name: console_dead_count :val
-- Dead (failed) jobs of one kind: the count a bulk action's confirmation states.
SELECT count(*) FROM pgfleet.jobs_all WHERE status = 'failed' AND name = $1;

-- name: console_retry_dead :one
-- Every dead job of kind $1 queued again now with fresh attempts, except one whose
-- job key another queued or running job holds (of several dead jobs sharing a key,
-- only the newest is retried). Wakes the workers when anything was retried.
WITH candidates AS (
    SELECT DISTINCT ON (COALESCE(job_key, id::text)) id, job_key
    FROM pgfleet.jobs
    WHERE status = 'failed' AND name = $1
    ORDER BY COALESCE(job_key, id::text), id DESC
), retried AS (
    UPDATE pgfleet.jobs j
    SET status = 'queued', attempt = 0, run_at = now(), started_at = NULL,
        finished_at = NULL, last_error = NULL,
        -- Under flow control as an enqueue would put it (job_retry says why).
        limited = j.limited OR j.limit_key IS NOT NULL OR j.queue_name IS NOT NULL
                  OR EXISTS (SELECT 1 FROM pgfleet.limits l WHERE l.name = j.name)
    FROM candidates c
    WHERE j.id = c.id AND j.status = 'failed'
      AND (c.job_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM pgfleet.jobs a
            WHERE a.job_key = c.job_key AND a.status IN ('queued', 'running')))
    RETURNING 1
), wake AS (
    SELECT pg_notify('pgfleet_jobs', '') FROM retried LIMIT 1
)
SELECT (SELECT count(*) FROM retried) AS retried,
       (SELECT count(*) FROM pgfleet.jobs WHERE status = 'failed' AND name = $1)
           - (SELECT count(*) FROM retried) AS skipped,
       (SELECT count(*) FROM wake) AS woke;

-- name: console_cancel_dead :val
-- Every dead job of kind $1 set aside as cancelled: it leaves the dead count and
-- keeps its last error.
WITH cancelled AS (
    UPDATE pgfleet.jobs SET status = 'cancelled', finished_at = now()
    WHERE status = 'failed' AND name = $1
    RETURNING 1
)
SELECT count(*) FROM cancelled;

-- name: console_worker_jobs :many
-- The jobs a worker holds (jobs_running_worker).
SELECT id, name, attempt, max_attempts, started_at
FROM pgfleet.jobs
WHERE status = 'running' AND locked_by = $1
ORDER BY started_at, id
LIMIT $2;

-- name: console_crons :many
-- Every recorded schedule with the job of its latest occurrence (if still retained).
SELECT c.id, c.job_name, c.definition, c.last_occurrence, c.last_job_id, c.updated_at,
       j.status::text AS last_job_status, j.finished_at AS last_job_finished_at
FROM pgfleet.crons c
LEFT JOIN pgfleet.jobs_all j ON j.id = c.last_job_id
ORDER BY c.id;
