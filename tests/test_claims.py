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
    assert {setting for setting, _ in LEARNS} == {"single", "private", "transformed", "dp"}
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
    assert "composition" not in p["guarantee"] and p["guarantee"] != p["against_recipients"]  # a bottom line, not a repeat (finding 16)
    # finding 7: one plain sentence per observer, the exact terms elsewhere
    assert p["plain"][0].startswith("for any one user, with probability at least 0.6 the release is at most e^2 = 7.39 times likelier")
    assert p["plain"][0].endswith("not differentially private end to end")
    assert len(p["plain"]) == {"single": 1, "private": 2, "transformed": 3}[setting]
    assert not any(term in " ".join(p["plain"]) for term in ("PDP", "Theorem", "verdict", "Lap(", " c,"))
    assert p["private"] is (setting != "transformed")
    if setting != "single":
        assert p["against_partners"].startswith("no differential privacy against partner organisations")
    if noise is not None and setting == "private":
        assert "noise total z" in p["learns"]["party"] and "noise total z" in p["learns"]["solver"]


def test_a_transformed_session_is_announced_with_its_warning(capsys) -> None:
    """Issue 22 finding 8: --solve transformed prints that the solver can rebuild every row."""
    from cels.cli.run import warn_transformed
    from cels.protocol.options import SessionOptions

    warn_transformed(SessionOptions.create(3, epsilon=1.0, delta=0.4, solve="transformed"), "cels simulate")
    assert "cels simulate: WARNING: --solve transformed" in capsys.readouterr().err
    warn_transformed(SessionOptions.create(3, epsilon=1.0, delta=0.4), "cels simulate")
    assert capsys.readouterr().err == ""


def test_no_help_text_or_document_claims_end_to_end_dp() -> None:
    """The README's promise is the strongest anywhere: no --help, summary or doc claims an
    end-to-end (eps + eps') bound."""
    from cels.cli import main

    texts = {p: p.read_text() for p in [*REPO.glob("*.md"), *(REPO / "docs").glob("*.md"), *(REPO / "cels").rglob("*.py")]}
    for banned in ("end-to-end (eps + ", "(eps + eps', delta)-DP by", "end-to-end DP (eps", "whole release is (CELS"):
        assert not [str(p) for p, t in texts.items() if banned in t], banned
    with pytest.raises(SystemExit):
        main(["sanitize", "--help"])
