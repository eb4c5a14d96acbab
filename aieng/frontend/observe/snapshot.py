"""What the HTTP thread may read: a snapshot the frontend loop publishes.

The loop calls ``publish_snapshot`` every ``snapshot_ms`` (and at once when a
worker comes or goes, without the costly stage summary, which is refreshed
only when a /debug has asked for it since the last one).  It builds a fresh
dict and swaps it in whole; nothing mutates it afterwards, so the HTTP
threads never touch the loop's tables and never make the loop compute on
their behalf, however many scrapers there are.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aieng.frontend.observe.procinfo import gpu_usage, process_memory
from aieng.frontend.requests.table import EXEC, POST, PRE

if TYPE_CHECKING:  # pragma: no cover
    from aieng.frontend.server import Frontend

MEMORY_EVERY_S = 2.0  # process memory costs a psutil call per process


def publish_snapshot(fe: "Frontend", now: float, full: bool = True) -> None:
    health = fe.ops.health(None)
    depth = fe.table.depth()
    fe.metrics.in_flight.set(len(fe.table))
    for stage in (PRE, EXEC, POST):
        fe.metrics.queue.labels(stage).set(depth.get(stage, 0))
    prev = fe.snapshot
    # The stage summary costs the loop milliseconds (more with full windows), so it is refreshed
    # only on a periodic snapshot after a /debug asked for it: at most once per period, however
    # many ask, and never while nobody looks.
    asked = full and fe.http is not None and fe.http.debug_asked.is_set()
    if asked:
        fe.http.debug_asked.clear()
    snap = {"published_at": now, "supervisor_seen_at": fe.supervisor_seen_at,
            "health": health, "queue_depth": depth, "counts": fe.pipeline.counts.view(),
            "in_flight": len(fe.table),
            "drift_psi": {"/".join(k): round(v, 4) for k, v in fe.drift.scores().items()},
            "stats": fe.stats.summary(None) if asked else prev.get("stats", {}),
            "routing": fe.rollout.view(), "pool": fe.poolctl.view(),
            "models": {name: {v: {"hash": sp.content_hash, "metadata": sp.extra.get("metadata", {})}
                              for v, sp in vs.items()} for name, vs in fe.specs.items()}}
    old = fe.metrics.snapshot
    msnap = {"restarts": dict(fe.state["restarts"]), "ready": health["ready"],
             "models": {(k.split(":")[0], k.split(":")[1], v or "none"): 1.0
                        for k, v in health["providers"].items()},
             "rss": old.get("rss", {}), "gpus": old.get("gpus", {}), "drift": fe.drift.scores(),
             "rss_at": old.get("rss_at", 0.0), "clients": fe.gate.view()}
    if now >= msnap["rss_at"] or not msnap["rss"]:
        msnap["rss"] = process_memory(fe.state["processes"])
        msnap["gpus"] = gpu_usage() if fe.workers.info("executor").get("runtime", {}).get("gpus") else {}
        msnap["rss_at"] = now + MEMORY_EVERY_S
    snap["memory"] = {f"{w}": v for (_, w), v in msnap["rss"].items()}
    snap["gpus"] = {str(i): {"memory_used_bytes": u, "utilization": g} for i, (u, g) in msnap["gpus"].items()}
    fe.metrics.snapshot = msnap
    fe.snapshot = snap
