-- pgfleet 0018: a limited name's due jobs without a turn read in claim order.
--
-- claim_flow takes a flagged name's due jobs without a turn (scheduled, retried,
-- snoozed, moved later) first, in (priority, run_at, id) order. 0017's index of
-- those jobs was on (name, run_at): to read them in claim order the plan must sort,
-- and with statistics that say many queued jobs have no turn (every unflagged job
-- has none) the planner preferred jobs_runnable, which has that order, and filtered
-- it: each claim of a limited name then read every queued job of the table (a
-- backlog of 100,000 limited jobs beside 60,000 others: 160,000 index entries and
-- their rows per round, the claim path's Postgres time per job nearly doubled).
-- The index now has the claim's order after the name, so that reading it needs no
-- sort and no statistics can make the whole queue look cheaper.
--
-- What it locks: the build takes SHARE on pgfleet.jobs (enqueues and claims wait
-- for it; it reads the table once and indexes only queued flagged jobs without a
-- turn, as a rule a handful). Workers of the previous version keep working: their
-- claims use the new index.

DROP INDEX pgfleet.jobs_flow_scheduled;
CREATE INDEX jobs_flow_scheduled ON pgfleet.jobs (name, priority, run_at, id)
    WHERE status = 'queued' AND limited AND turn IS NULL;
