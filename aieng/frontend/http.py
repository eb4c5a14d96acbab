"""The frontend's small HTTP server (``AIENG_HTTP_ADDR``, default 127.0.0.1:8000).

``/healthz`` liveness and ``/readyz`` readiness (200 or 503, for load
balancers and Kubernetes probes), ``/metrics`` (Prometheus text format) and
``/debug`` (JSON: health, queue depths, counts).  It runs on a daemon thread
and reads only snapshots the frontend loop publishes (a reference swap), so
it never touches the loop's own tables.
"""
from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

log = logging.getLogger("aieng.frontend.http")


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class HttpServer:
    def __init__(self, addr: str, snapshot: Callable[[], dict[str, Any]], metrics: Callable[[], bytes],
                 frontend_addr: str = ""):
        self.snapshot, self.metrics = snapshot, metrics
        self.frontend_addr = frontend_addr
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                snap = outer.snapshot()
                health = snap.get("health", {})
                if path == "/healthz":
                    self.reply(200 if health.get("live") else 503, health)
                elif path == "/readyz":
                    self.reply(200 if health.get("ready") else 503, health)
                elif path == "/metrics":
                    self.reply(200, outer.metrics(), "text/plain; version=0.0.4; charset=utf-8")
                elif path == "/debug":
                    self.reply(200, dict(snap, stats=outer.stats()))
                else:
                    self.reply(404, {"error": "not found", "paths": ["/healthz", "/readyz", "/metrics", "/debug"]})

            def reply(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s", fmt % args)

        host, port = parse_addr(addr)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_cls = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        self.server = server_cls((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)
        self.thread.start()

    def stats(self) -> dict[str, Any]:
        """Stage summaries come from the frontend's own ``stats`` op over its client socket,
        so this thread never reads the loop's tables."""
        if not self.frontend_addr:
            return {}
        from aieng.client import Client

        try:
            with Client(self.frontend_addr, timeout_s=5.0, dealer=True) as c:
                reply = c.call({"op": "stats", "id": "debug"})
            reply.pop("id", None)
            return reply
        except Exception as exc:  # the loop is busy or gone: say so rather than hang the probe
            return {"error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
