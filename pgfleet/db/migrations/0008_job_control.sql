-- pgfleet 0008: job control. A job keeps every failed attempt's error, its
-- handler's result, how often it snoozed, and a cancel asked of it while running.
--
-- errors:         the last 10 failed attempts, oldest first, each
--                 {"at", "attempt", "error", "worker"}; errors_omitted counts the
--                 older ones that no longer fit.
-- result:         the handler's return value (JSON), set when the job succeeds.
-- snoozes:        how many times the handler snoozed (raise pgfleet.Snooze(delay)):
--                 a snooze puts the job back without using an attempt.
-- cancel_requested_at, cancelled_by: Queue.cancel on a running job records the
--                 request here and tells its worker; the worker's outcome ends the
--                 job cancelled (never retried).
-- awaited:        someone waits for this job (Queue.wait): finishing it notifies
--                 the pgfleet_done channel with its id. Jobs nobody waits for
--                 finish without a notification.
--
-- Every column is nullable without a default, NULL meaning none (0 for the
-- counts, false for awaited): a catalog change only, no table rewrite on a table
-- full of jobs (the ACCESS EXCLUSIVE lock is held for that moment only), and a job
-- that uses none of it is stored exactly as wide as before (a NULL costs a bit of
-- the row's null bitmap, which it already has), so the claim and completion
-- write no more than they did.

ALTER TABLE pgfleet.jobs
    ADD COLUMN errors              jsonb,
    ADD COLUMN errors_omitted      integer,
    ADD COLUMN result              jsonb,
    ADD COLUMN snoozes             integer,
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancelled_by        text,
    ADD COLUMN awaited             boolean;
