"""Names a package offers, imported from their modules on first use (PEP 562), so that reading a
command's flags (``cels sanitize --help``) loads no numpy, scipy or gRPC."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, sources: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``name`` is imported from the submodule
    ``sources[name]`` when first asked for, and kept in the package."""

    def __getattr__(name: str) -> Any:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sources[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
