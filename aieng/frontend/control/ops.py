"""Client ops other than ``infer``: health, models, stats, log_level (a dispatch table).

Each op reads the frontend's state and returns the reply map; none blocks.
``models`` answers from a reply packed once per change of what the workers
report, so a flood of it costs a lookup each (the op rate limit bounds the
rest).  Every map key in a reply is a string (docs/protocol.md).
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from aieng.wire import messages as m
from aieng.wire import protocol as p

if TYPE_CHECKING:  # pragma: no cover
    from aieng.frontend.server import Frontend

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _version() -> str:
    from aieng import __version__
    return __version__


class ClientOps:
    def __init__(self, fe: "Frontend"):
        self.fe = fe
        self.table: dict[str, Callable[[Any, dict], dict]] = {
            "health": self.health, "models": self.models, "stats": self.stats, "log_level": self.log_level,
        }
        self._models_key: Any = None
        self._models_reply: dict = {}

    def handle(self, op: str, req_id: Any, req: dict) -> dict | None:
        fn = self.table.get(op)
        return None if fn is None else fn(req_id, req)

    def health(self, req_id: Any, req: dict | None = None) -> dict:
        fe = self.fe
        now = time.monotonic()
        roles = fe.workers.count(now)
        models = fe.workers.info("executor").get("models", {})
        providers = {k: v.get("provider") for k, v in models.items()}
        live = all(roles.values())
        # ready: started once, every role has a live worker (one of several restarting still
        # serves), not draining.  ``degraded`` says some process is down or restarting.
        return {"id": req_id, "ok": True, "live": live,
                "ready": bool(fe.admission.started and live and not fe.admission.draining),
                "started": fe.admission.started,
                "degraded": not fe.supervisor_ready,
                "protocol": p.PROTOCOL_VERSION, "version": _version(), "pid": os.getpid(),
                "uptime_s": round(time.time() - fe.started, 3), "in_flight": len(fe.table),
                "workers": roles, "providers": providers, "draining": fe.admission.draining,
                "failed_models": fe.failed_models(),
                "breakers": fe.breakers.view(), "degradation": fe.degrader.view(),
                "cache": fe.cache.view() if fe.cache.enabled else None, "clients": fe.gate.view(),
                "processes": fe.state["processes"], "restarts": fe.state["restarts"],
                "counts": fe.pipeline.counts.view()}

    def models(self, req_id: Any, req: dict | None = None) -> dict:
        fe = self.fe
        ex = fe.workers.info("executor").get("models", {})
        failed = fe.failed_models()
        w = fe.workers.by_name.get("executor")
        routes = tuple(r.state.serial for r in fe.rollout.models.values())  # a routing change repacks
        # the executor's session facts arrive with its hello, after its pid may be known, and change (its
        # background_runs): key on their value (a dict compare per call; the models op is not a hot path)
        served = tuple((n, tuple(sorted(v))) for n, v in sorted(fe.specs.items()))  # run-time loads change it
        key = (w.pid if w else None, ex, served, tuple(sorted(failed.items())), routes)
        if key != self._models_key:
            out = {}
            for name, versions in fe.specs.items():
                state = fe.rollout.models[name].state
                out[name] = {"default_version": state.stable, "weights": state.weights,
                             "versions": {v: dict(s.public(), onnx=ex.get(s.key),
                                                  load_error=failed.get(s.key))
                                          for v, s in versions.items()}}
            self._models_key, self._models_reply = key, out
        # the pool's view changes with every cold load and eviction: built per call (a few lazy versions)
        return {"id": req_id, "ok": True, "models": self._models_reply, "pool": fe.poolctl.view()}

    def stats(self, req_id: Any, req: dict) -> dict:
        """Stage timings (for ``aieng report``), queue depths, counts; ``reset`` starts a new window."""
        fe = self.fe
        since = req.get("since_s")
        is_number = isinstance(since, (int, float)) and not isinstance(since, bool)
        since = float(since) if is_number and since > 0 else None
        summary = fe.stats.summary(since)
        summary.update({"id": req_id, "ok": True, "in_flight": len(fe.table), "queue_depth": fe.table.depth(),
                        "counts": fe.pipeline.counts.view(), "restarts": fe.state["restarts"],
                        "shadow": fe.mirror.view(), "pool": fe.poolctl.view()})
        if req.get("reset") is True:
            fe.stats.reset()
            fe.mirror.reset()
        return summary

    def log_level(self, req_id: Any, req: dict) -> dict:
        """Admin op: change every process's log level at run time, no restart."""
        level = req.get("level")
        if level not in LEVELS:
            return {"id": req_id, "ok": False,
                    "error": {"code": p.INVALID_REQUEST,
                              "message": "level must be DEBUG, INFO, WARNING or ERROR"}}
        logging.getLogger().setLevel(level)
        msg = m.encode(m.LogLevel(level))
        names = list(self.fe.workers.by_name) + ["supervisor"]
        told = [name for name in names if self.fe.send_hub(name, [msg])]
        self.fe.log.warning("log level set to %s (%s)", level, ", ".join(told))
        return {"id": req_id, "ok": True, "level": level, "processes": told}
