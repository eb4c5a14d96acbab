"""``ModelSpec`` is frozen and typed all the way down (issue 34 item 3: no dict field read by key anywhere).

The walk reads the field types of ``ModelSpec`` and of every record below it (each preprocess type too) and
fails on a field typed dict, list, set or a Mapping, on a bare ``Any``, and on a dataclass that is not
frozen.  ``Opaque`` (a value as model.yaml wrote it, frozen, with no lookup by key) is allowed only where
``OPAQUE`` names it.  The same holds of the values of real specs, and the wire form round-trips them.  And
no module of aieng/ reads a section of a spec by key (``spec.preprocess["type"]``, ``s.batching.get(...)``).
"""
from __future__ import annotations

import ast
import collections.abc
import dataclasses
import shutil
import types
import typing
from typing import Any

import msgpack
import pytest
import yaml

from aieng.models.frozen import FrozenMap, Opaque
from aieng.models.repo import scan
from aieng.models.sections import PREPROCESS_TYPES, Preprocess
from aieng.models.spec import ModelSpec
from aieng.wire import messages as m
from tests.unit.demo import MODELS, ROOT, needs_demo_models

# Where a spec holds a value as written, and why the server never reads it by key.
OPAQUE = {
    "metadata",  # model.yaml ``metadata:``: passed whole to clients (models op, /debug)
    "inputs[].shown", "outputs[].shown",  # a declaration as written: what the models op shows
    "postprocess.steps[].params",  # an op's parameters: the chain's parse checks them against the op
    "preprocess.params",  # a python hook's own settings: handed whole to the user's code (HookSpec.params)
    "degrade.fallback",  # the outputs answered at degradation level 3: sent to clients whole
    # the routing section's parts: the rollout parses the section as it parses a reloaded model.yaml
    "routing.weights", "routing.rules", "routing.groups", "routing.auto_rollback", "routing.shadow",
}
MAPPINGS = (dict, list, set, frozenset, collections.abc.Mapping, collections.abc.MutableMapping,
            collections.abc.MutableSequence, collections.abc.Set)


def _members(hint: Any) -> list[Any]:
    """The types a field's hint admits: a union's members, a tuple's element types (themselves
    unpacked)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return [t for a in args if a is not type(None) for t in _members(a)]
    if origin is tuple:
        return [t for a in args if a is not Ellipsis for t in _members(a) or [a]]
    return [hint]


def walk(cls: type, path: str, problems: list[str], opaque: set[str], seen: set) -> None:
    if not dataclasses.fields(cls) or (cls, path) in seen:
        return
    seen.add((cls, path))
    if not cls.__dataclass_params__.frozen:
        problems.append(f"{path or cls.__name__}: {cls.__name__} is not frozen")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        hint = hints[f.name]
        if hint is Any:
            problems.append(f"{where}: typed Any")
        for t in _members(hint):
            origin = typing.get_origin(t) or t
            if isinstance(origin, type) and issubclass(origin, MAPPINGS):
                problems.append(f"{where}: typed {t}")
            elif t is Opaque:
                opaque.add(where)
            elif isinstance(t, type) and dataclasses.is_dataclass(t):
                below = where + ("[]" if typing.get_origin(hint) is tuple or tuple in map(
                    typing.get_origin, typing.get_args(hint)) else "")
                for sub in ([t, *PREPROCESS_TYPES.values()] if t is Preprocess else [t]):
                    walk(sub, below, problems, opaque, seen)


def test_every_field_of_the_spec_is_a_frozen_record_a_tuple_of_them_or_a_scalar():
    problems: list[str] = []
    opaque: set[str] = set()
    walk(ModelSpec, "", problems, opaque, set())
    assert problems == []
    assert opaque == OPAQUE


def test_no_module_reads_a_spec_section_by_key():
    """``x.<section>[key]`` or ``x.<section>.get(...)`` for a section field of the spec, anywhere in aieng/
    (``self.<name>`` is left out: components have their own ``inputs``, ``batching``, ... maps)."""
    sections = {f.name for f in dataclasses.fields(ModelSpec)} - {
        "name", "version", "path", "content_hash", "description", "timeout_ms", "onnx_path"}
    found = []
    for path in sorted((ROOT / "aieng").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Subscript) and not (isinstance(node.slice, ast.Constant)
                                                        and isinstance(node.slice.value, int)):
                target = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("get", "items", "keys", "values")):
                target = node.func.value
            else:
                continue
            if (isinstance(target, ast.Attribute) and target.attr in sections
                    and not (isinstance(target.value, ast.Name) and target.value.id == "self")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_an_opaque_value_has_no_lookup_by_key():
    for cls in (Opaque, FrozenMap):
        assert not hasattr(cls, "get") and not hasattr(cls, "keys")
    assert not hasattr(Opaque, "__getitem__")


def frozen_values(obj: Any, path: str = "spec") -> list[str]:
    """Where a spec's values hold a dict, a list, a set or an unfrozen record."""
    if isinstance(obj, (dict, list, set)):
        return [f"{path}: {type(obj).__name__}"]
    if isinstance(obj, Opaque):
        return frozen_values(obj.value, path)
    if dataclasses.is_dataclass(obj):
        bad = [] if type(obj).__dataclass_params__.frozen else [f"{path}: not frozen"]
        return bad + [p for f in dataclasses.fields(obj)
                      for p in frozen_values(getattr(obj, f.name), f"{path}.{f.name}")]
    if isinstance(obj, tuple):
        return [p for i, v in enumerate(obj) for p in frozen_values(v, f"{path}[{i}]")]
    return []


def through_the_wire(spec: ModelSpec) -> ModelSpec:
    """As a spec travels: a map in a msgpack body (``LoadVersion``), and as a child's start argument."""
    loaded = m.decode(m.encode(m.LoadVersion(spec))).spec
    packed = msgpack.unpackb(msgpack.packb(spec.to_dict()), raw=False, strict_map_key=False)
    assert ModelSpec.from_dict(packed) == loaded
    return loaded


def check_round_trip(spec: ModelSpec) -> None:
    assert frozen_values(spec) == []
    again = through_the_wire(spec)
    assert again == spec and type(again.preprocess) is type(spec.preprocess)
    assert again.public() == spec.public() and frozen_values(again) == []


@needs_demo_models
def test_the_demo_models_and_the_ocr_pipeline_round_trip_and_show_their_model_yaml():
    specs = scan(str(MODELS))
    assert specs["ocr"]["1"].pipeline is not None  # a pipeline model is among them
    for versions in specs.values():
        for spec in versions.values():
            check_round_trip(spec)
            written = yaml.safe_load(open(f"{spec.path}/model.yaml", encoding="utf-8"))
            pub = spec.public()
            assert (pub["inputs"], pub["outputs"]) == (written["inputs"], written["outputs"])


@needs_demo_models
def test_every_optional_section_round_trips(tmp_path):
    """routing (rules, groups, shadow, auto-rollback), pool, degrade, drift, metadata, padding."""
    repo = tmp_path / "repo"
    for v in ("1", "2"):
        shutil.copytree(MODELS / "tabular" / "1", repo / "tab" / v)
    (repo / "tab" / "model.yaml").write_text(yaml.safe_dump({
        "pool": {"lazy": True, "pinned": True},
        "routing": {"weights": {"1": 90, "2": 10}, "groups": {"beta": ["alice"]},
                    "rules": [{"name": "beta", "group": "beta", "version": "2"},
                              {"name": "heavy", "when": {"input": "body_mass_g", "op": ">", "value": 5000},
                               "version": "2"}],
                    "allow_pinned": False, "shadow": {"version": "2", "percent": 5},
                    "auto_rollback": {"max_error_rate_delta": 0.05, "window_s": 60}}}))
    cfg = yaml.safe_load((repo / "tab" / "2" / "model.yaml").read_text())
    cfg.update(degrade={"queue_depth": [16, 32, 64], "fallback": {"label": "unknown", "p": [0.5, 0.5]}},
               metadata={"created": "2026-01-01", "metrics": {"accuracy": 0.97}}, padding={"features": 0.5},
               postprocess={"steps": [{"op": "softmax", "source": "probabilities", "output": "p"},
                                      {"op": "top_k", "name": "best", "source": "p", "k": 2,
                                       "timeout_ms": 5, "on_timeout": "skip"}], "answer": ["p", "best"]})
    (repo / "tab" / "2" / "model.yaml").write_text(yaml.safe_dump(cfg))
    specs = scan(str(repo))["tab"]
    two = specs["2"]
    assert two.pool.lazy and two.routing is not None and two.degrade is not None
    assert two.routing.section()["rules"][1]["when"] == {"input": "body_mass_g", "op": ">", "value": 5000}
    assert two.padding.pad_value("features") == 0.5 and two.padding.pad_value("other") == 0
    assert two.metadata.thaw() == {"created": "2026-01-01", "metrics": {"accuracy": 0.97}}
    assert [s.name for s in two.postprocess.steps] == [None, "best"]
    assert two.postprocess.answer == ("p", "best")
    for spec in specs.values():
        check_round_trip(spec)


def test_a_spec_cannot_be_changed_after_it_is_built():
    spec = ModelSpec.from_dict(ModelSpec.from_dict({
        "name": "m", "version": "1", "path": "/nowhere", "content_hash": "ab" * 32, "description": "",
        "inputs": [], "outputs": [], "preprocess": {"type": "tensor"}, "postprocess": {"steps": []},
        "padding": {"values": []}, "batching": {"max_batch_size": 8, "max_wait_ms": 2.0,
                                                 "max_padding_waste": 0.3}, "timeout_ms": 0}).to_dict())
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batching.max_batch_size = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.timeout_ms = 1  # type: ignore[misc]
