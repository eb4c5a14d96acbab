"""pyproject.toml states what the package really needs: the lower bounds of grpcio and protobuf are the
versions the committed gRPC stubs check at import, and matplotlib is in the extra named for the plots."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "aieng" / "gateway" / "proto"
PROTOS = (PROTO, ROOT / "aieng" / "models" / "proto")  # the gRPC stubs; Triton's ModelConfig message
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def lower_bound(reqs: list[str], name: str) -> str:
    (found,) = [r for r in reqs if re.match(rf"{re.escape(name)}(\[[^\]]*\])?\s*>=", r)]
    return found.split(">=", 1)[1].split(",")[0].strip()


def test_grpcio_lower_bound_is_the_version_the_stubs_require():
    (generated,) = re.findall(r"^GRPC_GENERATED_VERSION = '([\d.]+)'$",
                              (PROTO / "grpc_service_pb2_grpc.py").read_text(), re.M)
    assert lower_bound(PROJECT["dependencies"], "grpcio") == generated


def test_protobuf_lower_bound_is_the_gencode_version_of_every_stub():
    versions = {re.search(r"^# Protobuf Python Version: ([\d.]+)$", p.read_text(), re.M).group(1)
                for d in PROTOS for p in d.glob("*_pb2.py")}
    assert len(versions) == 1 and len(list(PROTOS[1].glob("*_pb2.py"))) == 1, versions
    assert lower_bound(PROJECT["dependencies"], "protobuf") == versions.pop()


def test_matplotlib_is_in_the_plots_extra_not_the_runtime():
    assert not [r for r in PROJECT["dependencies"] if r.startswith("matplotlib")]
    assert [r for r in PROJECT["optional-dependencies"]["plots"] if r.startswith("matplotlib")]


def test_the_gpu_extra_brings_cuda_and_cudnn_with_onnxruntime_gpu():
    (req,) = PROJECT["optional-dependencies"]["gpu"]
    assert re.match(r"onnxruntime-gpu\[cuda,cudnn\]>=", req)
    assert lower_bound(PROJECT["dependencies"], "onnxruntime-gpu") == lower_bound([req], "onnxruntime-gpu")
