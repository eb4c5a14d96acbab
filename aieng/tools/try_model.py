"""``aieng models try PATH --input NAME=VALUE ...``: one input through one model version's whole pipeline
in this process, without a server, the answer printed as JSON: how a team tests its own pre- and
postprocessing (issue 36's hooks) before serving it, and works as well for any other model.

PATH is a version directory (its model.yaml, or an ONNX file the server would serve without one) or a
model directory (its latest served version).  The request goes the server's way (``inprocess``): its
inputs checked against the declared ones (``inputs.validate_inputs``), the model's preprocessor (a
``python`` one loads the user's code through ``processing/usercode``), an ONNX Runtime session, the
postprocess chain (a ``python`` step gets the request's inputs as the pool's does).  A file entry loads
only with AIENG_ALLOW_MODEL_CODE set, as in the server.

A value is JSON when it parses as JSON, else the text itself; ``@FILE`` is that file's bytes (an image).
The caller's mistakes are ``UsageError`` (one line, exit 2): a bad PATH or spec, a missing or malformed
input, the variable not set, and an input the hook refuses with ``ValueError`` (INVALID_INPUT, as the
server answers it).  A bug in the user's code (any other exception, at load or per request) prints its
traceback and the server's one-line answer, exit 1.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import numpy as np

from aieng.tools.checks import UsageError, input_pairs


def read_value(text: str) -> Any:
    if text.startswith("@"):
        with open(text[1:], "rb") as fh:  # an OSError names the file: the CLI's one line
            return fh.read()
    try:
        return json.loads(text)
    except ValueError:
        return text


def resolve(path: str, allow_code: bool):
    """The version PATH names (or its model's latest served one)."""
    from aieng.models.inferred import onnx_file
    from aieng.models.repo import latest, scan, triton_model, version_spec
    from aieng.models.spec import ModelError

    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise UsageError(f"{path}: not a directory (a version directory, or a model directory)")
    try:
        if os.path.isfile(os.path.join(path, "model.yaml")) or onnx_file(path) is not None:
            mdir = os.path.dirname(path)
            return version_spec(os.path.basename(mdir), os.path.basename(path), path, triton_model(mdir),
                                allow_code)
        name = os.path.basename(path)
        versions = scan(os.path.dirname(path), [name], allow_code=allow_code)[name]
        return versions[latest(versions)]
    except ModelError as exc:
        raise UsageError(str(exc)) from None


def jsonable(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bytes):
        return f"<{len(obj)} bytes>"
    return obj


def run_once(spec, sent: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The answer's outputs for one request (``RequestError`` as the server would answer it)."""
    from aieng import envs
    from aieng.gpu_executor.sessions import ModelSession
    from aieng.inputs import validate_inputs
    from aieng.tools.inprocess import InProcessModel

    model = InProcessModel(spec)
    inputs = validate_inputs(spec, dict(sent))
    [encoded] = model.encode([inputs])
    if isinstance(encoded, Exception):  # a batchable processor's per-request failure
        raise encoded
    sess = ModelSession(spec, "auto", min(4, envs.cpu_count()), False, stop_spinning=False)
    [values] = model.answer(sess, [encoded], params, [sent])
    return values


def main_try(args) -> int:
    from aieng.tools.inprocess import allow_code
    from aieng.wire.protocol import INVALID_INPUT, RequestError

    if not args.model:
        raise UsageError("models try needs PATH (a version directory, or a model directory)")
    sent = {k: read_value(v) for k, v in input_pairs(args.input)}
    params = {k: read_value(v) for k, v in input_pairs(args.param)}
    spec = resolve(args.model, allow_code())
    try:
        values = run_once(spec, sent, params)
    except RequestError as exc:
        trace = getattr(exc, "trace_text", None)
        if trace:  # a bug in the user's code: where it happened
            print(trace.rstrip(), file=sys.stderr)
        if exc.code == INVALID_INPUT:
            raise UsageError(f"{exc.code}: {exc.message}") from None
        print(f"aieng: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:  # the user's code failed to load or to build: its traceback, then one line
        traceback.print_exc(file=sys.stderr)
        print(f"aieng: {spec.key} did not load: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"model": spec.name, "version": spec.version, "outputs": jsonable(values)}, indent=2))
    return 0
