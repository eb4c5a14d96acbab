"""The API-key rules of the gRPC door, applied around a method once its caller's key is known (``guard.py``).

``authorization`` reads the call's ``authorization`` metadata (``Bearer KEY``, what tritonclient's
``headers=`` and KServe send).  ``admit`` and ``visible`` wrap a method for a key's holder: a model
outside its allow-list is answered as an unknown one (NOT_FOUND in Triton's words; ModelReady
``ready=false``), repository load/unload needs a key without an allow-list, and the repository index and
the statistics list only its models.  Only ``grpc.py`` imports this (after it has set ``GRPC_EXPERIMENTS``).
"""
from __future__ import annotations

import grpc

from aieng.gateway import models
from aieng.gateway.apikeys import Grant
from aieng.gateway.proto import grpc_service_pb2 as pb

UNDECODABLE = object()  # a request message that did not parse (the method answers INVALID_ARGUMENT)
# the request field naming the model, per method: a key's allow-list hides the others (``guard.py``)
MODEL_FIELD = {"ModelReady": ("name", "version"), "ModelMetadata": ("name", "version"),
               "ModelConfig": ("name", "version"), "ModelStatistics": ("name", "version"),
               "ModelInfer": ("model_name", "model_version")}
LISTS = {"RepositoryIndex": "models", "ModelStatistics": "model_stats"}  # answers a key sees a part of


def authorization(context) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == "authorization":
            return v
    return None


async def admit(name: str, request, context, grant: Grant):
    """Before method ``name`` runs for a key's holder: None to go on, else its answer (or an abort).  A
    model outside the allow-list is an unknown one; load/unload needs a key without a list.  (Returns
    before the method runs: an abort's traceback must not hold a frame that holds the request.)"""
    if grant.models is None:
        return None
    field = MODEL_FIELD.get(name)
    model = getattr(request, field[0]) if field is not None else ""
    if model and model not in grant.models:
        if name == "ModelReady":
            return pb.ModelReadyResponse(ready=False)
        await context.abort(grpc.StatusCode.NOT_FOUND,
                            models.unknown_model(model, getattr(request, field[1]) or None))
    if name in ("RepositoryModelLoad", "RepositoryModelUnload"):
        action = "load" if name == "RepositoryModelLoad" else "unload"
        await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                            f"repository {action} needs an API key without a model allow-list")
    return None


def visible(name: str, resp, grant: Grant):
    """The answer of ``name`` with only the models a key with an allow-list may see."""
    kept = LISTS.get(name)
    if kept is not None and grant.models is not None and resp is not None:
        entries = getattr(resp, kept)
        keep = [e for e in entries if e.name in grant.models]
        del entries[:]
        entries.extend(keep)
    return resp
