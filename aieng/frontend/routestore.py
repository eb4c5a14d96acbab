"""Routing state on disk: one small JSON file, replaced atomically, read at start and on reload.

File: ``<state dir>/routing-<12 hex of sha256(realpath of the model repository)>.json``,
so two servers of different repositories never share one, and a restarted
server of the same repository finds its own::

    {"format": 1, "saved_at": <unix s>, "models": {
       "<model>": {"config_digest": "<sha256 of model.yaml's routing section>",
                   "current": <state>, "history": [<state>, ...],   # newest last
                   "events": [{"at": <unix s>, "kind": "auto_rollback", ...}, ...]}}}
    <state> = {"weights": {...}, "ranges": {version: [[start, end], ...]}, "rules": [...],
               "groups": {...}, "allow_pinned": bool, "reason": str,
               "shadow": null | {"version", "percent", "max_load", "timeout_ms"}}   # absent: null

Write: a temp file in the same directory, fsync, ``os.replace`` over the old
one, fsync the directory; so a crash leaves the old file or the new one,
never half of one.  The state dir is created (0700) on the first save only.
Read: a missing file is "nothing saved"; an unreadable or malformed one is
logged and ignored (the model.yaml routing applies), never fatal.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from typing import Any

FORMAT = 1
log = logging.getLogger("aieng.frontend.routestore")


def store_path(state_dir: str, model_repository: str) -> str:
    tag = hashlib.sha256(os.path.realpath(model_repository).encode()).hexdigest()[:12]
    return os.path.join(state_dir, f"routing-{tag}.json")


class RouteStore:
    def __init__(self, path: str):
        self.path = path

    def load(self) -> dict[str, Any]:
        """``{model: saved}``; empty when nothing (readable) is saved."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nesting thousands deep
            log.error("routing state %s is unreadable (%s); using model.yaml routing", self.path,
                      type(exc).__name__ if isinstance(exc, RecursionError) else exc)
            return {}
        if (not isinstance(data, dict) or data.get("format") != FORMAT
                or not isinstance(data.get("models"), dict)):
            log.error("routing state %s has an unknown format; using model.yaml routing", self.path)
            return {}
        return data["models"]

    def save(self, models: dict[str, Any]) -> None:
        """Replace the file atomically; raises OSError (the caller undoes its change)."""
        d = os.path.dirname(self.path) or "."
        os.makedirs(d, mode=0o700, exist_ok=True)
        body = json.dumps({"format": FORMAT, "saved_at": time.time(), "models": models}, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=".routing-", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
