"""Graceful degradation per model version, driven by measured pressure (``degrade:`` in model.yaml).

``Degrader`` holds each opted-in version's level, its ``fallback`` answer and the latencies of
its last 200 answers; the loop calls ``update`` every 0.5 s with each version's requests in flight
(primaries only).  Levels, each including the ones below:
  1  skip optional postprocessing (e.g. ``top_k``);
  2  stop waiting to fill batches (the executor runs what it has);
  3  answer from the response cache, else the configured fallback answer, else OVERLOADED,
     without queueing the request.
A level is entered when either measure (requests in flight, or p95 latency once 20 answers are
known) reaches its threshold, and left when both fall below half of it, so it does not flap.
Answers given under a level carry ``"degraded": level``; health shows each version's level.
The setting: docs/models.md (``degrade``); where it acts: docs/architecture.md, "Lifecycle".
"""
from __future__ import annotations

from collections import deque

import numpy as np

from aieng.models.sections import Degrade
from aieng.models.served import ServedVersions


class _Model:
    def __init__(self, cfg: Degrade):
        self.depth = [float(x) for x in cfg.queue_depth or []]
        self.latency = [float(x) / 1000.0 for x in cfg.latency_ms or []]
        self.fallback = cfg.fallback.thaw() if cfg.fallback is not None else None
        self.level = 0
        self.recent: deque[float] = deque(maxlen=200)

    def update(self, in_flight: int) -> int:
        p95 = float(np.percentile(self.recent, 95)) if len(self.recent) >= 20 else 0.0

        def reached(level: int, scale: float) -> bool:
            i = level - 1
            return ((i < len(self.depth) and in_flight >= self.depth[i] * scale)
                    or (i < len(self.latency) and p95 >= self.latency[i] * scale))

        while self.level < 3 and reached(self.level + 1, 1.0):
            self.level += 1
        while self.level > 0 and not reached(self.level, 0.5):
            self.level -= 1
        return self.level


class Degrader:
    def __init__(self, specs: ServedVersions):
        self.models: dict[str, _Model] = {}
        for versions in specs.values():
            for spec in versions.values():
                cfg = spec.degrade
                if cfg is not None:
                    self.models[spec.key] = _Model(cfg)

    def level(self, key: str) -> int:
        m = self.models.get(key)
        return m.level if m else 0

    def fallback(self, key: str):
        m = self.models.get(key)
        return m.fallback if m else None

    def observe_latency(self, key: str, seconds: float) -> None:
        m = self.models.get(key)
        if m is not None:
            m.recent.append(seconds)

    def update(self, in_flight_by_model: dict[str, int]) -> None:
        for key, m in self.models.items():
            m.update(in_flight_by_model.get(key, 0))

    def view(self) -> dict[str, int]:
        return {k: m.level for k, m in self.models.items()}
