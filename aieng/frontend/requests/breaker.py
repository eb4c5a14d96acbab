"""Circuit breakers, one per model version, kept by the frontend.

closed     requests flow; each model failure (INTERNAL from the executor: the run
           itself failed) counts, a success resets the count.
open       after ``threshold`` consecutive failures: requests for that model fail
           fast with UNAVAILABLE for ``cooldown`` seconds; other models are not
           affected.
half-open  after the cooldown one request is let through as a probe: success
           closes the breaker, failure opens it again with the cooldown doubled
           (up to 60 s); anything else (e.g. the probe's own input was bad)
           frees the probe slot for the next request.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_COOLDOWN_S = 60.0


@dataclass
class _State:
    state: str = "closed"
    failures: int = 0
    opened_at: float = 0.0
    cooldown: float = 0.0
    probing: bool = False


class Breakers:
    def __init__(self, threshold: int, cooldown_s: float):
        self.threshold, self.cooldown_s = threshold, cooldown_s
        self.states: dict[str, _State] = {}

    def allow(self, key: str, now: float) -> tuple[bool, bool, str]:
        """``(admit, is_probe, why)`` for a new request of ``key``."""
        s = self.states.get(key)
        if self.threshold <= 0 or s is None or s.state == "closed":
            return True, False, ""
        if s.state == "open" and now >= s.opened_at + s.cooldown:
            s.state, s.probing = "half-open", False
        if s.state == "half-open" and not s.probing:
            s.probing = True
            return True, True, ""
        left = max(0.0, s.opened_at + s.cooldown - now)
        return False, False, (f"circuit open for {key} after {s.failures} consecutive model failures; "
                              f"next probe in {left:.1f}s")

    def success(self, key: str) -> None:
        s = self.states.get(key)
        if s is not None:
            self.states[key] = _State()

    def failure(self, key: str, now: float, probe: bool) -> None:
        if self.threshold <= 0:
            return
        s = self.states.setdefault(key, _State())
        s.failures += 1
        if probe or (s.state == "closed" and s.failures >= self.threshold):
            s.cooldown = min(MAX_COOLDOWN_S, s.cooldown * 2) if probe and s.cooldown else self.cooldown_s
            s.state, s.opened_at, s.probing = "open", now, False

    def neutral(self, key: str, probe: bool) -> None:
        s = self.states.get(key)
        if probe and s is not None:
            s.probing = False

    def view(self) -> dict[str, dict]:
        return {k: {"state": s.state, "failures": s.failures, "cooldown_s": s.cooldown}
                for k, s in self.states.items() if s.state != "closed" or s.failures}
