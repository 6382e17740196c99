"""Names imported on first use, so that reading a command's flags (``cels sanitize --help``)
loads no numpy, scipy or gRPC: a package's names (PEP 562), and functions named as
``"module:function"``, as entry points name them."""

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


def resolve(ref: str) -> Any:
    """The object a ``"module:name"`` reference names, imported now."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)
