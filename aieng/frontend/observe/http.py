"""The frontend's probe port (``AIENG_HTTP_ADDR``, default 127.0.0.1:8000): ``/healthz`` liveness,
``/readyz`` and ``/startupz`` (200 or 503, for load balancers and Kubernetes), ``/metrics``
(Prometheus text), ``/debug`` (JSON: health, queue depths, stage timings, counts, memory) and the live
status page ``/`` with its feed ``/status.json`` (``statuspage.py``), on
``aieng.httpcore`` (the OIP port's server: its framing and bounds) run by one thread of its own.
Nothing here can slow the frontend loop down by more than a bounded amount:

  * every answer but /metrics comes from the snapshot dict the loop publishes (swapped whole, never
    mutated); the HTTP thread never calls into the loop, so /debug also works with CURVE on.  A /debug
    (or /status.json) sets ``debug_asked``: the loop refreshes the costly stage timings (and the status
    page's last minute) at its next publish only then;
  * the probes' bodies are encoded once per published snapshot (``health_json``); an answer only
    compares two ages and joins bytes;
  * /metrics is rendered at most once per ``cache_ms`` (scrapers in between share the last render);
  * ``timeout_s`` for a request head and for an idle connection, at most ``MAX_CONNS`` connections, at
    most ``MAX_RATE`` answers a second, both shared fairly between client addresses by the core server
    (``httpcore.server``): one client flooding or holding the port cannot keep a probe from another
    address out (a kubelet's probe waits about one turn per other waiting address, 5 ms each).

With ``token_file`` set, /metrics, /debug and /status.json need ``Authorization: Bearer <token>`` (401
otherwise); the probes and the status page's shell stay open.  The token is read once, at start.
With ``tls`` (``AIENG_HTTP_TLS``: the OIP doors' certificate, ``httpcore.tls.ServerTls``) the port speaks
only HTTPS, without client certificates (a kubelet's HTTPS probe presents none); a rotation of the files
is picked up at the first request after it (``poll``: a stat at most once a second, on this thread).
"""
from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from typing import Any, Callable

from aieng.config import Config
from aieng.frontend.observe.statuspage import FEED, PAGE_HEADERS, StatusPage
from aieng.httpcore.server import HttpServer as CoreServer
from aieng.httpcore.server import Peer
from aieng.httpcore.thread import ServerThread
from aieng.httpcore.tls import ServerTls, TlsFiles

PATHS = ["/", "/status.json", "/healthz", "/readyz", "/startupz", "/metrics", "/debug"]
STALE_MIN_S = 5.0  # liveness: the loop's snapshot and the supervisor's word may be this old (or 10 periods)


def liveness(snap: dict[str, Any], now: float, stale_s: float) -> dict[str, Any]:
    """Alive: the frontend loop is making progress (it published a snapshot lately) and the supervisor
    is alive (it told the frontend lately).  Worker restarts are recovery, not death: an orchestrator
    must not kill the pod for them, so they show in /readyz only."""
    loop_age = now - snap.get("published_at", float("-inf"))
    supervisor_age = now - snap.get("supervisor_seen_at", float("-inf"))
    alive = loop_age <= stale_s and supervisor_age <= stale_s
    return {"alive": alive, "loop_age_s": round(min(loop_age, 1e9), 3),
            "supervisor_age_s": round(min(supervisor_age, 1e9), 3)}

PROTECTED = ("/metrics", "/debug", FEED)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CHALLENGE = 'Bearer realm="aieng"'
MAX_CONNS = 512  # open connections (file descriptors, not threads)
MAX_RATE = 200.0  # answers a second: probes and scrapers need a few; a tight loop does not take the CPU
MAX_BODY = 4096  # ours are GETs; a small body is read and ignored (405 says why)
log = logging.getLogger("aieng.frontend.observe.http")


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"bad HTTP address {addr!r} (AIENG_HTTP_ADDR): expected host:port") from None
    return host.strip("[]") or "127.0.0.1", number


def read_token(path: str) -> bytes:
    """The bearer token in ``path`` (surrounding whitespace stripped); an empty file is refused."""
    with open(path, "rb") as fh:
        token = fh.read().strip()
    if not token:
        raise ValueError(f"HTTP token file {path} (AIENG_HTTP_TOKEN_FILE) is empty")
    return token


def authorized(header: str | None, token: bytes | None) -> bool:
    if token is None:
        return True
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1"), token)


def bind(addr: str) -> socket.socket:
    """A listening socket on ``addr``; any failure is an OSError that names the address."""
    host, port = parse_addr(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart within TIME_WAIT still binds
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        err = OSError(f"cannot bind the HTTP address {addr} (AIENG_HTTP_ADDR): {exc}")
        err.errno = exc.errno
        raise err from None
    return sock


def probe_tls(cfg: Config, log: logging.Logger) -> ServerTls | None:
    """The probe port's TLS (``AIENG_HTTP_TLS``): the OIP doors' certificate and key, no client CA."""
    if not cfg.http_tls:
        return None
    return ServerTls(TlsFiles(cfg.oip_tls_cert_file, cfg.oip_tls_key_file), log,
                     {"cert": "AIENG_OIP_TLS_CERT_FILE", "key": "AIENG_OIP_TLS_KEY_FILE"})


class HttpServer:
    def __init__(self, addr: str, snapshot: Callable[[], dict[str, Any]], metrics: Callable[[], bytes],
                 token_file: str = "", threads: int = 4, timeout_s: float = 5.0, cache_ms: int = 500,
                 dropped: Callable[[str], None] | None = None, tls: ServerTls | None = None):
        """Bind ``addr`` (an OSError naming it if that fails) and start serving; ``dropped(reason)``
        counts each connection closed without an answer (``Metrics.dropped_connection``).  ``threads``
        is ignored (one thread serves every connection), kept for callers and AIENG_HTTP_THREADS."""
        self.snapshot, self.render = snapshot, metrics
        self.token = read_token(token_file) if token_file else None
        self.cache_s = cache_ms / 1000.0
        self.stale_s = max(STALE_MIN_S, 10 * self.cache_s)  # cache_ms is the loop's snapshot period
        self.metrics_body: bytes | None = None
        self.metrics_at = 0.0
        self.debug_cache: tuple[dict, bytes] | None = None  # (the snapshot, its JSON)
        self.debug_asked = threading.Event()  # tells the loop to refresh the snapshot's stage stats
        self.probes: tuple[dict, bytes] | None = None  # (the snapshot, its health map as JSON)
        self.page = StatusPage()
        self.tls = tls
        self.core = CoreServer(self.handle, MAX_BODY, head_s=timeout_s, idle_s=timeout_s, max_conns=MAX_CONNS,
                               log=log, on_drop=dropped, rate=MAX_RATE,
                               tls=None if tls is None else tls.context)
        self.server = ServerThread(self.core, bind(addr), name="http")

    async def handle(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes,
                     peer: Peer) -> tuple[int, dict[str, str], bytes]:
        """One answer, on the server's thread, when the core server's pace gives this request its turn."""
        if self.tls is not None:
            self.tls.poll(time.monotonic())  # rotated files: the next handshake gets them
        if method not in ("GET", "HEAD"):
            code, out, ctype = 405, b'{"error": "only GET and HEAD"}', "application/json"
            extra = {"Allow": "GET, HEAD"}
        else:
            code, out, ctype, extra = self.route(path, headers)
        return code, {"Content-Type": ctype, "Cache-Control": "no-store", **extra}, out

    def route(self, path: str, headers: dict[str, str]) -> tuple[int, bytes, str, dict[str, str]]:
        if path in PROTECTED and not authorized(headers.get("authorization"), self.token):
            return 401, b'{"error": "unauthorized"}', "application/json", {"WWW-Authenticate": CHALLENGE}
        if path == "/metrics":
            return 200, self.metrics_text(), METRICS_TYPE, {}
        snap = self.snapshot()
        if path == "/debug":
            self.debug_asked.set()
            return 200, self.debug_json(snap), "application/json", {}
        if path == FEED:
            self.debug_asked.set()  # its stage timings and last minute, as /debug's
            return 200, self.page.feed_json(snap), "application/json", {}
        asset = self.page.asset(path)
        if asset is not None:
            return 200, asset[0], asset[1], PAGE_HEADERS
        health = snap.get("health", {})
        if path == "/healthz":
            alive = liveness(snap, time.monotonic(), self.stale_s)
            body = self.health_json(snap)
            # the health map plus ``liveness``: only the three-key map is encoded per request
            body = body[:-1] + (b", " if len(body) > 2 else b"") + b'"liveness": ' + _json(alive) + b"}"
            return (200 if alive["alive"] else 503), body, "application/json", {}
        if path == "/readyz":
            return (200 if health.get("ready") else 503), self.health_json(snap), "application/json", {}
        if path == "/startupz":
            return (200 if health.get("started") else 503), self.health_json(snap), "application/json", {}
        return 404, _json({"error": "not found", "paths": PATHS}), "application/json", {}

    def metrics_text(self) -> bytes:
        """The last render if it is younger than ``cache_ms``, else a new one (renders run on the one
        server thread: scrapers arriving during one get it from the cache next)."""
        if self.metrics_body is None or time.monotonic() - self.metrics_at >= self.cache_s:
            self.metrics_body = self.render()
            self.metrics_at = time.monotonic()  # from the end: renders are >= cache_ms apart
        return self.metrics_body

    def health_json(self, snap: dict[str, Any]) -> bytes:
        """The snapshot's health map as JSON, encoded once per published snapshot."""
        cached = self.probes
        if cached is not None and cached[0] is snap:
            return cached[1]
        body = _json(snap.get("health", {}))
        self.probes = (snap, body)
        return body

    def debug_json(self, snap: dict[str, Any]) -> bytes:
        """The snapshot as JSON, encoded once per published snapshot (it is never mutated)."""
        cached = self.debug_cache
        if cached is not None and cached[0] is snap:
            return cached[1]
        body = _json(snap)
        self.debug_cache = (snap, body)
        return body

    def close(self) -> None:
        self.server.close()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, default=str).encode()
