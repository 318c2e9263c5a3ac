"""The static files storage (controlplane/staticstorage.py): after collectstatic pages link content-hashed names,
gzipped beside them, with DEBUG on as well as off; without a collected tree, or once a source changed after it was
collected, they link the plain names that whitenoise serves from the sources."""

import os
import re
import time

import pytest
from django.core.management import call_command
from django.templatetags.static import static

from controlplane import staticstorage


@pytest.fixture
def sources(tmp_path, settings, monkeypatch):
    """A static tree of one style sheet, collected into tmp_path / "root" on demand; checks not cached."""
    source = tmp_path / "src"
    (source / "css").mkdir(parents=True)
    (source / "css" / "site.css").write_text("body { color: #222; }\n" * 40)
    settings.STATICFILES_DIRS = [source]
    settings.STATICFILES_FINDERS = ["django.contrib.staticfiles.finders.FileSystemFinder"]
    settings.STATIC_ROOT = tmp_path / "root"
    monkeypatch.setattr(staticstorage, "CHECK_SECONDS", 0.0)
    return source


@pytest.mark.parametrize("debug", [True, False])
def test_collected_files_are_linked_by_hash_and_gzipped(sources, settings, debug):
    call_command("collectstatic", interactive=False, verbosity=0)
    settings.DEBUG = debug
    url = static("css/site.css")
    assert re.fullmatch(r"/static/css/site\.[0-9a-f]{12}\.css", url), url
    collected = settings.STATIC_ROOT / url.removeprefix("/static/")
    assert collected.exists() and collected.with_name(collected.name + ".gz").exists()


def test_without_a_collected_tree_pages_link_the_sources(sources):
    assert static("css/site.css") == "/static/css/site.css"


def test_a_source_edited_after_collectstatic_is_linked_by_its_plain_name(sources, settings):
    call_command("collectstatic", interactive=False, verbosity=0)
    assert static("css/site.css") != "/static/css/site.css"
    edited = time.time() + 5  # the source is newer than the manifest
    os.utime(sources / "css" / "site.css", (edited, edited))
    assert static("css/site.css") == "/static/css/site.css"
    call_command("collectstatic", interactive=False, verbosity=0)  # collected again, after the edit
    manifest = settings.STATIC_ROOT / "staticfiles.json"
    os.utime(manifest, (edited + 1, edited + 1))
    assert static("css/site.css") != "/static/css/site.css"


def test_a_name_missing_from_the_manifest_is_linked_plain(sources):
    call_command("collectstatic", interactive=False, verbosity=0)
    assert static("css/not-collected.css") == "/static/css/not-collected.css"
