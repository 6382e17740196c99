"""The layers stay visible (issue 11): primitives know no protocol, protocol logic is sans-I/O,
primitives stay primitives (issue 24: cels/crypto takes keys and bytes, no threads, pools or
clocks), and no module of cels/ imports itself through others.

Every module's imports are read with ``ast`` (top level, inside functions and under
``TYPE_CHECKING``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CELS = Path(__file__).resolve().parent.parent / "cels"

RULES = {
    "crypto": (
        "cels.protocol", "cels.node", "cels.views", "cels.attacks", "cels.workers", "google.protobuf", "grpc",
        "threading", "time", "concurrent", "multiprocessing",
    ),  # fmt: skip
    # the state machines call the work through cels.engine's interface and its Ray-free routines, never Ray
    "protocol": ("grpc", "threading", "time", "matplotlib", "logging", "cels.node", "cels.views", "cels.attacks", "cels.cli", "ray", "cels.engine.ray"),
    "engine": ("grpc", "google.protobuf", "cels.node", "cels.cli", "cels.protocol"),  # the party's executors: no wire, no node, no protocol
    "mechanism": ("cels.protocol", "cels.node", "grpc"),
}
"""Package under cels/ -> module prefixes none of its modules may import."""
EXCEPTIONS = {"engine/ray/trust.py": {"grpc"}}
"""Module -> what it may import all the same: ray_trust calls a joined Ray cluster's own gRPC
services without a token (Ray's wire, not CELS's) to refuse a cluster that answers."""


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
        and name not in EXCEPTIONS.get(str(path.relative_to(CELS)), set())
    }
    assert not found, sorted(found)


def test_ray_stays_in_the_ray_backend() -> None:
    """The in-process engine is the one-shard case of the sharded work (cels.engine.work), which
    is Ray-free: only cels/engine/ray/ imports Ray, and nothing outside it imports that package
    but the engine registry's string (cels.engine.options.ENGINES) and the CLI's TLS command."""
    allowed = {"cli/run.py"}  # cels ray-tls: cels.engine.ray.tls, imported when the command runs
    found = {
        f"{path.relative_to(CELS)} imports {name}"
        for path in sorted(CELS.rglob("*.py"))
        if not str(path.relative_to(CELS)).startswith("engine/ray/") and str(path.relative_to(CELS)) not in allowed
        for name in imports(path)
        if name == "ray" or name.startswith(("ray.", "cels.engine.ray"))
    }
    assert not found, sorted(found)


def test_the_rule_catches_a_violation(tmp_path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    import time\n    from cels.node.service import Node\n")
    assert {"time", "cels.node.service"} <= imports(bad)


def test_the_cipher_stream_is_a_primitive() -> None:
    """cels/crypto/streams.py, the ChaCha20 stream of every private draw (docs/crypto.md,
    Randomness), is under the crypto rule and imports only the standard library, numpy,
    randomgen and cryptography (HKDF): no protobuf, no protocol, not even the mechanism that uses it."""
    path = CELS / "crypto" / "streams.py"
    assert path in modules("crypto")
    assert {name.split(".")[0] for name in imports(path)} <= {"__future__", "random", "secrets", "numpy", "randomgen", "cryptography"}


KNOWN_CIRCLES: set[frozenset[str]] = set()
"""Import circles not broken yet (each must still exist: a broken one is deleted here)."""


def import_graph(package: Path = CELS) -> dict[str, set[str]]:
    """Module of ``package`` -> the modules of ``package`` it imports: ``import cels.x`` and
    ``from cels.x import y`` name cels/x.py or cels/x/__init__.py, and also cels/x/y.py when
    y is a submodule."""
    paths = [p for p in sorted(package.rglob("*.py")) if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]
    names_of = {}
    for path in paths:
        parts = path.relative_to(package.parent).with_suffix("").parts
        names_of[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    known = set(names_of.values())
    graph = {}
    for path, name in names_of.items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        graph[name] = (names & known) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The modules of every import circle: the strongly connected components of more than one
    module (Tarjan's algorithm, a depth-first search over the imports)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_among_cels_modules() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found - KNOWN_CIRCLES, sorted(sorted(c) for c in found - KNOWN_CIRCLES)
    assert not KNOWN_CIRCLES - found, f"broken, delete from KNOWN_CIRCLES: {sorted(sorted(c) for c in KNOWN_CIRCLES - found)}"


def test_the_circle_search_finds_circles_and_submodule_imports(tmp_path) -> None:
    """cels.a -> cels.b (``from cels import b``) -> cels.c (``import``) -> cels.a (a
    ``TYPE_CHECKING`` import of ``from cels.a import ...``) is one circle; cels.d, imported by
    cels.c only, is in none, and without the last import there is no circle."""
    package = tmp_path / "cels"
    package.mkdir()
    sources = {
        "__init__.py": "",
        "a.py": "from cels import b\n",
        "b.py": "def f():\n    import cels.c\n",
        "c.py": "from typing import TYPE_CHECKING\nimport cels.d\nif TYPE_CHECKING:\n    from cels.a import X\n",
        "d.py": "import os\n",
    }
    for name, text in sources.items():
        (package / name).write_text(text)
    graph = import_graph(package)
    assert graph["cels.a"] == {"cels", "cels.b"} and graph["cels.c"] == {"cels.a", "cels.d"} and graph["cels.d"] == set()
    assert circles(graph) == {frozenset({"cels.a", "cels.b", "cels.c"})}
    (package / "c.py").write_text("import cels.d\n")
    assert circles(import_graph(package)) == set()


SIZE_LIMITS = {"protocol/party.py": 300, "node/service.py": 350}
"""Issue 24's targets: the party composes its phase machines; the node only adapts to gRPC."""
CLASS_LIMIT = 250


def test_no_class_and_no_capped_module_grows_past_its_limit() -> None:
    long_classes = {
        f"{path.relative_to(CELS)}:{node.name}": node.end_lineno - node.lineno + 1
        for path in modules("")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LIMIT
    }
    assert not long_classes, long_classes
    for module, limit in SIZE_LIMITS.items():
        assert len((CELS / module).read_text().splitlines()) < limit, module
