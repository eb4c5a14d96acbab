"""The OIP gateway's own Python per infer request, in process (issue 35, "the OIP doors"): what its code costs
with no socket, no loop wake-up and no grpc.aio around it.

    PYTHONPATH=/tmp/before .venv/bin/python docs/bench/gateway_hot_path.py   # a tree's code
    PYTHONPATH=. .venv/bin/python docs/bench/gateway_hot_path.py

The gRPC ``Servicer.ModelInfer`` (request parsed from bytes, answer serialized) and the HTTP
``OipHttp.handle`` (binary extension) for one minilm-like text row, through the real ``Service`` and
``Upstream``, whose request/reply core is replaced by one that packs the native request and decodes a real
reply (a 384-float tensor) with the real ``decode_reply``.  Printed: process CPU per request, median and range
of 7 rounds of 3000.  Hot caches: in the server the same code runs after a wake-up, several times slower
(``gateway_cpu_ab.py`` measures that).
"""
from __future__ import annotations

import asyncio
import logging
import os
import statistics
import struct
import sys
import time

import msgpack
import numpy as np

sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(":")[0] or ".")

from aieng.client import decode_reply  # noqa: E402
from aieng.gateway import grpc as g  # noqa: E402
from aieng.gateway import http as h  # noqa: E402
from aieng.gateway.budget import PeerBudget  # noqa: E402
from aieng.gateway.decode import Decoder  # noqa: E402
from aieng.gateway.models import Catalog  # noqa: E402
from aieng.gateway.proto import grpc_service_pb2 as pb  # noqa: E402
from aieng.gateway.service import Service  # noqa: E402
from aieng.gateway.upstream import Upstream  # noqa: E402
from aieng.httpcore.server import Peer  # noqa: E402
from aieng.wire import protocol as p  # noqa: E402

REPLY = msgpack.packb({"id": 5, "ok": True, "model": "minilm", "version": "2",
                       "outputs": {"embedding": p.encode_tensor(np.random.rand(384).astype(np.float32))},
                       "timing": {"total": 1234, "queue": 12, "pre": 100, "exec": 1000, "post": 50},
                       "batch": 1, "trace_id": "ab" * 16, "route": "weights"}, use_bin_type=True)
TEXT = b"a sentence of some ordinary length for minilm to embed " * 2
MODELS = {"minilm": {"default_version": "2", "versions": {"2": {
    "version": "2", "max_batch_size": 32, "timeout_ms": 10000, "inputs": [{"name": "text", "kind": "text"}],
    "outputs": [{"name": "embedding", "kind": "tensor", "dtype": "float32", "shape": [384]}]}}}}


class Core:
    """The request/reply core without a socket: packs the request, answers ``REPLY`` decoded."""
    in_flight = 0

    async def call(self, request: dict, wait_s: float) -> dict:
        msgpack.packb(request, use_bin_type=True)
        return decode_reply(REPLY)


class Context:
    """What ``ModelInfer`` asks of grpc.aio's servicer context."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:45678"

    def invocation_metadata(self) -> tuple:
        return ()

    def time_remaining(self) -> float:
        return 59.9

    def set_trailing_metadata(self, md) -> None:
        pass

    async def abort(self, code, message) -> None:
        raise RuntimeError(message)


async def main() -> None:
    catalog = Catalog()
    catalog.update(MODELS)
    up = Upstream("tcp://127.0.0.1:1", catalog, 10000, logging.getLogger("hot"), None, "t" * 43)
    up.core.close()
    up.core = Core()
    up.models_event.set()
    up.listed = True
    svc = Service(up, PeerBudget(1000), Decoder())
    servicer, ctx = g.Servicer(svc, (None, 8001)), Context()
    req = pb.ModelInferRequest(model_name="minilm")
    req.inputs.add(name="text", datatype="BYTES", shape=[1])
    req.raw_input_contents.append(struct.pack("<I", len(TEXT)) + TEXT)
    data = req.SerializeToString()
    head = (b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],'
            b'"parameters":{"binary_data_size":%d}}],'
            b'"parameters":{"binary_data_output":true}}' % (len(TEXT) + 4))
    body = head + struct.pack("<I", len(TEXT)) + TEXT
    headers = {"inference-header-content-length": str(len(head)), "content-length": str(len(body))}
    oip, peer = h.OipHttp(svc), Peer("127.0.0.1", 45678, "127.0.0.1", 8000)

    async def grpc_one():
        resp = await servicer.ModelInfer(pb.ModelInferRequest.FromString(data), ctx)
        return resp.SerializeToString()

    async def http_one():
        return await oip.handle("POST", "/v2/models/minilm/infer", "", headers, body, peer)

    for name, fn in (("grpc", grpc_one), ("http", http_one)):
        xs = []
        for _ in range(7):
            n, t = 3000, time.process_time()
            for _ in range(n):
                await fn()
            xs.append((time.process_time() - t) / n * 1e6)
        print(f"{name}: median {statistics.median(xs):.1f} us/request (min {min(xs):.1f}, max {max(xs):.1f})")
    svc.decoder.close()


if __name__ == "__main__":
    asyncio.run(main())
