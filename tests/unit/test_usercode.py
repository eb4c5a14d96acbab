"""A team's own Python: the entry's check at the scan (models/hooks.py) and its loading in a worker
(processing/usercode.py): each version's file in its own namespace, the error mapping."""
import logging
import os
import sys

import pytest

from aieng.models import hooks, repo
from aieng.processing import usercode
from aieng.wire.protocol import INTERNAL, INVALID_INPUT, RequestError

YAML = """
inputs: [{name: x, kind: number}]
outputs: [{name: y, kind: tensor}]
preprocess: {type: python, entry: "%s", scale: 3}
postprocess: {type: tensor}
"""
CODE = """
from . import helper
class Pre:
    def __init__(self, spec):
        self.spec = spec
    def __call__(self, inputs):
        return helper.VALUE
"""


def version(tmp_path, ver: str, value: int, entry: str = "model.py:Pre"):
    d = tmp_path / "m" / ver
    d.mkdir(parents=True)
    (d / "model.yaml").write_text(YAML % entry)
    (d / "model.onnx").write_bytes(b"")
    (d / "model.py").write_text(CODE)
    (d / "helper.py").write_text(f"VALUE = {value}\n")
    return d


def test_entry_forms():
    assert hooks.parse_entry("model.py:Pre") == hooks.Entry("model.py", "Pre", True)
    assert hooks.parse_entry("lib/pre.py:Pre") == hooks.Entry("lib/pre.py", "Pre", True)
    assert hooks.parse_entry("mypkg.pre:Pre") == hooks.Entry("mypkg.pre", "Pre", False)
    for bad in ("model.py", "a:b:c", "model.py:1x", "../x.py:Pre", "/abs/x.py:Pre", "my-pkg:Pre", 3):
        with pytest.raises(ValueError):
            hooks.parse_entry(bad)


def test_a_file_entry_needs_the_variable_and_a_file_inside(tmp_path):
    d = version(tmp_path, "1", 1)
    with pytest.raises(repo.ModelError) as exc:
        repo.load_spec("m", "1", str(d))
    assert "AIENG_ALLOW_MODEL_CODE" in str(exc.value) and "\n" not in str(exc.value)
    spec = repo.load_spec("m", "1", str(d), allow_code=True)
    assert spec.preprocess.entry == "model.py:Pre" and spec.preprocess.params.thaw() == {"scale": 3}
    assert repo.ModelSpec.from_dict(spec.to_dict()) == spec
    (d / "model.yaml").write_text(YAML % "other.py:Pre")
    with pytest.raises(repo.ModelError, match="other.py is not a file"):
        repo.load_spec("m", "1", str(d), allow_code=True)
    (d / "model.yaml").write_text(YAML % "json:Pre")  # a module entry needs no permission
    assert repo.load_spec("m", "1", str(d)).preprocess.entry == "json:Pre"


def test_each_version_has_its_own_namespace(tmp_path):
    one = repo.load_spec("m", "1", str(version(tmp_path, "1", 1)), allow_code=True)
    two = repo.load_spec("m", "2", str(version(tmp_path, "2", 2)), allow_code=True)
    a = usercode.build(one, one.preprocess.entry, one.preprocess.params.thaw())
    b = usercode.build(two, two.preprocess.entry, two.preprocess.params.thaw())
    assert (a({}), b({})) == (1, 2)
    assert a.spec.dir == one.path and a.spec.params == {"scale": 3}
    assert a.spec.inputs == (("x", "number", None, None),)
    usercode.forget(one)
    assert not any(n.startswith(usercode.package_name(one)) for n in list(__import__("sys").modules))
    assert b({}) == 2


def test_error_mapping(caplog):
    err = usercode.mapped(ValueError("bad x"), "model.py:Pre")
    assert (err.code, err.message) == (INVALID_INPUT, "bad x")
    try:
        {}["k"]
    except KeyError as exc:
        err = usercode.mapped(exc, "model.py:Pre")
    assert (err.code, err.message) == (INTERNAL, "KeyError: 'k'")
    with caplog.at_level(logging.ERROR):
        usercode.log_failure(logging.getLogger("t"), err, 7, "trace-1")
    assert "model.py:Pre failed for request 7" in caplog.text and "Traceback" in caplog.text
    same = RequestError(INVALID_INPUT, "x")
    assert usercode.mapped(same, "h") is same
    assert os.sep  # keep the import used on every platform


def test_a_module_entry_is_imported_as_usual(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "teampkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "pre.py").write_text("class Pre:\n    def __init__(self, spec):\n        self.spec = spec\n")
    # sys.path set directly: syspath_prepend calls into pkg_resources when another test loaded it, and this
    # setuptools' pkg_resources no longer has what it calls
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *sys.path])
    for name in ("teampkg", "teampkg.pre"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    d = version(tmp_path, "1", 1, entry="teampkg.pre:Pre")
    spec = repo.load_spec("m", "1", str(d))  # no AIENG_ALLOW_MODEL_CODE needed: the operator's install
    built = usercode.build(spec, spec.preprocess.entry, {})
    assert type(built).__module__ == "teampkg.pre" and built.spec.version == "1"
    with pytest.raises(AttributeError, match="has no 'Post'"):
        usercode.load(spec, "teampkg.pre:Post")
