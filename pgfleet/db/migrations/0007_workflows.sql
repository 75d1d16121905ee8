-- pgfleet 0007: workflows. Jobs that wait for other jobs (dependencies), batches
-- whose callback runs once every member has finished, and chains built on both.
--
-- A dependent job is inserted with status 'waiting' and waiting_on = the number of
-- its parents not yet accounted for. It is outside every claim path: the runnable
-- index, the named-queue indexes and the backlog counts only read 'queued' rows.
--
-- One edge row per (child, parent) in pgfleet.job_dependencies. A parent with
-- children has has_children = true; the triggers below act only for such a row
-- when its status becomes succeeded, failed or cancelled, inside the statement
-- that finished it (the worker's batched completion, an operator's cancel, a
-- rescue that buries a job...), so in its transaction: the parent's outcome is
-- recorded on each of its unsettled edges (once: a parent counts once whatever
-- happens to it later), then each waiting child, locked, loses the parents that
-- succeeded; the last one makes it 'queued' and due. A failed or cancelled parent
-- cancels the child (and, through the same triggers, its own children) naming
-- the parent, unless the edge says the child runs anyway. A batch's callback is a
-- child whose edges are all run-anyway batch edges: when it is released, its
-- payload's "batch" key gets the members' outcomes.
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
    -- Settled by this transaction, not yet applied to the child (see below).
    pending    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (child_id, parent_id),
    CHECK (child_id <> parent_id)
);
-- A finishing parent's edges, and the console's list of a job's children.
CREATE INDEX job_dependencies_parent ON pgfleet.job_dependencies (parent_id);
CREATE INDEX job_dependencies_pending ON pgfleet.job_dependencies (child_id) WHERE pending;

-- Settling is in two steps, so that parents finishing together in one transaction
-- (a worker's round) and in another (a second worker's) can never deadlock on
-- their children: the row trigger below only records each finished parent's
-- outcome on its unsettled edges, marking them pending; at commit, a deferred
-- trigger locks every child with pending edges in id order, and applies them.
-- Whoever locks a child second sees the first's edges committed, so the count is
-- exact. Every name in the functions is schema-qualified.

-- Record parent_id's outcome on its unsettled edges (to the children in
-- only_children, when given), as pending.
CREATE FUNCTION pgfleet.job_settle_edges(parent_id uuid, outcome pgfleet.job_status,
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
    RETURN n;
END
$edges$;

-- Apply this transaction's pending edges to their children: each child loses the
-- parents that succeeded (or that it runs after anyway) and is due once none is
-- left; a parent that failed or was cancelled cancels it. Returns how many became
-- due.
CREATE FUNCTION pgfleet.job_settle_pending()
RETURNS integer
LANGUAGE plpgsql
AS $pending$
DECLARE
    children uuid[];
    oks integer[];
    culprits text[];
    released uuid[];
BEGIN
    -- The children of this transaction's pending edges, locked in id order first
    -- (whatever order their parents finished in) and before the edges are
    -- updated: updating an edge this transaction wrote re-checks its foreign key,
    -- which share-locks the child, and two transactions holding that share lock
    -- would then wait for each other's FOR UPDATE.
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

CREATE FUNCTION pgfleet.job_finished_trigger() RETURNS trigger
LANGUAGE plpgsql
AS $trigger$
BEGIN
    PERFORM pgfleet.job_settle_edges(NEW.id, NEW.status, NULL);
    RETURN NULL;
END
$trigger$;

CREATE FUNCTION pgfleet.job_settle_trigger() RETURNS trigger
LANGUAGE plpgsql
AS $trigger$
BEGIN
    PERFORM pgfleet.job_settle_pending();
    RETURN NULL;
END
$trigger$;

-- Fires only for a job that has children, as it finishes: every other update of
-- the jobs table (claims, retries) skips it on the WHEN test.
CREATE TRIGGER jobs_finished_parent
    AFTER UPDATE OF status ON pgfleet.jobs
    FOR EACH ROW
    WHEN (OLD.has_children AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION pgfleet.job_finished_trigger();

-- At commit, for each edge marked pending: the first applies them all (the others
-- find none left). Deferred to the commit, and on the edges, so that a statement
-- that finished no parent (almost every claim round) fires nothing; the worker's
-- round commits in its own round trip, so its children are due when it answers.
CREATE CONSTRAINT TRIGGER job_dependencies_settle
    AFTER UPDATE ON pgfleet.job_dependencies
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.pending)
    EXECUTE FUNCTION pgfleet.job_settle_trigger();
