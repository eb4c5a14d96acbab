"""One version's run-time load or unload as the frontend tracks it (``Load``: its state, its workers still
building, its golden requests, its footprints)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aieng.models import repo as model_repo

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


class LoadBook:
    """Every version's last load or unload, by ``model:version``: what ``models`` and ``status`` show."""

    def __init__(self) -> None:
        self._loads: dict[str, Load] = {}

    def get(self, key: str) -> Load | None:
        return self._loads.get(key)

    def put(self, key: str, ld: Load) -> Load:
        self._loads[key] = ld
        return ld

    def all(self) -> list[Load]:
        return list(self._loads.values())

    def items(self) -> list[tuple[str, Load]]:
        return list(self._loads.items())

    def busy(self, key: str) -> bool:
        ld = self._loads.get(key)
        return ld is not None and ld.state in BUSY

    def owner_of(self, golden_id: str) -> Load | None:
        """The load whose golden request ``golden_id`` is in flight."""
        return next((x for x in self._loads.values() if golden_id in x.pending), None)

    def view(self) -> dict[str, dict]:
        return {k: ld.view() for k, ld in self._loads.items()}
