"""``aieng models try PATH --input NAME=VALUE ...``: one input through one model version's whole pipeline
in this process, without a server, the answer printed as JSON: how a team tests its own pre- and
postprocessing (issue 36's hooks) before serving it, and works as well for any other model.

PATH is a version directory (its model.yaml, or an ONNX file the server would serve without one) or a
model directory (its latest served version).  The request goes the server's way (``inprocess``): its
inputs checked against the declared ones (``inputs.validate_inputs``), the model's preprocessor (a
``python`` one loads the user's code through ``processing/usercode``), an ONNX Runtime session, the
postprocess chain (a ``python`` step gets the request's inputs as the pool's does).  A file entry loads
only with AIENG_ALLOW_MODEL_CODE set, as in the server.

A value is JSON when it parses as JSON, else the text itself; ``@FILE`` is that file's bytes (an image);
a declared ``tensor`` input's JSON (a nested list, a number) goes as an array of its declared dtype.
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


def as_sent(spec, values: dict[str, Any]) -> dict[str, Any]:
    """The inputs as a client sends them: a declared ``tensor`` input given as JSON (a list or a number)
    becomes the tensor map the native client sends for a numpy array of the declared dtype."""
    from aieng.wire.protocol import encode_tensor

    out = dict(values)
    for decl in spec.inputs:
        value = out.get(decl.name)
        if decl.kind != "tensor" or not isinstance(value, (list, int, float)) or isinstance(value, bool):
            continue
        try:
            dtype = np.dtype(decl.dtype) if decl.dtype else None
        except TypeError:  # a name numpy does not know (BYTES): as numpy reads the values
            dtype = None
        try:
            out[decl.name] = encode_tensor(np.asarray(value, dtype=dtype))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"input {decl.name!r}: {exc}") from None
    return out


def load(spec):
    """``(InProcessModel, session)``: the version built as a worker builds it (the user's classes too)."""
    from aieng import envs
    from aieng.gpu_executor.sessions import ModelSession
    from aieng.tools.inprocess import InProcessModel

    model = InProcessModel(spec)
    return model, ModelSession(spec, "auto", min(4, envs.cpu_count()), False, stop_spinning=False)


def run_once(model, sess, sent: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The answer's outputs for one request (``RequestError`` as the server would answer it)."""
    from aieng.inputs import validate_inputs
    from aieng.wire.protocol import INVALID_INPUT, RequestError

    inputs = validate_inputs(model.spec, dict(sent))
    [encoded] = model.encode([inputs])
    if isinstance(encoded, Exception):  # a batchable processor's per-request failure
        raise encoded
    problem = sess.check_shapes([(name, arr.dtype, list(arr.shape)) for name, arr in encoded[0]])
    if problem:  # the executor's check of what preprocessing made, before the batch
        raise RequestError(INVALID_INPUT, problem)
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
    sent = as_sent(spec, sent)
    try:
        model, sess = load(spec)
    except Exception as exc:  # the user's code failed to import or to build: its traceback, then one line
        traceback.print_exc(file=sys.stderr)
        print(f"aieng: {spec.key} did not load: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        values = run_once(model, sess, sent, params)
    except RequestError as exc:
        trace = getattr(exc, "trace_text", None)
        if trace:  # a bug in the user's code: where it happened
            print(trace.rstrip(), file=sys.stderr)
        if exc.code == INVALID_INPUT:
            raise UsageError(f"{exc.code}: {exc.message}") from None
        print(f"aieng: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:  # past the checks: what the server would answer INTERNAL
        traceback.print_exc(file=sys.stderr)
        print(f"aieng: INTERNAL: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"model": spec.name, "version": spec.version, "outputs": jsonable(values)}, indent=2))
    return 0
