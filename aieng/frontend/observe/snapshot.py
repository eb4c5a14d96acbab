"""What the HTTP thread may read: a snapshot the frontend loop publishes (``Snapshots``).

The loop calls ``publish`` every ``snapshot_ms`` (and at once when a worker comes or goes, without the
costly stage summary, which is refreshed only when a /debug or /status.json has asked for it since the last
one).  Each builds a fresh dict and swaps it in whole; nothing mutates it afterwards, so the HTTP thread
never touches the loop's tables and never makes the loop compute on its behalf, however many scrapers
there are.  The Prometheus collector's part goes to ``Metrics.publish`` the same way.  With a ``window``
(``observe/window.RollingWindow``, when the probe port is on) it also holds each model's last minute
(``traffic``, refreshed as the stage summary is: when /debug or /status.json asked) and each process's
CPU (``cpu``, sampled with the memory), which the status page shows.
"""
from __future__ import annotations

import threading
from dataclasses import asdict
from typing import Any, Callable

from aieng.frontend.control.lifecycle import Lifecycle
from aieng.frontend.control.views import Views
from aieng.frontend.control.workers import Workers
from aieng.frontend.observe.drift import DriftMonitor
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.observe.procinfo import CpuUsage, gpu_usage, process_memory
from aieng.frontend.observe.stats import StageStats
from aieng.frontend.observe.window import RollingWindow
from aieng.frontend.requests.table import EXEC, POST, PRE, RequestTable
from aieng.models.served import ServedVersions

MEMORY_EVERY_S = 2.0  # process memory costs a psutil call per process


class Snapshots:
    def __init__(self, metrics: Metrics, table: RequestTable, stats: StageStats, drift: DriftMonitor,
                 life: Lifecycle, workers: Workers, specs: ServedVersions,
                 health: Callable[[], dict], views: Views,
                 debug_asked: threading.Event | None, window: RollingWindow | None = None):
        """``health()`` is the health op's answer; of ``views`` (``control/views.Views``) it shows
        ``counts``, ``routing``, ``pool`` and ``clients``; ``debug_asked`` is set by the HTTP side when a
        /debug or /status.json wants a fresh stage summary."""
        self.metrics, self.table, self.stats, self.drift = metrics, table, stats, drift
        self.life, self.workers, self.specs, self.health = life, workers, specs, health
        self.views, self.debug_asked, self.window = views, debug_asked, window
        self.cpu = CpuUsage() if window is not None else None
        self._cpu: dict[str, float] = {}
        self.current: dict[str, Any] = {}
        self._rss: dict = {}
        self._gpus: dict = {}
        self._rss_at = 0.0

    def publish(self, now: float, full: bool = True) -> None:
        health = self.health()
        depth = self.table.depth()
        self.metrics.in_flight.set(len(self.table))
        for stage in (PRE, EXEC, POST):
            self.metrics.queue.labels(stage).set(depth.get(stage, 0))
        # The stage summary costs the loop milliseconds (more with full windows), so it is refreshed
        # only on a periodic snapshot after a /debug asked for it: at most once per period, however
        # many ask, and never while nobody looks.
        asked = full and self.debug_asked is not None and self.debug_asked.is_set()
        if asked:
            self.debug_asked.clear()
        counts, routing, pool = self.views.counts(), self.views.routing(), self.views.pool()
        dview = self.drift.view()  # PSI per feature, computed once per snapshot
        drift, out_drift, refs = {}, {}, {}
        for model, versions in dview.items():
            for version, d in versions.items():
                drift.update({(model, version, f): v for f, v in d["psi"]["input"].items()})
                out_drift.update({(model, version, f): v for f, v in d["psi"]["output"].items()})
                refs[(model, version)] = d["reference"]
        snap = {"published_at": now, "supervisor_seen_at": self.life.supervisor_seen_at,
                "health": health, "queue_depth": depth, "counts": counts,
                "in_flight": len(self.table),
                "drift_psi": {"/".join(k): round(v, 4) for k, v in drift.items()},
                "drift": dview,
                "stats": self.stats.summary(None) if asked else self.current.get("stats", {}),
                "stats_at": now if asked else self.current.get("stats_at"),
                "routing": routing, "pool": pool,
                "models": {name: {v: {"hash": sp.content_hash, "metadata": sp.metadata.thaw()}
                                  for v, sp in vs.items()} for name, vs in self.specs.items()}}
        if self.window is not None:  # merging the minute costs the loop ~0.1 ms a model: only while watched
            snap["traffic"] = ({model: {v: asdict(t) for v, t in rows.items()}
                                for model, rows in self.window.view(now).items()}
                               if asked else self.current.get("traffic", {}))
        if now >= self._rss_at or not self._rss:
            self._rss = process_memory(self.life.processes)
            if self.cpu is not None:
                self._cpu = self.cpu.sample(self.life.processes)
            ex = self.workers.last_hello("executor")
            self._gpus = gpu_usage() if ex is not None and ex.gpus else {}
            self._rss_at = now + MEMORY_EVERY_S
        self.metrics.publish({
            "restarts": dict(self.life.restarts), "ready": health["ready"],
            "models": {(k.split(":")[0], k.split(":")[1], v or "none"): 1.0
                       for k, v in health["providers"].items()},
            "rss": self._rss, "gpus": self._gpus, "drift": drift, "output_drift": out_drift,
            "drift_refs": refs, "clients": self.views.clients()})
        snap["memory"] = {f"{w}": v for (_, w), v in self._rss.items()}
        snap["cpu"] = dict(self._cpu)
        snap["gpus"] = {str(i): {"memory_used_bytes": u, "utilization": g}
                        for i, (u, g) in self._gpus.items()}
        self.current = snap
