-- pgfleet 0012: the named-queue flag of 0009 is set on insert only; a check keeps
-- every live job of a named queue flagged.
--
-- A row trigger that fires BEFORE UPDATE makes Postgres lock and re-read every row
-- any UPDATE of the table writes before the trigger's WHEN is even tested
-- (PostgreSQL 15: ExecBRUpdateTriggers calls GetTupleForTrigger, which locks the
-- tuple), whatever the UPDATE OF list says. The claim's rows are already locked
-- (FOR UPDATE SKIP LOCKED), but every completion paid a tuple lock of its own: one
-- more WAL record per job (54 bytes: a round of 500 completed and 500 claimed jobs
-- wrote 4,869 records and 420 kB, now 4,369 and 393 kB, as before 0006) and about
-- 4% more backend CPU per round (measured by EXPLAIN (ANALYZE, WAL) and the claim
-- backend's CPU, rounds interleaved with and without the trigger).
--
-- Only an INSERT can bring a job with a queue name into the table unflagged: the
-- flag is never cleared, and pgfleet's statements that queue a finished job again
-- (retry) set it. The check makes it a rule for every writer (SQL by hand, a
-- finished job from before 0009 queued again): a queued, running or waiting job
-- with a queue name is flagged, or the write fails (SQLSTATE 23514). Finished jobs
-- are exempt, so those from before 0009 stay as they are. 'waiting' is not named:
-- it cannot be used in the transaction that adds it (0007) when a fresh database
-- applies every migration at once.
--
-- What it locks: DROP TRIGGER and the check (NOT VALID: nothing is scanned) take
-- the jobs table's ACCESS EXCLUSIVE lock for a moment; CREATE TRIGGER a SHARE ROW
-- EXCLUSIVE lock. No row is read or written. Workers and producers of the previous
-- version keep working: their inserts set the flag (and the trigger still does),
-- their updates never clear it.

DROP TRIGGER jobs_named_queue_flow ON pgfleet.jobs;

CREATE TRIGGER jobs_named_queue_flow
    BEFORE INSERT ON pgfleet.jobs
    FOR EACH ROW WHEN (NEW.queue_name IS NOT NULL AND NOT NEW.limited)
    EXECUTE FUNCTION pgfleet.jobs_flag_named_queue();

ALTER TABLE pgfleet.jobs ADD CONSTRAINT jobs_named_queue_flagged
    CHECK (queue_name IS NULL OR limited OR status IN ('succeeded', 'failed', 'cancelled'))
    NOT VALID;
