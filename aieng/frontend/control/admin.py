"""The admin socket: routing changes and model listings, never over the client socket.

``AdminServer`` binds a ROUTER at ``Config.admin_addr`` (default ``ipc://<runtime dir>/admin.sock``;
a tcp address must be loopback unless CURVE is on, which ``Config.validate`` enforces).  With
CURVE it has a ZMQ context of its own, so its authenticator (its own allowed-keys dir) never mixes
with the client socket's; without, it shares the frontend's.  The loop polls it (``drain``); an op
is a few dict operations and no file I/O.  One msgpack map in (at most ``MAX_ADMIN_BYTES``, else ZMQ
drops it), one out: ``{"op", "id", ...}`` -> ``{"id", "ok": true, ...}`` or ``{"id", "ok": false,
"error": {"code", "message"}}``.  ``AdminOps.table`` dispatches status, models, set_weights, set_rules,
rollback, promote, reload, shadow_on, shadow_off, load and unload (``Versions``: answered at once,
progress in ``models``/``status``), and the server-wide ops the client socket refuses by default
(``ClientOps.wide_ops``: ``log_level`` with a level, ``stats`` with ``reset``).  A routing change is in
force at once and answered (``Pending``) when the state writer's ticket is done: an INTERNAL error
saying it is in force but not saved when the write failed; ``changed: false`` waits for any earlier
unsaved change.  Bad input, or a change
routing to a version that failed to load, is refused and changes nothing.  Settings, commands and
the durability contract: docs/rollout.md, sections 6 and 7.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

import zmq

from aieng.config import Config
from aieng.frontend.control.workers import Workers
from aieng.frontend.requests.clients import curve_server
from aieng.frontend.rollout import routing
from aieng.frontend.rollout.mirror import Mirror
from aieng.frontend.rollout.rollout import Rollout
from aieng.frontend.rollout.statewriter import RETRY_S, Ticket
from aieng.models import repo as model_repo
from aieng.models.routing import RoutingError, parse_shadow
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p
from aieng.wire.addresses import admin_addr

MAX_ADMIN_BYTES = 8 * 1024 * 1024  # a user group of 100,000 keys fits


class Pending:
    """An answer sent once ``ticket`` is done: as built when saved, else an error saying what holds."""

    def __init__(self, ticket: Ticket, answer: dict):
        self.ticket, self.answer = ticket, answer

    def reply(self, error: str | None) -> dict:
        if error is None:
            return self.answer
        what = f"routing of {self.answer['model']!r}" if "model" in self.answer else "the routing"
        return {"id": self.answer.get("id"), "ok": False, "error": {"code": p.INTERNAL, "message": (
            f"{error}; {what} is in force as answered but not saved: a restart loses it unless a later "
            f"write succeeds (retried every {RETRY_S:g}s)")}}


class AdminServer:
    def __init__(self, cfg: Config, ops: "AdminOps", log: logging.Logger):
        self.ops, self.log = ops, log
        # With CURVE, a context of its own: one ZAP handler per context, and the admin keys must not
        # mix with the client socket's.  Without, the shared one (a second context's IO thread
        # measurably reordered hub and client traffic in the component tests).
        curve = bool(cfg.admin_curve_secret_key_file)
        self.own_ctx = curve
        self.ctx = zmq.Context() if curve else zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_ADMIN_BYTES)
        self.auth = None
        if curve:
            self.auth = curve_server(self.ctx, self.sock, cfg.admin_curve_secret_key_file,
                                     cfg.admin_curve_client_keys_dir)
        self.addr = admin_addr(cfg.admin_addr, cfg.runtime_dir)
        try:
            self.sock.bind(self.addr)
        except zmq.ZMQError as exc:
            self.close()
            raise RuntimeError(f"cannot bind the admin socket AIENG_ADMIN_ADDR={self.addr}: {exc}") from None
        log.info("admin socket on %s%s", self.addr, " (CURVE)" if self.auth else "")

    def drain(self) -> None:
        for _ in range(100):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            out = self.ops.handle(frames[-1])
            if isinstance(out, Pending):  # sent when the state file holds the change (or cannot)
                out.ticket.then(lambda err, env=frames[:-1], o=out: self.send(env, o.reply(err)))
            else:
                self.send(frames[:-1], out)

    def send(self, envelope: list, answer: dict) -> None:
        self.sock.send_multipart(envelope + [p.pack(answer)])

    def close(self) -> None:
        self.sock.close(0)
        if self.auth is not None:
            self.auth.stop()
        if self.own_ctx:
            self.ctx.term()


class Versions(Protocol):
    """What admin ops ask of ``versions.manager.VersionManager``."""

    def load(self, name: str, version: str, source: str = "admin", config: str | None = None) -> dict: ...

    def unload(self, name: str, version: str, source: str = "admin") -> dict: ...

    def rescan(self) -> dict[str, list[str]]: ...

    def loads_view(self) -> dict[str, dict]: ...


class AdminOps:
    def __init__(self, rollout: Rollout, mirror: Mirror, versions: Versions, workers: Workers,
                 specs: ServedVersions,
                 log: logging.Logger, wide: dict[str, Callable[[dict], dict]] | None = None):
        self.rollout, self.mirror, self.versions, self.workers = rollout, mirror, versions, workers
        self.specs, self.log = specs, log
        self.table: dict[str, Callable[[dict], dict | Pending]] = {
            "status": self.status, "models": self.models, "set_weights": self.set_weights,
            "set_rules": self.set_rules, "rollback": self.rollback, "promote": self.promote,
            "reload": self.reload, "shadow_on": self.shadow_on, "shadow_off": self.shadow_off,
            "load": self.load, "unload": self.unload, **(wide or {}),
        }

    def handle(self, body: bytes) -> dict | Pending:
        req_id = None
        try:
            try:
                req = p.unpack_limited(body, MAX_ADMIN_BYTES)
            except Exception as exc:
                raise p.RequestError(p.INVALID_REQUEST, f"malformed msgpack: {type(exc).__name__}") from None
            if not isinstance(req, dict):
                raise p.RequestError(p.INVALID_REQUEST, "an admin request must be a msgpack map")
            req_id = req.get("id") if p.valid_id(req.get("id")) else None
            fn = self.table.get(req.get("op")) if isinstance(req.get("op"), str) else None
            if fn is None:
                raise p.RequestError(p.INVALID_REQUEST, f"unknown admin op {req.get('op')!r} "
                                                    f"(have {', '.join(self.table)})")
            out = fn(req)
        except p.RequestError as exc:
            return {"id": req_id, "ok": False, "error": {"code": exc.code, "message": exc.message}}
        except RoutingError as exc:
            return {"id": req_id, "ok": False, "error": {"code": p.INVALID_REQUEST, "message": str(exc)}}
        except Exception as exc:  # a bug must not take the frontend down
            self.log.exception("admin op failed")
            return {"id": req_id, "ok": False, "error": {"code": p.INTERNAL, "message": type(exc).__name__}}
        if isinstance(out, Pending):
            out.answer.update({"id": req_id, "ok": True})
        else:
            out.update({"id": req_id, "ok": True})
        return out

    def model(self, req: dict):
        name = req.get("model")
        m = self.rollout.model(name)
        if m is None:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"unknown model {name!r} "
                                                f"(serving {', '.join(self.rollout.names())})")
        return m

    def commit(self, m, new: routing.RoutingState, what: str) -> Pending:
        failed = self.workers.failed_models()
        targets = {v for v, w in new.weights.items() if w > 0} | {r.version for r in new.rules}
        for v in sorted(targets):
            if f"{m.name}:{v}" in failed:  # routing to it would answer UNAVAILABLE
                raise p.RequestError(p.INVALID_REQUEST, f"version {v} of {m.name!r} is not loaded "
                                                    f"({failed[f'{m.name}:{v}']}); nothing changed")
        before = m.state
        if new.routes_as(before):  # nothing to change or log: no history entry either
            return Pending(self.rollout.saved_ticket(), {"model": m.name, "routing": routing_view(before),
                                                            "moved_buckets": 0, "changed": False})
        ticket = self.rollout.change(m, new)
        moved = sum(1 for a, b in zip(before.owner, new.owner) if a != b)
        self.log.warning("routing of %s changed by %s: weights %s, %d rules, %d buckets moved", m.name,
                            what, new.weights, len(new.rules), moved)
        return Pending(ticket, {"model": m.name, "routing": routing_view(new), "moved_buckets": moved,
                                "changed": True})

    # -- ops -------------------------------------------------------------------------------
    def status(self, req: dict) -> dict:
        names = [self.model(req).name] if req.get("model") is not None else self.rollout.names()
        now = time.monotonic()
        out = {n: self.rollout.status(n, now) for n in names}
        for n in names:  # the shadow comparison so far, per candidate version (mirror.py)
            out[n]["shadow_stats"] = self.mirror.view(n)
        for key, view in self.versions.loads_view().items():
            name, _, version = key.partition(":")
            if name in out:
                out[name].setdefault("loads", {})[version] = view
        return {"models": out}

    def models(self, req: dict) -> dict:
        failed = self.workers.failed_models()
        out = {}
        for name, versions in self.specs.items():
            state = self.rollout.model(name).state
            out[name] = {"stable": state.stable, "versions": {
                v: {"hash": s.content_hash, "description": s.description,
                    "metadata": s.metadata.thaw(), "weight": state.weights.get(v, 0.0),
                    "load_error": failed.get(s.key), "path": s.path,
                    **({"inferred": s.inferred.public()} if s.inferred else {})}
                for v, s in versions.items()}}
        for name, why in self.workers.left_out_models().items():  # left out at start: no version read
            out[name] = {"stable": None, "versions": {}, "load_error": why}
        for key, view in self.versions.loads_view().items():  # loading, failed, draining, unloaded: shown too
            name, _, version = key.partition(":")
            if name in out:
                entry = out[name]["versions"].setdefault(version, {"weight": 0.0})
                entry["load"] = view
        return {"models": out}

    def set_weights(self, req: dict) -> Pending:
        m = self.model(req)
        new = routing.build(m.state, m.versions, req.get("weights"), reason="set_weights")
        return self.commit(m, new, "set_weights")

    def set_rules(self, req: dict) -> Pending:
        m = self.model(req)
        rules = {"rules": req.get("rules"), "groups": req.get("groups")}
        if rules["rules"] is None:
            raise p.RequestError(p.INVALID_REQUEST, "set_rules needs 'rules' (a list; [] removes every rule)")
        new = routing.build(m.state, m.versions, rules=rules, allow_pinned=req.get("allow_pinned"),
                            reason="set_rules")
        return self.commit(m, new, "set_rules")

    def promote(self, req: dict) -> Pending:
        m = self.model(req)
        version = req.get("version")
        version = str(version) if isinstance(version, int) and not isinstance(version, bool) else version
        if version not in m.versions:
            raise p.RequestError(p.MODEL_NOT_FOUND, f"model {m.name!r} has no version {version!r}")
        weights = {v: (100.0 if v == version else 0.0) for v in m.state.weights}
        weights[version] = 100.0
        new = routing.build(m.state, m.versions, weights, reason=f"promote {version}")
        return self.commit(m, new, "promote")

    def rollback(self, req: dict) -> Pending:
        m = self.model(req)
        if not m.history:
            raise p.RequestError(p.INVALID_REQUEST,
                                 f"model {m.name!r} has no previous routing to roll back to")
        ticket = self.rollout.rollback(m)
        self.log.warning("routing of %s rolled back: weights %s", m.name, m.state.weights)
        return Pending(ticket, {"model": m.name, "routing": routing_view(m.state)})

    def shadow_on(self, req: dict) -> Pending:
        """Mirror ``percent`` of the model's requests to ``version`` (``max_load``, ``timeout_ms``)."""
        m = self.model(req)
        conf = parse_shadow({k: req[k] for k in ("version", "percent", "max_load", "timeout_ms")
                                    if k in req}, m.versions)
        failed = self.workers.failed_models().get(f"{m.name}:{conf.version}")
        if failed is not None:
            raise p.RequestError(p.INVALID_REQUEST, f"version {conf.version} of {m.name!r} is not loaded "
                                                f"({failed}); nothing changed")
        new = routing.build(m.state, m.versions, reason=f"shadow on: {conf.percent:g}% to {conf.version}",
                            shadow=conf)
        return self.commit(m, new, "shadow_on")

    def shadow_off(self, req: dict) -> Pending:
        m = self.model(req)
        if m.state.shadow is None:
            raise p.RequestError(p.INVALID_REQUEST, f"model {m.name!r} has no shadow traffic to turn off")
        return self.commit(m, routing.build(m.state, m.versions, reason="shadow off", shadow=None),
                           "shadow_off")

    def version_arg(self, req: dict) -> tuple[str, str]:
        name, version = req.get("model"), req.get("version")
        version = str(version) if isinstance(version, int) and not isinstance(version, bool) else version
        if not isinstance(name, str) or not isinstance(version, str) or not version:
            raise p.RequestError(p.INVALID_REQUEST, "load/unload need 'model' and 'version' (strings)")
        return name, version

    def load(self, req: dict) -> dict:
        config = req.get("config")  # a Triton ModelConfig in JSON form, used instead of its config.pbtxt
        if config is not None and not isinstance(config, str):
            raise p.RequestError(p.INVALID_REQUEST, "load's 'config' must be a string: a ModelConfig as JSON")
        override = {"config": config} if config is not None else {}
        return self.versions.load(*self.version_arg(req), **override)

    def unload(self, req: dict) -> dict:
        return self.versions.unload(*self.version_arg(req))

    def reload(self, req: dict) -> dict:
        dirs = self.versions.rescan()
        try:
            changed = self.rollout.reload_from_disk()
        except model_repo.ModelError as exc:
            raise p.RequestError(p.INVALID_REQUEST, f"{exc}; nothing changed") from None
        return {"changed": changed, "versions": dirs}


def routing_view(state: routing.RoutingState) -> dict:
    return {"weights": state.weights, "stable": state.stable, "rules": [r.name for r in state.rules],
            "allow_pinned": state.allow_pinned, "reason": state.reason,
            "shadow": state.shadow.public() if state.shadow is not None else None}
