"""The docs build as a site in strict mode (deploy/mkdocs.yml): a broken link, a missing anchor,
a page left out of the navigation or a nav entry without its page fails the build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` (not ``-q``: quiet, MkDocs counts no warning and strict passes)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_docs_build_in_strict_mode(tmp_path) -> None:
    built = build(REPO / "deploy" / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "site-rules" / "index.html").is_file() and (tmp_path / "site" / "bench" / "scale.png").is_file()


def test_a_broken_anchor_fails_the_build(tmp_path) -> None:
    """The check can fail: the same docs with one link to an anchor no page has."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(REPO / "docs"), str(docs)], check=True)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](faults.md#no-such-section)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((REPO / "deploy" / "mkdocs.yml").read_text().replace("docs_dir: ../docs", f"docs_dir: {docs}").replace("site_dir: ../build/site", f"site_dir: {tmp_path / 'out'}"))
    built = build(config, tmp_path / "site")
    assert built.returncode != 0 and "no-such-section" in built.stderr


def test_readme_numbers_are_the_benchmarks_json() -> None:
    """Every number README.md gives about cost is read from docs/bench (make readme), so a
    changed benchmark result shows here until README is regenerated."""
    from cels.bench.readme import FIGURES, main, render

    assert main(["--check"]) == 0
    generated = render()
    assert generated.count("\n") == 7 and all(f.source for f in FIGURES.values())


def test_readme_check_fails_on_a_stale_number(tmp_path) -> None:
    from cels.bench.readme import main, render

    stale = tmp_path / "README.md"
    stale.write_text("x\n" + render().replace("2 user shards takes", "2 user shards takes 9") + "\ny\n")
    assert main(["--check", "--readme", str(stale)]) == 1
    assert main(["--readme", str(stale)]) == 0 and main(["--check", "--readme", str(stale)]) == 0
    assert stale.read_text() == "x\n" + render() + "\ny\n"
