"""``AsyncClient`` over several replicas: ``AsyncClient([...])`` becomes ``AsyncReplicaClient``.

One request/reply core (``core.py``) per concrete endpoint, with ``ZMQ_IMMEDIATE`` and a connection-state
callback: a handshake asks for a probe, a lost connection marks the endpoint down and fails its in-flight
requests (``RpcLost``).  Endpoints take requests once a ``health`` probe says ready; a background task
probes (down ones with backoff, up ones every ``probe_every_s``) and re-resolves DNS names.  Every request
gets exactly one reply by its deadline (``timeout_ms / 1000 + margin_s``, at most ``timeout_s``), carrying
``endpoint``; the client's own have ``client_error``: ``UNAVAILABLE`` (``lost``, ``no_replica``) or
``TIMEOUT`` (``deadline``).  A ``lost`` or ``UNAVAILABLE`` answer is retried at most ``retries`` times on
another up replica while the deadline allows (``retried_from``).  ``close`` fails waiting calls
(``RpcClosed``).  The full contract: docs/replicas.md; selection and health state: ``endpoints.py``.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import zmq

from aieng.client.core import RpcClosed, RpcCore, RpcError, RpcLost, RpcTimeout, RpcUnsent
from aieng.client.endpoints import client_error, expand
from aieng.client.replica_base import ReplicaBase, judge
from aieng.client.single import AsyncSingleClient, decode_reply


class AsyncReplicaClient(ReplicaBase, AsyncSingleClient):
    """``AsyncClient`` over several replicas (see the module docstring)."""

    def __init__(self, addr: Any = None, timeout_s: float = 30.0, curve: Any = None, **opts: Any):
        self.cores: dict[str, RpcCore] = {}  # one per concrete endpoint
        self._setup(addr, timeout_s, curve, zmq.Context.instance(), **opts)
        self.maintainer: asyncio.Task | None = None
        self.background: set[asyncio.Task] = set()
        self.closed = False

    def open_endpoint(self, a: str) -> None:
        self.cores[a] = RpcCore(a, self.curve, decode_reply, ctx=self.ctx, sockopts=self.sockopts(),
                                on_state=lambda up: self._state(a, up))

    def shut_endpoint(self, a: str) -> None:
        core = self.cores.pop(a, None)
        if core is not None:
            core.close()

    def _start(self) -> None:
        if self.closed:
            raise RpcClosed(f"the client over {self.addr} is closed")
        if self.maintainer is None:
            self.maintainer = asyncio.get_running_loop().create_task(self._maintain())
        for core in self.cores.values():
            core.start()

    def _state(self, addr: str, connected: bool) -> None:
        """The monitor of ``addr``'s core saw a handshake (messages can flow: probe) or a lost connection
        (its in-flight requests' replies can no longer come: each gets ``UNAVAILABLE`` naming it)."""
        now = time.monotonic()
        if connected:
            self.set.probe_soon(addr, now)
            return
        self.set.mark_down(addr, now, "connection lost")
        why = self.lost(addr, "connection lost (replica gone or restarting)")["message"]
        core = self.cores.get(addr)
        if core is not None:
            core.fail_pending(lambda: RpcLost(why))

    async def _maintain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = time.monotonic()
            for ep in self.set.due(now):
                ep.probing = True
                task = loop.create_task(self._probe(ep.addr))
                self.background.add(task)
                task.add_done_callback(self.background.discard)
            if now >= self.next_resolve:
                self.next_resolve = now + self.resolve_every_s
                resolved = await loop.run_in_executor(
                    None, lambda: expand(self.configured, self.resolver, self.ipv6, self.resolved))
                self.apply_resolution(resolved, time.monotonic())
                self._start()
            for a in self.set.closable():
                self.close_endpoint(a)
            await asyncio.sleep(0.05)

    async def _ask(self, addr: str, request: dict, timeout_s: float) -> dict | None:
        """One request to one endpoint, waiting (within ``timeout_s``) for its connection first: its reply,
        a ``lost`` client error, or None when none came in time."""
        core, deadline = self.cores[addr], time.monotonic() + timeout_s
        while True:
            try:
                reply = await core.call(request, max(0.0, deadline - time.monotonic()))
            except RpcUnsent:  # not connected (yet): ZMQ_IMMEDIATE refused the send
                if time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
                continue
            except RpcLost as exc:
                return client_error(request["id"], "UNAVAILABLE", str(exc), addr, "lost")
            except RpcError:
                return None
            reply["endpoint"] = addr
            return reply

    async def _probe(self, addr: str) -> None:
        try:
            reply = await self._ask(addr, {"op": "health", "id": f"aieng-probe-{next(self.probe_ids)}"},
                                    self.probe_timeout_s)
            why = judge(reply, self.probe_timeout_s)
            if why is None:
                self.set.probe_ok(addr, time.monotonic())
            else:
                self.set.mark_down(addr, time.monotonic(), why)
        finally:
            ep = self.set.eps.get(addr)
            if ep is not None:
                ep.probing = False

    async def _exchange(self, addr: str, request: dict, deadline: float) -> dict:
        ep, err = self.set.eps[addr], client_error
        ep.in_flight += 1
        try:
            try:
                reply = await self.cores[addr].call(request, max(0.0, deadline - time.monotonic()))
            except RpcUnsent:
                self.set.mark_down(addr, time.monotonic(), "not connected")
                return err(request["id"], "UNAVAILABLE", f"replica {addr} is not connected", addr, "unsent")
            except RpcLost as exc:
                return err(request["id"], "UNAVAILABLE", str(exc), addr, "lost")
            except RpcTimeout:
                self.set.probe_soon(addr, time.monotonic())
                why = f"no reply from replica {addr} before the client deadline"
                return err(request["id"], "TIMEOUT", why, addr, "deadline")
            reply["endpoint"] = addr
            if (reply.get("error") or {}).get("code") == "UNAVAILABLE":
                self.set.probe_soon(addr, time.monotonic())  # draining or restarting: let a probe decide
            ep.served += 1
            return reply
        finally:
            ep.in_flight -= 1

    async def _pick(self, deadline: float) -> str | None:
        while True:
            ep = self.set.pick()
            if ep is not None or time.monotonic() >= deadline:
                return ep.addr if ep is not None else None
            await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    async def call(self, request: dict, raise_on_error: bool = True) -> dict:
        self._start()
        rid = request.get("id")
        deadline = time.monotonic() + self.deadline_s(request)
        tried: list[str] = []
        addr = await self._pick(deadline)
        while True:
            if addr is None:
                reply = self.no_replica(rid)
                break
            reply = await self._exchange(addr, request, deadline)
            if reply.get("client_error") == "unsent":  # nothing was sent: not a try
                addr = await self._pick(deadline)
                continue
            step = self.next_try(reply, request, deadline, tried, addr)
            if step is None:
                break
            request, addr = step
        return self.finish(reply, tried, raise_on_error)

    async def wait_ready(self, timeout_s: float = 10.0, every: bool = False) -> dict[str, str]:
        """Wait (at most ``timeout_s``) until one endpoint, or ``every`` one, is up; returns
        ``endpoints()``."""
        self._start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self.endpoints().values()
            if (all if every else any)(s == "up" for s in states):
                break
            await asyncio.sleep(0.02)
        return self.endpoints()

    async def health(self) -> dict:
        """Every endpoint's own ``health`` reply (None when it did not answer within ``probe_timeout_s``);
        ``ok`` when at least one is ready."""
        self._start()
        addrs = list(self.cores)
        asks = [self._ask(a, {"op": "health", "id": f"aieng-health-{next(self.ids)}"}, self.probe_timeout_s)
                for a in addrs]
        replies = await asyncio.gather(*asks)
        eps = dict(zip(addrs, replies))
        return {"ok": any(judge(r, 0) is None for r in eps.values()), "endpoints": eps}

    def close(self) -> None:
        """Stop probing and resolving; requests still waiting fail with ``RpcClosed`` (idempotent)."""
        self.closed = True
        for task in [self.maintainer, *self.background]:
            if task is not None:
                task.cancel()
        for a in list(self.cores):
            self.close_endpoint(a)

