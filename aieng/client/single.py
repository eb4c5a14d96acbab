"""Python clients for aieng (protocol version 1) over one address: ``SingleClient``, ``AsyncSingleClient``.

``SingleClient``: blocking, one request at a time over a REQ socket (or a DEALER with ``dealer=True``,
which survives a lost reply).  ``AsyncSingleClient``: asyncio, many requests in flight over one DEALER,
replies matched by ``id`` (the request/reply core, ``core.py``).  Callers get them as ``Client`` and
``AsyncClient`` (``factory.py``, which also picks the replica forms for several endpoints; the replica
clients extend these two and share their request methods).  Inputs may be str, bytes, numbers, lists or numpy
arrays (sent as tensor maps); tensor maps in replies come back as numpy arrays.  Usage and what each
promises: docs/protocol.md ("The Python client"); replicas: docs/replicas.md.
"""
from __future__ import annotations

import itertools
import os
from typing import Any

import msgpack
import numpy as np
import zmq

from aieng.client.core import RpcCore
from aieng.wire.protocol import decode_tensor, encode_tensor

DEFAULT_ADDR = "tcp://127.0.0.1:5555"


def server_addr(addr: Any = None) -> Any:
    """The address a client uses: the one given, else ``$AIENG_FRONTEND_ADDR``, else ``DEFAULT_ADDR``."""
    return addr or os.environ.get("AIENG_FRONTEND_ADDR", DEFAULT_ADDR)


class ServerError(Exception):
    def __init__(self, code: str, message: str, reply: dict):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.reply = code, message, reply


def raise_for_error(reply: dict) -> None:
    """``ServerError`` for a reply that is not ``ok``."""
    if not reply.get("ok"):
        err = reply.get("error") or {}
        raise ServerError(err.get("code", "?"), err.get("message", ""), reply)


def _wire_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: encode_tensor(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()}


def decode_reply(raw: bytes, tensors: bool = True) -> dict:
    reply = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    if tensors and reply.get("ok") and isinstance(reply.get("outputs"), dict):
        reply["outputs"] = {k: decode_tensor(v) if isinstance(v, dict) and "dtype" in v else v
                            for k, v in reply["outputs"].items()}
    return reply


def build_request(req_id: Any, model: str, inputs: dict, version: str | None = None,
                  params: dict | None = None, timeout_ms: int | None = None,
                  routing_key: str | None = None, traceparent: str | None = None) -> dict:
    """``routing_key`` (e.g. a user id) keeps a caller on the same model version while the rollout's
    weights stand (docs/rollout.md); without it the request id is hashed.  ``traceparent``: the caller's
    W3C trace context (the answer's ``traceparent`` carries the server's span)."""
    req: dict[str, Any] = {"op": "infer", "id": req_id, "model": model, "inputs": _wire_inputs(inputs)}
    if version is not None:
        req["version"] = version
    if routing_key is not None:
        req["routing_key"] = routing_key
    if params:
        req["params"] = params
    if timeout_ms is not None:
        req["timeout_ms"] = timeout_ms
    if traceparent is not None:
        req["traceparent"] = traceparent
    return req


def apply_curve(sock: zmq.Socket, curve: tuple[bytes, bytes, bytes] | None) -> None:
    """``curve = (client_public, client_secret, server_public)`` (z85 keys, e.g. from zmq.auth)."""
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve


class SingleClient:
    def __init__(self, addr: str | None = None, timeout_s: float = 30.0, dealer: bool = False,
                 curve: tuple[bytes, bytes, bytes] | None = None):
        self.addr = server_addr(addr)
        self.timeout_s = timeout_s
        self.ctx = zmq.Context.instance()
        self.dealer = dealer
        self.curve = curve
        self.sock = None
        self.ids = itertools.count(1)
        self._connect()

    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
        self.sock = self.ctx.socket(zmq.DEALER if self.dealer else zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        # a DEALER with no connected peer (say, its CURVE handshake refused) blocks in send: bound it too
        self.sock.setsockopt(zmq.SNDTIMEO, int(self.timeout_s * 1000))
        apply_curve(self.sock, self.curve)
        self.sock.connect(self.addr)

    def call(self, request: dict, raise_on_error: bool = True) -> dict:
        try:
            if self.dealer:
                self.sock.send_multipart([b"", msgpack.packb(request, use_bin_type=True)])
            else:
                self.sock.send(msgpack.packb(request, use_bin_type=True))
        except zmq.Again:  # no peer took it within the timeout
            self._connect()
            raise TimeoutError(f"could not send to {self.addr} within {self.timeout_s}s") from None
        while True:
            if not self.sock.poll(int(self.timeout_s * 1000)):
                self._connect()  # a REQ socket cannot send again until it receives
                raise TimeoutError(f"no reply from {self.addr} within {self.timeout_s}s")
            frames = self.sock.recv_multipart()
            reply = decode_reply(frames[-1])
            if not self.dealer or reply.get("id") == request.get("id"):
                break  # a DEALER may see a late reply to an earlier, timed-out call: skip it
        if raise_on_error:
            raise_for_error(reply)
        return reply

    def infer(self, model: str, inputs: dict, **kw: Any) -> dict:
        raise_on_error = kw.pop("raise_on_error", True)
        return self.call(build_request(next(self.ids), model, inputs, **kw), raise_on_error)

    def health(self) -> dict:
        return self.call({"op": "health", "id": next(self.ids)})

    def models(self) -> dict:
        return self.call({"op": "models", "id": next(self.ids)})

    def close(self) -> None:
        self.sock.close(0)

    def __enter__(self) -> "SingleClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncSingleClient:
    """Many requests in flight over one DEALER socket; replies in any order (the request/reply core,
    ``core.py``: a late reply is dropped, ``close`` fails what is pending with ``RpcClosed``)."""

    def __init__(self, addr: str | None = None, timeout_s: float = 30.0,
                 curve: tuple[bytes, bytes, bytes] | None = None):
        self.addr = server_addr(addr)
        self.timeout_s = timeout_s
        self.core = RpcCore(self.addr, curve, decode_reply)
        self.ids = itertools.count(1)

    async def call(self, request: dict, raise_on_error: bool = True) -> dict:
        """The reply to ``request`` (its ``id`` is kept; one is added when absent); ``TimeoutError`` after
        ``timeout_s``."""
        reply = await self.core.call(request, self.timeout_s)
        if raise_on_error:
            raise_for_error(reply)
        return reply

    async def infer(self, model: str, inputs: dict, **kw: Any) -> dict:
        raise_on_error = kw.pop("raise_on_error", True)
        return await self.call(build_request(next(self.ids), model, inputs, **kw), raise_on_error)

    async def health(self) -> dict:
        return await self.call({"op": "health", "id": next(self.ids)})

    def close(self) -> None:
        self.core.close()
