"""The content security policy header (django-csp), with what only a request or the plotly.js bundle can tell.

The policy itself is ``CONTENT_SECURITY_POLICY`` in settings. To it this middleware adds, on every response:

- ``ws(s)://<this host>`` to connect-src, for the live pages' websocket (CSP level 3 lets ``'self'`` match the
  same host's websocket, level 2 does not);
- to style-src, the hashes of the ``<style>`` elements plotly.js writes as it runs: empty ones that it then fills
  through the CSSOM (``insertRule``, which CSP does not govern), and the style sheet of its map traces, which it
  inserts whole when it loads. They are read from the bundle Lockstep serves, so an upgrade of plotly keeps the
  policy. No ``'unsafe-inline'`` anywhere. See docs/security.md.
"""

import base64
import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path

from csp.middleware import CSPMiddleware, PolicyParts
from django.core.exceptions import DisallowedHost

# ``e=document.createElement("style"); … e.textContent='<css>'``: a style sheet plotly.js inserts verbatim.
_INSERTED_SHEET = re.compile(
    r"""createElement\("style"\)[^;]{0,300};[^']{0,300}?\.textContent='((?:[^'\\]|\\.)*)'"""
)


def style_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _js_string(literal: str) -> str:
    """The value of a single-quoted JavaScript string literal's body (the escapes JSON shares)."""
    if "\\" not in literal:
        return literal
    return json.loads('"' + literal.replace("\\'", "'").replace('"', '\\"') + '"')


# The plotly.js bundle the pages load (static/vendor/README.md).
PLOTLY_BUNDLE = "vendor/plotly.min.js"


@lru_cache(maxsize=1)
def plotly_style_hashes() -> tuple[str, ...]:
    """style-src hashes for what plotly.js (the bundle served as vendor/plotly.min.js) writes into <style>."""
    from django.contrib.staticfiles import finders

    bundle = Path(finders.find(PLOTLY_BUNDLE)).read_text(encoding="utf-8")
    sheets = [_js_string(match.group(1)) for match in _INSERTED_SHEET.finditer(bundle)]
    return tuple(dict.fromkeys([style_hash(""), *map(style_hash, sheets)]))


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, adding the websocket origin and plotly.js's style hashes (module docstring)."""

    def get_policy_parts(self, request, response, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        update = dict(parts.update or {})
        update["style-src"] = [*update.get("style-src", []), *plotly_style_hashes()]
        try:
            host = request.get_host()
        except DisallowedHost:  # answered 400 already; no websocket to allow
            host = None
        if host:
            scheme = "wss" if request.is_secure() else "ws"
            update["connect-src"] = [*update.get("connect-src", []), f"{scheme}://{host}"]
        parts.update = update
        return parts
