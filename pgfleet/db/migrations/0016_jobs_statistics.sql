-- pgfleet 0016: the claim table's ANALYZE samples a tenth of the rows and skips
-- the columns no plan reads (issues #24, #31, #32).
--
-- The leader vacuums pgfleet.jobs with ANALYZE whenever its dead tuples pile up
-- (0011): several times a minute on a busy queue. With the default target (100)
-- each ANALYZE read 30,000 rows and built statistics for every column, payloads,
-- results, errors and trace contexts included: 160 ms of one backend's CPU on a
-- table of 40,000 jobs, about a tenth of all the database's CPU in a drain.
--
-- No plan of pgfleet needs more than the share of each status, name and flag and
-- a coarse spread of times: a target of 10 keeps 10 common values and 10
-- histogram buckets per column from 3,000 sampled rows (the job statuses are 6).
-- The columns only ever read by primary key or shown (payload, result, errors,
-- ids and tokens, counters, timestamps no query filters on) get no statistics:
-- an ANALYZE then takes about 13 ms on the same table.
--
-- Online: SET STATISTICS takes SHARE UPDATE EXCLUSIVE (claims, enqueues and
-- completions go on); it applies from the next ANALYZE. Only the claim table:
-- history's partitions are analyzed by autovacuum, rarely.
ALTER TABLE pgfleet.jobs
    ALTER COLUMN status SET STATISTICS 10,
    ALTER COLUMN name SET STATISTICS 10,
    ALTER COLUMN priority SET STATISTICS 10,
    ALTER COLUMN queue_name SET STATISTICS 10,
    ALTER COLUMN run_at SET STATISTICS 10,
    ALTER COLUMN finished_at SET STATISTICS 10,
    ALTER COLUMN locked_by SET STATISTICS 10,
    ALTER COLUMN limit_key SET STATISTICS 10,
    ALTER COLUMN limited SET STATISTICS 10,
    ALTER COLUMN waiting_on SET STATISTICS 10,
    ALTER COLUMN has_children SET STATISTICS 10,
    ALTER COLUMN cancel_requested_at SET STATISTICS 10,
    ALTER COLUMN awaited SET STATISTICS 10,
    ALTER COLUMN id SET STATISTICS 0,
    ALTER COLUMN payload SET STATISTICS 0,
    ALTER COLUMN attempt SET STATISTICS 0,
    ALTER COLUMN max_attempts SET STATISTICS 0,
    ALTER COLUMN job_key SET STATISTICS 0,
    ALTER COLUMN created_at SET STATISTICS 0,
    ALTER COLUMN started_at SET STATISTICS 0,
    ALTER COLUMN last_error SET STATISTICS 0,
    ALTER COLUMN lock_token SET STATISTICS 0,
    ALTER COLUMN trace_context SET STATISTICS 0,
    ALTER COLUMN errors SET STATISTICS 0,
    ALTER COLUMN errors_omitted SET STATISTICS 0,
    ALTER COLUMN result SET STATISTICS 0,
    ALTER COLUMN snoozes SET STATISTICS 0,
    ALTER COLUMN cancelled_by SET STATISTICS 0,
    ALTER COLUMN result_json SET STATISTICS 0;
