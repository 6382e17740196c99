"""One vocabulary for phases and session states (issue 24): outside cels/protocol/phases.py no
string literal stands where a phase or a host state does -- compared with, assigned to or
passed as a ``phase`` / ``state``, given to ``_enter`` or to a transition-table row
(``accepts``), or keyed in ``STEP_PHASE``.  Read with ``ast`` over every module of cels/."""

from __future__ import annotations

import ast
from pathlib import Path

from cels.protocol.phases import Phase, SessionState

CELS = Path(__file__).resolve().parent.parent / "cels"
WORDS = {p.value for p in Phase} | {s.value for s in SessionState}
FIELDS = {"phase", "state", "old", "new"}


def _is_word(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in WORDS


def _names_phase(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in FIELDS) or (isinstance(node, ast.Name) and node.id in FIELDS)


def phase_literals(source: str) -> list[str]:
    """The places in ``source`` where a phase or state word stands as a string literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_phase(s) for s in sides):
                words = [s for s in sides if _is_word(s)]
                words += [e for s in sides if isinstance(s, (ast.Tuple, ast.Set, ast.List)) for e in s.elts if _is_word(e)]
                found += [f"line {w.lineno}: compared {w.value!r}" for w in words]
        elif isinstance(node, ast.Assign) and any(_names_phase(t) for t in node.targets) and _is_word(node.value):
            found.append(f"line {node.lineno}: assigned {node.value.value!r}")
        elif isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            args = [*node.args] if func in ("_enter", "accepts") else []
            args += [k.value for k in node.keywords if k.arg in FIELDS]
            for arg in args:
                elts = arg.elts if isinstance(arg, (ast.Tuple, ast.List, ast.Set)) else [arg]
                found += [f"line {e.lineno}: passed {e.value!r} to {func}" for e in elts if _is_word(e)]
        elif isinstance(node, ast.Dict):
            found += [f"line {v.lineno}: mapped to {v.value!r}" for v in node.values if _is_word(v) and v.value in {p.value for p in Phase}]
    return found


def test_no_phase_or_state_literal_outside_the_enum_module() -> None:
    found = {
        str(path.relative_to(CELS)): hits
        for path in sorted(CELS.rglob("*.py"))
        if path.name != "phases.py" and not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
        for hits in [phase_literals(path.read_text())]
        if hits
    }
    assert not found, found


def test_the_check_finds_each_kind_of_literal() -> None:
    source = (
        "role.phase == 'nlp'\nx.phase = 'done'\nself._enter('union')\naccepts(('counts', 'sampling'), h)\n"
        "Event(phase='ready')\nstate in ('running', 'aborted')\nSTEP = {'abort': 'control'}\n"
    )
    assert len(phase_literals(source)) == 9
    assert phase_literals("role.phase == Phase.NLP\nsum_id == 'counts'\nreport['solve'] = 1\n") == []
