"""Reload's part in hot swap: the repository's version directories turned into loads and unloads."""
from __future__ import annotations

import logging
from typing import Protocol

from aieng.models import repo as model_repo
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p

log = logging.getLogger("aieng.frontend.versions.hotswap")


class Swap(Protocol):
    """What rescanning needs of ``manager.VersionManager``."""

    def busy_versions(self, name: str) -> set[str]: ...

    def load(self, name: str, version: str, source: str = "admin") -> dict: ...

    def unload(self, name: str, version: str, source: str = "admin") -> dict: ...


def rescan(swap: Swap, model_dirs: dict[str, str], specs: ServedVersions) -> dict[str, list[str]]:
    """New version directories the policy serves are loaded; versions whose directory is gone are
    unloaded (when nothing routes to them: else logged and kept).  Returns what was started."""
    started: dict[str, list[str]] = {"loading": [], "unloading": [], "kept": []}
    for name, mdir in model_dirs.items():
        try:
            found, served = model_repo.model_versions(mdir, model_repo.triton_model(mdir))
        except (OSError, model_repo.ModelError) as exc:
            log.error("reload: %s not rescanned: %s", name, exc)
            continue
        busy = swap.busy_versions(name)
        for v in served:
            if v not in specs[name] and v not in busy:
                try:
                    swap.load(name, v, "reload")
                    started["loading"].append(f"{name}:{v}")
                except p.RequestError as exc:
                    log.error("reload: %s", exc.message)
        for v in list(specs[name]):
            if v not in found:
                try:
                    swap.unload(name, v, "reload")
                    started["unloading"].append(f"{name}:{v}")
                except p.RequestError as exc:
                    log.error("reload: directory of %s:%s is gone but it stays: %s", name, v, exc.message)
                    started["kept"].append(f"{name}:{v}")
    return started

