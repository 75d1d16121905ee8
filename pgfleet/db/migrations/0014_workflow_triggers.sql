-- pgfleet 0014: the workflow triggers of 0007 leave the completion's path. No
-- AFTER UPDATE row trigger is left on pgfleet.jobs, and deleting a job outside a
-- workflow runs no query on pgfleet.job_dependencies.
--
-- Why: any AFTER UPDATE row trigger on a table makes Postgres fetch the old
-- version of every row each UPDATE writes, before its WHEN is tested (PostgreSQL
-- 15: ExecARUpdateTriggers, GetTupleForTrigger). pgfleet.jobs had two: 0007's
-- jobs_finished_parent and the foreign key of job_dependencies.child_id (Postgres
-- puts the key's triggers on the referenced table, for UPDATE and DELETE), so every
-- claim and every completion paid a tuple fetch per job, though almost no job is
-- in a workflow. And the key's ON DELETE CASCADE ran a DELETE on
-- job_dependencies for every job deleted: each one the leader moves to history,
-- each one a completion removes (remove_succeeded_jobs), each one pruned.
--
-- What replaces them, with the same rules as 0007's (its header still describes
-- the settling: two steps, the deferred trigger on the edges unchanged):
--
-- - The cascade: a row trigger AFTER DELETE that fires only for a job with
--   parents (waiting_on is set when such a job is inserted and never cleared; no
--   other job has it) and deletes its edges; TRUNCATE of pgfleet.jobs empties
--   job_dependencies (the key made a bare TRUNCATE fail and CASCADE take both).
--   Nothing checks an edge's child any more: only job_dependencies_link writes
--   edges, for the children it has just inserted.
-- - The finished parent: a statement trigger AFTER UPDATE (a statement trigger
--   without transition tables reads no row), which finds the parents finished
--   and not yet settled through the partial index below, marks each settled and
--   records its outcome on its edges (what pgfleet.job_settle_edges did for each
--   from the row trigger, in one statement). A statement that finished no parent probes an empty
--   index. has_children now has three values: NULL, no children; true, children
--   whose edges its finish has not settled yet; false, children, and its finish
--   (or link to a finished parent, which job_settle_new settles) recorded. A
--   retried parent stays false, as its edges count its first outcome only; one
--   given new children while not finished is true again. The trigger fires on
--   every UPDATE, not UPDATE OF status: Postgres queues one AFTER STATEMENT event
--   per table and statement, the last UPDATE's (the claim statement updates
--   pgfleet.jobs several times), before testing the column list, so an UPDATE OF
--   trigger is lost when the statement's last UPDATE of the table sets no status.
--   It costs a parent one more write of its row (the marker), and a statement that
--   finished none one probe of the empty index (about 4 us: once per claim round).
--
-- What it locks, on a table full of jobs: the finished parents still in
-- pgfleet.jobs are marked settled (an UPDATE of those rows, through the finished
-- jobs' index, under row locks); the index is built under a SHARE lock (a scan
-- of the table, while enqueues, claims and completions wait, as for 0009's
-- index); dropping the key and the trigger takes the ACCESS EXCLUSIVE lock of
-- pgfleet.jobs and job_dependencies for a moment. No rewrite. Edges not yet
-- settled (their parent not finished) keep working: their parent is still true
-- and the new trigger settles it when it finishes. Workers and producers of the
-- previous version keep working: they finish jobs with the same statements, and
-- a finished parent their link marks true is settled by that statement's trigger
-- (their job_settle_new then finds the edges recorded, and applies them).

UPDATE pgfleet.jobs SET has_children = false
WHERE has_children AND status IN ('succeeded', 'failed', 'cancelled');

-- The parents finished and not yet settled: empty but for the moment between a
-- statement that finishes parents and its trigger. Never read by a claim.
-- Finished is written as the range of job_status from 'succeeded' to 'cancelled'
-- (the order of the type: queued, running, succeeded, failed, cancelled, waiting),
-- not as IN (...): Postgres cannot prove jobs_finished's predicate from a range,
-- so the trigger's queries can only read this index. Written as IN, they were
-- planned once per session on an empty table and could read jobs_finished, every
-- finished job of the last minute, in every statement: a drain of parent-child
-- pairs read 600,000 index entries for 20,000 jobs.
CREATE INDEX jobs_parents_unsettled ON pgfleet.jobs (id)
    WHERE has_children AND status >= 'succeeded' AND status <= 'cancelled';

ALTER TABLE pgfleet.job_dependencies DROP CONSTRAINT job_dependencies_child_id_fkey;
DROP TRIGGER jobs_finished_parent ON pgfleet.jobs;
DROP FUNCTION pgfleet.job_finished_trigger();

-- Every parent this transaction sees finished and unsettled: its own (rows
-- another transaction finished are settled before it commits); one locked by
-- another transaction is that one's to settle (SKIP LOCKED: no waiting here).
-- The row locks are FOR NO KEY UPDATE, the strength of the UPDATE that finished
-- the parent: FOR UPDATE would also skip a row someone holds FOR KEY SHARE (a
-- foreign key's check), leaving a parent its own statement finished unsettled.
-- Marked settled, and its outcome recorded on its unsettled edges, as pending:
-- pgfleet.job_settle_edges for all of them in one statement. The marker's UPDATE
-- fires this trigger again, which finds none left.
CREATE FUNCTION pgfleet.jobs_finished_parents() RETURNS trigger
LANGUAGE plpgsql
AS $trigger$
BEGIN
    PERFORM 1 FROM pgfleet.jobs u
    WHERE u.has_children AND u.status >= 'succeeded' AND u.status <= 'cancelled'
    LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH settled AS (
        UPDATE pgfleet.jobs j SET has_children = false
        WHERE j.id IN (SELECT u.id FROM pgfleet.jobs u
                       WHERE u.has_children
                         AND u.status >= 'succeeded' AND u.status <= 'cancelled'
                       FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING j.id, j.status
    )
    UPDATE pgfleet.job_dependencies d SET outcome = s.status, pending = true
    FROM settled s
    WHERE d.parent_id = s.id AND d.outcome IS NULL;
    IF FOUND THEN
        PERFORM set_config('pgfleet.edges_pending', '1', true);
    END IF;
    RETURN NULL;
END
$trigger$;

CREATE TRIGGER jobs_finished_parents
    AFTER UPDATE ON pgfleet.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgfleet.jobs_finished_parents();

CREATE FUNCTION pgfleet.jobs_child_deleted() RETURNS trigger
LANGUAGE plpgsql
AS $trigger$
BEGIN
    DELETE FROM pgfleet.job_dependencies d WHERE d.child_id = OLD.id;
    RETURN NULL;
END
$trigger$;

CREATE TRIGGER jobs_child_deleted
    AFTER DELETE ON pgfleet.jobs
    FOR EACH ROW WHEN (OLD.waiting_on IS NOT NULL)
    EXECUTE FUNCTION pgfleet.jobs_child_deleted();

-- A DELETE, not a TRUNCATE: a TRUNCATE that names both tables is using the edges'
-- table when this runs, and may not truncate it again.
CREATE FUNCTION pgfleet.jobs_truncated() RETURNS trigger
LANGUAGE plpgsql
AS $trigger$
BEGIN
    DELETE FROM pgfleet.job_dependencies;
    RETURN NULL;
END
$trigger$;

CREATE TRIGGER jobs_truncated
    AFTER TRUNCATE ON pgfleet.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgfleet.jobs_truncated();

-- At commit, 0007's deferred trigger calls pgfleet.job_settle_pending once per
-- edge marked pending: the first call applies them all, and each later one found
-- none left only by walking the job_dependencies_pending index, whose entries the
-- first call's update left dead but not removable (their writer, this
-- transaction, is still open). So a transaction that settled n edges read about
-- n^2/2 index entries (5.4 million for a drain of 20,000 jobs in parent-child
-- pairs, most of its CPU). Now a flag local to the transaction,
-- pgfleet.edges_pending, says whether edges were marked pending since the last
-- settling: '1', set by the two functions that mark edges (job_settle_edges, and
-- jobs_finished_parents above); '0', set by job_settle_pending before it reads
-- them. The trigger skips the call while it is '0', so every call after the one
-- that did the work costs the trigger's firing only. Unset (edges marked by hand
-- in SQL), the trigger calls it, as before. The rules are unchanged:
-- - The flag is cleared before the pending edges are read, so edges that the
--   settling itself marks (a cancelled child's own children, through the
--   statement trigger of its UPDATE) set it again, and the events their update
--   queued apply them, as the next call did before.
-- - set_config(..., true) is undone with the savepoint it was set in, as are the
--   edges' updates and their trigger events.
-- - Each transaction has its own flag; what a call reads and locks is unchanged.
-- - job_settle_pending called directly (job_settle_new) always does the work.
CREATE OR REPLACE FUNCTION pgfleet.job_settle_edges(parent_id uuid, outcome pgfleet.job_status,
                                                    only_children uuid[])
RETURNS integer
LANGUAGE plpgsql
AS $edges$
DECLARE
    n integer;
BEGIN
    UPDATE pgfleet.job_dependencies d
    SET outcome = job_settle_edges.outcome, pending = true
    WHERE d.parent_id = job_settle_edges.parent_id AND d.outcome IS NULL
      AND (only_children IS NULL OR d.child_id = ANY (only_children));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM set_config('pgfleet.edges_pending', '1', true);
    END IF;
    RETURN n;
END
$edges$;

CREATE OR REPLACE FUNCTION pgfleet.job_settle_pending()
RETURNS integer
LANGUAGE plpgsql
AS $pending$
DECLARE
    children uuid[];
    oks integer[];
    culprits text[];
    released uuid[];
BEGIN
    -- Before they are read: edges marked from here on set it again.
    PERFORM set_config('pgfleet.edges_pending', '0', true);
    -- The children of this transaction's pending edges, locked in id order first
    -- (whatever order their parents finished in) and before the edges are
    -- updated, as in 0007.
    SELECT array_agg(DISTINCT d.child_id ORDER BY d.child_id) INTO children
    FROM pgfleet.job_dependencies d WHERE d.pending;
    IF children IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgfleet.jobs c WHERE c.id = ANY (children) ORDER BY c.id FOR UPDATE;

    WITH taken AS (
        UPDATE pgfleet.job_dependencies d SET pending = false
        WHERE d.pending AND d.child_id = ANY (children)
        RETURNING d.child_id, d.parent_id, d.outcome, d.run_anyway
    ), per_child AS (
        SELECT t.child_id,
               count(*) FILTER (WHERE t.outcome = 'succeeded' OR t.run_anyway) AS ok,
               min(t.parent_id::text || ' ' || t.outcome::text)
                   FILTER (WHERE t.outcome <> 'succeeded' AND NOT t.run_anyway) AS culprit
        FROM taken t GROUP BY t.child_id
    )
    SELECT array_agg(p.child_id ORDER BY p.child_id), array_agg(p.ok ORDER BY p.child_id),
           array_agg(p.culprit ORDER BY p.child_id)
    INTO children, oks, culprits
    FROM per_child p;
    IF children IS NULL THEN
        RETURN 0;
    END IF;

    -- A child cancelled here fires the triggers in turn for its own children.
    UPDATE pgfleet.jobs c
    SET status = 'cancelled', finished_at = now(), waiting_on = 0,
        last_error = 'cancelled: parent job ' || s.culprit
    FROM unnest(children, culprits) AS s(child_id, culprit)
    WHERE c.id = s.child_id AND s.culprit IS NOT NULL AND c.status = 'waiting';

    WITH due AS (
        UPDATE pgfleet.jobs c
        SET waiting_on = greatest(c.waiting_on - s.ok, 0),
            status = CASE WHEN c.waiting_on <= s.ok THEN 'queued'
                          ELSE 'waiting' END::pgfleet.job_status,
            run_at = CASE WHEN c.waiting_on <= s.ok THEN greatest(c.run_at, now())
                          ELSE c.run_at END
        FROM unnest(children, oks, culprits) AS s(child_id, ok, culprit)
        WHERE c.id = s.child_id AND s.culprit IS NULL AND s.ok > 0 AND c.status = 'waiting'
        RETURNING c.id, c.status
    )
    SELECT array_agg(due.id) INTO released FROM due WHERE due.status = 'queued';
    IF released IS NULL THEN
        RETURN 0;
    END IF;

    -- A batch's callback learns its members' outcomes: every other member's edge
    -- was settled by a transaction that held this child's lock and committed.
    UPDATE pgfleet.jobs c
    SET payload = c.payload || jsonb_build_object('batch', jsonb_build_object(
            'id', c.id,
            'size', b.size, 'succeeded', b.succeeded,
            'failed', b.failed, 'cancelled', b.cancelled))
    FROM (SELECT d.child_id,
                 count(*) AS size,
                 count(*) FILTER (WHERE d.outcome = 'succeeded') AS succeeded,
                 count(*) FILTER (WHERE d.outcome = 'failed') AS failed,
                 count(*) FILTER (WHERE d.outcome = 'cancelled') AS cancelled
          FROM pgfleet.job_dependencies d
          WHERE d.child_id = ANY (released) AND d.batch
          GROUP BY d.child_id) b
    WHERE c.id = b.child_id AND jsonb_typeof(c.payload) = 'object';
    PERFORM pg_notify('pgfleet_jobs', '');
    RETURN cardinality(released);
END
$pending$;

CREATE OR REPLACE FUNCTION pgfleet.job_settle_trigger() RETURNS trigger
LANGUAGE plpgsql
AS $trigger$
BEGIN
    IF current_setting('pgfleet.edges_pending', true) IS DISTINCT FROM '0' THEN
        PERFORM pgfleet.job_settle_pending();
    END IF;
    RETURN NULL;
END
$trigger$;
