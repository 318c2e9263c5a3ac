"""The API's JSON parser: DRF's, with a bound on nesting.

A body nested deeper than the stdlib parser's recursion goes raises RecursionError (a 500); one nested a few
hundred levels parses, then makes every later walk of it (serializers, JSONField, the audit diff) deep and slow.
No Lockstep payload nests deeper than a handful of levels (fields that take free-form JSON, such as
add-on values, check their own, lower, bound and name the field), so anything past ``MAX_DEPTH`` is a 400.
"""

import json

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_DEPTH = 64


def too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Whether a parsed JSON value nests containers deeper than ``limit`` (iterative: never recurses)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = stream.read().decode(encoding) if stream is not None else ""
            data = json.loads(text, parse_constant=_refuse_constant)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels") from None
        except (ValueError, UnicodeDecodeError) as error:
            raise ParseError(f"JSON parse error - {error}"[:300]) from None
        if too_deep(data):
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels")
        return data


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")
