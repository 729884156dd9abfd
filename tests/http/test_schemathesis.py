"""Property-based run of schemathesis against ``/openapi.json``: every generated request,
valid or not, gets an answer the document describes (status, content type, schema,
Allow header), invalid ones are refused with 4xx, and nothing ever answers 5xx.

One check is left out: ``positive_data_acceptance`` ("a schema-valid request must
succeed"). Some rules cannot be said in JSON Schema — a priority above the queue's own
``max_priority``, a receipt whose lease is gone, a filter policy's grammar, a body that
must be a string when ``encoding`` is ``text`` — and the server rightly answers those
with 4xx; every such answer is still checked against the document.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error, positive_data_acceptance  # noqa: E402

from fairq.http.api import Limits  # noqa: E402
from fairq.http.app import create_app  # noqa: E402
from fairq.http.auth import KeyRing  # noqa: E402

# the default backend of `fairq serve`: SQLite, in a file of its own
DB = Path(tempfile.mkdtemp(prefix="fairq-schemathesis-")) / "fairq.db"
app = create_app(
    url=f"sqlite:///{DB}",
    limits=Limits(max_batch=10, max_wait=0.2),
    sample_interval=0.5,
    allowed_hosts=["testserver"],  # schemathesis's ASGI host name
)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_api_conforms_to_its_openapi_document(case: schemathesis.Case) -> None:
    case.call_and_validate(
        additional_checks=[not_a_server_error], excluded_checks=[positive_data_acceptance]
    )


# the same API with API keys: the document gains its security schemes and 401/403 answers
KEY = "schemathesis-admin-key-0123456789"
secured = create_app(
    url="memory://",
    keys=KeyRing.parse(f"{KEY}:admin"),
    limits=Limits(max_batch=10, max_wait=0.2),
    sample_interval=0.5,
)
secured_schema = schemathesis.openapi.from_asgi("/openapi.json", secured)


@secured_schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_api_with_keys_conforms_to_its_openapi_document(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {KEY}"},
        additional_checks=[not_a_server_error],
        excluded_checks=[positive_data_acceptance],
    )
