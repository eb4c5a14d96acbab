"""The gateway's one connection to the frontend: a ZMQ DEALER, like any native client.

Many requests are in flight on it at once, through the request/reply core (``client/core.py``: ids,
the pending map, the reader on the socket's descriptor, timers; the profile showed zmq.asyncio's
per-send bookkeeping costing more than the send itself, hence the descriptor).  The frontend answers
every request by its deadline, so a reply that never comes means the frontend died (its table is
lost): the request fails UNAVAILABLE ``GRACE_S`` after its deadline and a late reply is dropped.

A background task asks ``health`` every ``HEALTH_S`` and ``models`` every ``REFRESH_S`` (both answered
from the frontend's state at the cost of a lookup, well under its per-client op rate limit), so
liveness, readiness and metadata never wait for the frontend, and model changes show within seconds.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aieng.client import decode_reply
from aieng.client.core import RpcClosed, RpcCore, RpcError, RpcFull, RpcTimeout, RpcUnsent
from aieng.gateway.models import Catalog
from aieng.wire.protocol import OVERLOADED, UNAVAILABLE, RequestError

GRACE_S = 2.0
HEALTH_S = 0.5
REFRESH_S = 2.0
FRESH_S = 3.0  # a health reply older than this: the frontend is unreachable (not live, not ready)


# the request/reply core's failures as the gateway answers them
FAILS = {RpcTimeout: (UNAVAILABLE, "no answer from the frontend (restarting?)"),
         RpcClosed: (UNAVAILABLE, "the gateway is stopping"),
         RpcFull: (OVERLOADED, "too many requests in flight to the frontend")}


class Upstream:
    def __init__(self, addr: str, catalog: Catalog, default_timeout_ms: int, log: logging.Logger,
                 curve: tuple[bytes, bytes, bytes] | None = None, token: str = ""):
        """``token``: the gateways' secret (``Config.gateway_token``); a request carries it beside its OIP
        peer's address (``via``), so the frontend counts the request as that peer's, not the gateway's."""
        self.token = token
        self.core = RpcCore(addr, curve, decode_reply, log=log)
        self.catalog, self.default_timeout_ms, self.log = catalog, default_timeout_ms, log
        self.health: dict = {}
        self.health_at = float("-inf")
        self.models_event = asyncio.Event()  # set once a list was taken while the server was ready
        self.listed = False  # any list taken
        self.tasks: list[asyncio.Task] = []
        self.requests = 0

    def start(self) -> None:
        self.core.start()
        self.tasks = [asyncio.get_running_loop().create_task(self._poll())]

    @property
    def in_flight(self) -> int:
        return self.core.in_flight

    async def call(self, request: dict, wait_s: float) -> dict:
        """Send one native request; its reply map (``ok`` true or false), or UNAVAILABLE after ``wait_s``."""
        try:
            return await self.core.call(request, wait_s)
        except RpcUnsent as exc:
            raise RequestError(UNAVAILABLE, f"cannot reach the frontend: {exc}") from None
        except RpcError as exc:
            code, message = FAILS[type(exc)]
            raise RequestError(code, message) from None

    async def infer(self, model: str, version: str | None, inputs: dict, params: dict | None,
                    timeout_ms: int | None, model_timeout_ms: int = 0, trace: dict | None = None,
                    peer: str = "") -> dict:
        req: dict[str, Any] = {"op": "infer", "model": model, "inputs": inputs}
        if self.token and peer:  # whose request this is (the drift reference counts clients by it)
            req["via"] = {"token": self.token, "peer": peer}
        if trace:  # traceparent / tracestate / trace_id (``traceparent.native_fields``)
            req.update(trace)
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
                due = time.monotonic() >= next_models or (ready and not listed_ready)
                if due and await self._list(ready):
                    next_models, listed_ready = time.monotonic() + REFRESH_S, ready
            except RequestError:
                pass  # the frontend is away: health goes stale, and the next round asks again
            except Exception:  # pragma: no cover - a bug here must not stop the polling
                self.log.exception("polling the frontend failed")
            await asyncio.sleep(HEALTH_S)

    async def _list(self, ready: bool) -> bool:
        """Take the model list into the catalog; whether the frontend gave one.  Its own frame, so the reply
        (every version's whole public view, ~8 KiB each) is not kept by the polling loop between rounds."""
        reply = await self.op("models")
        if not reply.get("ok"):
            return False
        self.catalog.update(reply["models"])
        self.listed = True
        if ready:  # a complete list: what metadata requests wait for
            self.models_event.set()
        return True

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
        self.core.close()  # fails what is pending: "the gateway is stopping"
