"""One version's run-time load or unload as the frontend tracks it (``Load``: its state, its workers still
building, its golden requests, its footprints)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aieng import model_repo
from aieng.frontend.versions.golden import GOLDEN_FILE, _input, compare, read_golden  # noqa: F401 (compare: scripts)


def _without(weights: dict[str, float], version: str) -> dict[str, float]:
    return {v: w for v, w in weights.items() if v != version}


BUSY = ("validating", "loading", "golden", "draining")


@dataclass
class Load:
    """One version's run-time load (or unload), as ``models``/``rollout status`` show it."""
    name: str
    version: str
    source: str  # admin / reload
    # validating -> loading -> golden -> ready | failed;  draining -> unloaded;  pool (poolctl): cold, evicted
    state: str = "validating"
    spec: model_repo.ModelSpec | None = None
    future: Any = None  # the validation on the pool thread
    started: float = field(default_factory=time.monotonic)
    waiting: set = field(default_factory=set)  # workers that have not answered yet
    golden: dict | None = None
    pending: dict = field(default_factory=dict)  # golden request id -> case index
    error: str = ""
    seconds: float = 0.0
    at: float = field(default_factory=time.time)
    footprint: dict = field(default_factory=dict)  # worker -> its RSS growth building it (VersionLoaded)
    release_pending: bool = False  # failed with its golden requests still in flight: release once they end
    pre_queue: list = field(default_factory=list)  # preprocess workers still to build it, one at a time
    next_case: int = 0  # the next golden case to send
    pre_now: str = ""  # the preprocess worker building it now (out of the rotation meanwhile)
    body: bytes = b""  # the encoded LoadVersion

    def view(self) -> dict:
        out = {"state": self.state, "source": self.source, "at": self.at, "seconds": round(self.seconds, 3),
               "golden_cases": len(self.golden["cases"]) if self.golden else 0}
        if self.error:
            out["error"] = self.error
        if self.waiting:
            out["waiting_for"] = sorted(self.waiting)
        if self.footprint:
            out["footprint_bytes"] = dict(sorted(self.footprint.items()))
        return out
