"""What the client ops and the snapshots show of the other components: one named read per view.

The composition root (``frontend/server.py``) builds one ``Views`` of the components' own ``view``
methods; ``control/ops.ClientOps`` (health, models, stats) and ``observe/snapshot.Snapshots`` (the HTTP
snapshot and the Prometheus collector) call them by name.  Each call returns a fresh plain value (maps
of numbers and strings, ready for msgpack or JSON); none changes the component it reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Views:
    breakers: Callable[[], dict]  # requests/breaker.Breakers: open or failing breakers
    degradation: Callable[[], dict]  # requests/degrade.Degrader: each model's level
    cache: Callable[[], dict | None]  # requests/cache.ResponseCache: None when the cache is off
    clients: Callable[[], dict]  # requests/clients.ClientGate: replies dropped, requests refused
    counts: Callable[[], dict]  # requests/answers: requests and errors counted
    pool: Callable[[], dict[str, Any]]  # versions/manager.VersionManager: the model pool
    routing: Callable[[], dict]  # rollout/rollout.Rollout: each model's routing
    drift: Callable[[], dict]  # observe/drift.DriftMonitor: references and PSI
    direct: Callable[[], dict[str, Any]]  # requests/pipeline.Pipeline: the direct route's limits
    lanes: Callable[[], dict] = dict  # control/workers.Workers.lanes: what the pool lanes carried
