"""The sequence diagram of a recorded session as a PNG (matplotlib; ``cels views DIR``)."""

from __future__ import annotations

from pathlib import Path

from cels.fileio import atomic_write
from cels.views.read import PHASE_ORDER, NodeView, _participants, _size, arrows


def sequence_png(views: dict[str, NodeView], path: str | Path) -> None:
    """The same sequence diagram drawn with matplotlib (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = arrows(views)
    nodes = _participants(views, drawn)
    x = {n: i for i, n in enumerate(nodes)}
    height = 1.2 + 0.24 * (len(drawn) + 2)
    fig, ax = plt.subplots(figsize=(2.2 * len(nodes) + 2.5, height))
    top, bottom = 0.5, -(len(drawn) + 0.5)
    for n in nodes:
        ax.plot([x[n], x[n]], [bottom, top], color="0.6", lw=0.8, zorder=1)
        ax.text(x[n], top + 0.3, n, ha="center", va="bottom", fontsize=9, weight="bold")
    colours = dict(zip(PHASE_ORDER, ("0.9", "#dbe9f6", "#e3f1dc", "#fbe5d6", "#efe3f3", "#fff2cc")))
    start, phase = 0, None
    for i, a in enumerate([*drawn, None]):
        if a is None or a.phase != phase:
            if phase is not None:
                ax.axhspan(-(i - 0.5), -(start - 0.5), color=colours.get(phase, "0.95"), zorder=0)
                ax.text(-0.6, -(start + i - 1) / 2, phase, ha="right", va="center", fontsize=8, style="italic")
            if a is not None:
                start, phase = i, a.phase
        if a is None:
            break
        ax.annotate("", xy=(x[a.recipient], -i), xytext=(x[a.sender], -i),
                    arrowprops={"arrowstyle": "->", "lw": 0.8}, zorder=2)  # fmt: skip
        ax.text((x[a.sender] + x[a.recipient]) / 2, -i + 0.08, f"{a.label} ({_size(a.bytes)})", ha="center",
                va="bottom", fontsize=6)  # fmt: skip
    ax.set_xlim(-1.8, len(nodes) - 0.4)
    ax.set_ylim(bottom - 0.2, top + 1.0)
    ax.axis("off")
    fig.tight_layout()
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
