"""The versions a frontend serves, at run time: one owner for loads, golden runs, unloads and the pool's
cold and evicted versions (``VersionManager``).

It builds the hot swap path (``hotswap.HotSwap``) and the model pool (``poolctl.PoolControl``) over one
``LoadBook`` and is all that admin ops, client ops and the frontend loop call.  It is the one writer of
the served versions (``models.served``): it claims the registry's writer and hands it to the hot swap,
which adds a version once its golden set passed and removes one when it is unloaded.  What it needs
comes in as arguments: the hub sender, the workers' view, the routing (``Rollout``), the pipeline's
``start``, the request table and the metrics; ``refuse(req, code, message)`` answers a held request that
never entered the pipeline.  Golden requests are ``Kind.GOLDEN``: their answers come back to the hot
swap's ``on_answer`` through their ``Golden`` link.
"""
from __future__ import annotations

from typing import Any, Callable

from aieng.config import Config
from aieng.frontend.control.workers import Workers
from aieng.frontend.observe.metrics import Metrics
from aieng.frontend.requests.table import Request, RequestTable
from aieng.frontend.rollout.rollout import Rollout
from aieng.frontend.versions.hotswap import HotSwap
from aieng.frontend.versions.load import BUSY, LoadBook
from aieng.frontend.versions.poolctl import PoolControl
from aieng.frontend.versions.rescan import rescan
from aieng.models.served import ServedVersions

__all__ = ["VersionManager"]


class VersionManager:
    def __init__(self, cfg: Config, specs: ServedVersions, hub: Callable[[str, list], bool],
                 workers: Workers, rollout: Rollout, start: Callable[[Request], None], table: RequestTable,
                 metrics: Metrics, refuse: Callable[[Request, str, str], None]):
        self.specs, self.rollout = specs, rollout
        self.loads = LoadBook()
        self.pool = PoolControl(cfg, specs, self.loads, self, start, table.per_model, metrics, refuse)
        # the one writer of the served versions (models/served.py): the hot swap adds and removes them
        self.swap = HotSwap(cfg, specs, specs.claim_writer(), hub, workers, rollout, start, table, metrics,
                            self.loads, self.pool)
        self.handlers = self.swap.handlers  # VersionLoaded, VersionFailed from the workers

    # -- commands (admin ops, reload, the pool's cold loads) -------------------------------------
    def load(self, name: str, version: str, source: str = "admin", config: str | None = None) -> dict:
        return self.swap.load(name, version, source, config)

    def unload(self, name: str, version: str, source: str = "admin") -> dict:
        return self.swap.unload(name, version, source)

    def release(self, key: str) -> None:
        self.swap.release(key)

    def rescan(self) -> dict[str, list[str]]:
        """Version directories added or removed since the last scan: loads and unloads started."""
        return rescan(self, self.rollout.model_dirs(), self.specs)

    # -- requests -------------------------------------------------------------------------------
    def start(self, req: Request, inputs: Any) -> bool:
        """Dispatch ``req`` now (True), or hold it for its version's cold load (False)."""
        return self.pool.start(req, inputs)

    def waiters(self) -> int:
        return self.pool.waiters()

    def fail_all(self, code: str, message: str) -> int:
        return self.pool.fail_all(code, message)

    # -- events and time ------------------------------------------------------------------------
    def on_worker_down(self, worker: str, code: int) -> None:
        self.swap.on_worker_down(worker, code)

    def tick(self, now: float) -> None:
        self.swap.tick(now)

    def sweep(self, now: float) -> None:
        self.pool.sweep(now)

    # -- views ----------------------------------------------------------------------------------
    def busy(self, key: str) -> bool:
        return self.loads.busy(key)

    def loads_view(self) -> dict[str, dict]:
        return self.loads.view()

    def busy_versions(self, name: str) -> set[str]:
        return {ld.version for ld in self.loads.all() if ld.name == name and ld.state in BUSY}

    def pool_view(self) -> dict[str, Any]:
        return self.pool.view()

    def close(self) -> None:
        self.swap.close()
