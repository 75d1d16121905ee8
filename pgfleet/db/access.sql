-- Access to the jobs API and the console (pgfleet/service/credentials.py,
-- pgfleet/service/console/auth.py): revoked credential names and console sessions,
-- named like queries.sql and loaded and checked at import by pgfleet/db/access.py.
-- Revocations are announced on the channel 'pgfleet_credentials'
-- (pgfleet.db.access.CREDENTIALS_CHANNEL): every API replica reloads its list.

-- name: revocation_list :many
SELECT name, revoked_at, reason FROM pgfleet.revoked_credentials ORDER BY name;

-- name: revocation_check :val
-- Whether a credential name is revoked: asked per request while a replica's
-- revocation listener is down.
SELECT EXISTS (SELECT 1 FROM pgfleet.revoked_credentials WHERE name = $1);

-- name: revocation_add :one
-- Revoke $1 (with reason $2), end its console sessions and tell every replica, in
-- one statement. added is false when it was already revoked.
WITH added AS (
    INSERT INTO pgfleet.revoked_credentials (name, reason) VALUES ($1, $2)
    ON CONFLICT (name) DO NOTHING
    RETURNING name
), ended AS (
    DELETE FROM pgfleet.console_sessions WHERE credential = $1 RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM added) AS added,
       (SELECT count(*) FROM ended) AS sessions_ended,
       pg_notify('pgfleet_credentials', '') IS NOT NULL AS notified;

-- name: revocation_remove :val
-- Accept $1 again; true when it was revoked.
WITH removed AS (
    DELETE FROM pgfleet.revoked_credentials WHERE name = $1 RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM removed) AND pg_notify('pgfleet_credentials', '') IS NOT NULL;

-- name: session_create :exec
-- A new console session: $1 the SHA-256 of the cookie's secret, $2 the credential's
-- name, $3 the SHA-256 of its secret, $4 the session's CSRF token, $5 its lifetime
-- and $6 its idle timeout in seconds. Sessions past either end are deleted on the
-- way (at most 1000 a login, by the expiry index), so the table keeps only live ones.
WITH swept AS (
    DELETE FROM pgfleet.console_sessions
    WHERE id IN (
        SELECT id FROM pgfleet.console_sessions
        WHERE expires_at < now()
           OR last_seen_at < now() - make_interval(secs => idle_seconds)
        LIMIT 1000
    )
)
INSERT INTO pgfleet.console_sessions
    (id, credential, credential_digest, csrf, expires_at, idle_seconds)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5::float8), $6::integer);

-- name: session_touch :one
-- The live session whose cookie hashes to $1, marked seen now; with the notice it
-- held, which is handed over once (cleared). No row: no such session, expired,
-- idle too long, or its credential revoked.
WITH live AS (
    SELECT s.id, s.notice
    FROM pgfleet.console_sessions s
    WHERE s.id = $1
      AND s.expires_at > now()
      AND s.last_seen_at > now() - make_interval(secs => s.idle_seconds)
      AND NOT EXISTS (
          SELECT 1 FROM pgfleet.revoked_credentials r WHERE r.name = s.credential
      )
    FOR UPDATE
)
UPDATE pgfleet.console_sessions s
SET last_seen_at = now(), notice = NULL
FROM live
WHERE s.id = live.id
RETURNING s.credential, s.credential_digest, s.csrf, live.notice,
          s.expires_at - now() AS remaining;

-- name: session_notice_set :exec
UPDATE pgfleet.console_sessions SET notice = left($2, 500) WHERE id = $1;

-- name: session_delete :val
-- Log out: true when the session existed.
WITH gone AS (DELETE FROM pgfleet.console_sessions WHERE id = $1 RETURNING 1)
SELECT EXISTS (SELECT 1 FROM gone);

-- name: session_count_by_credential :many
-- Live sessions per credential name (pgfleet credentials list).
SELECT credential, count(*) AS sessions, max(last_seen_at) AS last_seen_at
FROM pgfleet.console_sessions
WHERE expires_at > now() AND last_seen_at > now() - make_interval(secs => idle_seconds)
GROUP BY credential
ORDER BY credential;
