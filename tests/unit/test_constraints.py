"""constraints.txt pins every dependency the project declares, and the suite runs on exactly those pins."""
from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_name(name)] = version.strip()
    return pins


def test_every_declared_dependency_is_pinned_and_installed_at_its_pin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {_name(r) for r in extra}
    pins = _pins()
    assert declared - set(pins) == set(), "declared but not pinned: run scripts/update_constraints.sh"
    wrong = {n: (metadata.version(n), pins[n]) for n in declared if metadata.version(n) != pins[n]}
    assert wrong == {}, "installed != pinned (installed, pinned): scripts/setup.sh installs with -c"
