"""Clients over several aieng replicas: ``Client([...])`` and ``AsyncClient([...])`` become these classes.

Contract (user docs: docs/replicas.md; selection, health state and DNS expansion: aieng/replicas.py):

* One DEALER socket per concrete endpoint (``ZMQ_IMMEDIATE``: nothing is queued for an endpoint that is not
  connected), each with a socket monitor. A DNS name is re-resolved every ``resolve_every_s``.
* An endpoint takes requests only after a ``health`` probe (timeout ``probe_timeout_s``) answered ``ready``.
  A lost TCP connection (the monitor's DISCONNECTED: the replica died or its frontend restarted), a failed
  probe, or a send that finds no connection marks it down; down endpoints are probed with backoff and come
  back when ready. ``AsyncClient`` also probes up endpoints every ``probe_every_s`` (a hung replica drops
  out); the blocking ``Client`` probes only down ones, when a call finds them due.
* Every request gets exactly one reply. Its deadline is ``timeout_ms / 1000 + margin_s`` when it has
  ``timeout_ms`` (never more than ``timeout_s``), else ``timeout_s``. Replies made by the client itself carry
  ``client_error`` and ``endpoint``, raised as ``ServerError`` unless ``raise_on_error=False``:
  ``UNAVAILABLE`` when the connection to the replica holding the request was lost (the message names it) or
  no replica was ready until the deadline; ``TIMEOUT`` when the deadline passed with no reply.
* Retry: at most ``retries`` (default 1) more tries, each on another replica that is up at that moment,
  only when the reply never came because the connection was lost, or the replica answered ``UNAVAILABLE``,
  and only when the deadline leaves time (the retried request's ``timeout_ms`` is cut to what is left).
  Never after a missed deadline. A retried reply has ``retried_from`` (the endpoints tried before).
  Every reply of a replica client has ``endpoint``: the replica that gave it.
"""
from __future__ import annotations

import asyncio
import itertools
import socket
import time
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from aieng.client import AsyncClient, ServerError, apply_curve, decode_reply, server_addr
from aieng.replicas import Backoff, EndpointSet, client_error, expand, should_retry, split_addrs

EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class _Replicas:
    """What both clients share: options, the endpoint set, sockets, deadlines and the retry rule."""

    def _setup(self, addr: Any, timeout_s: float, curve: Any, ctx: zmq.Context, retries: int = 1,
               margin_s: float = 1.0, probe_timeout_s: float = 1.0, probe_every_s: float = 2.0,
               resolve_every_s: float = 30.0, backoff: Backoff | None = None, ipv6: bool = False,
               resolver: Any = socket.getaddrinfo) -> None:
        addr = server_addr(addr)
        self.configured = split_addrs(addr) or [addr]
        self.addr = ",".join(self.configured)
        self.timeout_s, self.curve, self.ctx = timeout_s, curve, ctx
        self.retries, self.margin_s = retries, margin_s
        self.probe_timeout_s, self.resolve_every_s, self.ipv6, self.resolver = (
            probe_timeout_s, resolve_every_s, ipv6, resolver)
        self.set = EndpointSet(backoff or Backoff(), probe_every_s)
        self.socks: dict[str, zmq.Socket] = {}
        self.mons: dict[str, zmq.Socket] = {}
        self.ids = itertools.count(1)
        self.probe_ids = itertools.count(1)
        self.resolved: dict[str, list[str]] = {}
        self.next_resolve = 0.0
        self.apply_resolution(expand(self.configured, resolver, ipv6), time.monotonic())

    def apply_resolution(self, resolved: dict[str, list[str]], now: float) -> None:
        self.resolved = resolved
        empty = any(not eps for eps in resolved.values())  # a name with no address yet: ask again soon
        self.next_resolve = now + (min(1.0, self.resolve_every_s) if empty else self.resolve_every_s)
        added, _ = self.set.update([e for eps in resolved.values() for e in eps], now)
        for a in added:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.IMMEDIATE, 1)  # a message for an unconnected replica fails now, is not queued
            if self.ipv6:
                s.setsockopt(zmq.IPV6, 1)
            apply_curve(s, self.curve)
            self.mons[a] = s.get_monitor_socket(EVENTS)  # before connect: no event is missed
            s.connect(a)
            self.socks[a] = s
        for a in self.set.closable():
            self.close_endpoint(a)

    def close_endpoint(self, a: str) -> None:
        self.set.remove(a)
        mon, s = self.mons.pop(a, None), self.socks.pop(a, None)
        if s is not None:
            s.disable_monitor()
            s.close(0)
        if mon is not None:
            mon.close(0)

    def endpoints(self) -> dict[str, str]:
        """Each concrete endpoint's state as this client sees it: ``"up"`` or ``"down: <why>"``."""
        eps = self.set.eps.items()
        return {a: "up" if ep.up else f"down: {ep.reason}" for a, ep in eps if not ep.retired}

    def deadline_s(self, request: dict) -> float:
        t = request.get("timeout_ms")
        return min(self.timeout_s, t / 1000.0 + self.margin_s) if isinstance(t, int) else self.timeout_s

    def retry_request(self, request: dict, deadline: float) -> dict | None:
        """The request to send again, its ``timeout_ms`` cut to the time left; None if none is left."""
        left_ms = int((deadline - time.monotonic() - self.margin_s) * 1000)
        if "timeout_ms" not in request:
            return request if deadline - time.monotonic() > self.margin_s else None
        if left_ms < 1:
            return None
        return {**request, "timeout_ms": min(request["timeout_ms"], left_ms)}

    def next_try(self, reply: dict, request: dict, deadline: float, tried: list[str],
                 addr: str) -> tuple[dict, str] | None:
        """After ``reply`` from ``addr``: the request and the replica to try next (one not tried yet,
        within ``retries`` and the deadline; ``tried`` gains ``addr``), or None: ``reply`` is the answer."""
        again = self.retry_request(request, deadline) if should_retry(reply) else None
        other = self.set.pick(exclude=tried + [addr]) if again is not None else None
        if len(tried) >= self.retries or other is None:
            return None
        tried.append(addr)
        return again, other.addr

    def no_replica(self, rid: Any) -> dict:
        why = f"no replica ready: {self.set.describe()}"
        return client_error(rid, "UNAVAILABLE", why, None, "no_replica")

    def lost(self, addr: str, why: str) -> dict:
        return {"code": "UNAVAILABLE", "message": f"replica {addr}: {why} before its reply came"}

    def finish(self, reply: dict, tried: list[str], raise_on_error: bool) -> dict:
        if tried:
            reply["retried_from"] = tried
        if raise_on_error and not reply.get("ok"):
            err = reply.get("error") or {}
            raise ServerError(err.get("code", "?"), err.get("message", ""), reply)
        return reply


def _judge(reply: dict | None, timeout_s: float) -> str | None:
    """None if a health reply says ready, else why not."""
    if reply is None:
        return f"no answer to health within {timeout_s:g}s"
    if not reply.get("ok"):
        return (reply.get("error") or {}).get("message", "health failed")
    if not reply.get("ready"):
        return "draining" if reply.get("draining") else "not ready"
    return None


class AsyncReplicaClient(_Replicas, AsyncClient):
    """``AsyncClient`` over several replicas (see the module docstring)."""

    def __init__(self, addr: Any = None, timeout_s: float = 30.0, curve: Any = None, **opts: Any):
        self._setup(addr, timeout_s, curve, zmq.asyncio.Context.instance(), **opts)
        self.waiting: dict[Any, tuple[asyncio.Future, str]] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.maintainer: asyncio.Task | None = None
        self.background: set[asyncio.Task] = set()

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.maintainer is None:
            self.maintainer = loop.create_task(self._maintain())
        for a in self.socks:
            if a not in self.tasks:
                self.tasks[a] = loop.create_task(self._read(a))

    async def _read(self, addr: str) -> None:
        sock, mon = self.socks[addr], self.mons[addr]
        poller = zmq.asyncio.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            if mon in ready:
                event = parse_monitor_message(await mon.recv_multipart())["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    self._lost(addr)
                elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:  # messages can flow now: probe
                    self.set.probe_soon(addr, time.monotonic())
            if sock in ready:
                frames = await sock.recv_multipart()
                try:
                    reply = decode_reply(frames[-1])
                except Exception:  # noqa: BLE001 - a reply we cannot read answers nothing
                    continue
                entry = self.waiting.get(reply.get("id"))
                if entry is not None and entry[1] == addr and not entry[0].done():
                    reply["endpoint"] = addr
                    entry[0].set_result(reply)

    def _lost(self, addr: str) -> None:
        self.set.mark_down(addr, time.monotonic(), "connection lost")
        for rid, (fut, a) in list(self.waiting.items()):
            if a == addr and not fut.done():
                err = self.lost(addr, "connection lost (replica gone or restarting)")
                fut.set_result(client_error(rid, err["code"], err["message"], addr, "lost"))

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
                task = self.tasks.pop(a, None)
                if task is not None:
                    task.cancel()
                self.close_endpoint(a)
            await asyncio.sleep(0.05)

    async def _ask(self, addr: str, request: dict, timeout_s: float) -> dict | None:
        """Send one request to one endpoint and wait for its reply (None when none came in time)."""
        sock = self.socks[addr]
        fut = asyncio.get_running_loop().create_future()
        self.waiting[request["id"]] = (fut, addr)
        try:
            if not await sock.poll(int(timeout_s * 1000), zmq.POLLOUT):
                return None
            await sock.send(msgpack.packb(request, use_bin_type=True), zmq.NOBLOCK)
            return await asyncio.wait_for(fut, timeout_s)
        except (asyncio.TimeoutError, zmq.Again):
            return None
        finally:
            if self.waiting.get(request["id"], (None,))[0] is fut:
                del self.waiting[request["id"]]

    async def _probe(self, addr: str) -> None:
        try:
            reply = await self._ask(addr, {"op": "health", "id": f"aieng-probe-{next(self.probe_ids)}"},
                                    self.probe_timeout_s)
            why = _judge(reply, self.probe_timeout_s)
            if why is None:
                self.set.probe_ok(addr, time.monotonic())
            else:
                self.set.mark_down(addr, time.monotonic(), why)
        finally:
            ep = self.set.eps.get(addr)
            if ep is not None:
                ep.probing = False

    async def _exchange(self, addr: str, request: dict, deadline: float) -> dict:
        rid, ep = request.get("id"), self.set.eps[addr]
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = (fut, addr)
        ep.in_flight += 1
        try:
            try:
                await self.socks[addr].send(msgpack.packb(request, use_bin_type=True), zmq.NOBLOCK)
            except zmq.Again:
                self.set.mark_down(addr, time.monotonic(), "not connected")
                return client_error(rid, "UNAVAILABLE", f"replica {addr} is not connected", addr, "unsent")
            try:
                reply = await asyncio.wait_for(fut, max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                self.set.probe_soon(addr, time.monotonic())
                return client_error(rid, "TIMEOUT", f"no reply from replica {addr} before the client "
                                    "deadline", addr, "deadline")
            if (reply.get("error") or {}).get("code") == "UNAVAILABLE":
                self.set.probe_soon(addr, time.monotonic())  # draining or restarting: let a probe decide
            ep.served += 1
            return reply
        finally:
            ep.in_flight -= 1
            if self.waiting.get(rid, (None,))[0] is fut:
                del self.waiting[rid]

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
        addrs = list(self.socks)
        asks = [self._ask(a, {"op": "health", "id": f"aieng-health-{next(self.ids)}"}, self.probe_timeout_s)
                for a in addrs]
        replies = await asyncio.gather(*asks)
        eps = dict(zip(addrs, replies))
        return {"ok": any(_judge(r, 0) is None for r in eps.values()), "endpoints": eps}

    def close(self) -> None:
        for task in [self.maintainer, *self.tasks.values(), *self.background]:
            if task is not None:
                task.cancel()
        for a in list(self.socks):
            self.close_endpoint(a)
