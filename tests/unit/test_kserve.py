"""deploy/kserve: validated offline against KServe's own CRD schemas, and checked against aieng.

Validation: every document against the ``openAPIV3Schema`` of its kind (tests/data/kserve/, taken from
KServe's CRD manifests at the commit its README names), strictly: an object field the schema does not name
is refused, as ``kubectl apply --validate=strict`` would.  Then what the schema cannot know: the args are
ones ``aieng serve`` takes, the OIP addresses are KServe's ports on the pod's address, /dev/shm is sized for
the runtime's rings, every path the server writes is on a writable volume under the read-only root, and the
InferenceServices name this runtime, a format and a protocol it supports.  Run for real (no cluster):
tests/e2e/test_kserve.py.
"""
import copy
import json
import os
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from aieng.cli.main import build_parser
from aieng.config import load_config
from aieng.wire import addresses, shmsize
from tests.conftest import ROOT
from tests.dockerfile import image_env

KSERVE = os.path.join(ROOT, "deploy", "kserve")
SCHEMAS = os.path.join(ROOT, "tests", "data", "kserve")
KINDS = {("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime-v1alpha1.json",
         ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-v1beta1.json"}
DOCS = sorted(f for f in os.listdir(KSERVE) if f.endswith(".yaml"))


def load(name: str) -> dict:
    with open(os.path.join(KSERVE, name), encoding="utf-8") as fh:
        (doc,) = [d for d in yaml.safe_load_all(fh) if d]
    return doc


def strict(schema):
    """Objects with named properties refuse other fields unless the schema keeps unknown ones."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(x) for x in schema]
    return schema


def validator(doc: dict) -> jsonschema.Draft7Validator:
    name = KINDS[(doc["apiVersion"], doc["kind"])]
    with open(os.path.join(SCHEMAS, name), encoding="utf-8") as fh:
        return jsonschema.Draft7Validator(strict(json.load(fh)))


def runtime() -> dict:
    return load("servingruntime.yaml")


def container() -> dict:
    (c,) = runtime()["spec"]["containers"]
    return c


def isvcs() -> list[dict]:
    docs = [load(f) for f in DOCS]
    return [d for d in docs if d["kind"] == "InferenceService"]


def pod_config():
    """The configuration the runtime's container starts with: the image's environment, then its env."""
    env = {k: v for k, v in image_env().items() if k.startswith("AIENG_")}
    env.update({e["name"]: e["value"] for e in container().get("env", [])})
    return load_config(environ=env)


@pytest.mark.parametrize("name", DOCS)
def test_validates_against_kserves_crd_schema(name):
    doc = load(name)
    errors = sorted(validator(doc).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
    # metadata is `type: object` in a CRD schema: the API server checks the name (KServe: a DNS-1035 label)
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", doc["metadata"]["name"])


def test_the_runtimes_pod_validates_as_kubernetes_pod():
    """KServe builds the predictor's pod from the runtime's containers and volumes: they are core/v1 ones."""
    spec = runtime()["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "penguins-predictor"},
           "spec": {"containers": spec["containers"], "volumes": spec["volumes"]}}
    kubernetes_validate.validate(pod, "1.30", strict=True)


def test_the_strict_schema_refuses_what_kserve_does_not_know():
    """The validation can fail: a misspelt field, a wrong type and a missing required field are refused."""
    doc = runtime()
    bad = copy.deepcopy(doc)
    bad["spec"]["containers"][0]["argz"] = ["--model-name={{.Name}}"]
    bad["spec"]["supportedModelFormats"][0]["autoSelect"] = "yes"
    del bad["spec"]["containers"][0]["name"]
    paths = {tuple(e.path) for e in validator(bad).iter_errors(bad)}
    assert {("spec", "containers", 0), ("spec", "supportedModelFormats", 0, "autoSelect")} <= paths
    isvc = isvcs()[0]
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["canaryTrafficPercentage"] = 10
    assert list(validator(bad).iter_errors(bad))


def test_runtime_speaks_v2_over_http_and_grpc_for_onnx():
    spec = runtime()["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    (fmt,) = spec["supportedModelFormats"]
    assert fmt["name"] == "onnx" and fmt["autoSelect"] is True


def test_args_are_aiengs_serve_flags_for_the_storage_initializers_mount():
    c = container()
    assert c["command"] == ["aieng", "serve"]
    args = build_parser().parse_args(c["command"][1:] + c["args"])
    assert (args.model_name, args.model_dir) == ("{{.Name}}", "/mnt/models")
    assert args.models_dir is None and args.models is None


def test_oip_on_kserves_ports_on_the_pods_address_and_probed_there():
    cfg = pod_config()
    assert (cfg.oip_http_addr, cfg.oip_grpc_addr) == ("0.0.0.0:8080", "0.0.0.0:8081")
    probe = container()["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/v2/health/ready", 8080)
    assert "ports" not in container(), "Serverless (Knative) takes one port: the InferenceService names it"
    annotations = runtime()["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == cfg.http_addr.rpartition(":")[2]


def test_dev_shm_is_sized_for_the_runtimes_rings():
    spec = runtime()["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{shmsize.needed_mib(pod_config())}Mi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container()["volumeMounts"]


def test_every_path_the_server_writes_is_on_a_writable_volume():
    c, cfg = container(), pod_config()
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsNonRoot"] is True  # the image's USER is numeric (test_container.py)
    volumes = {v["name"]: v for v in runtime()["spec"]["volumes"]}
    written = [cfg.state_dir, "/tmp", "/dev/shm", cfg.runtime_dir or addresses.runtime_dir("1")]
    assert written[-1].startswith("/tmp/")
    for path in written:
        mounts = [m for m in c["volumeMounts"] if os.path.commonpath([m["mountPath"], path]) == m["mountPath"]
                  and m["mountPath"] != "/"]
        assert mounts, f"{path} is on the read-only root filesystem"
        assert not mounts[0].get("readOnly") and "emptyDir" in volumes[mounts[0]["name"]]


@pytest.mark.parametrize("isvc", isvcs(), ids=lambda d: d["metadata"]["name"])
def test_inferenceservices_use_this_runtime_as_it_serves(isvc):
    model = isvc["spec"]["predictor"]["model"]
    spec = runtime()["spec"]
    assert model["runtime"] == runtime()["metadata"]["name"]
    assert model["modelFormat"]["name"] in [f["name"] for f in spec["supportedModelFormats"]]
    assert model.get("protocolVersion", "v2") in spec["protocolVersions"]
    if model.get("protocolVersion") == "grpc-v2":  # the gRPC port, named so KServe speaks HTTP/2 to it
        assert model["ports"] == [{"name": "h2c", "containerPort": 8081, "protocol": "TCP"}]
        assert pod_config().oip_grpc_addr.endswith(":8081")
        assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    else:
        assert "ports" not in model  # Serverless: the default port, 8080 (HTTP)


def test_the_example_rolls_out_a_canary():
    (canary,) = [d for d in isvcs() if "canaryTrafficPercent" in d["spec"]["predictor"]]
    assert 0 < canary["spec"]["predictor"]["canaryTrafficPercent"] < 100
    assert "deploymentMode" not in str(canary["metadata"]), "KServe's canary needs Serverless mode (Knative)"
