#!/usr/bin/env bash
# Regenerate the Open Inference Protocol gRPC stubs in aieng/gateway/proto/ and Triton's ModelConfig message in
# aieng/models/proto/ from the published protos there (grpc_service.proto and model_config.proto, copied unchanged
# from triton-inference-server/common, commit 83adf7cf88a2f343005974dff3728be746de2d66, protobuf/), with
# grpcio-tools (the `dev` extra).  model_config lives in the model layer because config.pbtxt is read into it
# there (aieng/models/triton_config.py); the gateway's stubs import it from there.
# The generated modules are committed, so serving needs only grpcio + protobuf; rerun this after updating the
# protos, and raise grpcio>= and protobuf>= in pyproject.toml to the versions the new stubs name
# (tests/unit/test_packaging.py checks).  protoc writes top-level imports (`import model_config_pb2`); sed
# makes them absolute, and registers the files in aieng's own descriptor pool instead of protobuf's default.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
GW=aieng/gateway/proto
MC=aieng/models/proto
"$PY" -m grpc_tools.protoc -I "$MC" --python_out="$MC" "$MC/model_config.proto"
"$PY" -m grpc_tools.protoc -I "$GW" -I "$MC" --python_out="$GW" --grpc_python_out="$GW" "$GW/grpc_service.proto"
sed -i -E 's/^import model_config_pb2 as /from aieng.models.proto import model_config_pb2 as /' "$GW"/*_pb2*.py
sed -i -E 's/^import grpc_service_pb2 as /from . import grpc_service_pb2 as /' "$GW"/*_pb2*.py
# aieng's protos live in a descriptor pool of their own (aieng/models/proto/__init__.py says why)
sed -i -E 's/^DESCRIPTOR = _descriptor_pool\.Default\(\)\.AddSerializedFile\(/from aieng.models.proto import POOL as _POOL\nDESCRIPTOR = _POOL.AddSerializedFile(/' \
    "$GW"/*_pb2.py "$MC"/*_pb2.py
echo "generated: $(ls "$GW"/*_pb2*.py "$MC"/*_pb2.py | tr '\n' ' ')"
