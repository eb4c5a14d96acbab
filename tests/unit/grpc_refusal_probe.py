"""Run as ``python -m tests.unit.grpc_refusal_probe`` by ``test_oip_grpc_refusal.py``: a process of its own,
because the gateway's compiled protos and tritonclient's (which the e2e tests import) cannot share one
protobuf descriptor pool.  Prints one JSON line: per case, the handler frames still holding the request.

A refused gRPC request leaves no reference cycle behind (issue 20, finding 5).

In the gateway a cycle that holds a request keeps tens of MB until a full collection. Here the collector is
switched off and every object it would find is kept (``DEBUG_SAVEALL``), so a frame in that list that holds
the request is the leak itself, whatever the allocator does with RSS (the e2e test measures RSS)."""

from __future__ import annotations

import asyncio
import gc
import json
import types

from aieng.gateway.decode import Decoder
from aieng.gateway.grpc import Servicer, _handlers, pb


class Aborted(Exception):
    pass


class Context:
    """What the handler uses of ``grpc.aio.ServicerContext``: ``abort`` raises, as grpc's does."""

    def __init__(self):
        self.status: tuple | None = None

    def time_remaining(self):
        return None

    def peer(self):
        return "ipv4:127.0.0.1:50000"

    async def abort(self, code, message):
        self.status = (code, message)
        raise Aborted(message)


def servicer() -> Servicer:
    # decoding is all it reaches
    return Servicer(service=types.SimpleNamespace(decoder=Decoder(), shm=None), local=(None, 0))


def refused_request() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="tabular")
    req.inputs.add(name="island", datatype="BYTES", shape=[1])
    req.raw_input_contents.append(b"\0" * 4096)  # 1024 empty elements for a shape of one: refused
    return req


def requests_held_after(call) -> list[str]:
    """The handler frames that a reference cycle keeps and that still hold the request."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        call()
        gc.collect()
        return [f"{o.f_code.co_name}:{name}" for o in gc.garbage if isinstance(o, types.FrameType)
                for name, value in o.f_locals.items() if isinstance(value, pb.ModelInferRequest)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def servicer_case() -> tuple[list[str], str]:
    ctx = Context()

    def call():
        try:
            asyncio.run(servicer().ModelInfer(refused_request(), ctx))
        except Aborted:
            pass

    return requests_held_after(call), str(ctx.status and ctx.status[0].name)


def registered_case() -> tuple[list[str], str]:
    ctx = Context()
    handler = _handlers(servicer()).service(
        types.SimpleNamespace(method="/inference.GRPCInferenceService/ModelInfer"))

    def call():
        try:
            asyncio.run(handler.unary_unary(refused_request(), ctx))
        except Aborted:
            pass

    return requests_held_after(call), str(ctx.status and ctx.status[0].name)


if __name__ == "__main__":
    print(json.dumps({"servicer": servicer_case(), "registered": registered_case()}))
