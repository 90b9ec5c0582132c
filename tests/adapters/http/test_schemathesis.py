"""Schemathesis fuzzing of every operation in the gateway's own ``/openapi.json``, against the app
``gpupool serve`` builds (`gpupool.cli.serve.build`: SQLite store, auth file, metrics, proxy) on a
real loopback server. Every operation gets schema-valid cases and, where it takes a body,
schema-violating ones (which must be 4xx); every response is validated against the schema (status
code declared, content type, headers, body schema), requests without the token must be 401, and a
5xx is allowed only where the operation declares it (the designed 503s: unresolvable, no backend).
Bounded: `EXAMPLES` cases per operation and mode."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    use_after_free,
)

from gpupool.cli.serve import build
from tests.adapters.http.servers import running

ADMIN, TENANT = "schema-admin-token", "schema-tenant-token"
EXAMPLES = 8


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d: Path = tmp_path_factory.mktemp("schemathesis")
    auth = d / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {TENANT}, tenant: t, role: tenant}}\n"
    )
    bundle = build(data_dir=d / "data", auth_file=auth, simulate=False)
    with running(bundle.app) as url:
        yield url
    bundle.controller.store.close()


def documented_5xx_only(ctx: Any, response: Any, case: Case) -> bool | None:
    """A 5xx must be one the operation declares (only 503s are declared)."""
    status = response.status_code
    if status >= 500:
        declared = set(case.operation.definition.raw.get("responses", {}))
        assert str(status) in declared, f"undocumented {status}: {response.text[:300]}"
    return None


def negative_rejected(ctx: Any, response: Any, case: Case) -> bool | None:
    """Schemathesis' `negative_data_rejection`, with 413 counted as a rejection too: a schema-violating
    body may be refused for its size (the route's body limit) before it is validated."""
    if response.status_code == 413:
        assert response.json().get("code") == "body_too_large", response.text[:300]
        return None
    return negative_data_rejection(ctx, response, case)  # type: ignore[no-any-return]


EXCLUDED = [
    negative_data_rejection,  # replaced by negative_rejected
    not_a_server_error,  # replaced by documented_5xx_only
    positive_data_acceptance,  # schema-valid bodies may still be refused (e.g. no such GPU)
    use_after_free,
]


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~30-50 s on 2 busy cores; the margin is for a loaded CI machine
def test_every_operation_conforms_to_its_schema(gateway: str) -> None:
    for tok, prio in ((TENANT, "P2"), (ADMIN, "P1")):  # so that lists and gets return real leases
        r = httpx.post(
            f"{gateway}/v1/leases",
            headers={"Authorization": f"Bearer {tok}"},
            json={"priority": prio, "vram_mib": 1024},
            timeout=10,
        )
        assert r.status_code == 201, r.text
    schema = schemathesis.openapi.from_url(f"{gateway}/openapi.json").exclude(path="/v1/events")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    seen: dict[str, set[int]] = {}

    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)  # schema-valid, then schema-violating
    for op, mode in itertools.product(operations, modes):
        if mode is GenerationMode.NEGATIVE and not op.definition.raw.get("requestBody"):
            continue  # negative cases of body-less operations only vary paths and queries

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Case) -> None:
            r = case.call_and_validate(
                base_url=gateway,
                headers={"Authorization": f"Bearer {ADMIN}"},
                timeout=15,
                excluded_checks=EXCLUDED,
                additional_checks=[documented_5xx_only, negative_rejected],
            )
            seen.setdefault(case.operation.label, set()).add(r.status_code)

        run()
    assert set(seen) == {op.label for op in operations}
