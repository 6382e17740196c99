"""Table 5 (CELS 6.5): all parties' total bandwidth (megabytes) vs the number of parties r,
one row per input size, measured on in-memory sessions (:func:`cels.experiments.fig6.measure`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cels.experiments import common, fig6
from cels.experiments.common import panels, save_figure
from cels.fileio import atomic_write



def plot(rows: list[dict], path: Path) -> None:
    """Megabytes vs r, one line per input (the table as a plot)."""
    fig, axes = panels(1, width=5.0)
    for label in dict.fromkeys(r["dataset"] for r in rows):
        sel = sorted((r for r in rows if r["dataset"] == label), key=lambda r: r["parties"])
        axes[0, 0].plot([r["parties"] for r in sel], [r["megabytes_total"] for r in sel], marker="o", label=label)
    axes[0, 0].set_xlabel("parties r")
    axes[0, 0].set_ylabel("total bytes sent by all nodes (MB)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Table 5: total bandwidth (Paillier {rows[0]['key_bits']} bits)", fontsize=10)
    save_figure(fig, path)


def table(rows: list[dict]) -> str:
    """The paper's layout in Markdown: inputs as rows, r as columns, MB in the cells."""
    parties = sorted({r["parties"] for r in rows})
    lines = ["| input | " + " | ".join(f"r = {p}" for p in parties) + " |", "|---" * (len(parties) + 1) + "|"]
    for label in dict.fromkeys(r["dataset"] for r in rows):
        cells = {r["parties"]: r["megabytes_total"] for r in rows if r["dataset"] == label}
        lines.append(f"| {label} | " + " | ".join(f"{cells[p]:.2f}" if p in cells else "" for p in parties) + " |")
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fig6.add_session_arguments(parser)
    parser.add_argument("--msnbc-users", default="500,1000", help="MSNBC inputs (first N users each)")
    parser.add_argument("--aol-users", default="100,250", help="AOL inputs (first N users each, cleaned)")


def run(args: argparse.Namespace, out_dir: Path) -> list[dict]:
    parties = common.int_list(args.parties, "--parties")
    cases = [(d, r) for d in common.datasets_from_args(args) for r in parties]
    rows = fig6.measure(cases, **fig6.session_kwargs(args))
    plot(rows, out_dir / "table5.png")
    with atomic_write(out_dir / "table5.md") as fh:
        fh.write(table(rows))
    return rows
