"""SQL of the benchmark (tools/bench/): the raw-SQL reference queue it measures
pgfleet against (a minimal table, as a hand-written queue would have), and what it
reads and writes around the measurements. Not part of the installed package.
"""

RAW_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS bench_raw;
CREATE TABLE IF NOT EXISTS bench_raw.jobs (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    status text NOT NULL DEFAULT 'queued',
    priority int NOT NULL DEFAULT 0,
    attempts int NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    locked_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS jobs_ready ON bench_raw.jobs (priority, run_at, id)
    WHERE status = 'queued';
"""

RESET = (
    "TRUNCATE bench_raw.jobs, pgfleet.jobs, pgfleet.job_dependencies; "
    "DELETE FROM pgfleet.workers; DELETE FROM pgfleet.leader"
)

RAW_INSERT_ONE = "INSERT INTO bench_raw.jobs (kind, payload) VALUES ('noop', $1::jsonb)"
RAW_INSERT_MANY = (
    "INSERT INTO bench_raw.jobs (kind, payload) SELECT 'noop', p FROM unnest($1::jsonb[]) AS p"
)
RAW_CLAIM = """
UPDATE bench_raw.jobs j SET status = 'running', attempts = attempts + 1, locked_at = now()
FROM (SELECT id FROM bench_raw.jobs WHERE status = 'queued' AND run_at <= now()
      ORDER BY priority, run_at, id LIMIT $1 FOR UPDATE SKIP LOCKED) c
WHERE j.id = c.id RETURNING j.id, j.payload
"""
RAW_COMPLETE = (
    "UPDATE bench_raw.jobs SET status = 'succeeded', finished_at = now(), locked_at = NULL "
    "WHERE id = ANY($1::bigint[])"
)

# A retained history of finished jobs, written directly (1 M rows take seconds, not
# the minutes the queue would need to produce them).
FILL_FINISHED = """
INSERT INTO pgfleet.jobs (id, name, payload, status, attempt, max_attempts, run_at,
                          created_at, started_at, finished_at)
SELECT gen_random_uuid(), 'noop', '{}', 'succeeded', 1, 25, t, t, t, t
FROM (SELECT now() - make_interval(secs => g) AS t FROM generate_series(1, $1) AS g) s
"""
TABLE_STATS = """
SELECT pg_total_relation_size('pgfleet.jobs') AS total_bytes,
       pg_relation_size('pgfleet.jobs') AS heap_bytes,
       COALESCE(s.n_dead_tup, 0) AS dead_tuples,
       COALESCE(s.n_live_tup, 0) AS live_tuples
FROM pg_stat_user_tables s WHERE s.schemaname = 'pgfleet' AND s.relname = 'jobs'
"""
VACUUM_JOBS = "VACUUM (ANALYZE) pgfleet.jobs"
RAW_FILL = (
    "INSERT INTO bench_raw.jobs (kind, payload) SELECT 'noop', '{}' FROM generate_series(1, $1)"
)
PING = "SELECT 1"
# The backends serving the benchmark's database, for its CPU meter.
BACKEND_PIDS = (
    "SELECT pid FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
# The server's WAL position, for the WAL a measurement wrote (server-wide: whatever
# else the server runs meanwhile counts too).
WAL_LSN = "SELECT pg_current_wal_lsn()::text"
WAL_SINCE = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8"
CHECKPOINT = "CHECKPOINT"
