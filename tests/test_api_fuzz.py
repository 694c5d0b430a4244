"""Property-based fuzzing of the whole HTTP API from its own OpenAPI schema (schemathesis).

Every operation of /schema gets valid and invalid requests, as an all-tenants key, as a
tenant key and without credentials, against the live test server. Each response must:
not be a 5xx; conform to the schema (status code, content type, body); be a JSON error of
the contract's shape when it is a 4xx; and a refused write must have written nothing.

Deterministic: a fixed seed and a bounded number of examples per operation and mode.
A long run, e.g. ``PGQUEUE_FUZZ_EXAMPLES=150 pytest tests/test_api_fuzz.py -s``, prints how
many requests it made; ``PGQUEUE_FUZZ_SEED`` picks another seed.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest
import requests
import schemathesis
from django.core.cache import cache
from django.db import connection
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from pgqueue import keys
from tests.api_fixtures import make_job

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("PGQUEUE_FUZZ_EXAMPLES", "6"))
SEED = int(os.environ.get("PGQUEUE_FUZZ_SEED", "20261201"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
WRITES = {"POST", "PUT", "PATCH", "DELETE"}

#: What a refused write must leave as it was: every job's status and every weight.
STATE_SQL = """
SELECT (SELECT count(*) FROM pgqueue_job),
       (SELECT md5(coalesce(string_agg(id || status, ',' ORDER BY id), '')) FROM pgqueue_job),
       (SELECT count(*) FROM pgqueue_tenant),
       (SELECT md5(coalesce(string_agg(name || weight, ',' ORDER BY name), ''))
          FROM pgqueue_tenant),
       (SELECT count(*) FROM pgqueue_queue_weight)
"""


def state() -> tuple[Any, ...]:
    with connection.cursor() as cur:
        cur.execute(STATE_SQL)
        return cur.fetchone()


def assert_json_error(response: Any) -> None:
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), (
        response.status_code,
        content_type,
        response.content[:300],
    )
    body = json.loads(response.content)
    assert isinstance(body, dict) and set(body) <= {"error", "detail", "fields"}, body
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("detail"), str) and body["detail"], body
    assert isinstance(body.get("fields", {}), dict), body


def fuzz(
    operation: Any,
    mode: GenerationMode,
    base_url: str,
    session: requests.Session,
    who: str,
    headers: dict[str, str],
    outcomes: Counter[tuple[str, int]],
) -> None:
    """EXAMPLES requests of one operation in one mode, each checked."""

    @seed(SEED)
    @settings(
        max_examples=EXAMPLES,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def exercise(case: Any) -> None:
        before = state() if case.method.upper() in WRITES else None
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=30)
        outcomes[(who, response.status_code)] += 1
        where = (who, case.method, case.formatted_path, response.status_code)
        assert response.status_code < 500, (*where, response.content[:500])
        case.validate_response(response, checks=CHECKS, headers=headers)
        if 400 <= response.status_code < 500:
            assert_json_error(response)
            if before is not None:
                assert state() == before, where

    try:
        exercise()
    except Unsatisfiable:
        # Only when nothing in the operation can be made invalid (no parameters, no body).
        assert mode is GenerationMode.NEGATIVE, operation.label


def test_the_whole_api_survives_fuzzing(live_server: Any) -> None:
    make_job("queued", tenant="acme")
    make_job("dead", tenant="acme")
    make_job("queued", tenant="globex")
    credentials = {
        "all-tenants key": {"Authorization": f"Bearer {keys.create_api_key()[1]}"},
        "tenant key": {"Authorization": f"Bearer {keys.create_api_key(tenant='acme')[1]}"},
        "no credentials": {},
    }
    # The address, not "localhost": no resolver round trip on each of the requests.
    base_url = live_server.url.replace("//localhost:", "//127.0.0.1:")
    raw = requests.get(f"{base_url}/schema?format=json", timeout=30)
    assert raw.status_code == 200, raw.content[:300]
    schema = schemathesis.openapi.from_dict(raw.json())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    outcomes: Counter[tuple[str, int]] = Counter()
    with requests.Session() as session:
        for who, headers in credentials.items():
            cache.clear()  # each kind starts with a clean throttle history
            for operation in operations:
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    fuzz(operation, mode, base_url, session, who, headers, outcomes)

    total = sum(outcomes.values())
    print(f"\nfuzz: {total} requests, seed {SEED}, {EXAMPLES} examples per operation and mode")
    for (who, code), count in sorted(outcomes.items()):
        print(f"  {who:16} {code}: {count}")
    assert not [o for o in outcomes if o[1] >= 500]
    assert {who for who, _ in outcomes} == set(credentials)
