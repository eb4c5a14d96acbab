"""The commented TLS examples of deploy/k8s and deploy/kserve, uncommented as a user would, still validate
and say what the server reads: the three AIENG_OIP_TLS_* variables naming files in the directory a Secret is
mounted at (as a whole: a subPath mount is never updated, so a rotation would not arrive), and the probes
left on the plain probe port."""
from __future__ import annotations

import json
import os
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from aieng import envs
from aieng.config import load_config
from tests.conftest import ROOT
from tests.unit.test_kserve import strict

TLS_VARS = ("AIENG_OIP_TLS_CERT_FILE", "AIENG_OIP_TLS_KEY_FILE", "AIENG_OIP_TLS_CLIENT_CA_FILE")
# a commented line of the example: an oip-tls volume or mount (and its secret line), or a TLS variable
EXAMPLE = re.compile(r"^(\s*)# (- \{name: oip-tls.*|- name: oip-tls.*|  secret: \{secretName.*"
                     r"|AIENG_OIP_TLS_\w+: .*|- \{name: AIENG_OIP_TLS_.*)$")


def uncommented(path: str) -> dict:
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    out, found = [], 0
    for line in lines:
        m = EXAMPLE.match(line)
        found += bool(m)
        out.append(f"{m.group(1)}{m.group(2)}" if m else line)
    assert found >= 3, f"{path}: the TLS example is gone"
    (doc,) = [d for d in yaml.safe_load_all("\n".join(out)) if d]
    return doc


def check_secret_mount(spec: dict, container: dict, env: dict[str, str]) -> None:
    assert set(TLS_VARS) <= set(env) and all(v in envs.BY_NAME for v in TLS_VARS)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "oip-tls"]
    assert "subPath" not in mount and mount["readOnly"] is True
    assert {os.path.dirname(env[v]) for v in TLS_VARS} == {mount["mountPath"]}
    assert {os.path.basename(env[v]) for v in TLS_VARS} == {"tls.crt", "tls.key", "ca.crt"}
    (vol,) = [v for v in spec["volumes"] if v["name"] == "oip-tls"]
    assert vol["secret"] == {"secretName": "aieng-oip-tls"}
    cfg = load_config(environ={k: v for k, v in env.items() if k.startswith("AIENG_")})
    assert cfg.oip_tls_client_ca_file == env["AIENG_OIP_TLS_CLIENT_CA_FILE"]


def test_the_deployments_tls_example_validates_and_probes_stay_plain():
    deployment = uncommented("deploy/k8s/base/deployment.yaml")
    configmap = uncommented("deploy/k8s/base/configmap.yaml")
    for doc in (deployment, configmap):
        kubernetes_validate.validate(doc, "1.30", strict=True)
    spec = deployment["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    check_secret_mount(spec, c, configmap["data"])
    http_port = load_config(environ={k: v for k, v in configmap["data"].items()
                                     if k.startswith("AIENG_")}).http_addr.rpartition(":")[2]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    probes = [c[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")]
    assert {str(ports[p["port"]]) for p in probes} == {http_port}  # not an OIP port: those speak TLS now
    assert all(p.get("scheme", "HTTP") == "HTTP" for p in probes)


def test_the_serving_runtimes_tls_example_validates():
    runtime = uncommented("deploy/kserve/servingruntime.yaml")
    with open(os.path.join(ROOT, "tests", "data", "kserve", "servingruntime-v1alpha1.json"),
              encoding="utf-8") as fh:
        schema = jsonschema.Draft7Validator(strict(json.load(fh)))
    assert list(schema.iter_errors(runtime)) == []
    spec = runtime["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": spec["containers"], "volumes": spec["volumes"]}}
    kubernetes_validate.validate(pod, "1.30", strict=True)
    (c,) = spec["containers"]
    check_secret_mount(spec, c, {e["name"]: e["value"] for e in c["env"]})


@pytest.mark.parametrize("path", ["deploy/k8s/base/deployment.yaml", "deploy/kserve/servingruntime.yaml"])
def test_as_shipped_tls_is_off(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        text = fh.read()
    assert all(line.lstrip().startswith("#") for line in text.splitlines() if "oip-tls" in line)
