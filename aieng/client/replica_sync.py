"""The blocking ``Client`` over several replicas: ``Client([...])`` becomes ``ReplicaClient``.

Contract: as ``AsyncReplicaClient`` (docs/replicas.md: probes, deadlines, exactly one reply per request,
the same retry rule), over one DEALER and its monitor per endpoint, one request at a time: selection is
round robin. Nothing runs in the background: socket events are read, and due probes of down endpoints
sent, inside ``call``. So a call may spend up to ``probe_timeout_s`` waiting on a probe of a replica that
is connected but hung; a replica that refuses connections costs nothing (its probe fails at once). An up
endpoint goes down on a lost connection, a missed deadline or an ``UNAVAILABLE`` answer, and comes back
through a probe.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import msgpack
import zmq
from zmq.utils.monitor import parse_monitor_message

from aieng.client.endpoints import client_error, expand
from aieng.client.replica_base import ReplicaBase, judge
from aieng.client.single import SingleClient, apply_curve, decode_reply

EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class ReplicaClient(ReplicaBase, SingleClient):
    def __init__(self, addr: Any = None, timeout_s: float = 30.0, dealer: bool = True, curve: Any = None,
                 **opts: Any):
        self.socks: dict[str, zmq.Socket] = {}
        self.mons: dict[str, zmq.Socket] = {}  # each socket's monitor
        self._setup(addr, timeout_s, curve, zmq.Context.instance(), **opts)
        self.dealer = True  # a REQ socket cannot give up on a lost reply; replicas always use DEALERs
        self.waiting: dict[Any, str] = {}  # request id -> the endpoint it was sent to
        self.replies: dict[Any, dict] = {}

    def open_endpoint(self, a: str) -> None:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        for opt, value in self.sockopts().items():
            s.setsockopt(opt, value)
        apply_curve(s, self.curve)
        self.mons[a] = s.get_monitor_socket(EVENTS)  # before connect: no event is missed
        s.connect(a)
        self.socks[a] = s

    def shut_endpoint(self, a: str) -> None:
        mon, s = self.mons.pop(a, None), self.socks.pop(a, None)
        if s is not None:
            s.disable_monitor()
            s.close(0)
        if mon is not None:
            mon.close(0)

    def _pump(self, until: float, done: Callable[[], bool]) -> None:
        """Read replies and monitor events until ``done()`` or ``until`` passes."""
        while not done():
            poller = zmq.Poller()
            for a in self.socks:
                poller.register(self.socks[a], zmq.POLLIN)
                poller.register(self.mons[a], zmq.POLLIN)
            left = until - time.monotonic()
            events = dict(poller.poll(max(0, int(left * 1000))))
            for a, mon in list(self.mons.items()):
                if mon in events:
                    event = parse_monitor_message(mon.recv_multipart())["event"]
                    if event == zmq.EVENT_DISCONNECTED:
                        self._lost(a)
                    elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:  # messages can flow now: probe
                        self.set.probe_soon(a, time.monotonic())
            for a, sock in list(self.socks.items()):
                if sock in events:
                    try:
                        reply = decode_reply(sock.recv_multipart()[-1])
                    except Exception:  # noqa: BLE001 - a reply we cannot read answers nothing
                        continue
                    rid = reply.get("id")
                    if self.waiting.get(rid) == a and rid not in self.replies:
                        reply["endpoint"] = a
                        self.replies[rid] = reply
            if left <= 0:
                return

    def _lost(self, addr: str) -> None:
        self.set.mark_down(addr, time.monotonic(), "connection lost")
        for rid, a in self.waiting.items():
            if a == addr and rid not in self.replies:
                err = self.lost(addr, "connection lost (replica gone or restarting)")
                self.replies[rid] = client_error(rid, err["code"], err["message"], addr, "lost")

    def _send(self, addr: str, request: dict) -> bool:
        self.waiting[request["id"]] = addr
        self.replies.pop(request["id"], None)
        try:
            self.socks[addr].send(msgpack.packb(request, use_bin_type=True), zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.set.mark_down(addr, time.monotonic(), "not connected")
            return False

    def _take(self, rid: Any) -> dict | None:
        self.waiting.pop(rid, None)
        return self.replies.pop(rid, None)

    def _maintain(self) -> None:
        """Re-resolve DNS names when due; probe the down endpoints that are due."""
        self._pump(0.0, lambda: False)  # socket events first: a lost connection marks its endpoint down
        now = time.monotonic()
        if now >= self.next_resolve:
            self.apply_resolution(expand(self.configured, self.resolver, self.ipv6, self.resolved), now)
        sent = {}
        for ep in self.set.due(now, include_up=False):
            pid = f"aieng-probe-{next(self.probe_ids)}"
            if self._send(ep.addr, {"op": "health", "id": pid}):
                sent[pid] = ep.addr
            else:
                self._take(pid)
        until = time.monotonic() + self.probe_timeout_s
        self._pump(until, lambda: all(p in self.replies for p in sent))
        for pid, addr in sent.items():
            why = judge(self._take(pid), self.probe_timeout_s)
            if why is None:
                self.set.probe_ok(addr, time.monotonic())
            else:
                self.set.mark_down(addr, time.monotonic(), why)

    def _pick(self, deadline: float) -> str | None:
        while True:
            self._maintain()
            ep = self.set.pick()
            if ep is not None or time.monotonic() >= deadline:
                return ep.addr if ep is not None else None
            self._pump(min(deadline, time.monotonic() + 0.02), lambda: False)

    def _exchange(self, addr: str, request: dict, deadline: float) -> dict:
        rid = request.get("id")
        if not self._send(addr, request):
            self._take(rid)
            return client_error(rid, "UNAVAILABLE", f"replica {addr} is not connected", addr, "unsent")
        self._pump(deadline, lambda: rid in self.replies)
        reply = self._take(rid)
        if reply is None:
            self.set.mark_down(addr, time.monotonic(), "no reply before a request's deadline")
            return client_error(rid, "TIMEOUT", f"no reply from replica {addr} before the client deadline",
                                addr, "deadline")
        if (reply.get("error") or {}).get("code") == "UNAVAILABLE" and not reply.get("client_error"):
            self.set.mark_down(addr, time.monotonic(), "answered UNAVAILABLE")
        return reply

    def call(self, request: dict, raise_on_error: bool = True) -> dict:
        rid = request.get("id")
        deadline = time.monotonic() + self.deadline_s(request)
        tried: list[str] = []
        addr = self._pick(deadline)
        while True:
            if addr is None:
                reply = self.no_replica(rid)
                break
            reply = self._exchange(addr, request, deadline)
            if reply.get("client_error") == "unsent":  # nothing was sent: not a try
                addr = self._pick(deadline)
                continue
            step = self.next_try(reply, request, deadline, tried, addr)
            if step is None:
                break
            request, addr = step
        return self.finish(reply, tried, raise_on_error)

    def wait_ready(self, timeout_s: float = 10.0, every: bool = False) -> dict[str, str]:
        """Wait (at most ``timeout_s``) until one endpoint, or ``every`` one, is up; returns
        ``endpoints()``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._maintain()
            if (all if every else any)(s == "up" for s in self.endpoints().values()):
                break
            self._pump(min(deadline, time.monotonic() + 0.02), lambda: False)
        return self.endpoints()

    def health(self) -> dict:
        """Every endpoint's own ``health`` reply (None when it did not answer within ``probe_timeout_s``);
        ``ok`` when at least one is ready."""
        sent = {}
        for a in self.socks:
            hid = f"aieng-health-{next(self.ids)}"
            if self._send(a, {"op": "health", "id": hid}):
                sent[hid] = a
            else:
                self._take(hid)
        self._pump(time.monotonic() + self.probe_timeout_s, lambda: all(h in self.replies for h in sent))
        eps = {a: None for a in self.socks}
        for hid, a in sent.items():
            eps[a] = self._take(hid)
        return {"ok": any(judge(r, 0) is None for r in eps.values()), "endpoints": eps}

    def close(self) -> None:
        for a in list(self.socks):
            self.close_endpoint(a)

