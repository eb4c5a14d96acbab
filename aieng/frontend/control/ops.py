"""Client ops other than ``infer``: health, models, stats, log_level (a dispatch table).

Each op reads the components it was given and returns the reply map; none blocks.  Two of them can
change more than the caller's own request: a ``log_level`` change (every process logs more, or less)
and a ``stats`` reset (everyone's report window and the shadow comparison).  Those are admin operations:
``wide_ops`` serves them on the admin socket (``admin.py``); on the client socket they answer
PERMISSION_DENIED and change nothing unless ``client_admin`` (``AIENG_CLIENT_ADMIN_OPS``).  Reading
(``log_level`` without a level, ``stats`` without ``reset``) is served to every client.
``models`` answers from a reply packed once per change of what the workers
report, so a flood of it costs a lookup each (the op rate limit bounds the
rest); a model the start left out is listed with its ``load_error`` and no
versions.  Every map key in a reply is a string (docs/protocol.md).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from aieng.frontend.control.lifecycle import Lifecycle
from aieng.frontend.control.views import Views
from aieng.frontend.control.workers import Workers
from aieng.frontend.observe.stats import StageStats
from aieng.frontend.requests.table import RequestTable
from aieng.frontend.rollout.mirror import Mirror
from aieng.frontend.rollout.rollout import Rollout
from aieng.models.served import ServedVersions
from aieng.wire import messages as m
from aieng.wire import protocol as p

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _version() -> str:
    from aieng import __version__
    return __version__


class ClientOps:
    def __init__(self, workers: Workers, life: Lifecycle, table: RequestTable,
                 specs: ServedVersions, rollout: Rollout, stats: StageStats, mirror: Mirror,
                 hub: Callable[[str, list], bool], views: Views, log: logging.Logger,
                 client_admin: bool = False):
        """``views``: what health, models and stats show of the other components (``views.Views``);
        ``hub(worker, frames)`` sends to a worker or the supervisor; ``client_admin``: the
        server-wide changes are served on the client socket too."""
        self.client_admin = client_admin
        self.workers, self.life, self.table, self.specs, self.rollout = workers, life, table, specs, rollout
        self.stats, self.mirror, self.hub, self.views, self.log = stats, mirror, hub, views, log
        self.level_set: str | None = None  # the last level log_level set at run time (None: none yet)
        self.table_ops: dict[str, Callable[[Any, dict], dict]] = {
            "health": self.health, "models": self.models, "stats": self.stats_op, "log_level": self.log_level,
        }
        self._models_key: Any = None
        # kept packed: rebuilt only when what it shows changes (the gateways ask every 2 s), and as dicts it
        # would hold every version's public view (~5 KiB each) for nothing between calls
        self._models_reply = m.Packed()

    def handle(self, op: str, req_id: Any, req: dict) -> dict | None:
        """The op's reply (sent with ``protocol.pack_map``: the models list is spliced in packed)."""
        fn = self.table_ops.get(op)
        return None if fn is None else fn(req_id, req)

    def health(self, req_id: Any = None, req: dict | None = None) -> dict:
        life, views = self.life, self.views
        now = time.monotonic()
        roles = self.workers.count(now)
        ex = self.workers.last_hello("executor")
        providers = dict(ex.providers) if ex is not None else {}
        live = all(roles.values())
        # ready: started once, every role has a live worker (one of several restarting still
        # serves), not draining.  ``degraded`` says some process is down or restarting.
        return {"id": req_id, "ok": True, "live": live,
                "ready": bool(life.started and live and not life.draining),
                "started": life.started,
                "degraded": not life.supervisor_ready,
                "protocol": p.PROTOCOL_VERSION, "version": _version(), "pid": os.getpid(),
                "uptime_s": round(life.uptime_s(), 3), "in_flight": len(self.table),
                "workers": roles, "providers": providers, "draining": life.draining,
                # preprocess workers on one slow request past STALL_S (Workers.pick_pre routes around them)
                "stalled": sorted(n for n, _ in self.workers.names(("preprocess",))
                                  if self.workers.stalled(n, now, self.table.busy)),
                "failed_models": self.workers.failed_models(),
                "breakers": views.breakers(), "degradation": views.degradation(),
                "cache": views.cache(), "clients": views.clients(),
                "processes": {n: ps.view() for n, ps in life.processes.items()}, "restarts": life.restarts,
                "counts": views.counts(), "direct": views.direct(), "lanes": views.lanes()}

    def models(self, req_id: Any, req: dict | None = None) -> dict:
        hello = self.workers.last_hello("executor")
        ex = hello.sessions if hello is not None else m.Packed()
        failed = self.workers.failed_models()
        # the executor's session facts arrive with its hello, after its pid may be known, and change (its
        # background_runs): key on their value (a bytes compare per call: they stay packed until shown)
        served = self.specs.generation  # counts the run-time loads and unloads
        images_off = self.views.direct()["images_off"]  # the frontend's own word on the image route
        key = (self.workers.pid("executor"), ex, served, tuple(sorted(failed.items())),
               self.rollout.serials(), images_off)
        if key != self._models_key:
            facts, out = ex.thaw(), {}
            for name, versions in self.specs.items():
                stable, weights = self.rollout.weights(name)
                out[name] = {"default_version": stable, "weights": weights,
                             "versions": {v: dict(s.public(), onnx=onnx_view(s, facts.get(s.key), images_off),
                                                  load_error=failed.get(s.key))
                                          for v, s in versions.items()}}
            for name, why in self.workers.left_out_models().items():  # left out at start: no version read
                out[name] = {"default_version": None, "weights": {}, "versions": {}, "load_error": why}
            self._models_key, self._models_reply = key, m.Packed.of(out)
        # the pool's view changes with every cold load and eviction: built per call (a few lazy versions)
        # drift scores move with every answer: built per call too (model -> version -> reference, PSI)
        return {"id": req_id, "ok": True, "models": self._models_reply, "pool": self.views.pool(),
                "drift": self.views.drift()}

    def wide_ops(self) -> dict[str, Callable[[dict], dict]]:
        """The server-wide ops as the admin socket serves them: ``fn(req)`` -> the reply's fields, or
        ``RequestError``."""
        def as_admin(op: Callable[..., dict]) -> Callable[[dict], dict]:
            def run(req: dict) -> dict:
                out = op(req.get("id"), req, admin=True)
                if not out["ok"]:  # the client socket's error reply, as the admin socket's error
                    raise p.RequestError(out["error"]["code"], out["error"]["message"])
                return out
            return run
        return {"log_level": as_admin(self.log_level), "stats": as_admin(self.stats_op)}

    @staticmethod
    def denied(req_id: Any, what: str, admin_op: str) -> dict:
        return {"id": req_id, "ok": False, "error": {"code": p.PERMISSION_DENIED, "message": (
            f"{what} changes the whole server: an admin operation (the admin socket's {admin_op!r} op; or "
            f"AIENG_CLIENT_ADMIN_OPS=1 to allow it on the client socket); nothing changed")}}

    def stats_op(self, req_id: Any, req: dict, admin: bool = False) -> dict:
        """Stage timings (for ``aieng report``), queue depths, counts; ``reset`` starts a new window
        (an admin operation: ``wide_ops``)."""
        if req.get("reset") is True and not (admin or self.client_admin):
            return self.denied(req_id, "a stats reset", "stats")
        since = req.get("since_s")
        is_number = isinstance(since, (int, float)) and not isinstance(since, bool)
        since = float(since) if is_number and since > 0 else None
        summary = self.stats.summary(since)
        summary.update({"id": req_id, "ok": True, "in_flight": len(self.table),
                        "queue_depth": self.table.depth(),
                        "counts": self.views.counts(), "restarts": self.life.restarts,
                        "shadow": self.mirror.view(), "pool": self.views.pool()})
        if req.get("reset") is True:
            self.stats.reset()
            self.mirror.reset()
        return summary

    def log_level(self, req_id: Any, req: dict, admin: bool = False) -> dict:
        """Change every process's log level at run time, no restart (an admin operation: ``wide_ops``);
        without ``level``, read it."""
        level = req.get("level")
        if level is None:  # a read (the OIP logging extension's GET): the frontend's level is every process's
            return {"id": req_id, "ok": True, "level": logging.getLevelName(logging.getLogger().level)}
        if not (admin or self.client_admin):
            return self.denied(req_id, "changing the log level", "log_level")
        if level not in LEVELS:
            return {"id": req_id, "ok": False,
                    "error": {"code": p.INVALID_REQUEST,
                              "message": "level must be DEBUG, INFO, WARNING or ERROR"}}
        logging.getLogger().setLevel(level)
        self.level_set = level
        msg = m.encode(m.LogLevel(level))
        names = self.workers.all_names() + ["supervisor"]
        told = [name for name in names if self.hub(name, [msg])]
        self.log.warning("log level set to %s (%s)", level, ", ".join(told))
        return {"id": req_id, "ok": True, "level": level, "processes": told}

    def joined(self, name: str) -> None:
        """``name`` said hello for the first time: after a run-time change it gets that level too (a
        process started before the change but heard from only after it, a gateway just after the start,
        was not among those told)."""
        if self.level_set is not None:
            self.hub(name, [m.encode(m.LogLevel(self.level_set))])


def onnx_view(spec, onnx: dict | None, images_off: str | None) -> dict | None:
    """A version's session facts as the executor reported them, except where the frontend has since sent
    its images to the pool (``Pipeline.images_off``): then its ``preprocess`` says so."""
    pre = (onnx or {}).get("preprocess") or {}
    if not images_off or spec.preprocess.type != "image" or pre.get("where", "pool") == "pool":
        return onnx
    return {**onnx, "preprocess": {"where": "pool", "why": images_off}}
