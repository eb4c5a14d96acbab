"""The live status page of the probe port: ``/`` (the page), ``/status.js`` and ``/status.css`` (its script
and style, files of this package under ``pages/``, read once at start) and ``/status.json`` (the feed the
page polls about once a second).

The feed is built by ``feed(snapshot)`` from the snapshot the frontend loop publishes (``snapshot.py``), on
the HTTP thread, and encoded once per published snapshot: the HTTP thread never calls into the loop.  It
holds, per model: each version's readiness, routing weight (and its share of the model's) and hash, the
canary's state (versions other than the stable one with a weight, whether an auto-rollback watches them,
the routing's last reason and event), the last minute of answers (``window.RollingWindow``: requests a
second, errors, p50 and p99) and the stage timings; and for the server: readiness, in-flight requests,
queue depth per stage, drift scores (PSI, largest first) and the processes with their CPU and memory.

The page shell and its files carry no data and load without the token; the feed needs what /debug needs
(``http.authorized``), so the page asks for the token, keeps it in sessionStorage and sends it as
``Authorization: Bearer``.  The page has no operations.  Its Content-Security-Policy allows only this
origin's script, style and fetches: nothing external is loaded, nothing inline runs.
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

FEED = "/status.json"
ASSETS = {"/": ("status.html", "text/html; charset=utf-8"),
          "/status.js": ("status.js", "text/javascript; charset=utf-8"),
          "/status.css": ("status.css", "text/css; charset=utf-8")}
PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
                                "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
MAX_DRIFT_ROWS = 50  # the largest scores; a model with hundreds of features would bury the page


def load_assets() -> dict[str, tuple[bytes, str]]:
    """``{path: (bytes, content type)}`` of the page's files, read from the package."""
    pages = resources.files(__package__).joinpath("pages")
    return {path: (pages.joinpath(name).read_bytes(), ctype) for path, (name, ctype) in ASSETS.items()}


def _version_key(v: str) -> tuple:
    return (0, int(v), "") if v.isdigit() else (1, 0, v)


def _state(key: str, providers: dict, failed: dict) -> str:
    if key in failed:
        return "failed"
    return "ready" if key in providers else "not loaded"


def _stages(model_stats: dict | None) -> dict[str, Any]:
    """Each stage's p50 and share of the total, in the order of the pipeline, and the total's p50/p99."""
    if not model_stats or "stages_us" not in model_stats:
        return {}
    stages = model_stats["stages_us"]
    total = stages.get("total", {})
    return {"stages": [{"stage": name, "p50_us": round(s["p50"], 1), "share": round(s["share"], 4)}
                       for name, s in stages.items() if name != "total"],
            "total_p50_us": round(total.get("p50", 0.0), 1), "total_p99_us": round(total.get("p99", 0.0), 1),
            "requests": model_stats.get("requests", 0)}


def _model(name: str, versions: dict, snap: dict) -> dict[str, Any]:
    health = snap.get("health", {})
    providers, failed = health.get("providers", {}), health.get("failed_models", {})
    route = snap.get("routing", {}).get(name, {})
    weights, stable = route.get("weights", {}), route.get("stable")
    total = sum(weights.values()) or 1.0  # weights are relative (model.yaml's 90/10): the share routes
    traffic = snap.get("traffic", {}).get(name, {})
    rows = []
    for v in sorted(versions, key=_version_key):
        key = f"{name}:{v}"
        rows.append({"version": v, "state": _state(key, providers, failed), "error": failed.get(key),
                     "provider": providers.get(key), "weight": weights.get(v, 0.0),
                     "share": round(weights.get(v, 0.0) / total, 4), "stable": v == stable,
                     "hash": (versions[v].get("hash") or "")[:12], "traffic": traffic.get(v)})
    events = route.get("events") or []
    canary = sorted((v for v, w in weights.items() if v != stable and w > 0), key=_version_key)
    return {"name": name, "stable": stable, "versions": rows, "traffic": traffic.get(""),
            "canary": {"versions": canary, "auto_rollback": bool(route.get("auto_rollback")),
                       "reason": route.get("reason"), "last_event": events[-1] if events else None},
            "timings": _stages(snap.get("stats", {}).get("models", {}).get(name))}


def feed(snap: dict[str, Any]) -> dict[str, Any]:
    """What the status page shows, from one published snapshot (a pure function of it)."""
    health = snap.get("health", {})
    models = [_model(name, versions, snap) for name, versions in sorted(snap.get("models", {}).items())]
    for name, why in sorted(health.get("failed_models", {}).items()):  # left out at start: no version read
        if ":" not in name and name not in snap.get("models", {}):
            models.append({"name": name, "stable": None, "versions": [], "traffic": None, "timings": {},
                           "canary": {"versions": [], "auto_rollback": False, "reason": why,
                                      "last_event": None},
                           "error": why})
    memory, cpu = snap.get("memory", {}), snap.get("cpu", {})
    processes = [{"name": n, "role": p.get("role"), "pid": p.get("pid"), "alive": p.get("alive"),
                  "restarts": p.get("restarts", 0), "cpu_percent": cpu.get(n), "rss_bytes": memory.get(n)}
                 for n, p in sorted(health.get("processes", {}).items())]
    drift = sorted(snap.get("drift_psi", {}).items(), key=lambda kv: -kv[1])[:MAX_DRIFT_ROWS]
    return {"server": {"ready": bool(health.get("ready")), "started": bool(health.get("started")),
                       "degraded": bool(health.get("degraded")), "draining": bool(health.get("draining")),
                       "version": health.get("version"), "uptime_s": health.get("uptime_s"),
                       "in_flight": snap.get("in_flight", 0), "queue_depth": snap.get("queue_depth", {}),
                       "counts": snap.get("counts", {}), "stats_at": snap.get("stats_at"),
                       "published_at": snap.get("published_at")},
            "models": models,
            "drift": [{"key": k, "psi": v} for k, v in drift],
            "processes": processes,
            "gpus": snap.get("gpus", {})}


class StatusPage:
    """The page's files and the feed's JSON, cached per published snapshot (swapped whole, never mutated)."""

    def __init__(self) -> None:
        self.assets = load_assets()
        self.cached: tuple[dict, bytes] | None = None

    def asset(self, path: str) -> tuple[bytes, str] | None:
        return self.assets.get(path)

    def feed_json(self, snap: dict[str, Any]) -> bytes:
        cached = self.cached
        if cached is not None and cached[0] is snap:
            return cached[1]
        body = json.dumps(feed(snap), default=str).encode()
        self.cached = (snap, body)
        return body
