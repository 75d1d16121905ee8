-- pgfleet 0006: workflows. Jobs that wait for other jobs (dependencies), batches
-- whose callback runs once every member has finished, and chains built on both.
--
-- A dependent job is inserted with status 'waiting' and waiting_on = the number of
-- its parents not yet accounted for. It is outside every claim path: the runnable
-- index, the named-queue indexes and the backlog counts only read 'queued' rows.
--
-- One edge row per (child, parent) in pgfleet.job_dependencies. A parent with
-- children has has_children = true; the trigger below fires only for such a row
-- when its status becomes succeeded, failed or cancelled, in the statement that
-- finished it (the worker's batched completion, an operator's cancel, a rescue that
-- buries a job...): it records the parent's outcome on each of its unsettled edges
-- and, in the same transaction, decrements each waiting child (the child's row
-- lock serialises parents finishing at once on two workers; the edge's outcome,
-- set once, makes a parent count once whatever happens to it later). The last
-- parent's success makes the child 'queued' and due; a failed or cancelled parent
-- cancels it (and, through the same trigger, its own children) naming the parent,
-- unless the edge says the child runs anyway. A batch's callback is a child whose
-- edges are all run-anyway batch edges: when it is released, its payload's "batch"
-- key gets the members' outcomes.
--
-- What it locks: two nullable columns without defaults (a catalog change; the jobs
-- table's ACCESS EXCLUSIVE lock for that moment), a new table, one index on the
-- new column and a trigger (SHARE ROW EXCLUSIVE on pgfleet.jobs, briefly).
--
-- ALTER TYPE ... ADD VALUE runs inside the migration's transaction, where the new
-- value cannot be used yet: nothing below names 'waiting' as a job_status (the
-- functions are PL/pgSQL, whose bodies are planned when first run), and the index
-- of waiting jobs is on waiting_on, which is positive exactly while a job waits.

ALTER TYPE pgfleet.job_status ADD VALUE IF NOT EXISTS 'waiting';

ALTER TABLE pgfleet.jobs
    ADD COLUMN waiting_on integer,
    ADD COLUMN has_children boolean;

-- Waiting jobs by name: the metrics' and the console's count of jobs waiting on
-- parents. Never read by a claim.
CREATE INDEX jobs_waiting ON pgfleet.jobs (name) WHERE waiting_on > 0;

CREATE TABLE pgfleet.job_dependencies (
    -- The edge goes when its child is pruned; a parent may be pruned first (its
    -- outcome is recorded here).
    child_id   uuid    NOT NULL REFERENCES pgfleet.jobs (id) ON DELETE CASCADE,
    parent_id  uuid    NOT NULL,
    -- The child runs whatever this parent's outcome (a batch's callback does).
    run_anyway boolean NOT NULL DEFAULT false,
    -- The edge belongs to a batch whose callback is child_id.
    batch      boolean NOT NULL DEFAULT false,
    -- The parent's final status once it finished (NULL: not yet).
    outcome    pgfleet.job_status,
    PRIMARY KEY (child_id, parent_id),
    CHECK (child_id <> parent_id)
);
-- A finishing parent's edges, and the console's list of a job's children.
CREATE INDEX job_dependencies_parent ON pgfleet.job_dependencies (parent_id);

-- Settle the edges from parent_id (only those to the children in only_children,
-- when given) as finished with outcome; returns how many children became due.
CREATE FUNCTION pgfleet.job_settle(parent_id uuid, outcome pgfleet.job_status,
                                   only_children uuid[])
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $settle$
DECLARE
    go uuid[];
    stop uuid[];
    released uuid[];
BEGIN
    WITH settled AS (
        UPDATE pgfleet.job_dependencies d
        SET outcome = job_settle.outcome
        WHERE d.parent_id = job_settle.parent_id AND d.outcome IS NULL
          AND (only_children IS NULL OR d.child_id = ANY (only_children))
        RETURNING d.child_id, d.run_anyway
    )
    SELECT array_agg(s.child_id) FILTER (WHERE job_settle.outcome = 'succeeded' OR s.run_anyway),
           array_agg(s.child_id) FILTER (WHERE job_settle.outcome <> 'succeeded'
                                           AND NOT s.run_anyway)
    INTO go, stop
    FROM settled s;

    IF stop IS NOT NULL THEN
        -- Each cancelled child fires this trigger in turn for its own children.
        UPDATE pgfleet.jobs c
        SET status = 'cancelled', finished_at = now(), waiting_on = 0,
            last_error = 'cancelled: parent job ' || job_settle.parent_id::text || ' '
                         || job_settle.outcome::text
        WHERE c.id = ANY (stop) AND c.status = 'waiting';
    END IF;

    IF go IS NOT NULL THEN
        -- A single-table update: a parent finishing at the same time on another
        -- worker holds the child's row lock; this waits for it and then decrements
        -- the count that transaction left.
        WITH due AS (
            UPDATE pgfleet.jobs c
            SET waiting_on = c.waiting_on - 1,
                status = CASE WHEN c.waiting_on <= 1 THEN 'queued'
                              ELSE 'waiting' END::pgfleet.job_status,
                run_at = CASE WHEN c.waiting_on <= 1 THEN greatest(c.run_at, now())
                              ELSE c.run_at END
            WHERE c.id = ANY (go) AND c.status = 'waiting'
            RETURNING c.id, c.status
        )
        SELECT array_agg(due.id) INTO released FROM due WHERE due.status = 'queued';

        IF released IS NOT NULL THEN
            -- A batch's callback learns its members' outcomes. A statement of its
            -- own: every other parent's edge is settled and committed by now (each
            -- held this child's row lock, which the update above waited for).
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
        END IF;
    END IF;
    RETURN 0;
END
$settle$;

CREATE FUNCTION pgfleet.job_finished_trigger() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $trigger$
BEGIN
    PERFORM pgfleet.job_settle(NEW.id, NEW.status, NULL);
    RETURN NULL;
END
$trigger$;

-- Fires only for a job that has children, as it finishes: every other update of
-- the jobs table (claims, retries, heartbeats' renewals) skips it on the WHEN test.
CREATE TRIGGER jobs_settle_children
    AFTER UPDATE OF status ON pgfleet.jobs
    FOR EACH ROW
    WHEN (OLD.has_children AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION pgfleet.job_finished_trigger();
