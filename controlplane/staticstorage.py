"""Static files compressed and cacheable for a year, under `make run` (DEBUG on) as in production.

`manage.py collectstatic` (the Dockerfile's image and `make run` run it) copies every static file into
STATIC_ROOT under a name carrying a hash of its content (``css/app.3f1c2b7e9a01.css``), beside a gzip copy of
each, and writes the manifest of those names. Pages then link the hashed names, and whitenoise answers them
compressed (``Content-Encoding: gzip`` when the browser accepts it) with ``Cache-Control: max-age=315360000,
public, immutable``: a browser fetches each file once per content.

Django links the hashed names only with DEBUG off; this storage links them whenever a manifest is current, so
`make run` gets the same. Where there is none (a checkout's test run, a ``manage.py`` command without
collectstatic), or a file under ``static/`` changed after it was written (someone editing the sources), pages
link the plain names, which whitenoise serves from the sources (WHITENOISE_USE_FINDERS) as they are now:
uncompressed and briefly cached, never stale.
"""

import os
import time
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles.storage import StaticFilesStorage as PlainStorage
from whitenoise.storage import CompressedManifestStaticFilesStorage

# How long a check that the manifest is current holds: a page links tens of files, each asks.
CHECK_SECONDS = 1.0


def newest_source_mtime() -> float:
    """The modification time of the newest file under STATICFILES_DIRS (the project's own static files)."""
    newest = 0.0
    for directory in settings.STATICFILES_DIRS:
        for root, _, files in os.walk(directory):
            for name in files:
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
    return newest


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    """whitenoise's compressed manifest storage, linking hashed names whenever the manifest is current (module
    docstring), with DEBUG on or off, and plain names otherwise."""

    def __init__(self, *args, **kwargs):
        self._checked_at = float("-inf")
        self._manifest_mtime: float | None = None
        self._current = False
        super().__init__(*args, **kwargs)

    def _manifest_current(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at < CHECK_SECONDS:
            return self._current
        self._checked_at = now
        try:
            mtime = Path(self.path(self.manifest_name)).stat().st_mtime
        except OSError:
            self._current = False
            return False
        if mtime != self._manifest_mtime:  # collected again since this process read it
            self.hashed_files, self.manifest_hash = self.load_manifest()
            self._manifest_mtime = mtime
        self._current = bool(self.hashed_files) and newest_source_mtime() <= mtime
        return self._current

    def url(self, name, force=False):
        if self._manifest_current():
            try:
                return super().url(name, force=True)
            except ValueError:  # not in the manifest: serve it from the sources
                pass
        return PlainStorage.url(self, name)
