#!/usr/bin/env bash
# Regenerate the Open Inference Protocol gRPC stubs in aieng/gateway/proto/ from the published protos there
# (grpc_service.proto and model_config.proto, copied unchanged from triton-inference-server/common, commit
# 83adf7cf88a2f343005974dff3728be746de2d66, protobuf/), with grpcio-tools (the `dev` extra).
# The generated modules are committed, so serving needs only grpcio + protobuf; rerun this after updating the
# protos, and raise grpcio>= and protobuf>= in pyproject.toml to the versions the new stubs name
# (tests/unit/test_packaging.py checks).  protoc writes top-level imports (`import model_config_pb2`); sed
# makes them package-relative.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DIR=aieng/gateway/proto
"$PY" -m grpc_tools.protoc -I "$DIR" --python_out="$DIR" --grpc_python_out="$DIR" \
    "$DIR/grpc_service.proto" "$DIR/model_config.proto"
sed -i -E 's/^import (model_config_pb2|grpc_service_pb2) as /from . import \1 as /' "$DIR"/*_pb2*.py
echo "generated: $(ls "$DIR"/*_pb2*.py | tr '\n' ' ')"
