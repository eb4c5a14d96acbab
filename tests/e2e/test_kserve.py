"""KServe's ServingRuntime (deploy/kserve/servingruntime.yaml) run as written, without a cluster.

A demo model (tabular) is copied into a temp dir as a storage initializer leaves it in /mnt/models: one
version (model.yaml beside model.onnx) or a model directory with versions.  The server runs with the
container's ``command`` and ``args`` from the YAML, ``{{.Name}}`` replaced by the example InferenceService's
name (as KServe does) and /mnt/models by the temp dir, in the image's environment (deploy/Dockerfile's ENV,
its state dir moved to the temp dir) plus the runtime's ``env``; the addresses the pod binds on 0.0.0.0
are loopback ports here.  tritonclient then infers by the InferenceService's name over HTTP and gRPC, and
the answers are the model's reference outputs.  The image's AIENG_MODEL_REPOSITORY (/models) stays set:
the runtime's flags must win over it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import yaml

from tests.conftest import MODELS, ROOT
from tests.dockerfile import image_env
from tests.e2e.tabular_oip import tabular_inputs as rows_as_inputs
from tests.waits import until

pytestmark = pytest.mark.e2e
KSERVE = os.path.join(ROOT, "deploy", "kserve")
MOUNT = "/mnt/models"  # where KServe's storage initializer puts the storageUri's files


def load(name: str) -> dict:
    with open(os.path.join(KSERVE, name), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def runtime_container() -> dict:
    (c,) = load("servingruntime.yaml")["spec"]["containers"]
    return c


def isvc_name() -> str:
    return load("inferenceservice.yaml")["metadata"]["name"]


def runtime_argv(mount: str) -> list[str]:
    """The container's command line as KServe would run it, with the model mount moved to ``mount``."""
    c = runtime_container()
    assert c["command"] == ["aieng", "serve"], "the test runs `aieng serve` as python -m aieng.cli serve"
    args = [a.replace("{{.Name}}", isvc_name()) for a in c["args"]]
    assert sum(MOUNT in a for a in args) == 1 and not any("{{" in a for a in args)
    return [a.replace(MOUNT, mount) for a in args]


def pod_env(tmp_path) -> dict[str, str]:
    """The image's AIENG_* environment and the runtime's env, with what binds or writes moved here."""
    env = {k: v for k, v in image_env().items() if k.startswith("AIENG_")}
    runtime = {e["name"]: e["value"] for e in runtime_container()["env"]}
    oip = (runtime["AIENG_OIP_HTTP_ADDR"], runtime["AIENG_OIP_GRPC_ADDR"])
    assert oip == ("0.0.0.0:8080", "0.0.0.0:8081"), "KServe's ports, on the pod's address"
    env.update(runtime)
    for addr in ("AIENG_FRONTEND_ADDR", "AIENG_HTTP_ADDR", "AIENG_OIP_HTTP_ADDR", "AIENG_OIP_GRPC_ADDR"):
        del env[addr]  # ServerProcess binds each on a free loopback port
    env["AIENG_STATE_DIR"] = str(tmp_path / "state")  # the image's /var/lib/aieng volume
    assert env["AIENG_MODEL_REPOSITORY"] == "/models", "the image's repository, which the flags override"
    return env


def storage_initializer(tmp_path, layout: str) -> str:
    mnt = tmp_path / "mnt" / "models"
    src = os.path.join(MODELS, "tabular", "1") if layout == "version" else os.path.join(MODELS, "tabular")
    shutil.copytree(src, mnt)
    return str(mnt)


def reference_cases() -> list[dict]:
    with open(os.path.join(MODELS, "tabular", "1", "reference.json"), encoding="utf-8") as fh:
        return json.load(fh)["cases"][:5]


def tabular_inputs(mod, cases: list[dict]) -> list:
    return rows_as_inputs(mod, [c["input"] for c in cases])


def check_answers(res, cases: list[dict]) -> None:
    labels, probs = res.as_numpy("label"), res.as_numpy("probabilities")
    assert [x.decode() for x in labels] == [c["expected_label"] for c in cases]
    np.testing.assert_allclose(probs, [c["expected_probabilities"] for c in cases], atol=1e-5)


@pytest.mark.parametrize("layout", ["version", "versions"])
def test_runtime_args_serve_the_mount_under_the_inferenceservice_name(make_server, tmp_path, layout):
    name, cases = isvc_name(), reference_cases()
    srv = make_server(**pod_env(tmp_path))
    srv.args = runtime_argv(storage_initializer(tmp_path, layout))
    srv.start()
    http = th.InferenceServerClient(srv.oip_http)
    grpc = tg.InferenceServerClient(srv.oip_grpc)
    try:
        assert http.is_server_ready() and http.is_model_ready(name) and http.is_model_ready(name, "1")
        assert not http.is_model_ready("tabular"), "only the mounted model, under its InferenceService name"
        assert [m["name"] for m in http.get_model_repository_index()] == [name]
        meta = http.get_model_metadata(name)
        assert meta["name"] == name and meta["versions"] == ["1"]
        check_answers(http.infer(name, tabular_inputs(th, cases)), cases)
        assert grpc.is_model_ready(name)
        check_answers(grpc.infer(name, tabular_inputs(tg, cases)), cases)
        # A rescan (SIGHUP, or `aieng rollout reload`) looks beside the served version for others: in the
        # view, not in the mount's parent (where a one-version mount would be taken for version "models").
        os.kill(srv.pid, signal.SIGHUP)
        assert until(lambda: "; versions: " in srv.output(), 30, 0.2), srv.output()
        assert "; versions: no change" in srv.output()
        assert http.get_model_metadata(name)["versions"] == ["1"]
        check_answers(http.infer(name, tabular_inputs(th, cases)), cases)
    finally:
        http.close()
        grpc.close()
    assert srv.stop() == 0, srv.output()


@pytest.mark.parametrize("problem", ["missing", "no model.yaml"])
def test_a_mount_that_cannot_be_served_is_one_line_and_exit_2(tmp_path, problem):
    mnt = tmp_path / "mnt" / "models"
    if problem == "no model.yaml":
        mnt.mkdir(parents=True)
        (mnt / "model.onnx").write_bytes(b"not a model directory of aieng's")  # a bare KServe onnx layout
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(pod_env(tmp_path))
    r = subprocess.run([sys.executable, "-m", "aieng.cli", "serve", *runtime_argv(str(mnt))], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("aieng: --model-dir ") and str(mnt) in line
    assert ("is not a directory" if problem == "missing" else "holds no model.yaml") in line
