"""The public data every process reads lives in the repository (data/), and a missing or unreadable file stops a
process at start-up with the file's name, instead of a 500 at the first fault report that reads it."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane import data
from jobs.triage import classify_xid
from simulator.profiles import meta_rsc_figures, root_cause_mix
from tests.support.processes import BASE_DIR, child_env, manage_py


def test_every_file_is_inside_the_repository_and_readable():
    assert data.problems() == []
    for path in data.required_files():
        assert path.resolve().is_relative_to(BASE_DIR.resolve()), path
        assert (path.parent / "README.md").exists(), (
            f"{path.parent} has no README saying where its files come from"
        )
    components, counts = root_cause_mix()
    assert sum(counts) == 419 and "Faulty GPU" in components
    assert meta_rsc_figures()["mttf_job_1024gpu/RSC-1"][0] == 7.9
    assert classify_xid(79).mnemonic  # fallen off the bus: a row of the vendored catalogue


def test_a_missing_file_is_named_at_start_up(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    with pytest.raises(ImproperlyConfigured) as refused:
        data.check()
    assert str(tmp_path / "failures" / "llama3_405b_unexpected_interruptions.csv") in str(refused.value)
    assert str(tmp_path / "xid" / "nvidia_xid_catalog.csv") in str(refused.value)


def test_an_unreadable_or_empty_catalogue_is_named(settings, tmp_path):
    empty = tmp_path / "xid.csv"
    empty.write_text("")
    settings.XID_CATALOG = str(empty)
    assert data.problems() == [f"{empty}: empty"]
    settings.XID_CATALOG = str(tmp_path / "nowhere.csv")
    assert data.problems() == [f"{tmp_path / 'nowhere.csv'}: No such file or directory"]


def test_a_process_without_its_data_does_not_start(tmp_path):
    missing = tmp_path / "gone.csv"
    answer = manage_py("check", env=child_env(XID_CATALOG=str(missing)))
    assert answer.returncode != 0
    last = answer.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in last and str(missing) in last
