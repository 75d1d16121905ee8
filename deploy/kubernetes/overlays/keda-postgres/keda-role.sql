-- The read-only role KEDA's postgresql triggers connect as (scaledobject.yaml).
-- Run once, as the database's owner or a superuser, in pgfleet's database:
--
--   psql "$OWNER_URL" -f deploy/kubernetes/overlays/keda-postgres/keda-role.sql
--   psql "$OWNER_URL" -c "\password pgfleet_keda"
--
-- then store postgresql://pgfleet_keda:<password>@<host>/<db> as the key
-- database-url of the Secret pgfleet-keda. The role can read pgfleet.jobs, which is
-- all the trigger queries read, and nothing else; its sessions are read-only too.
-- tests/kubernetes/test_scaling_queries.py runs the triggers as this role.

CREATE ROLE pgfleet_keda LOGIN NOINHERIT CONNECTION LIMIT 4;
ALTER ROLE pgfleet_keda SET default_transaction_read_only = on;
ALTER ROLE pgfleet_keda SET statement_timeout = '5s';
GRANT USAGE ON SCHEMA pgfleet TO pgfleet_keda;
GRANT SELECT ON pgfleet.jobs TO pgfleet_keda;
