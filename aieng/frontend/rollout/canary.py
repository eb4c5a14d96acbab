"""Automatic rollback: is a canary worse than the stable version, over a recent window?

Pure logic.  The policy is ``models/routing.py``'s ``AutoRollback``, model.yaml's
``routing.auto_rollback`` (``parse``: None when off, ValueError when malformed).  A ``Watch`` per
model that configures it is told every answered request (``observe``: outcome and latency by
version; a client's error such as INVALID_INPUT is not counted at all), and ``verdict``, called
twice a second, names the first canary worse than the stable version (the one with the largest
weight) once the canary has ``min_requests`` in the last ``window_s`` seconds:

    error rate   errors / requests, an error being the version's fault (``FAULT_CODES``)
    worse when   canary error rate - stable error rate > max_error_rate_delta
             or  canary p99 > max_p99_ratio x stable p99 (min_requests successful answers each)

Each version's window is a bounded deque of (time, ok, latency) samples (``MAX_SAMPLES``), so
memory stays flat at any rate.  As an operator sees it: docs/rollout.md, section 5.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from aieng.models.routing import AutoRollback

FAULT_CODES = frozenset({"INTERNAL", "TIMEOUT", "UNAVAILABLE"})
MAX_SAMPLES = 20_000


class Window:
    def __init__(self) -> None:
        self.samples: deque[tuple[float, bool, float]] = deque(maxlen=MAX_SAMPLES)

    def add(self, now: float, ok: bool, latency_s: float) -> None:
        self.samples.append((now, ok, latency_s))

    def trim(self, cut: float) -> None:
        while self.samples and self.samples[0][0] < cut:
            self.samples.popleft()

    def view(self) -> dict:
        n = len(self.samples)
        lat = [s[2] for s in self.samples if s[1]]
        errors = n - len(lat)
        return {"requests": n, "errors": errors, "error_rate": errors / n if n else 0.0,
                "p99_s": float(np.percentile(lat, 99)) if lat else None, "ok": len(lat)}


class Watch:
    """The windows of one model's versions."""

    def __init__(self, policy: AutoRollback):
        self.policy = policy
        self.windows: dict[str, Window] = {}

    def observe(self, version: str, now: float, code: str, latency_s: float) -> None:
        if code != "OK" and code not in FAULT_CODES:
            return
        w = self.windows.get(version)
        if w is None:
            w = self.windows[version] = Window()
        w.add(now, code == "OK", latency_s)

    def views(self, now: float) -> dict[str, dict]:
        cut = now - self.policy.window_s
        for w in self.windows.values():
            w.trim(cut)
        return {v: w.view() for v, w in self.windows.items()}

    def verdict(self, now: float, stable: str, canaries: list[str]) -> tuple[str, str] | None:
        """(version, why) of the first canary worse than ``stable``, or None."""
        p = self.policy
        views = self.views(now)
        base = views.get(stable, Window().view())
        for v in canaries:
            c = views.get(v)
            if c is None or c["requests"] < p.min_requests:
                continue
            delta = c["error_rate"] - base["error_rate"]
            if delta > p.max_error_rate_delta:
                return v, (f"error rate {c['error_rate']:.1%} vs stable {stable} {base['error_rate']:.1%} "
                           f"(over {p.window_s:g}s; allowed delta {p.max_error_rate_delta:.1%})")
            if (c["ok"] >= p.min_requests and base["ok"] >= p.min_requests and base["p99_s"]
                    and c["p99_s"] > p.max_p99_ratio * base["p99_s"]):
                return v, (f"p99 {c['p99_s'] * 1000:.1f} ms vs stable {stable} {base['p99_s'] * 1000:.1f} ms "
                           f"(over {p.window_s:g}s; allowed ratio {p.max_p99_ratio:g})")
        return None

    def forget(self, version: str) -> None:
        self.windows.pop(version, None)
