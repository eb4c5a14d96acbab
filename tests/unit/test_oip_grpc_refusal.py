"""A refused gRPC request leaves no reference cycle behind (issue 20, finding 5).

In the gateway a cycle that holds a request keeps tens of MB until a full collection. Here the collector is
switched off and every object it would find is kept (``DEBUG_SAVEALL``), so a frame in that list that holds
the request is the leak itself, whatever the allocator does with RSS (the e2e test measures RSS)."""

from __future__ import annotations

import asyncio
import gc
import types

import grpc

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

    async def abort(self, code, message):
        self.status = (code, message)
        raise Aborted(message)


def servicer() -> Servicer:
    return Servicer(service=types.SimpleNamespace(decoder=Decoder()))  # decoding is all it reaches


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


def test_a_refused_infer_leaves_no_frame_in_a_cycle():
    ctx = Context()

    def call():
        try:
            asyncio.run(servicer().ModelInfer(refused_request(), ctx))
        except Aborted:
            pass

    assert requests_held_after(call) == []
    assert ctx.status is not None and ctx.status[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_the_registered_method_drops_the_request_too():
    ctx = Context()
    handler = _handlers(servicer()).service(
        types.SimpleNamespace(method="/inference.GRPCInferenceService/ModelInfer"))

    def call():
        try:
            asyncio.run(handler.unary_unary(refused_request(), ctx))
        except Aborted:
            pass

    assert requests_held_after(call) == []
    assert ctx.status is not None and ctx.status[0] == grpc.StatusCode.INVALID_ARGUMENT
