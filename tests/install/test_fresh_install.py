"""The package installs into a fresh venv from its own metadata alone (no constraints.txt, no dev extra)
and every entry point starts: pyproject's console scripts, ``python -m aieng.cli``, and an import of every
module (the gRPC stubs check their grpcio and protobuf versions at import); a bare ONNX file's graph is read
(onnx comes with the package).  Without the plots extra the
plot helper says which extra to install.

Minutes (pip unpacks onnxruntime-gpu, opencv, grpcio... into the venv; downloads go through pip's cache),
so it runs only in CI (``CI`` set) or with ``-m install`` (``conftest.py`` here), bounded by timeouts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.install
PIP_TIMEOUT_S = 900  # a cold cache downloads ~500 MB of wheels; a warm one installs in about a minute

PROBE = """
import importlib, json, pkgutil, sys
from importlib import metadata
import aieng
out = {"file": aieng.__file__, "scripts": {}, "modules": []}
for ep in metadata.entry_points(group="console_scripts"):
    if ep.dist.name == "aieng":
        out["scripts"][ep.name] = callable(ep.load())
for m in pkgutil.walk_packages(aieng.__path__, "aieng."):
    if m.name.endswith(".__main__"):  # runs the command line when imported: run below as python -m
        continue
    importlib.import_module(m.name)
    out["modules"].append(m.name)
from aieng.tools.plots import MissingExtra, pyplot
try:
    pyplot()
except MissingExtra as exc:
    out["plots"] = str(exc)
# a bare ONNX file is described from its graph (zero-config serving): onnx must come with the package
import onnx
from onnx import TensorProto, helper
x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 2]) for n in ("x", "y"))
onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])),
          "probe.onnx")
from aieng.models.onnx_infer import describe
out["bare_onnx_batched"] = describe("probe.onnx").batch_axis().batched
print(json.dumps(out))
"""


def run(argv: list[str], cwd, timeout: float, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_fresh_venv_without_constraints_runs_every_entry_point(tmp_path):
    # What a wheel is built from (pyproject, setup.cfg, the readme, the package); a copy, so the build
    # writes nothing into the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src)
    shutil.copytree(os.path.join(ROOT, "aieng"), src / "aieng",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bindir = venv / "bin"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_CONSTRAINT", "PIP_NO_CACHE", "PYTHON", "VIRTUAL_ENV", "AIENG_"))}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    t0 = time.monotonic()
    r = run([str(bindir / "python"), "-m", "pip", "install", "--quiet", "--no-compile", str(src)], tmp_path,
            PIP_TIMEOUT_S, env)
    print(f"pip install into a fresh venv: {time.monotonic() - t0:.0f} s")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    scripts = tomllib.loads((src / "pyproject.toml").read_text())["project"]["scripts"]
    # cwd is tmp_path: the checkout is not on sys.path, so everything below comes from the venv
    r = run([str(bindir / "python"), "-c", PROBE], tmp_path, 300, env)
    assert r.returncode == 0, r.stderr[-3000:]
    probe = json.loads(r.stdout.splitlines()[-1])
    assert probe["file"].startswith(str(venv))
    assert probe["scripts"] == {name: True for name in scripts}
    assert "aieng.gateway.proto.grpc_service_pb2_grpc" in probe["modules"]
    assert "aieng.cli.main" in probe["modules"]
    assert probe["bare_onnx_batched"] is True  # onnx installed with the package, the graph read
    assert probe["plots"] == "no plot: matplotlib is not installed (pip install 'aieng[plots]')"
    for name in scripts:
        r = run([str(bindir / name), "--help"], tmp_path, 120, env)
        assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-3000:]
    r = run([str(bindir / "python"), "-m", "aieng.cli", "--help"], tmp_path, 120, env)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-3000:]
