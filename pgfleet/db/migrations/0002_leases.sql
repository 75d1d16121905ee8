-- pgfleet 0002: named leases for fleet-wide roles other than maintenance.
-- The queue-level metrics are exported by whichever process holds the 'metrics'
-- lease; API processes compete for it too, so the backlog gauges (and the alerts on
-- them) survive the loss of every worker.

CREATE TABLE pgfleet.leases (
    role        text        PRIMARY KEY CHECK (char_length(role) BETWEEN 1 AND 64),
    holder      uuid        NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
