"""The layers stay visible (issue 11): primitives know no protocol, protocol logic is sans-I/O.

Every module's imports are read with ``ast`` (top level and inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CELS = Path(__file__).resolve().parent.parent / "cels"

RULES = {
    "crypto": ("cels.protocol", "cels.node", "cels.views", "cels.attacks", "google.protobuf", "grpc"),
    "protocol": ("grpc", "threading", "time", "matplotlib", "logging", "cels.node", "cels.views", "cels.attacks", "cels.cli"),
    "mechanism": ("cels.protocol", "cels.node", "grpc"),
}
"""Package under cels/ -> module prefixes none of its modules may import."""


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(package: str) -> list[Path]:
    return [p for p in sorted((CELS / package).rglob("*.py")) if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


@pytest.mark.parametrize("package", sorted(RULES))
def test_layer_imports(package) -> None:
    found = {
        f"{path.relative_to(CELS)} imports {name}"
        for path in modules(package)
        for name in imports(path)
        if any(name == banned or name.startswith(banned + ".") for banned in RULES[package])
    }
    assert not found, sorted(found)


def test_the_rule_catches_a_violation(tmp_path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    import time\n    from cels.node.service import Node\n")
    assert {"time", "cels.node.service"} <= imports(bad)


def test_the_cipher_stream_is_a_primitive() -> None:
    """cels/crypto/streams.py, the ChaCha20 stream of every private draw (docs/crypto.md,
    Randomness), is under the crypto rule and imports only the standard library, numpy and
    randomgen: no protobuf, no protocol, not even the mechanism that uses it."""
    path = CELS / "crypto" / "streams.py"
    assert path in modules("crypto")
    assert {name.split(".")[0] for name in imports(path)} <= {"__future__", "random", "secrets", "numpy", "randomgen"}
