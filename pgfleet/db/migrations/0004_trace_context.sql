-- pgfleet 0004: the W3C trace context of the enqueue that created a job.
-- {"traceparent": "...", "tracestate": "..."} as a producer with a tracer provider
-- injected it (NULL otherwise); the worker's span for each attempt continues that
-- trace. A nullable column without a default: a catalog change, no table rewrite;
-- it takes the jobs table's ACCESS EXCLUSIVE lock for that moment only.

ALTER TABLE pgfleet.jobs ADD COLUMN trace_context jsonb;
