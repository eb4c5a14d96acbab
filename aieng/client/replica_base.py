"""What both replica clients share (``ReplicaBase``): options, the endpoint set and its DNS resolution,
deadlines and the retry rule; each client opens and shuts its own connection per endpoint
(``open_endpoint``, ``shut_endpoint``); ``judge`` reads a health reply.  The contract: docs/replicas.md."""
from __future__ import annotations

import itertools
import socket
import time
from typing import Any

import zmq

from aieng.client.endpoints import Backoff, EndpointSet, client_error, expand, should_retry, split_addrs
from aieng.client.single import raise_for_error, server_addr


class ReplicaBase:
    """What both clients share: options, the endpoint set, deadlines and the retry rule."""

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
            self.open_endpoint(a)
        for a in self.set.closable():
            self.close_endpoint(a)

    def sockopts(self) -> dict[int, int]:
        """Every endpoint's DEALER: a message for an unconnected replica fails now, is not queued."""
        return {zmq.IMMEDIATE: 1, **({zmq.IPV6: 1} if self.ipv6 else {})}

    def open_endpoint(self, a: str) -> None:
        """Connect to the new endpoint ``a`` (each client its own way)."""
        raise NotImplementedError

    def shut_endpoint(self, a: str) -> None:
        """Close the connection to ``a`` (each client its own way)."""
        raise NotImplementedError

    def close_endpoint(self, a: str) -> None:
        self.set.remove(a)
        self.shut_endpoint(a)

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
        if raise_on_error:
            raise_for_error(reply)
        return reply


def judge(reply: dict | None, timeout_s: float) -> str | None:
    """None if a health reply says ready, else why not."""
    if reply is None:
        return f"no answer to health within {timeout_s:g}s"
    if not reply.get("ok"):
        return (reply.get("error") or {}).get("message", "health failed")
    if not reply.get("ready"):
        return "draining" if reply.get("draining") else "not ready"
    return None

