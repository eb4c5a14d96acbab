"""The served-versions registry (aieng/models/served.py): reads, the one writer, change notifications.

"One writer" is held here, not by memory: every module of aieng/ is read with ``ast`` (nothing imported),
and the only call of ``claim_writer`` and the only mention of ``VersionsWriter`` outside the registry are
in the version manager's modules.
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from aieng.models.served import Change, ServedVersions

PACKAGE = Path(__file__).resolve().parents[2] / "aieng"
REGISTRY = "models/served.py"
WRITER = "frontend/versions/manager.py"  # claims the writer
WRITER_OWNS = {WRITER, "frontend/versions/hotswap.py"}  # ... and hands it to the hot swap it owns


def spec(name: str, version: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, version=version)


def test_reads_are_live_and_read_only():
    served = ServedVersions.of([spec("m", "1"), spec("n", "1")])
    m = served.versions_of("m")
    assert sorted(served) == ["m", "n"] and "m" in served and "x" not in served and len(served) == 2
    assert served.get("m", "1") is m["1"] and served.get("m", "2") is None and served.get("x", "1") is None
    assert served.versions_of("x") == {} and served["m"] is m
    with pytest.raises(TypeError):
        m["2"] = spec("m", "2")  # type: ignore[index]
    writer = served.claim_writer()
    writer.add(spec("m", "2"))
    assert sorted(m) == ["1", "2"] and served.get("m", "2").version == "2"  # the view read before sees it
    assert writer.remove("m", "1").version == "1" and sorted(m) == ["2"]
    with pytest.raises(KeyError):
        writer.remove("m", "1")


def test_subscribers_hear_each_change_after_it_is_made():
    served = ServedVersions({"m": {"1": spec("m", "1")}})
    seen = []
    served.subscribe(lambda change: seen.append((change.kind, change.spec.version, sorted(served["m"]))))
    writer = served.claim_writer()
    before = served.generation
    writer.add(spec("m", "2"))
    writer.remove("m", "1")
    assert seen == [("added", "2", ["1", "2"]), ("removed", "1", ["2"])]
    assert served.generation == before + 2 and Change("added", None).kind == "added"


def test_the_writer_is_claimed_once():
    served = ServedVersions()
    served.claim_writer()
    with pytest.raises(RuntimeError):
        served.claim_writer()


def _mentions(tree: ast.AST) -> tuple[bool, bool]:
    claims = any(isinstance(n, ast.Attribute) and n.attr == "claim_writer" for n in ast.walk(tree))
    names_writer = any((isinstance(n, ast.Name) and n.id == "VersionsWriter")
                       or (isinstance(n, ast.alias) and n.name == "VersionsWriter")
                       or (isinstance(n, ast.Attribute) and n.attr == "VersionsWriter")
                       for n in ast.walk(tree))
    return claims, names_writer


def test_one_writer_of_the_served_versions():
    claimers, holders = set(), set()
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(PACKAGE).as_posix()
        if rel == REGISTRY:
            continue
        claims, names_writer = _mentions(ast.parse(f.read_text(encoding="utf-8")))
        if claims:
            claimers.add(rel)
        if names_writer:
            holders.add(rel)
    assert claimers == {WRITER}
    assert holders <= WRITER_OWNS
