"""The OpenAPI document of the jobs API: a valid OpenAPI 3.1 document, covering every
route ``pgfleet api`` serves (and none it does not), its request schemas in step with
the request parser's own tables."""

from __future__ import annotations

import json
import re
from typing import Any, cast

import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from pgfleet.cli import build_parser
from pgfleet.db.deadlines import AppPool
from pgfleet.jobs import JobKeyMode, JobStatus
from pgfleet.service import api_cmd
from pgfleet.service.access import AccessConfig, Gate
from pgfleet.service.api import ApiConfig, JobsApi
from pgfleet.service.api_schema import JOB_FIELDS, LIST_PARAMS, OPTION_FIELDS, Limits
from pgfleet.service.console import flags as console_flags
from pgfleet.service.credentials import load, new_token
from pgfleet.service.openapi import openapi_document

#: Served by `pgfleet api` but not part of the JSON API: the operator console's HTML
#: pages and forms, for people (documented on the console's own page).
CONSOLE_PREFIX = "/ui"


def _served_routes() -> set[tuple[str, str]]:
    """(method, path template) of every route of the application `pgfleet api` builds,
    the console included, as api_cmd.serve assembles it."""
    args = build_parser().parse_args(["api", "--dsn", "postgresql://app@db/app"])
    config = api_cmd.build_config(args)
    # No database is reached: the application is only inspected.
    jobs_api = JobsApi(api_cmd.make_queue(cast(AppPool, None), args, config), config)
    app = jobs_api.application()
    console = console_flags.build(args, Gate(config.access), config.redactor, None)
    assert console is not None, "the console is on by default"
    console.routes(app)
    routes = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert isinstance(path, str)
        # aiohttp answers HEAD on every GET route: implied by the GET operation.
        if route.method != "HEAD":
            routes.add((route.method.lower(), path))
    return routes


def _documented_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    methods = {"get", "post", "put", "patch", "delete", "head", "options"}
    return {
        (method, path)
        for path, item in doc["paths"].items()
        for method in item
        if method in methods
    }


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1.")
    validate(doc)  # raises naming the first problem
    json.dumps(doc)  # plain JSON, as served


@pytest.mark.parametrize(
    "limits",
    [Limits(max_batch=7, known_names=frozenset({"send_email", "resize"})), Limits()],
)
@pytest.mark.parametrize("bearer_auth", [True, False])
def test_every_configuration_gives_a_valid_document(limits: Limits, bearer_auth: bool) -> None:
    doc = openapi_document(limits, bearer_auth=bearer_auth)
    validate(doc)
    schemas = doc["components"]["schemas"]
    assert schemas["EnqueueBatch"]["properties"]["jobs"]["maxItems"] == limits.max_batch
    if limits.known_names is not None:
        assert schemas["JobName"]["enum"] == sorted(limits.known_names)
    assert ("security" in doc) is bearer_auth


def test_the_validator_refuses_a_broken_document() -> None:
    doc = openapi_document()
    doc["paths"]["/jobs"]["post"]["responses"]["202"].pop("description")
    with pytest.raises(OpenAPIValidationError):
        validate(doc)


def test_every_served_route_is_documented_and_nothing_else() -> None:
    served = {r for r in _served_routes() if not r[1].startswith(CONSOLE_PREFIX)}
    documented = _documented_routes(openapi_document())
    assert served - documented == set(), "served but not in the OpenAPI document"
    assert documented - served == set(), "documented but not served"
    assert ("get", "/openapi.json") in served


def test_the_console_is_the_only_undocumented_part() -> None:
    undocumented = _served_routes() - _documented_routes(openapi_document())
    assert undocumented, "the console is served by default"
    assert all(path.startswith(CONSOLE_PREFIX) for _method, path in undocumented)


def test_request_schemas_follow_the_parsers_tables() -> None:
    schemas = openapi_document()["components"]["schemas"]
    assert set(schemas["EnqueueOptions"]["properties"]) == OPTION_FIELDS
    assert set(schemas["EnqueueJob"]["properties"]) == JOB_FIELDS
    assert schemas["JobStatus"]["enum"] == [s.value for s in JobStatus]
    modes = schemas["EnqueueOptions"]["properties"]["job_key_mode"]["enum"]
    assert modes == [*(m.value for m in JobKeyMode), None]
    listing = openapi_document()["paths"]["/jobs"]["get"]["parameters"]
    assert {p["name"] for p in listing} == LIST_PARAMS


def test_the_name_pattern_is_the_librarys() -> None:
    pattern = re.compile(openapi_document()["components"]["schemas"]["JobName"]["pattern"])
    assert pattern.search("send_email:v2.1-a")
    for bad in ("", "bad name", "x" * 129, "é"):
        assert not pattern.search(bad), bad


def test_the_served_document_reflects_the_apis_configuration() -> None:
    access = AccessConfig(load(entries=f"ci:producer:{new_token()}"))
    config = ApiConfig(max_batch=3, access=access, known_names=frozenset({"a"}))
    api = JobsApi(cast(Any, None), config)
    doc = api._openapi
    assert doc == openapi_document(config.limits, bearer_auth=True, access=api.declared_access())
    assert doc["components"]["schemas"]["EnqueueBatch"]["properties"]["jobs"]["maxItems"] == 3
    open_api = JobsApi(cast(Any, None), ApiConfig())
    assert "security" not in open_api._openapi


def test_each_operation_names_the_access_and_roles_its_handler_declares() -> None:
    api = JobsApi(cast(Any, None), ApiConfig())
    ops = {op["operationId"]: op for item in api._openapi["paths"].values() for op in item.values()}
    assert {k: v["x-pgfleet-roles"] for k, v in ops.items() if v["tags"] == ["jobs"]} == {
        "enqueue": ["operator", "producer"],
        "enqueueBatch": ["operator", "producer"],
        "getBatch": ["operator", "producer", "viewer"],
        "jobDependencies": ["operator", "producer", "viewer"],
        "getJob": ["operator", "producer", "viewer"],
        "listJobs": ["operator", "viewer"],
        "cancelJob": ["operator"],
        "retryJob": ["operator"],
        "listLimits": ["operator", "viewer"],
        "setLimits": ["operator"],
        "clearLimits": ["operator"],
        "pause": ["operator"],
        "resume": ["operator"],
    }
    assert ops["healthz"]["x-pgfleet-access"] == "public"
    assert api._openapi["x-pgfleet-roles"]["producer"] == ["enqueue", "read_job"]
    for op in ops.values():
        if op["tags"] == ["jobs"]:
            assert {"401", "403", "421", "429"} <= set(op["responses"]), op["operationId"]
