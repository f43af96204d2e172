"""The OpenAPI document is complete, and the app honours it under generated input.

Schemathesis drives the app in-process (ASGI) against a real Redis: no generated request may
get a 500 or a status its operation does not document, and every response must match its
documented schema and content type.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from service_fixtures import KEYS, RedisServer, needs_redis

pytestmark = [needs_redis, pytest.mark.service]

#: Generated cases per operation: enough to hit every branch of the parsers, under a minute.
MAX_EXAMPLES = 30


def no_internal_error(ctx: Any, response: Any, case: Any) -> None:
    """Like ``not_a_server_error`` but for 500 only: 503 is documented (no worker, no Redis)."""
    if response.status_code == 500:
        raise AssertionError(f"500 Internal Server Error: {response.text[:500]}")


CHECKS = [no_internal_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]


@pytest.fixture(scope="module")
def app(redis_server: RedisServer) -> Any:
    from baechi.jobs.settings import Settings
    from baechi.service.app import create_app

    # Database 1: generated placements are queued there, away from the live workers' queue.
    url = redis_server.url.rsplit("/", 1)[0] + "/1"
    return create_app(Settings(redis_url=url, api_keys=tuple(KEYS.values()),
                               max_body_bytes=2**20, max_ops=2000))


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["valid-input", "invalid-input"])
def test_no_500_and_no_undocumented_status(app: Any, mode: GenerationMode) -> None:
    # Schemathesis' pytest plugin (lazy schemas) does not run under pytest 9, so each
    # operation's strategy is driven by Hypothesis directly; the checks are the same.
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy(generation_mode=mode)

        @given(case=strategy)
        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            case.call_and_validate(headers={"X-API-Key": KEYS["key-a"]}, checks=CHECKS)

        try:
            run()
        except Unsatisfiable:
            assert mode == GenerationMode.NEGATIVE, operation.label
            continue  # No parameters and no body: no invalid input to make.
        except Exception as exc:
            exc.add_note(f"operation: {operation.label} ({mode.value} input)")
            raise


def test_every_operation_documents_its_errors(app: Any) -> None:
    document = app.openapi()
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            if path not in ("/healthz", "/metrics"):  # these two answer without Redis
                assert "503" in statuses, (method, path)
            if path not in ("/healthz", "/readyz", "/metrics"):
                assert "401" in statuses, (method, path)
            if method == "post":
                assert {"400", "413", "422"} <= statuses, (method, path)
            if "{" in path:
                assert "404" in statuses, (method, path)
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == error_ref, (method, path, status)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    security = document["components"]["securitySchemes"]
    assert security["APIKeyHeader"]["name"] == "X-API-Key"


def test_the_request_schema_is_the_engines_models(app: Any) -> None:
    """Issue 12, item 7: one request schema — the engine's Cluster and Options, the
    registry's algorithm names and the one default — no re-declared copy."""
    from baechi.algorithms import ALGORITHM_NAMES
    from baechi.cluster import Cluster
    from baechi.defaults import DEFAULT_ALGORITHM
    from baechi.options import Options

    document = app.openapi()
    schemas = document["components"]["schemas"]
    request = schemas["PlacementRequest"]["properties"]
    assert request["cluster"] == {"$ref": "#/components/schemas/Cluster"}
    assert request["options"] == {"$ref": "#/components/schemas/Options"}
    assert request["algorithm"]["enum"] == list(ALGORITHM_NAMES)
    assert request["algorithm"]["default"] == DEFAULT_ALGORITHM
    assert set(schemas["Cluster"]["properties"]) == set(Cluster.model_fields)
    assert set(schemas["Options"]["properties"]) == set(Options.model_fields)
    # both forms of devices a request may send, and sizes with units
    devices = schemas["Cluster"]["properties"]["devices"]["anyOf"]
    assert {"$ref": "#/components/schemas/DeviceCount"} in devices
    assert {"type": "string"} in schemas["Device"]["properties"]["memory_bytes"]["anyOf"]
    assert not {"ClusterSpec", "DeviceSpec", "NetworkSpec"} & set(schemas)
