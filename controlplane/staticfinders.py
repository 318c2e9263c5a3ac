"""Serves plotly.js from the installed plotly package, so no page needs a CDN."""

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_DIR = Path(plotly.__file__).parent / "package_data"
PLOTLY_FILES = {"vendor/plotly.min.js": "plotly.min.js"}


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=str(PLOTLY_DIR))
        self.storage.prefix = "vendor"

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        name = PLOTLY_FILES.get(path)
        if name is None:
            return [] if find_all else None
        found = str(PLOTLY_DIR / name)
        return [found] if find_all else found

    def list(self, ignore_patterns):
        for name in PLOTLY_FILES.values():
            yield name, self.storage
