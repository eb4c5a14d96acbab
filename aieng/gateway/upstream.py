"""The gateway's one connection to the frontend: a ZMQ DEALER, like any native client.

Many requests are in flight on it at once; each is one msgpack map in one frame with a gateway-unique
integer ``id``, and the reply is matched by that id.  The socket is a plain (not ``zmq.asyncio``) one
whose file descriptor the event loop watches: a send is one non-blocking call (the DEALER queues without
limit, bounded by what the gateway holds), and the reader drains every waiting reply per wake-up; the
profile showed zmq.asyncio's per-send future and event bookkeeping costing more than the send itself.
ZMQ's descriptor is edge-triggered, so the loop drains again after every send too.

The frontend answers every request by its deadline, so a reply that never comes means the frontend
died (its table is lost): a timer fails the request UNAVAILABLE ``GRACE_S`` after its deadline and a
late reply is dropped.

A background task asks ``health`` every ``HEALTH_S`` and ``models`` every ``REFRESH_S`` (both answered
from the frontend's state at the cost of a lookup, well under its per-client op rate limit), so
liveness, readiness and metadata never wait for the frontend, and model changes show within seconds.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import msgpack
import zmq

from aieng.client import decode_reply
from aieng.gateway.models import Catalog
from aieng.wire.protocol import UNAVAILABLE, RequestError

GRACE_S = 2.0
HEALTH_S = 0.5
REFRESH_S = 2.0
FRESH_S = 3.0  # a health reply older than this: the frontend is unreachable (not live, not ready)


class Upstream:
    def __init__(self, addr: str, catalog: Catalog, default_timeout_ms: int, log: logging.Logger,
                 curve: tuple[bytes, bytes, bytes] | None = None):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)  # bounded by the requests the gateway holds, not a queue size
        self.sock.setsockopt(zmq.RCVHWM, 0)
        if curve is not None:
            self.sock.curve_publickey, self.sock.curve_secretkey, self.sock.curve_serverkey = curve
        self.sock.connect(addr)
        self.catalog, self.default_timeout_ms, self.log = catalog, default_timeout_ms, log
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future] = {}
        self.health: dict = {}
        self.health_at = float("-inf")
        self.models_event = asyncio.Event()  # set once a list was taken while the server was ready
        self.listed = False  # any list taken
        self.tasks: list[asyncio.Task] = []
        self.requests = 0
        self.fd = self.sock.getsockopt(zmq.FD)
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.fd, self._drain)
        self.tasks = [self.loop.create_task(self._poll())]

    def _drain(self) -> None:
        while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                reply = decode_reply(frames[-1].buffer)
            except Exception as exc:  # never the gateway's death
                self.log.error("undecodable reply from the frontend skipped: %s", exc)
                continue
            fut = self.waiting.pop(reply.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(reply)

    def _expire(self, rid: int) -> None:
        fut = self.waiting.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(RequestError(UNAVAILABLE, "no answer from the frontend (restarting?)"))

    async def call(self, request: dict, wait_s: float) -> dict:
        """Send one native request; its reply map (``ok`` true or false), or UNAVAILABLE after ``wait_s``."""
        rid = next(self.ids)
        request["id"] = rid
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.waiting[rid] = fut
        timer = loop.call_later(wait_s, self._expire, rid)
        try:
            self.sock.send(msgpack.packb(request, use_bin_type=True), zmq.NOBLOCK)
            loop.call_soon(self._drain)  # the send may have consumed the descriptor's edge
            return await fut
        except zmq.ZMQError as exc:
            raise RequestError(UNAVAILABLE, f"cannot reach the frontend: {exc}") from None
        finally:
            timer.cancel()
            self.waiting.pop(rid, None)

    async def infer(self, model: str, version: str | None, inputs: dict, params: dict | None,
                    timeout_ms: int | None, model_timeout_ms: int = 0) -> dict:
        req: dict[str, Any] = {"op": "infer", "model": model, "inputs": inputs}
        if version:
            req["version"] = version
        if params:
            req["params"] = params
        if timeout_ms is not None:
            req["timeout_ms"] = timeout_ms
        self.requests += 1
        budget = timeout_ms or model_timeout_ms or self.default_timeout_ms
        return await self.call(req, budget / 1000.0 + GRACE_S)

    async def op(self, name: str, **fields: Any) -> dict:
        return await self.call({"op": name, **fields}, GRACE_S + 1.0)

    async def _poll(self) -> None:
        next_models, listed_ready = 0.0, False
        while True:
            try:
                h = await self.op("health")
                ready = bool(h.get("ok") and h.get("ready"))
                if h.get("ok"):
                    self.health, self.health_at = h, time.monotonic()
                # a list taken before the server was ready may lack the executor's session facts
                # (shapes, dtypes): take it again as soon as the server says ready
                if time.monotonic() >= next_models or (ready and not listed_ready):
                    reply = await self.op("models")
                    if reply.get("ok"):
                        self.catalog.update(reply["models"])
                        self.listed = True
                        if ready:  # a complete list: what metadata requests wait for
                            self.models_event.set()
                        next_models, listed_ready = time.monotonic() + REFRESH_S, ready
            except RequestError:
                pass  # the frontend is away: health goes stale, and the next round asks again
            except Exception:  # pragma: no cover - a bug here must not stop the polling
                self.log.exception("polling the frontend failed")
            await asyncio.sleep(HEALTH_S)

    async def refresh(self) -> None:
        """Take the model list now (after a repository change)."""
        try:
            reply = await self.op("models")
        except RequestError:
            return
        if reply.get("ok"):
            self.catalog.update(reply["models"])

    async def wait_models(self, timeout_s: float = 3.0) -> bool:
        """Wait for a list taken while the server was ready; after ``timeout_s`` (a server that stays
        not ready) any list will do."""
        if not self.models_event.is_set():
            try:
                await asyncio.wait_for(self.models_event.wait(), timeout_s)
            except asyncio.TimeoutError:
                return self.listed
        return True

    async def is_live(self) -> bool:
        if not self.live:
            await self._fresh()
        return self.live

    async def is_ready(self) -> bool:
        """Readiness, asking the frontend afresh when the last word was "not ready" (so a probe sees a
        change at once; a flood of such probes is bounded by the frontend's op rate limit)."""
        if not self.ready:
            await self._fresh()
        return self.ready

    async def _fresh(self) -> None:
        try:
            h = await self.call({"op": "health"}, 1.0)
        except RequestError:
            return
        if h.get("ok"):
            self.health, self.health_at = h, time.monotonic()

    @property
    def live(self) -> bool:
        return time.monotonic() - self.health_at <= FRESH_S

    @property
    def ready(self) -> bool:
        return self.live and bool(self.health.get("ready"))

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        if self.loop is not None:
            self.loop.remove_reader(self.fd)
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(RequestError(UNAVAILABLE, "the gateway is stopping"))
        self.sock.close(0)
        self.ctx.term()
