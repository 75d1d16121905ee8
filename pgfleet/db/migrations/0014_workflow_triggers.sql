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
-- Marked settled, and its outcome recorded on its unsettled edges, as pending:
-- pgfleet.job_settle_edges for all of them in one statement. The marker's UPDATE
-- fires this trigger again, which finds none left.
CREATE FUNCTION pgfleet.jobs_finished_parents() RETURNS trigger
LANGUAGE plpgsql
AS $trigger$
BEGIN
    PERFORM 1 FROM pgfleet.jobs u
    WHERE u.has_children AND u.status >= 'succeeded' AND u.status <= 'cancelled'
    LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH settled AS (
        UPDATE pgfleet.jobs j SET has_children = false
        WHERE j.id IN (SELECT u.id FROM pgfleet.jobs u
                       WHERE u.has_children
                         AND u.status >= 'succeeded' AND u.status <= 'cancelled'
                       FOR UPDATE SKIP LOCKED)
        RETURNING j.id, j.status
    )
    UPDATE pgfleet.job_dependencies d SET outcome = s.status, pending = true
    FROM settled s
    WHERE d.parent_id = s.id AND d.outcome IS NULL;
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
