"""The Schemathesis checks every generated request's answer must pass (tests/test_fuzz.py, test_schema_stateful.py):
no server error, and the documented status code, media type, body and headers."""

from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
