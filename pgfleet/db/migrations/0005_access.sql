-- pgfleet 0005: access to the jobs API and the console that every replica agrees on.
--
-- revoked_credentials: credential names refused from now on, whatever their secret.
-- Credentials themselves live in each API's configuration (their secrets never
-- reach the database); revoking one by name here takes effect at once on every
-- replica, and a rotated credential gets a new name.
--
-- console_sessions: signed-in console sessions. The cookie carries a random secret;
-- only its SHA-256 is stored here, so reading this table does not give a session.
-- Logging out deletes the row, which ends the session on every replica at once;
-- a session also ends at its absolute expiry and after idle_seconds without a
-- request.
--
-- Two new, empty tables: nothing else is locked or rewritten.

CREATE TABLE pgfleet.revoked_credentials (
    name       text        PRIMARY KEY
                           CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$'),
    revoked_at timestamptz NOT NULL DEFAULT now(),
    reason     text        NOT NULL DEFAULT '' CHECK (char_length(reason) <= 500)
);

CREATE TABLE pgfleet.console_sessions (
    id                bytea       PRIMARY KEY CHECK (octet_length(id) = 32),
    credential        text        NOT NULL CHECK (char_length(credential) BETWEEN 1 AND 64),
    -- SHA-256 of the credential's secret at sign-in: a session ends when its
    -- credential's secret changes.
    credential_digest bytea       NOT NULL CHECK (octet_length(credential_digest) = 32),
    csrf              text        NOT NULL CHECK (char_length(csrf) BETWEEN 16 AND 128),
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_seen_at      timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    idle_seconds      integer     NOT NULL CHECK (idle_seconds > 0),
    -- What the next page shows once (the outcome of the last action).
    notice            text        CHECK (char_length(notice) <= 500)
);

CREATE INDEX console_sessions_credential ON pgfleet.console_sessions (credential);
CREATE INDEX console_sessions_expires ON pgfleet.console_sessions (expires_at);
