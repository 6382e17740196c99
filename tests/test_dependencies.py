"""Dependencies chosen, not drifted (docs/deployment.md, "Dependencies"): floors past the known
CVEs, and a hashed lock that the test environment is installed from."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
LOCKS = {name: REPO / "deploy" / "lock" / f"{name}.txt" for name in ("test", "image", "core")}
FIXED = {
    "pyarrow": ("14.0.1", "CVE-2023-47248: code execution when reading a Parquet file"),
    "cryptography": ("42.0.4", "CVE-2024-26130: a NULL dereference in PKCS#12 serialisation"),
    "ray": ("2.52", "no token authentication before it (docs/ray.md, 'Who may reach a party's Ray cluster')"),
}
"""Package -> the first release past a known vulnerability, and why."""


def requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]]


def locked(path: Path) -> dict[str, tuple[Version, list[str]]]:
    """name -> (version, hashes) of a pip-compile lock."""
    out = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", path.read_text()):
        match = re.match(r"([A-Za-z0-9_.\-]+)==([^\s\\]+)", block)
        if match:
            out[match[1].lower().replace("_", "-")] = (Version(match[2]), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return out


def test_every_floor_is_past_the_known_vulnerabilities() -> None:
    floors: dict[str, list[Version]] = {}
    for req in requirements():
        floors.setdefault(req.name.lower(), []).extend(Version(s.version) for s in req.specifier if s.operator in (">=", "=="))
    for name, (fixed, why) in FIXED.items():
        assert floors.get(name) and min(floors[name]) >= Version(fixed), f"{name} admits releases below {fixed} ({why})"


def test_the_locks_pin_every_dependency_with_hashes_past_the_floors() -> None:
    for name, path in LOCKS.items():
        pins = locked(path)
        assert pins and all(hashes for _, hashes in pins.values()), name
        for req in requirements():
            if req.marker is not None and not req.marker.evaluate({"extra": "test"}):
                continue
            key = req.name.lower().replace("_", "-")
            if key in pins:
                assert pins[key][0] in req.specifier, (name, req, pins[key][0])
        for package, (fixed, why) in FIXED.items():
            if package in pins:
                assert pins[package][0] >= Version(fixed), (name, package, why)
    assert {"numpy", "grpcio", "cryptography", "ray", "pyarrow", "pytest"} <= set(locked(LOCKS["test"]))
    assert "ray" in locked(LOCKS["image"]) and "pytest" not in locked(LOCKS["image"])
    core = set(locked(LOCKS["core"]))  # make demo's: the core dependencies, no extra
    assert {"numpy", "grpcio", "cryptography"} <= core and not core & {"ray", "pyarrow", "pytest", "hypothesis"}


def test_this_environment_is_the_locked_one() -> None:
    """make venv installs the test lock with --require-hashes: every locked package is installed
    at its locked version (a drifted environment fails here)."""
    drifted = {}
    for name, (version, _) in locked(LOCKS["test"]).items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            drifted[name] = "missing"
            continue
        if installed != version:
            drifted[name] = f"{installed} installed, {version} locked"
    assert not drifted, drifted
