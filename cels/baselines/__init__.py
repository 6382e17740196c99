"""Baseline sanitizers to compare CELS against (docs/baselines.md): ZEALOUS (Götz et al.),
Korolova et al. and Safelog (Zhang et al.).

``BASELINES[name]`` offers ``add_arguments(group)`` and ``run(records, args, rng) -> (items,
report)``; :func:`write_release` writes the items (format: :mod:`cels.baselines.release`).
"""

from __future__ import annotations

from cels.baselines.base import Baseline
from cels.baselines.korolova import Korolova
from cels.baselines.release import KINDS, ReleasedItem, read_release, write_release
from cels.baselines.safelog import Safelog
from cels.baselines.sampling import baseline_rng
from cels.baselines.zealous import Zealous

BASELINES: dict[str, Baseline] = {b.name: b for b in (Zealous(), Korolova(), Safelog())}

__all__ = ["BASELINES", "KINDS", "Baseline", "ReleasedItem", "baseline_rng", "read_release", "write_release"]
