"""Property-based requests over the whole OpenAPI (schemathesis): no 5xx, answers match the schema.

The schema is the app's own (built in-process at collection, checked equal to the live
/openapi.json); the requests go to the shared live service: EXAMPLES per operation.
"""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from litetopk.service import ServiceSettings, create_app

#: Examples per operation: ~14 operations x 150 = ~2,000 requests per run (about a minute here).
EXAMPLES = 150
SPEC = create_app(ServiceSettings(uds="", warmup=False)).openapi()
schema = schemathesis.openapi.from_dict(SPEC)


def test_live_schema_is_the_tested_schema(service):
    assert httpx.get(f"{service.url}/openapi.json").json() == SPEC


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_conforming_answers(case, service):
    # Every default check (5xx, status codes, content types, response schemas, Allow headers...)
    # except "schema-valid request accepted": a well-formed request naming a region that does not
    # exist is rightly refused.
    case.call_and_validate(base_url=service.url, excluded_checks=[positive_data_acceptance])
