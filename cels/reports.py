"""Two reports per release (docs/deployment.md, "Reports"): a public release note beside the
release, and a confidential operator report elsewhere.

The release note holds the parameters, the guarantee, the threat-model row (``privacy.learns``,
cels.claims) and only sizes that anyone can read off the release itself.  Everything else --
input sizes, the exact totals (``noise.total_before``), utility measured against the exact pair
totals, the solver's rounds, every node's seconds and bytes -- is computed from the private data
without noise, so it goes to the operator report: written with mode 0600, marked confidential in
its first field, and by default not beside the release but under :func:`operator_report_dir`.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from cels.fileio import atomic_write_json

CONFIDENTIAL = (
    "CONFIDENTIAL operator report: it holds statistics of the private input that are not differentially "
    "private (input sizes, exact totals, utility against the exact counts, rounds, per-node seconds and bytes). "
    "Do not publish it; publish the release and its release note"
)
PUBLIC_NOTE = "public release note: the parameters, the guarantee and sizes read off the release itself"
NOTE_SUFFIX = ".release-note.json"
OPERATOR_MODE = 0o600

_PUBLIC_PRIVACY = (
    "guarantee", "against_recipients", "against_partners", "learns", "delta_meaning", "end_to_end", "private",
    "not_private_because", "reproducible_seed", "epsilon", "delta", "b", "bound", "noise_epsilon", "sensitivity",
    "cap", "min_count", "method", "definition", "composition", "noise", "dp_claim", "per_kind",
    "release", "plain", "unit", "threshold", "max_items_per_user", "items", "collusion", "padding_epsilon", "accounting",
)  # fmt: skip
"""The privacy keys a release note keeps: parameters and claims, never a data-derived figure."""
_PUBLIC_SIZES = ("output_records", "output_users", "output_pairs", "output_items")
"""Sizes anyone can count in the release itself: a sampled log's rows, pseudonymous users and
distinct query-url pairs (cels.logs.model.output_sizes), a histogram's items."""
_PUBLIC_SETTINGS = {
    "solve": ("solve", "mode"), "round_batch": ("solve", "round_batch"), "sampling": ("sampling", "mode"),
    "parties": ("sizes", "parties"), "key_bits": ("key_bits",), "group_bits": ("group_bits",),
    "universe_cipher": ("universe_cipher",), "objective": ("params", "objective"), "release": ("release", "kind"),
}  # fmt: skip
"""Public session settings: note key -> where the report keeps it."""


def release_note_path(release: str | os.PathLike[str]) -> Path:
    """The release note's place: beside the release, ``RELEASE.release-note.json``."""
    return Path(f"{os.fspath(release)}{NOTE_SUFFIX}")


def operator_report_dir() -> Path:
    """Where operator reports go by default: ``$CELS_REPORT_DIR``, else
    ``$XDG_STATE_HOME/cels/reports`` (``~/.local/state/cels/reports``)."""
    if os.environ.get("CELS_REPORT_DIR"):
        return Path(os.environ["CELS_REPORT_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "cels" / "reports"


def default_operator_path(release: str | os.PathLike[str], session_id: str | None = None) -> Path:
    """``<operator_report_dir>/<release name>.<UTC time>.<id>.report.json``, the directory made
    0700: a session's report is named by its session id, which matches its release note and the
    parties' ledger entries; a single holder's by a random id.  Two runs in one second never
    share a name, so neither report replaces the other."""
    directory = operator_report_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f".{session_id or secrets.token_hex(4)}"
    return directory / f"{Path(release).name}.{stamp}.report.json"


def _lookup(report: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = report
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def release_note(report: dict[str, Any], release: str | os.PathLike[str]) -> dict[str, Any]:
    """The public part of ``report`` for the release at ``release``."""
    privacy = report.get("privacy") or {}
    settings = {key: _lookup(report, path) for key, path in _PUBLIC_SETTINGS.items()}
    return {
        "release_note": PUBLIC_NOTE,
        "release": Path(release).name,
        **({"session_id": report["session_id"]} if report.get("session_id") else {}),  # the parties' ledgers name it too
        "method": report.get("method"),
        "privacy": {k: privacy[k] for k in _PUBLIC_PRIVACY if k in privacy},
        "settings": {k: v for k, v in settings.items() if v is not None},
        "sizes": {k: v for k, v in (report.get("sizes") or {}).items() if k in _PUBLIC_SIZES},
    }


def operator_report(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` whole, its first field saying it is confidential."""
    return {"confidential": CONFIDENTIAL, **{k: v for k, v in report.items() if k != "confidential"}}


def write_reports(report: dict[str, Any], release: str | os.PathLike[str], operator_path: str | os.PathLike[str]) -> Path:
    """Write the release note beside ``release`` and the operator report (mode 0600) at
    ``operator_path``, each atomically; returns the release note's path."""
    atomic_write_json(operator_path, operator_report(report), file_mode=OPERATOR_MODE)
    note = release_note_path(release)
    atomic_write_json(note, release_note(report, release))
    return note
