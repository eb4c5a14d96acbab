"""A client's request frame as preprocessing reads it, wherever that runs (a preprocess worker, the
executor's ``inline_pre``): ``read_request(spec, body, max_bytes) -> (inputs, params)``.

The frame is unpacked under ``max_bytes`` (``wire.protocol.unpack_limited``), its ``inputs`` checked
against the model's declared ones (``inputs.validate_inputs``: a ``RequestError`` with the code the client
gets), and its ``params`` passed on as sent (``{}`` when absent) for postprocessing.  ``with_arrays``: the
inputs as user code gets them (``pre`` and a python ``post``), each declared tensor input as its array.
"""
from __future__ import annotations

from typing import Any

from aieng.inputs import validate_inputs
from aieng.models.repo import ModelSpec
from aieng.wire.protocol import decode_tensor, unpack_limited


def read_request(spec: ModelSpec, body, max_bytes: int) -> tuple[dict[str, Any], dict]:
    """``(inputs, params)`` of one request frame, the inputs checked (``RequestError``)."""
    req = unpack_limited(body, max_bytes)
    return validate_inputs(spec, req.get("inputs")), req.get("params") or {}


def with_arrays(tensors: tuple[str, ...], inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` with each input named in ``tensors`` (the declared ``tensor`` ones) decoded from its wire
    map to its numpy array (a read-only view of the frame), in place."""
    for name in tensors:
        if name in inputs:
            inputs[name] = decode_tensor(inputs[name], f"input '{name}'")
    return inputs
