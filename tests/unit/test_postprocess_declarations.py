"""The postprocess ops' declarations (aieng/models/postprocess.py: names and parameters, in the model layer)
against their code (aieng/processing/post: the implementations registered by name).

Every declared op has exactly one implementation and every implementation a declaration, so a chain the
scan accepts is one the pools can build; and the scan checks a chain without loading any op code.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from aieng.models.postprocess import BUILTIN, DECLARED, declare
from aieng.models.postprocess_schema import OpDecl, Param
from aieng.processing.post import chain  # noqa: F401  (imports every op module: fills the registry)
from aieng.processing.post.op import REGISTRY, Op, register


def implementations() -> dict[str, list[type]]:
    """Every class below ``Op`` that names an op itself (not by inheritance), by that name."""
    out: dict[str, list[type]] = {}
    todo = list(Op.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__dict__.get("NAME"):
            out.setdefault(cls.NAME, []).append(cls)
    return out


def test_every_declared_op_has_exactly_one_implementation_and_every_implementation_a_declaration():
    found = implementations()
    assert set(DECLARED) == set(REGISTRY) == set(found)
    assert {name: classes for name, classes in found.items() if classes != [REGISTRY[name]]} == {}
    assert {d.name for d in BUILTIN} <= set(REGISTRY)


def test_an_implementation_carries_its_declaration():
    for name, cls in REGISTRY.items():
        assert (cls.PARAMS, cls.RUNS_C) == (DECLARED[name].params, DECLARED[name].runs_c), name


def test_an_undeclared_op_is_refused_and_so_is_a_second_implementation_or_declaration():
    with pytest.raises(RuntimeError, match="not declared"):
        register(type("Nope", (), {"NAME": "test_undeclared"}))  # not an Op subclass: it must not linger
    with pytest.raises(RuntimeError, match="registered twice"):
        register(type("Softmax2", (), {"NAME": "softmax"}))
    with pytest.raises(RuntimeError, match="declared twice"):
        declare(OpDecl("softmax", (Param("source", "str"),)))
    assert declare(DECLARED["softmax"]) is DECLARED["softmax"]  # the same declaration again: a no-op


def test_checking_a_chain_loads_no_op_code_and_no_role():
    loaded = ("aieng.processing", "aieng.preprocess_workers", "aieng.postprocess_workers",
              "aieng.gpu_executor", "aieng.frontend", "numpy")
    code = ("import sys\nfrom aieng.models import repo\n"
            "repo.check_postprocess('m.yaml', {'steps': [{'op': 'softmax', 'source': 'x'}]})\n"
            f"print(sorted(m for m in sys.modules if m.startswith({loaded!r})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
