"""The gateway role (``aieng::gateway[i]``): the Open Inference Protocol's front door onto the pipeline.

``AIENG_GATEWAY_WORKERS`` processes, spawned and restarted by the supervisor like every role (through
``runtime.worker.run_process``), each serving OIP over HTTP (``AIENG_OIP_HTTP_ADDR``) and gRPC
(``AIENG_OIP_GRPC_ADDR``) on the same addresses (SO_REUSEPORT).  ``Gateway`` builds its parts: the
``Upstream`` to the frontend (a client like any other), the ``PeerBudget`` (``budget.py``), the decoder,
the admin ``Repository`` when control is on, the logging extension's ``LogSettings``, the API keys
(``apikeys.KeyRing``, when ``AIENG_OIP_API_KEYS_FILE`` is set: the loop looks for a rewrite every
``KEYS_S``) and the two servers, each door given its share of file descriptors (``connection_cap``), and
with AIENG_OIP_TLS_* both doors' TLS (``tls.py``).  Both listeners are bound before it reports ready (a
busy address fails the start naming its variable).  Running: one asyncio loop (uvloop where installed);
the heartbeat ``Hello`` to the hub every ``HEARTBEAT_S``, the hub's ``LogLevel``, the stop flag and (TLS
on) the TLS files' poll for a rotation (about once a second) every ``TICK_S``.  On stop: no new
connections, answers under way finish for ``DRAIN_S``, then close.  The process's life: docs/oip.md; why
a role of its own: docs/architecture.md ("The OIP front door").
"""
from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections.abc import Mapping

import zmq
import zmq.auth

from aieng.config import Config
from aieng.gateway.apikeys import KeyRing
from aieng.gateway.budget import PeerBudget, gateway_share
from aieng.gateway.decode import Decoder
from aieng.gateway.docs import DocsRoutes
from aieng.gateway.grpc import start_grpc
from aieng.gateway.http import OipHttp
from aieng.gateway.logsettings import LogSettings
from aieng.gateway.models import Catalog
from aieng.gateway.repository import Repository
from aieng.gateway.service import Service
from aieng.gateway.sysshm import SWEEP_S, from_config
from aieng.gateway.tls import grpc_credentials, server_tls, subject_reader
from aieng.gateway.upstream import Upstream
from aieng.httpcore.server import HttpServer
from aieng.models.repo import ModelSpec
from aieng.runtime import procutil
from aieng.runtime.hub import HEARTBEAT_S, dispatch
from aieng.wire import messages as m
from aieng.wire.addresses import hub_addr

TICK_S = 0.1
KEYS_S = 1.0  # how often the key file is looked at (a stat; read again only when it changed)
HUB_HANDLERS = {m.LogLevel: lambda msg: procutil.set_level(msg.level)}
DRAIN_S = 2.0
IDLE_FACTOR = 12  # an idle keep-alive connection may stay 12 x AIENG_HTTP_TIMEOUT_S (60 s by default)


def split_addr(addr: str, what: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host:
        raise ValueError(f"{what} must be host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def curve_keys(cfg: Config) -> tuple[bytes, bytes, bytes] | None:
    """With CURVE on, the gateway connects with the instance's gateway key, made by the supervisor and
    admitted by the frontend beside the keys of AIENG_CURVE_CLIENT_KEYS_DIR."""
    if not cfg.curve_secret_key_file:
        return None
    server_public, _ = zmq.auth.load_certificate(cfg.curve_secret_key_file)
    secret = cfg.gateway_curve_key.encode()
    return zmq.curve_public(secret), secret, server_public


def connection_cap(doors: int) -> int:
    """Connections each front door may hold: the process's file descriptors (its soft limit, raised to the
    hard one where allowed), less 128 for everything else, shared by the doors; 16..4096 each.  Neither door
    can then take the descriptors the other needs (issue 20, finding 3: silent gRPC connections had taken
    every descriptor, HTTP's too)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return max(16, min(4096, (soft - 128) // max(1, doors)))


def new_loop() -> asyncio.AbstractEventLoop:
    """libuv's loop (uvloop) where it is installed: the same asyncio API, less CPU per loop turn (measured:
    docs/architecture.md, 'The OIP front door'); the standard loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Gateway:
    role = "gateway"

    def __init__(self, cfg: Config, specs: Mapping[str, ModelSpec], worker: str, log: logging.Logger):
        self.cfg, self.worker, self.log = cfg, worker, log
        self.loop = new_loop()
        asyncio.set_event_loop(self.loop)
        self.hub = procutil.hub_socket(zmq.Context.instance(), hub_addr(cfg.runtime_dir), worker)
        # only each version's batching is kept: a SpecBook builds the specs one at a time for it (items())
        batching = {f"{s.name}/{s.version}": s.batching for _, s in specs.items()}
        self.http: HttpServer | None = None
        self.grpc = None
        self.loop.run_until_complete(self._start(Catalog(batching)))

    async def _start(self, catalog: Catalog) -> None:
        cfg = self.cfg
        self.upstream = Upstream(cfg.frontend_addr, catalog, cfg.default_timeout_ms, self.log,
                                 curve_keys(cfg), cfg.gateway_token)
        # repository load/unload and a log level change go to the admin socket, and only when turned on
        # (repository.py, logsettings.py): the client socket refuses server-wide changes
        self.admin = Repository(cfg, bool(cfg.admin_curve_secret_key_file), self.log) \
            if cfg.oip_repository_control or cfg.oip_logging_control else None
        self.repository = self.admin if cfg.oip_repository_control else None
        share = gateway_share(cfg.max_inflight, cfg.per_client_inflight, cfg.gateways)
        self.shm = from_config(cfg)
        logs = LogSettings(self.upstream.op, cfg.log_format, self.admin.op if cfg.oip_logging_control
                           and self.admin is not None else None)
        self.service = Service(self.upstream, PeerBudget(share), Decoder(), self.repository, self.shm, logs)
        self.tls = server_tls(cfg, self.log)
        self.keys = KeyRing(cfg.oip_api_keys_file, self.log) if cfg.oip_api_keys_file else None
        cap = connection_cap(bool(cfg.oip_http_addr) + bool(cfg.oip_grpc_addr))
        if cfg.oip_http_addr:
            host, port = split_addr(cfg.oip_http_addr, "AIENG_OIP_HTTP_ADDR")
            pages = DocsRoutes(self.service, self.keys, cfg) if cfg.oip_docs else None
            self.http = HttpServer(OipHttp(self.service, self.keys, pages).handle, cfg.max_message_bytes,
                                   cfg.http_timeout_s, cfg.http_timeout_s * IDLE_FACTOR, cap, self.log,
                                   codings=True, tls=None if self.tls is None else self.tls.context)
            try:
                await self.http.start(host, port)
            except OSError as exc:
                raise OSError(f"cannot bind the OIP HTTP address {cfg.oip_http_addr!r} "
                              f"(AIENG_OIP_HTTP_ADDR): {exc.strerror or exc}") from None
        if cfg.oip_grpc_addr:
            self.grpc = await start_grpc(self.service, cfg.oip_grpc_addr, cfg.max_message_bytes, cap,
                                         cfg.http_timeout_s, cfg.http_timeout_s * IDLE_FACTOR,
                                         None if self.tls is None else grpc_credentials(self.tls), self.keys,
                                         subject_reader(cfg))
        self.upstream.start()

    def run(self, stop: procutil.StopFlag) -> None:
        self.loop.run_until_complete(self._run(stop))

    async def _run(self, stop: procutil.StopFlag) -> None:
        next_hello = next_sweep = next_keys = 0.0
        while not stop.stop:
            now = self.loop.time()
            if now >= next_hello:
                self.hub.send(m.encode(m.Hello(self.worker, self.role, os.getpid())))
                next_hello = now + HEARTBEAT_S
            if now >= next_sweep and self.shm.regions:
                for name in self.shm.sweep():
                    self.log.info("shared memory region %r released: its key was unlinked", name)
                next_sweep = now + SWEEP_S
            if self.tls is not None:
                self.tls.poll(now)
            if self.keys is not None and now >= next_keys:
                self.keys.refresh()
                next_keys = now + KEYS_S
            self._read_hub()
            await asyncio.sleep(TICK_S)
        self.log.info("stopping: no new connections, %d requests in flight", self.upstream.in_flight)
        waits = []
        if self.http is not None:
            waits.append(self.http.close(DRAIN_S))
        if self.grpc is not None:
            waits.append(self.grpc.stop(DRAIN_S))
        await asyncio.gather(*waits, return_exceptions=True)

    def _read_hub(self) -> None:
        while True:
            try:
                data = self.hub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            dispatch(data, HUB_HANDLERS, self.log, "the frontend")

    def close(self) -> None:
        self.shm.close()
        self.upstream.close()
        self.service.decoder.close()
        if self.admin is not None:
            self.admin.close()
        self.hub.close(0)
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()
