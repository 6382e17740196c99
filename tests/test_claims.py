"""The one threat-model table (cels.claims): the documents carry it verbatim, every mode has a
cell for every observer, and the claims never promise an end-to-end bound (issue 22)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cels.claims import LEARNS, OBSERVERS, learns, learns_line, learns_table, privacy_accounting

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("document", ["SECURITY.md", "docs/security.md", "README.md"])
def test_documents_carry_the_generated_table(document) -> None:
    assert learns_table() in (REPO / document).read_text()


def test_every_mode_names_every_observer() -> None:
    assert {setting for setting, _ in LEARNS} == {"single", "private", "transformed"}
    for (setting, noise), row in LEARNS.items():
        assert set(row) == set(OBSERVERS)
        cell = learns(setting, noise)
        assert cell["line"] == learns_line(setting, noise) and "\n" not in cell["line"]


@pytest.mark.parametrize("setting", ["single", "private", "transformed"])
@pytest.mark.parametrize("noise", [None, 1.0])
def test_no_path_claims_an_end_to_end_bound(setting, noise) -> None:
    p = privacy_accounting(
        epsilon=2.0, delta=0.4, b=0.5, bound="cels", noise_epsilon=noise, sensitivity=None if noise is None else 3.0,
        cap=None, setting=setting, seeded=False,
    )
    assert p["end_to_end"] is False and "total_epsilon" not in p
    assert "given the released counts" in p["against_recipients"]
    assert "composition" not in p["guarantee"]
    assert p["private"] is (setting != "transformed")
    if setting != "single":
        assert p["against_partners"].startswith("no differential privacy against partner organisations")
    if noise is not None and setting == "private":
        assert "noise total z" in p["learns"]["party"] and "noise total z" in p["learns"]["solver"]
