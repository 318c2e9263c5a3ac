"""application/yaml in and out for the blueprint document endpoint."""

from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer


class YAMLTextParser(BaseParser):
    """Hands the raw document to the view, which reads it with fleet.blueprint_yaml's strict loader."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream.read() if stream is not None else b""


class YAMLTextRenderer(BaseRenderer):
    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, str):
            return data.encode("utf-8")
        import json

        import yaml

        # Error bodies carry DRF's ErrorDetail (a str subclass YAML cannot represent): make them plain first.
        plain = json.loads(json.dumps(data, default=str))
        return yaml.safe_dump(plain, sort_keys=False).encode("utf-8")
