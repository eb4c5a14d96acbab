"""Triton's own Python example clients, unchanged (tests/triton_examples/, README there), against aieng
serving Triton's QA models rebuilt as ONNX graphs (tests/e2e/triton_models.py): each client runs as a
subprocess (``python example.py -u 127.0.0.1:PORT``) and must exit 0 (they check their answers and exit 1
on a wrong one).

Two servings of the same graphs: with a hand-written tensor ``model.yaml`` beside each, and from the bare
ONNX files.  Both start with ``--no-exit-on-error``, so a model that cannot load yet (string tensors) is
its own failure and the others serve.  A client that fails only for a piece another part of issue 35
builds is ``xfail(strict=True)`` naming it (so its landing turns the mark into a failure, to be removed);
one that cannot pass against any server but Triton with its own QA repository says why.
"""
from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ServerProcess
from tests.e2e import triton_models

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).resolve().parents[1] / "triton_examples"
CLIENT_TIMEOUT_S = 120

NEEDS_ZERO = "needs zero: a version directory holding only model.onnx serves"
CANNOT = {
    "simple_http_health_metadata": "cannot pass: checks the server's name is 'triton'",
    "simple_grpc_health_metadata": "cannot pass: checks the server's name is 'triton' (and its failure path "
                                   "uses sys, which it does not import)",
    "simple_http_model_control": "cannot pass: checks Triton's QA repository holds 7 models, and loads "
                                 "with a config override",
    "simple_grpc_model_control": "cannot pass: checks Triton's QA repository holds 8 models, and loads "
                                 "with a config override",
}
STRINGS = {"simple_http_string_infer_client", "simple_grpc_string_infer_client",
           "simple_http_shm_string_client", "simple_grpc_shm_string_client",
           "grpc_explicit_byte_content_client"}

# (case id, script, transport, extra arguments)
CASES = [
    ("simple_http_infer_client", "simple_http_infer_client", "http", []),
    ("simple_http_infer_client-gzip-deflate", "simple_http_infer_client", "http",
     ["--request-compression-algorithm", "gzip", "--response-compression-algorithm", "deflate"]),
    ("simple_http_infer_client-deflate-gzip", "simple_http_infer_client", "http",
     ["--request-compression-algorithm", "deflate", "--response-compression-algorithm", "gzip"]),
    ("simple_grpc_infer_client", "simple_grpc_infer_client", "grpc", []),
    ("simple_grpc_infer_client-gzip", "simple_grpc_infer_client", "grpc", ["-C", "gzip"]),
    ("simple_http_async_infer_client", "simple_http_async_infer_client", "http", []),
    ("simple_grpc_async_infer_client", "simple_grpc_async_infer_client", "grpc", []),
    ("simple_http_aio_infer_client", "simple_http_aio_infer_client", "http", []),
    # tritonclient 2.41's aio client cannot compress a request (gzip is not imported there): answers only
    ("simple_http_aio_infer_client-gzip", "simple_http_aio_infer_client", "http",
     ["--response-compression-algorithm", "gzip"]),
    ("simple_grpc_aio_infer_client", "simple_grpc_aio_infer_client", "grpc", []),
    ("simple_http_shm_client", "simple_http_shm_client", "http", []),
    ("simple_grpc_shm_client", "simple_grpc_shm_client", "grpc", []),
    ("simple_http_string_infer_client", "simple_http_string_infer_client", "http", []),
    ("simple_grpc_string_infer_client", "simple_grpc_string_infer_client", "grpc", []),
    ("simple_http_shm_string_client", "simple_http_shm_string_client", "http", []),
    ("simple_grpc_shm_string_client", "simple_grpc_shm_string_client", "grpc", []),
    ("reuse_infer_objects_client-http", "reuse_infer_objects_client", "http", ["-i", "http"]),
    ("reuse_infer_objects_client-grpc", "reuse_infer_objects_client", "grpc", ["-i", "grpc"]),
    ("grpc_explicit_int_content_client", "grpc_explicit_int_content_client", "grpc", []),
    ("grpc_explicit_int8_content_client", "grpc_explicit_int8_content_client", "grpc", []),
    ("grpc_explicit_byte_content_client", "grpc_explicit_byte_content_client", "grpc", []),
    ("simple_grpc_custom_args_client", "simple_grpc_custom_args_client", "grpc", []),
    ("simple_grpc_keepalive_client", "simple_grpc_keepalive_client", "grpc", []),
    ("simple_http_health_metadata", "simple_http_health_metadata", "http", []),
    ("simple_grpc_health_metadata", "simple_grpc_health_metadata", "grpc", []),
    ("simple_http_model_control", "simple_http_model_control", "http", []),
    ("simple_grpc_model_control", "simple_grpc_model_control", "grpc", []),
]
SERVINGS = ("model_yaml", "bare_onnx")


def marks(script: str, serving: str) -> list:
    if script in CANNOT:
        return [pytest.mark.xfail(strict=True, reason=CANNOT[script])]
    return []


PARAMS = [pytest.param(serving, script, transport, args, id=f"{serving}-{case}", marks=marks(script, serving))
          for serving in SERVINGS for case, script, transport, args in CASES]


def shim_path(tmp: Path) -> str:
    """tritonclient 2.4x's shared-memory module imports ``pkg_resources``, which setuptools >= 81 no
    longer ships: a stand-in module on the clients' path (tests/tritonshm.py does the same in-process)."""
    # on sys.path, not sys.modules: tests/tritonshm.py may have put its own stand-in there (no __spec__)
    if importlib.machinery.PathFinder.find_spec("pkg_resources") is not None:
        return ""
    d = tmp / "shim"
    d.mkdir()
    (d / "pkg_resources.py").write_text(
        "import importlib.util, os\n\n\ndef resource_filename(package, name):\n"
        "    return os.path.join(os.path.dirname(importlib.util.find_spec(package).origin), name)\n")
    return str(d)


class Served:
    """One serving of the QA models: the server, or why it did not start (asserted in each test, so a
    serving that cannot start yet fails its tests, where their xfail marks apply)."""

    def __init__(self, tmp: Path, serving: str):
        repo = triton_models.build(tmp / "models", describe=serving == "model_yaml")
        self.server = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=str(repo), AIENG_PREPROCESS_WORKERS="1",
                                    AIENG_POSTPROCESS_WORKERS="1")
        self.server.args = ["--no-exit-on-error"]
        self.failure = ""
        try:
            self.server.start()
        except RuntimeError as exc:
            self.failure = str(exc)[-2000:]

    def stop(self) -> None:
        code = self.server.stop()
        if not self.failure:
            assert code == 0, self.server.output()
            assert self.server.segments() == []


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> str:
    return shim_path(tmp_path_factory.mktemp("shim"))


@pytest.fixture(scope="module")
def servings(tmp_path_factory):
    made: dict[str, Served] = {}

    def get(serving: str) -> Served:
        if serving not in made:
            for other in list(made):  # one server at a time: the parametrization runs serving by serving
                made.pop(other).stop()
            made[serving] = Served(tmp_path_factory.mktemp(serving), serving)
        return made[serving]

    yield get
    for served in made.values():
        served.stop()


@pytest.mark.parametrize("serving,script,transport,args", PARAMS)
def test_triton_example_client(servings, shim, serving, script, transport, args):
    served = servings(serving)
    assert not served.failure, f"the {serving} server did not start:\n{served.failure}"
    srv = served.server
    url = srv.oip_http if transport == "http" else srv.oip_grpc
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (shim, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{script}.py"), "-u", url, *args], env=env,
                          cwd=str(EXAMPLES), capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
