-- pgfleet 0010: finished jobs move to pgfleet.jobs_history, partitioned by the day
-- they finished (UTC), and retention drops whole days.
--
-- pgfleet.jobs keeps what workers claim, run and settle, and finished jobs for a
-- short while (the leader moves those finished longer ago than
-- history_move_after, a minute by default, a batch per statement). Retention then
-- drops each day's partition once all of it is past finished_job_retention: no
-- row-by-row DELETE, no dead tuples for vacuum, no WAL but the catalog's.
--
-- Reads of jobs by id, lists and counts go through pgfleet.jobs_all (jobs UNION
-- ALL history): one statement, one snapshot, and a job moves in one statement, so
-- a reader sees it in exactly one of the two tables, never in none or both.
-- Changing a job that lives in history (retry of a dead job) first moves it back
-- to pgfleet.jobs, in the same transaction (pgfleet.jobs_history_restore).
--
-- Jobs with parents stay in pgfleet.jobs: their edges in pgfleet.job_dependencies
-- reference them (ON DELETE CASCADE); they are pruned row by row as before.
-- Parents move (nothing references a parent; its outcome is on the edge).
--
-- The DEFAULT partition takes a row no day's partition covers: finished before the
-- oldest day the leader prepared, or days ahead of the server's clock. Creating a
-- day's partition moves that day's rows out of it first; retention deletes its
-- rows past the cutoff (it stays small).
--
-- What it locks: creating tables, a view and functions; nothing is rewritten and no
-- row moves here (the leader moves finished jobs afterwards, in batches), so the
-- migration takes no lock on pgfleet.jobs but ACCESS SHARE (LIKE and the view read
-- its definition: claims and enqueues neither wait for it nor block it) and is
-- over in milliseconds whatever the table's size (15 ms on 1,000,000 jobs). Workers of the previous version
-- keep working: they neither read nor write history (see docs/operations/upgrades.md).
--
-- A later migration that adds a column to pgfleet.jobs must add it to
-- pgfleet.jobs_history at the same position and recreate pgfleet.jobs_all: the
-- move copies rows column by column (SELECT *).

CREATE TABLE pgfleet.jobs_history (
    LIKE pgfleet.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    CHECK (finished_at IS NOT NULL)
) PARTITION BY RANGE (finished_at);

-- Lookups by id (one probe per partition: a month of days is 30 short index
-- probes), and the newest-first walks of lists and the console.
CREATE INDEX jobs_history_id ON pgfleet.jobs_history (id);
-- Dead jobs by name: the dead gauge, the console's counts and bulk actions.
CREATE INDEX jobs_history_failed_name ON pgfleet.jobs_history (name) WHERE status = 'failed';

CREATE TABLE pgfleet.jobs_history_default PARTITION OF pgfleet.jobs_history DEFAULT;

CREATE VIEW pgfleet.jobs_all AS
    SELECT * FROM pgfleet.jobs
    UNION ALL
    SELECT * FROM pgfleet.jobs_history;

-- A job's status wherever it lives, read in a snapshot of its own (VOLATILE): a
-- statement that waited for a row the leader was moving still finds the job, in
-- history. Linking a child to a parent that finished and moved uses it.
CREATE FUNCTION pgfleet.job_status_now(p_id uuid) RETURNS pgfleet.job_status
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    RETURN (SELECT a.status FROM pgfleet.jobs_all a WHERE a.id = p_id LIMIT 1);
END
$fn$;

-- The UTC day partition of jobs_history that holds day p_day, created when missing:
-- built apart, filled with that day's rows from the DEFAULT partition, then
-- attached (ATTACH takes SHARE UPDATE EXCLUSIVE on jobs_history: readers and the
-- mover carry on). True when it was created.
CREATE FUNCTION pgfleet.jobs_history_add_day(p_day date) RETURNS boolean
LANGUAGE plpgsql
AS $fn$
DECLARE
    part text := 'jobs_history_' || to_char(p_day, 'YYYYMMDD');
    lo timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass(format('pgfleet.%I', part)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE pgfleet.%I (LIKE pgfleet.jobs_history'
                   ' INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
    EXECUTE format('WITH moved AS (DELETE FROM pgfleet.jobs_history_default'
                   ' WHERE finished_at >= $1 AND finished_at < $2 RETURNING *)'
                   ' INSERT INTO pgfleet.%I SELECT * FROM moved', part)
        USING lo, hi;
    EXECUTE format('ALTER TABLE pgfleet.%I ADD CONSTRAINT %I'
                   ' CHECK (finished_at >= %L AND finished_at < %L)',
                   part, part || '_range', lo, hi);
    EXECUTE format('ALTER TABLE pgfleet.jobs_history ATTACH PARTITION pgfleet.%I'
                   ' FOR VALUES FROM (%L) TO (%L)', part, lo, hi);
    RETURN true;
END
$fn$;

-- Day partitions from p_from through p_ahead days after today (UTC): the leader's
-- preparation, at its start and then periodically, so a partition exists before
-- its day begins. How many it created.
CREATE FUNCTION pgfleet.jobs_history_prepare(p_from date, p_ahead integer) RETURNS integer
LANGUAGE plpgsql
AS $fn$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date := LEAST(COALESCE(p_from, today), today);
    created integer := 0;
BEGIN
    WHILE d <= today + p_ahead LOOP
        IF pgfleet.jobs_history_add_day(d) THEN
            created := created + 1;
        END IF;
        d := d + 1;
    END LOOP;
    RETURN created;
END
$fn$;

-- Retention: every day partition whose whole day finished before p_cutoff is
-- dropped (DROP takes ACCESS EXCLUSIVE on jobs_history for a moment; it waits at
-- most p_lock_timeout for it, and the next round tries again), and the DEFAULT
-- partition's rows before p_cutoff are deleted. Returns the partitions dropped,
-- each with its rows: the planner's estimate, or counted when p_exact.
CREATE FUNCTION pgfleet.jobs_history_drop(p_cutoff timestamptz, p_lock_timeout text,
                                          p_exact boolean)
RETURNS TABLE (partition text, n bigint)
LANGUAGE plpgsql
AS $fn$
DECLARE
    r record;
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    FOR r IN
        SELECT c.relname, c.reltuples::bigint AS est
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'pgfleet.jobs_history'::regclass
          AND c.relname ~ '^jobs_history_[0-9]{8}$'
          AND (to_date(substr(c.relname, 14), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC'
              <= p_cutoff
        ORDER BY c.relname
    LOOP
        partition := r.relname;
        n := greatest(r.est, 0);
        IF p_exact THEN
            EXECUTE format('SELECT count(*) FROM pgfleet.%I', r.relname) INTO n;
        END IF;
        EXECUTE format('DROP TABLE pgfleet.%I', r.relname);
        RETURN NEXT;
    END LOOP;
    WITH gone AS (DELETE FROM pgfleet.jobs_history_default WHERE finished_at < p_cutoff
                  RETURNING 1)
    SELECT 'jobs_history_default', count(*) INTO partition, n FROM gone;
    IF n > 0 THEN
        RETURN NEXT;
    END IF;
END
$fn$;
