"""The public data files Lockstep reads at run time, all inside the repository (data/README.md).

Every file a running process needs is named here once. ``check()`` runs when the control plane's app is ready
(every process: web, workers, beat, the simulator, ``manage.py``), so a missing or unreadable file stops the
process at start-up with the file's path instead of a traceback (or a 500) at the first request that reads it.
"""

from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def data_dir() -> Path:
    return Path(settings.DATA_DIR)


def failures_dir() -> Path:
    """The published failure figures the simulator's fault model reads."""
    return data_dir() / "failures"


def anomaly_dir() -> Path:
    """The labelled series the predictor is scored on (tests and benchmarks only)."""
    return data_dir() / "anomaly"


def xid_catalogue() -> Path:
    """NVIDIA's Xid catalogue that fault triage reads: ``XID_CATALOG`` where set, else the vendored copy."""
    return (
        Path(settings.XID_CATALOG) if settings.XID_CATALOG else data_dir() / "xid" / "nvidia_xid_catalog.csv"
    )


def required_files() -> list[Path]:
    """Every data file a running process reads."""
    return [
        failures_dir() / "llama3_405b_unexpected_interruptions.csv",
        failures_dir() / "meta_rsc_reliability_figures.csv",
        xid_catalogue(),
    ]


def problems(paths: list[Path] | None = None) -> list[str]:
    """What is wrong with the data files, one line each (empty: all present, readable and not empty)."""
    found = []
    for path in required_files() if paths is None else paths:
        try:
            with path.open("rb") as handle:
                if not handle.read(1):
                    found.append(f"{path}: empty")
        except OSError as error:
            found.append(f"{path}: {error.strerror or error}")
    return found


def check() -> None:
    """Refuse to start without the data files (ImproperlyConfigured naming each one at fault)."""
    wrong = problems()
    if wrong:
        raise ImproperlyConfigured(
            "Lockstep's data files are missing or unreadable (data/README.md says what each is): "
            + "; ".join(wrong)
        )
