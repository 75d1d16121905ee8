"""The HTTP jobs API as an OpenAPI 3.1 document, built from the code that serves it.

``pgfleet api`` serves it at ``GET /openapi.json`` (reflecting its own limits,
strict mode and authentication), so clients can be generated and tools can test
the API against it; the documentation's HTTP reference is generated from it.

What the request schemas say comes from the request parser's own tables
(:mod:`pgfleet.service.api_schema`: the body's fields, the options and their JSON
types, the query parameters) and from the library's limits (name pattern,
priority and attempt ranges, job key length, statuses and key modes): an option
added to the parser without a schema here makes :func:`openapi_document` fail,
and ``tests/unit/service/test_openapi.py`` fails on a route served but not documented.

Standard library and pgfleet's own leaf modules only: no aiohttp.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgfleet._version import __version__
from pgfleet.jobs import (
    MAX_ATTEMPTS_LIMIT,
    MAX_DELAY_SECONDS,
    MAX_JOB_KEY_LENGTH,
    MAX_PARENTS,
    NAME_PATTERN,
    PRIORITY_MAX,
    PRIORITY_MIN,
    JobKeyMode,
    JobStatus,
)
from pgfleet.limits import MAX_LIMIT, MAX_PER_SECONDS, MIN_PER_SECONDS
from pgfleet.service.api_schema import (
    DEFAULT_LIST_LIMIT,
    JOB_FIELDS,
    LIST_PARAMS,
    MAX_LIST_LIMIT,
    OPTION_FIELDS,
    Limits,
)
from pgfleet.service.credentials import Access, Role

__all__ = ["OPENAPI_VERSION", "openapi_document"]

OPENAPI_VERSION = "3.1.0"

_JSON = "application/json"
_REF = "#/components/schemas/"

_DESCRIPTION = """\
The HTTP jobs API of pgfleet (`pgfleet api`), backed by the durable queue in
PostgreSQL. A `202 Accepted` comes after the enqueue committed: the job survives
this process, the workers and the database restarting. Every refusal (4xx, 503)
happens before anything is written, with a JSON body `{"error": ..., "detail": ...}`
naming the problem.

When the API has credentials (`PGFLEET_API_CREDENTIALS`, or the one-token
`PGFLEET_API_TOKEN`), every `/jobs` request needs `Authorization: Bearer <secret>` of
a credential whose role allows the operation (`x-pgfleet-roles` on each operation):
`producer` enqueues and reads a job by its id, `viewer` reads everything but
payloads, `operator` does everything. A wrong secret is 401, a role that may not is
403, and a client that keeps failing is paused with 429 and `Retry-After`. Without
credentials the API answers only its own Host names (421 otherwise) and takes only
JSON POSTs (415 otherwise). The operator console under `/ui/` (HTML for people) and
the metrics port's `/metrics` are not part of this API.
"""

_NAME = {
    "type": "string",
    "pattern": f"^{NAME_PATTERN.pattern}$",
    "description": "1-128 letters, digits, '_', '-', '.' or ':'.",
    "examples": ["send_email"],
}

_TIME = {"type": "string", "format": "date-time"}

# One schema per enqueue option, keyed by the parser's own option names: an option
# the parser accepts and this table lacks fails the document's construction.
# ``null`` is accepted for each and means "the default".
_OPTION_SCHEMAS: dict[str, dict[str, Any]] = {
    "run_at": {
        "type": ["string", "null"],
        "format": "date-time",
        "description": "Run no earlier than this RFC 3339 date-time (with an offset). "
        "Not with delay.",
    },
    "delay": {
        "type": ["number", "null"],
        "minimum": 0,
        "maximum": MAX_DELAY_SECONDS,
        "description": "Run no earlier than this many seconds from now (database clock). "
        "Not with run_at.",
    },
    "priority": {
        "type": ["integer", "null"],
        "minimum": PRIORITY_MIN,
        "maximum": PRIORITY_MAX,
        "description": "Lower runs first (default 0).",
    },
    "max_attempts": {
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": MAX_ATTEMPTS_LIMIT,
        "description": "Attempts including the first (default 25).",
    },
    "queue_name": {
        "type": ["string", "null"],
        "pattern": _NAME["pattern"],
        "description": "At most one running job per queue name across the fleet.",
    },
    "job_key": {
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": MAX_JOB_KEY_LENGTH,
        "description": "At most one queued-or-running job per key; "
        "a key may appear once per batch.",
    },
    "limit_key": {
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": MAX_JOB_KEY_LENGTH,
        "description": "The key flow control counts the job under (a tenant, an account): "
        "per-key limits apply to each key, and a name's keys take turns.",
    },
    "job_key_mode": {
        "type": ["string", "null"],
        "enum": [*(m.value for m in JobKeyMode), None],
        "description": "What an enqueue does when its key is held: dedupe (keep the "
        "existing job), replace (overwrite a queued job, run_at included), "
        "preserve_run_at (overwrite payload and options, keep run_at).",
    },
    "after": {
        "type": ["array", "null"],
        "items": {
            "oneOf": [
                {"type": "string", "format": "uuid"},
                {"type": "integer", "minimum": 0},
            ]
        },
        "maxItems": MAX_PARENTS,
        "description": "Parents: the job waits (status waiting) until every one "
        "succeeded. Job ids, or in a batch the index of another job of the batch. "
        "A parent that fails or is cancelled cancels the job unless run_anyway. Not "
        "with job_key.",
    },
    "run_anyway": {
        "type": ["boolean", "null"],
        "description": "With after: run once every parent finished, whatever its outcome.",
    },
}

_JOB_FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "name": {"$ref": _REF + "JobName"},
    "payload": {
        "description": "Any JSON value (default null), at most the API's payload limit "
        "encoded. With --app, it must decode into the handler's declared type."
    },
    "options": {
        "oneOf": [{"$ref": _REF + "EnqueueOptions"}, {"type": "null"}],
        "description": "How and when the job runs.",
    },
}

_JOB_VIEW_REQUIRED = (
    "id",
    "name",
    "status",
    "attempt",
    "max_attempts",
    "priority",
    "run_at",
    "created_at",
)


def _job_view_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "A job's status record: the fields its state has. "
        "It never carries the payload.",
        "required": list(_JOB_VIEW_REQUIRED),
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "name": {"$ref": _REF + "JobName"},
            "status": {"$ref": _REF + "JobStatus"},
            "attempt": {"type": "integer", "minimum": 0},
            "max_attempts": {"type": "integer", "minimum": 1},
            "priority": {"type": "integer"},
            "run_at": _TIME,
            "created_at": _TIME,
            "started_at": _TIME,
            "finished_at": _TIME,
            "queue_name": {"$ref": _REF + "JobName"},
            "job_key": {"type": "string"},
            "limit_key": {
                "type": "string",
                "description": "The key its flow control counts it under, when enqueued with one.",
            },
            "error": {
                "type": "string",
                "description": "The last error, on a failed job or one between attempts.",
            },
            "worker_id": {
                "type": "string",
                "format": "uuid",
                "description": "The worker running it (running jobs only).",
            },
            "result": {
                "description": "What the handler returned (any JSON value), on a "
                "succeeded job that returned something; redacted like payloads."
            },
            "errors": {
                "type": "array",
                "description": "Each failed attempt's error, oldest first (the last 10).",
                "items": {
                    "type": "object",
                    "required": ["at", "attempt", "error"],
                    "additionalProperties": False,
                    "properties": {
                        "at": _TIME,
                        "attempt": {"type": "integer", "minimum": 0},
                        "error": {"type": "string"},
                        "worker_id": {"type": "string", "format": "uuid"},
                    },
                },
            },
            "errors_omitted": {
                "type": "integer",
                "minimum": 1,
                "description": "Older failed attempts no longer in errors.",
            },
            "snoozes": {
                "type": "integer",
                "minimum": 1,
                "description": "Times the handler snoozed (runs again later, no attempt used).",
            },
            "cancel_requested_at": {
                **_TIME,
                "description": "When someone cancelled it while it ran.",
            },
            "cancelled_by": {"type": "string", "description": "Who cancelled it."},
        },
    }


def _schemas(limits: Limits) -> dict[str, Any]:
    name = dict(_NAME)
    if limits.known_names is not None:
        name["enum"] = sorted(limits.known_names)
        name["description"] = "Strict mode: a job name the API's registry has a handler for."
    return {
        "JobName": name,
        "JobStatus": {"type": "string", "enum": [s.value for s in JobStatus]},
        "EnqueueOptions": {
            "type": "object",
            "additionalProperties": False,
            "properties": {key: _OPTION_SCHEMAS[key] for key in sorted(OPTION_FIELDS)},
        },
        "EnqueueJob": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {key: _JOB_FIELD_SCHEMAS[key] for key in sorted(JOB_FIELDS)},
        },
        "EnqueueBatch": {
            "type": "object",
            "required": ["jobs"],
            "additionalProperties": False,
            "properties": {
                "jobs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.max_batch,
                    "items": {"$ref": _REF + "EnqueueJob"},
                    "description": "Enqueued in one transaction: all or none.",
                }
            },
        },
        "Accepted": {
            "type": "object",
            "required": ["id", "status"],
            "additionalProperties": False,
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "status": {
                    "$ref": _REF + "JobStatus",
                    "description": "queued, or the status of the existing job a job_key "
                    "resolved to; for a job with after, waiting (or queued or cancelled "
                    "when its parents had already finished).",
                },
            },
        },
        "AcceptedBatch": {
            "type": "object",
            "required": ["jobs"],
            "additionalProperties": False,
            "properties": {"jobs": {"type": "array", "items": {"$ref": _REF + "Accepted"}}},
        },
        "EnqueueBatchWithCallback": {
            "type": "object",
            "required": ["jobs", "callback"],
            "additionalProperties": False,
            "properties": {
                "jobs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.max_batch - 1,
                    "items": {"$ref": _REF + "EnqueueJob"},
                    "description": "The members, enqueued with the callback in one transaction.",
                },
                "callback": {
                    "$ref": _REF + "EnqueueJob",
                    "description": "Runs once, when every member finished; its payload "
                    "(an object or null) gets a 'batch' key with the members' outcomes.",
                },
            },
        },
        "AcceptedBatchWithCallback": {
            "type": "object",
            "required": ["id", "jobs"],
            "additionalProperties": False,
            "properties": {
                "id": {
                    "type": "string",
                    "format": "uuid",
                    "description": "The batch's id: its callback job's.",
                },
                "jobs": {"type": "array", "items": {"$ref": _REF + "Accepted"}},
            },
        },
        "BatchProgress": {
            "type": "object",
            "required": [
                "id",
                "size",
                "succeeded",
                "failed",
                "cancelled",
                "pending",
                "callback_status",
            ],
            "additionalProperties": False,
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "size": {"type": "integer", "minimum": 1},
                "succeeded": {"type": "integer", "minimum": 0},
                "failed": {"type": "integer", "minimum": 0},
                "cancelled": {"type": "integer", "minimum": 0},
                "pending": {"type": "integer", "minimum": 0},
                "callback_status": {"$ref": _REF + "JobStatus"},
            },
        },
        "Relative": {
            "type": "object",
            "required": ["id", "name", "status", "run_anyway", "batch"],
            "additionalProperties": False,
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "name": {
                    "type": ["string", "null"],
                    "description": "null: a parent pruned since it finished.",
                },
                "status": {"$ref": _REF + "JobStatus"},
                "run_anyway": {"type": "boolean"},
                "batch": {"type": "boolean"},
            },
        },
        "Dependencies": {
            "type": "object",
            "required": ["parents", "children"],
            "additionalProperties": False,
            "properties": {
                "parents": {"type": "array", "items": {"$ref": _REF + "Relative"}},
                "children": {"type": "array", "items": {"$ref": _REF + "Relative"}},
            },
        },
        "Job": _job_view_schema(),
        "JobList": {
            "type": "object",
            "required": ["jobs"],
            "additionalProperties": False,
            "properties": {"jobs": {"type": "array", "items": {"$ref": _REF + "Job"}}},
        },
        "Limit": {
            "type": "object",
            "required": [
                "name",
                "concurrency",
                "rate",
                "per",
                "per_key",
                "source",
                "paused",
                "paused_at",
                "updated_at",
            ],
            "additionalProperties": False,
            "properties": {
                "name": {"$ref": _REF + "JobName"},
                "concurrency": {"type": ["integer", "null"]},
                "rate": {"type": ["integer", "null"]},
                "per": {"type": "number"},
                "per_key": {"type": "boolean"},
                "source": {"type": "string", "enum": ["code", "operator"]},
                "paused": {"type": "boolean"},
                "paused_at": {**_TIME, "type": ["string", "null"]},
                "updated_at": _TIME,
                "waiting": {
                    "type": "object",
                    "additionalProperties": {"type": "integer"},
                    "description": "Due jobs held back, by reason: paused, concurrency, rate.",
                },
            },
        },
        "LimitList": {
            "type": "object",
            "required": ["limits", "paused_queues"],
            "additionalProperties": False,
            "properties": {
                "limits": {"type": "array", "items": {"$ref": _REF + "Limit"}},
                "paused_queues": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["kind", "name", "paused_at"],
                        "additionalProperties": False,
                        "properties": {
                            "kind": {"type": "string", "enum": ["queue"]},
                            "name": {"type": "string"},
                            "paused_at": _TIME,
                        },
                    },
                },
            },
        },
        "LimitsBody": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "concurrency": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": MAX_LIMIT,
                    "description": "At most this many running at once (held ones included).",
                },
                "rate": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": MAX_LIMIT,
                    "description": "At most this many attempts started in any window of per.",
                },
                "per": {
                    "type": ["number", "null"],
                    "minimum": MIN_PER_SECONDS,
                    "maximum": MAX_PER_SECONDS,
                    "description": "The rate's window in seconds (default 1).",
                },
                "per_key": {
                    "type": ["boolean", "null"],
                    "description": "Each limit applies to each limit_key on its own.",
                },
            },
        },
        "PauseTarget": {
            "type": "object",
            "additionalProperties": False,
            "description": "Exactly one of name and queue_name.",
            "properties": {
                "name": {"$ref": _REF + "JobName"},
                "queue_name": {"type": "string", "pattern": _NAME["pattern"]},
            },
        },
        "Paused": {
            "type": "object",
            "required": ["name", "queue_name"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": ["string", "null"]},
                "queue_name": {"type": ["string", "null"]},
                "paused_at": _TIME,
                "resumed": {"type": "boolean"},
            },
        },
        "Cleared": {
            "type": "object",
            "required": ["name", "cleared"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "cleared": {"type": "boolean"}},
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": False,
            "properties": {
                "error": {"type": "string", "description": "What was refused, and why."},
                "detail": {
                    "type": "object",
                    "description": "Machine-readable particulars, e.g. the offending field.",
                },
            },
        },
        "Health": {
            "type": "object",
            "required": ["status"],
            "additionalProperties": False,
            "properties": {
                "status": {"type": "string", "enum": ["ok", "ready", "not ready", "shutting down"]},
                "reason": {"type": "string"},
            },
        },
    }


def _json(ref: str, description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {_JSON: {"schema": {"$ref": _REF + ref}}},
    }
    if headers:
        out["headers"] = headers
    return out


def _error(description: str) -> dict[str, Any]:
    return _json("Error", description)


_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying. Absent when retrying cannot "
        "help (shutting down, schema not migrated).",
        "schema": {"type": "integer", "minimum": 1},
    }
}

# Answers any /jobs operation can give, besides its own.
_COMMON: dict[str, Any] = {
    "401": _error("Authentication is on and the bearer token is missing or wrong."),
    "403": _error("The credential's role does not allow this operation."),
    "421": _error(
        "The Host header is not one this API answers for (--allowed-hosts; without "
        "credentials: loopback and the bound address)."
    ),
    "429": _json(
        "Error",
        "Too many failed authentications from this client: retry after the pause.",
        {
            "Retry-After": {
                "description": "Seconds before this client may try again.",
                "schema": {"type": "integer", "minimum": 1},
            }
        },
    ),
    "500": _error("An unexpected error; it is logged by the API."),
    "503": _json(
        "Error",
        "The database is unavailable (with Retry-After), the schema is not migrated, "
        "or the API is shutting down.",
        _RETRY_AFTER,
    ),
}


def _operation(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    secured: bool,
    **extra: Any,
) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, **extra}
    op["responses"] = {**responses, **(_COMMON if secured else {})}
    if secured:
        op["tags"] = ["jobs"]
    else:
        op["tags"] = ["service"]
        op["security"] = []
    return op


_JOB_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The job's id (a UUID; anything else is answered 404).",
    "schema": {"type": "string"},
}

_LIST_PARAMETERS: dict[str, dict[str, Any]] = {
    "status": {"schema": {"$ref": _REF + "JobStatus"}, "description": "Only jobs in this state."},
    "name": {"schema": {"$ref": _REF + "JobName"}, "description": "Only jobs of this name."},
    "limit": {
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIST_LIMIT,
            "default": DEFAULT_LIST_LIMIT,
        },
        "description": "How many jobs, newest first.",
    },
}


_LIMIT_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "The job name.",
    "schema": {"type": "string"},
}

_pause_body = {
    "required": True,
    "content": {_JSON: {"schema": {"$ref": _REF + "PauseTarget"}}},
}


def _paths(limits: Limits) -> dict[str, Any]:
    enqueue_body = {
        "required": True,
        "content": {
            _JSON: {
                "schema": {
                    "oneOf": [
                        {"$ref": _REF + "EnqueueJob"},
                        {"$ref": _REF + "EnqueueBatch"},
                    ]
                },
                "examples": {
                    "one": {
                        "value": {
                            "name": "send_email",
                            "payload": {"to": "ada@example.com", "subject": "Welcome"},
                            "options": {"max_attempts": 5, "job_key": "welcome:ada"},
                        }
                    },
                    "batch": {
                        "value": {
                            "jobs": [
                                {"name": "resize", "payload": {"image": 1}},
                                {"name": "resize", "payload": {"image": 2}},
                            ]
                        }
                    },
                },
            }
        },
    }
    not_found = _error("No job with that id (malformed ids included).")
    # Cancel and retry take no body: none, or an empty JSON object (without
    # credentials a POST must be JSON, which a page of another site cannot send).
    no_body = {
        "required": False,
        "content": {_JSON: {"schema": {"type": "object", "maxProperties": 0}}},
    }
    no_body_errors = {
        "415": _error("A body that is not application/json in UTF-8."),
        "422": _error("A body other than an empty JSON object."),
        "400": _error("Malformed JSON."),
    }
    refused = _error("The job's state does not allow it, or its job_key is taken; nothing changed.")
    job_record = _json("Job", "The job's status record after the operation.")
    return {
        "/jobs": {
            "post": _operation(
                "enqueue",
                "Enqueue one job, or a batch in one transaction",
                {
                    "202": {
                        "description": "Committed. One job: its id and Location; a batch: "
                        "every id, in order.",
                        "headers": {
                            "Location": {
                                "description": "/jobs/{id} of the job (one job only).",
                                "schema": {"type": "string"},
                            }
                        },
                        # What a client does next with the id (and what stateful
                        # tests follow).
                        "links": {
                            operation: {
                                "operationId": operation,
                                "parameters": {"id": "$response.body#/id"},
                            }
                            for operation in ("getJob", "cancelJob", "retryJob")
                        },
                        "content": {
                            _JSON: {
                                "schema": {
                                    "oneOf": [
                                        {"$ref": _REF + "Accepted"},
                                        {"$ref": _REF + "AcceptedBatch"},
                                    ]
                                }
                            }
                        },
                    },
                    "400": _error("Malformed JSON."),
                    "409": _error("A job_key repeated in the batch or held by another job."),
                    "413": _error(
                        f"The body, a payload or the batch (at most {limits.max_batch} jobs) "
                        "is too large, or the batch alone is over a backlog cap."
                    ),
                    "415": _error("The body is not application/json in UTF-8."),
                    "422": _error(
                        "Unknown fields, invalid names or options, or a payload that does "
                        "not encode (or decode for its handler); detail names the field."
                    ),
                },
                secured=True,
                requestBody=enqueue_body,
                description="Answers after the commit. With a backlog cap, a request that "
                "would take the runnable backlog over it is refused with 503 and "
                "Retry-After, nothing written.",
            ),
            "get": _operation(
                "listJobs",
                "The most recent jobs, newest first",
                {
                    "200": _json("JobList", "Status records, without payloads."),
                    "422": _error("An unknown or invalid query parameter."),
                },
                secured=True,
                parameters=[
                    {"name": key, "in": "query", "required": False, **_LIST_PARAMETERS[key]}
                    for key in sorted(LIST_PARAMS)
                ],
            ),
        },
        "/jobs/{id}": {
            "get": _operation(
                "getJob",
                "A job's status record; with wait, once it has finished",
                {
                    "200": _json(
                        "Job",
                        "The status record (never the payload). With wait: the finished "
                        "job, or its current record when wait ran out first.",
                    ),
                    "404": not_found,
                    "422": _error("An invalid wait parameter."),
                },
                secured=True,
                parameters=[
                    _JOB_ID,
                    {
                        "name": "wait",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "number", "minimum": 0, "maximum": limits.max_wait},
                        "description": "Long poll: answer once the job has finished, or "
                        f"after this many seconds (at most {limits.max_wait}, --max-wait).",
                    },
                ],
            ),
        },
        "/jobs/{id}/dependencies": {
            "get": _operation(
                "jobDependencies",
                "A job's parents (the jobs it waits on) and children",
                {
                    "200": _json("Dependencies", "Each with its status (up to 1000 each)."),
                    "404": not_found,
                },
                secured=True,
                parameters=[_JOB_ID],
            ),
        },
        "/batches": {
            "post": _operation(
                "enqueueBatch",
                "Enqueue a batch with a callback that runs once every member finished",
                {
                    "202": _json(
                        "AcceptedBatchWithCallback",
                        "Committed: the batch's id (its callback's) and every member's id.",
                        {
                            "Location": {
                                "description": "/batches/{id} of the batch.",
                                "schema": {"type": "string"},
                            }
                        },
                    ),
                    "400": _error("Malformed JSON."),
                    "409": _error("A job_key repeated in the batch or held by another job."),
                    "413": _error(
                        f"The body, a payload or the batch (at most {limits.max_batch} jobs "
                        "with the callback) is too large, or over a backlog cap."
                    ),
                    "415": _error("The body is not application/json in UTF-8."),
                    "422": _error(
                        "Unknown fields, invalid names or options, a dependency cycle or "
                        "unknown parent; detail names the field."
                    ),
                },
                secured=True,
                requestBody={
                    "required": True,
                    "content": {_JSON: {"schema": {"$ref": _REF + "EnqueueBatchWithCallback"}}},
                },
            ),
        },
        "/batches/{id}": {
            "get": _operation(
                "getBatch",
                "A batch's progress: members by outcome, and its callback's status",
                {
                    "200": _json("BatchProgress", "Counts of the members' outcomes so far."),
                    "404": _error("No batch with that id (malformed ids included)."),
                },
                secured=True,
                parameters=[{**_JOB_ID, "description": "The batch's id (its callback's)."}],
            ),
        },
        "/jobs/{id}/cancel": {
            "post": _operation(
                "cancelJob",
                "Cancel a queued job, or ask the worker running a running one to stop it",
                {"200": job_record, "404": not_found, "409": refused, **no_body_errors},
                secured=True,
                parameters=[_JOB_ID],
                requestBody=no_body,
            ),
        },
        "/jobs/{id}/retry": {
            "post": _operation(
                "retryJob",
                "Run a failed or cancelled job again, now, with fresh attempts",
                {"200": job_record, "404": not_found, "409": refused, **no_body_errors},
                secured=True,
                parameters=[_JOB_ID],
                requestBody=no_body,
            ),
        },
        "/limits": {
            "get": _operation(
                "listLimits",
                "Job names with a limit or a pause, and their due jobs waiting on it",
                {"200": _json("LimitList", "Every limit and pause, by name.")},
                secured=True,
            ),
        },
        "/limits/{name}": {
            "put": _operation(
                "setLimits",
                "Set a job name's limits for the whole fleet (an operator's value)",
                {
                    "200": _json("Limit", "The stored limits."),
                    **{k: v for k, v in no_body_errors.items() if k != "422"},
                    "422": _error("An invalid name, an unknown field or a value out of range."),
                },
                secured=True,
                parameters=[_LIMIT_NAME],
                requestBody={
                    "required": True,
                    "content": {_JSON: {"schema": {"$ref": _REF + "LimitsBody"}}},
                },
            ),
            "delete": _operation(
                "clearLimits",
                "Remove a job name's limits (a pause stays)",
                {
                    "200": _json("Cleared", "Whether the name had limits."),
                    "422": _error("An invalid job name."),
                },
                secured=True,
                parameters=[_LIMIT_NAME],
            ),
        },
        "/pause": {
            "post": _operation(
                "pause",
                "Stop new starts of a job name or a named queue across the fleet",
                {
                    "200": _json("Paused", "Paused (since paused_at)."),
                    **{k: v for k, v in no_body_errors.items() if k != "422"},
                    "422": _error("Not exactly one of name and queue_name, or an invalid one."),
                },
                secured=True,
                requestBody=_pause_body,
            ),
        },
        "/resume": {
            "post": _operation(
                "resume",
                "Let a paused job name or named queue start again",
                {
                    "200": _json("Paused", "resumed: whether it was paused."),
                    **{k: v for k, v in no_body_errors.items() if k != "422"},
                    "422": _error("Not exactly one of name and queue_name, or an invalid one."),
                },
                secured=True,
                requestBody=_pause_body,
            ),
        },
        "/healthz": {
            "get": _operation(
                "healthz",
                "The process is alive",
                {"200": _json("Health", '{"status": "ok"}')},
                secured=False,
            )
        },
        "/readyz": {
            "get": _operation(
                "readyz",
                "The database answers and the schema is current",
                {
                    "200": _json("Health", '{"status": "ready"}'),
                    "503": _json(
                        "Health",
                        "Not ready, or shutting down (why goes to the log and the metrics "
                        "port's /readyz, not to this public port).",
                    ),
                },
                secured=False,
            )
        },
        "/openapi.json": {
            "get": _operation(
                "openapi",
                "This document",
                {
                    "200": {
                        "description": "The OpenAPI 3.1 document of this API.",
                        "content": {_JSON: {"schema": {"type": "object"}}},
                    }
                },
                secured=False,
            )
        },
    }


def openapi_document(
    limits: Limits | None = None,
    *,
    bearer_auth: bool = True,
    access: Mapping[str, Access] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP jobs API.

    ``limits`` are the running API's (batch size, strict mode's job names), the
    defaults when None; ``bearer_auth`` says whether ``/jobs`` requests need a
    credential. ``access`` maps operation ids to what their handlers declare
    (``@requires``): each operation then names the access it needs and the roles that
    have it (``x-pgfleet-access``, ``x-pgfleet-roles``). A new dict on every call.
    """
    limits = limits or Limits()
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "pgfleet jobs API",
            "version": __version__,
            "description": _DESCRIPTION,
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "tags": [
            {
                "name": "jobs",
                "description": "Enqueue, inspect, cancel and retry jobs; limits and pauses.",
            },
            {"name": "service", "description": "Health, readiness and this document."},
        ],
        "paths": _paths(limits),
        "components": {"schemas": _schemas(limits)},
    }
    if access is not None:
        _declare_access(doc, access)
    doc["x-pgfleet-roles"] = {role.value: sorted(a.value for a in role.grants) for role in Role}
    if bearer_auth:
        doc["components"]["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "The secret of one of the API's named credentials "
                "(PGFLEET_API_CREDENTIALS, or PGFLEET_API_TOKEN: one operator). Its role "
                "decides what it may do: see x-pgfleet-roles on each operation.",
            }
        }
        doc["security"] = [{"bearer": []}]
    return doc


def _declare_access(doc: dict[str, Any], access: Mapping[str, Access]) -> None:
    for item in doc["paths"].values():
        for operation in item.values():
            declared = access.get(operation["operationId"])
            if declared is None:
                raise LookupError(
                    f"operation {operation['operationId']!r} has no routed handler declaring "
                    "its access: the handler's name in camelCase is the operationId "
                    "(list_jobs -> listJobs), and the handler carries @requires(Access.…)"
                )
            operation["x-pgfleet-access"] = declared.value
            operation["x-pgfleet-roles"] = sorted(r.value for r in Role if r.allows(declared))
