"""Endpoint set, health state and replica selection for the multi-endpoint clients (pure logic: no sockets).

* ``split_addrs``: a list/tuple, or one string with commas, is a replica list; a plain string is not.
* ``expand``: a ``tcp://host:port`` whose host is a DNS name becomes one ``tcp://<ip>:port`` per address
  (IPv4 unless ``ipv6``; IPv6 as ``tcp://[ip]:port``); IP literals and ``ipc://`` pass unchanged; a name
  that does not resolve keeps its last good endpoints (none the first time).
* ``Endpoint``: ``up`` only after a ``health`` probe answered ready; down ones are probed with ``Backoff``
  (exponential, capped, jittered), up ones every ``probe_every_s``; a ``retired`` one (gone from DNS)
  takes no new requests and is closed once nothing is in flight on it.
* ``EndpointSet.pick``: least in flight among up endpoints, ties round robin.
* ``client_error`` builds the replies the client makes itself; ``should_retry`` is the retry rule.
Why each rule, and how the clients use them: docs/replicas.md.
"""
from __future__ import annotations

import ipaddress
import random
import socket
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

Resolver = Callable[..., list]


def split_addrs(addr: Any) -> list[str] | None:
    """The replica list ``addr`` stands for, or None when it is one plain address (single-address mode)."""
    if isinstance(addr, (list, tuple)):
        out = [str(a).strip() for a in addr if str(a).strip()]
    elif isinstance(addr, str) and "," in addr:
        out = [a.strip() for a in addr.split(",") if a.strip()]
    else:
        return None
    if not out:
        raise ValueError("an empty list of endpoints")
    return list(dict.fromkeys(out))  # order kept, duplicates dropped


def parse_tcp(addr: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``tcp://host:port`` address (brackets stripped), None for other transports."""
    if not addr.startswith("tcp://"):
        return None
    rest = addr[len("tcp://"):]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"not a tcp://host:port address: {addr!r}")
    return host.strip("[]"), int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def tcp_endpoint(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def expand(addrs: Iterable[str], resolve: Resolver = socket.getaddrinfo, ipv6: bool = False,
           previous: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """Configured address -> its concrete endpoints (see the module docstring). ``previous`` is the last
    result, used for names that fail to resolve now."""
    previous = previous or {}
    out: dict[str, list[str]] = {}
    for addr in addrs:
        hp = parse_tcp(addr)
        if hp is None or hp[0] == "*" or is_ip(hp[0]):
            out[addr] = [addr]
            continue
        host, port = hp
        try:
            infos = resolve(host, port, socket.AF_UNSPEC if ipv6 else socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            out[addr] = list(previous.get(addr, []))
            continue
        eps = [tcp_endpoint(info[4][0], port) for info in infos]
        out[addr] = list(dict.fromkeys(eps)) or list(previous.get(addr, []))
    return out


@dataclass
class Backoff:
    """Delay before the n-th consecutive failed probe's retry: ``base_s * 2**(n-1)``, capped at ``cap_s``,
    times a random factor in ``1 +- jitter`` (so many clients do not probe a recovering replica in step)."""
    base_s: float = 0.2
    cap_s: float = 5.0
    jitter: float = 0.2

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        d = min(self.cap_s, self.base_s * 2 ** max(0, failures - 1))
        return d * (1.0 + self.jitter * (2.0 * rand() - 1.0))


@dataclass
class Endpoint:
    addr: str
    up: bool = False
    retired: bool = False
    in_flight: int = 0
    failures: int = 0          # consecutive failed probes
    next_probe: float = 0.0    # clock time of the next health probe
    probing: bool = False
    reason: str = "not probed yet"
    served: int = 0            # replies received from it (ok or server error)


@dataclass
class EndpointSet:
    backoff: Backoff = field(default_factory=Backoff)
    probe_every_s: float = 2.0
    rand: Callable[[], float] = random.random
    eps: dict[str, Endpoint] = field(default_factory=dict)
    rr: int = 0

    def update(self, addrs: Iterable[str], now: float) -> tuple[list[str], list[str]]:
        """Make the set ``addrs``: returns ``(added, retired)``. New endpoints start down, probed at once;
        ones no longer listed are retired (not removed: their in-flight requests still get answers)."""
        want = list(dict.fromkeys(addrs))
        added, retired = [], []
        for a in want:
            ep = self.eps.get(a)
            if ep is None:
                self.eps[a] = Endpoint(a, next_probe=now)
                added.append(a)
            elif ep.retired:
                ep.retired, ep.next_probe = False, now
        for a, ep in self.eps.items():
            if a not in want and not ep.retired:
                ep.retired, ep.up = True, False
                retired.append(a)
        return added, retired

    def closable(self) -> list[str]:
        """Retired endpoints with nothing in flight: their sockets can go."""
        return [a for a, ep in self.eps.items() if ep.retired and ep.in_flight == 0 and not ep.probing]

    def remove(self, addr: str) -> None:
        self.eps.pop(addr, None)

    def pick(self, exclude: Iterable[str] = ()) -> Endpoint | None:
        """Least in flight among up endpoints not in ``exclude``; ties go round robin."""
        order = list(self.eps.values())
        if not order:
            return None
        skip = set(exclude)
        best: Endpoint | None = None
        n = len(order)
        for k in range(n):
            ep = order[(self.rr + k) % n]
            if not ep.up or ep.retired or ep.addr in skip:
                continue
            if best is None or ep.in_flight < best.in_flight:
                best = ep
        if best is not None:
            self.rr = (order.index(best) + 1) % n
        return best

    def due(self, now: float, include_up: bool = True) -> list[Endpoint]:
        """Endpoints whose next probe is due and that are not being probed (down ones only unless
        ``include_up``)."""
        return [ep for ep in self.eps.values() if not ep.retired and not ep.probing and ep.next_probe <= now
                and (include_up or not ep.up)]

    def probe_ok(self, addr: str, now: float) -> None:
        ep = self.eps.get(addr)
        if ep is not None and not ep.retired:
            ep.up, ep.failures, ep.reason = True, 0, "ready"
            ep.next_probe = now + self.probe_every_s

    def mark_down(self, addr: str, now: float, reason: str) -> None:
        """A failed probe, a lost connection or a missed deadline: not routable until a probe says ready."""
        ep = self.eps.get(addr)
        if ep is None:
            return
        ep.up, ep.reason = False, reason
        ep.failures += 1
        ep.next_probe = now + self.backoff.delay(ep.failures, self.rand)

    def probe_soon(self, addr: str, now: float) -> None:
        """Ask for a probe now (e.g. the replica answered UNAVAILABLE: it may be draining)."""
        ep = self.eps.get(addr)
        if ep is not None:
            ep.next_probe = min(ep.next_probe, now)

    def next_due(self) -> float | None:
        times = [ep.next_probe for ep in self.eps.values() if not ep.retired and not ep.probing]
        return min(times) if times else None

    def describe(self) -> str:
        return "; ".join(f"{a} {'up' if ep.up else 'down'} ({ep.reason})" for a, ep in self.eps.items()
                         if not ep.retired) or "no endpoints"


def client_error(rid: Any, code: str, message: str, endpoint: str | None, kind: str) -> dict:
    """A reply the client makes itself when the server's never came (``client_error`` says why:
    ``lost`` connection, ``unsent``: not connected so nothing was sent, ``deadline`` passed, ``no_replica``
    up)."""
    return {"id": rid, "ok": False, "error": {"code": code, "message": message}, "endpoint": endpoint,
            "client_error": kind}


def should_retry(reply: dict) -> bool:
    """Retried once on another replica: the connection was lost before the reply came (infer has no side
    effects, so running it twice is harmless), or the replica itself said UNAVAILABLE (not ready, draining:
    it did not run the request). Not a missed deadline, OVERLOADED, TIMEOUT or any other answer."""
    if reply.get("ok"):
        return False
    if reply.get("client_error"):
        return reply["client_error"] in ("lost", "unsent")
    return (reply.get("error") or {}).get("code") == "UNAVAILABLE"
