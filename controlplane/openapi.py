"""The OpenAPI schema documents the errors every operation can answer, not only its success.

DESIGN's contract: errors are JSON, ``{"detail": ...}`` or field errors, with 4xx codes. drf-spectacular
documents the success response alone, so a client (or schemathesis' conformance checks) reading the schema
would not know that a 404 or a 400 can come back. ``AutoSchema`` adds them from what the operation is: any
operation that needs credentials can answer 401 and 403; one with a path parameter or a page number 404;
one with input (a body or query parameters) 400; one with a body 413 and 415; a write 409 (a conflict with
existing data or with the object's state); a rate-limited one 429; and any of them 503 while the database
cannot be reached (controlplane.middleware). Codes an operation declares itself (``@extend_schema``) are kept.

Operations are tagged by the area (the Django app) whose folder holds their view, so Swagger UI groups them as
the code is grouped (controlplane/openapi_tags.py names and describes each area).
"""

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from rest_framework import serializers

from controlplane.openapi_tags import AREAS


class ErrorSerializer(serializers.Serializer):
    """A refusal: what went wrong, in words."""

    detail = serializers.CharField()


# Field errors name the input at fault ({"field": ["message"]}, nested for nested input) or carry a detail.
FIELD_ERRORS = {
    "type": "object",
    "description": 'Field errors, {"field": ["message", ...]} (nested for nested input), or {"detail": "message"}.',
    "additionalProperties": {},
}

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
STRUCTURED_MEDIA_TYPES = frozenset({"application/json", "application/yaml"})


def area_of(view) -> str:
    """The tag of the area whose folder holds the view (a view of no Lockstep app keeps the control plane's)."""
    package = type(view).__module__.split(".", 1)[0]
    return AREAS.get(package, AREAS["controlplane"])[0]


class AutoSchema(SpectacularAutoSchema):
    def get_tags(self) -> list[str]:
        return [area_of(self.view)]

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation.setdefault("responses", {})
        for code, body in self._error_responses(operation).items():
            responses.setdefault(code, body)
        return operation

    def _error_responses(self, operation: dict) -> dict:
        parameters = operation.get("parameters", [])
        has_body = "requestBody" in operation
        has_query = any(parameter["in"] == "query" for parameter in parameters)
        has_path = any(parameter["in"] == "path" for parameter in parameters)
        needs_credentials = bool(operation.get("security")) and {} not in operation["security"]
        detail = self._error_body(ErrorSerializer)
        fields = self._error_body(FIELD_ERRORS)
        errors = {}
        if has_body or has_query:
            errors["400"] = {**fields, "description": "The input was refused (field errors or a detail)."}
        if needs_credentials:
            errors["401"] = {**detail, "description": "No credentials, or credentials that are not valid."}
            errors["403"] = {**detail, "description": "The credentials may not do this."}
        if has_path or any(parameter["name"] == "page" for parameter in parameters):
            errors["404"] = {**detail, "description": "No such object for this user, or no such page."}
        if self.method in WRITE_METHODS:
            errors["409"] = {
                **fields,
                "description": "The change conflicts with existing data or the object's state.",
            }
        if self.view.get_throttles():
            errors["429"] = {
                **detail,
                "description": "Too many requests; Retry-After says when to try again.",
            }
        errors["503"] = {
            **detail,
            "description": "The database cannot be reached right now; Retry-After says when to try again.",
        }
        if has_body:
            errors["413"] = {**fields, "description": "The body is larger than this operation accepts."}
            errors["415"] = {**fields, "description": "The body is not in a media type this operation reads."}
        return errors

    def _error_body(self, schema) -> dict:
        # An error is rendered like the answer the client asked for (JSON, or YAML where the operation speaks
        # it); a view whose format cannot carry one (plain-text exposition) answers its errors in JSON.
        media_types = [media for media in self.map_renderers("media_type") if media in STRUCTURED_MEDIA_TYPES]
        return self._get_response_for_code(schema, "400", media_types=media_types or ["application/json"])
