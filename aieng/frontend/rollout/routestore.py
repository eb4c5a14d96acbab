"""Routing state on disk: one JSON file, each group stored once, replaced atomically, read at start.

File: ``<state dir>/routing-<12 hex of sha256(realpath of the model repository)>.json``,
so two servers of different repositories never share one, and a restarted
server of the same repository finds its own::

    {"format": 2, "saved_at": <unix s>, "models": {
       "<model>": {"config_digest": "<sha256 of model.yaml's routing section>",
                   "current": <state>, "history": [<state>, ...],   # newest last
                   "events": [{"at": <unix s>, "kind": "auto_rollback", ...}, ...]}},
     "groups": {"<sha256 of the keys' JSON>": [key, ...], ...}}
    <state> = {"weights": {...}, "ranges": {version: [[start, end], ...]}, "rules": [...],
               "groups": {name: "<sha256>"}, "allow_pinned": bool, "reason": str,
               "shadow": null | {"version", "percent", "max_load", "timeout_ms"}}   # absent: null

Groups are content-addressed: every state that routes with the same group (a
weight change keeps the rules) names one entry of ``groups``, so 16 history
entries of a 100,000-key group cost one copy.  Format 1 (each state holding
its groups' keys) is still read; the next write is format 2.

Bounds: the groups of one routing hold at most ``routing.MAX_GROUP_CHARS``
characters (a key's length + 1 each; a larger one is refused, never cut), and
``rollout`` keeps a model's history within twice that, so the file holds at
most 8 Mi characters of keys per model (UTF-8; JSON escapes aside) plus about
1 KB per state.

Write (``save``, on the state writer's thread, never the frontend loop): a temp
file in the same directory, fsync, ``os.replace`` over the old one, fsync the
directory; so a crash leaves the old file or the new one, never half of one.
A group's JSON and digest are computed once (in chunks, so the loop thread gets
the GIL between them) and reused while a state names it.
Read: a missing file is "nothing saved"; an unreadable or malformed one is
logged and ignored (the model.yaml routing applies), never fatal.

The state dir is checked at start (``state_dir_problem``: created 0700 if
missing, a probe file written, synced and removed); the supervisor refuses to
start when it cannot be written, so a change (an automatic rollback too) is
never kept only in memory without anyone being told.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from aieng.frontend.rollout import routing

FORMAT = 2
CHUNK = 2000  # keys per json.dumps call when a group is encoded: the GIL can pass between calls
log = logging.getLogger("aieng.frontend.rollout.routestore")


def store_path(state_dir: str, model_repository: str) -> str:
    tag = hashlib.sha256(os.path.realpath(model_repository).encode()).hexdigest()[:12]
    return os.path.join(state_dir, f"routing-{tag}.json")


def state_dir_problem(path: str) -> str | None:
    """Why the routing state cannot be written in ``path`` (None: it can).  Creates it (0700) if missing and
    writes, syncs and removes a probe file, as a save would."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        try:
            os.write(fd, b"aieng")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


@dataclass(frozen=True)
class Saved:
    """One model's routing as the loop hands it to the writer: references to immutable states, no copy."""
    config_digest: str
    current: routing.RoutingState
    history: tuple[routing.RoutingState, ...]
    events: tuple[dict, ...]


def encode_group(keys: tuple[str, ...]) -> tuple[str, str]:
    """(sha256 of its JSON, its JSON) for a group's keys in their order."""
    parts = [json.dumps(keys[i:i + CHUNK], ensure_ascii=False)[1:-1] for i in range(0, len(keys), CHUNK)]
    text = "[" + ", ".join(parts) + "]"
    return hashlib.sha256(text.encode()).hexdigest(), text


class GroupReader:
    """A saved state's groups as ``routing.Group`` objects, one per distinct group: by digest from the file's
    table (format 2, ``table`` given) or by content (format 1: each state held its groups' keys)."""

    def __init__(self, table: Any):
        self.table = table if isinstance(table, dict) else None
        self.made: dict[Any, routing.Group] = {}

    def read(self, name: Any, value: Any) -> Any:
        """The Group a state's entry stands for; the raw value when damaged (that state is then dropped)."""
        if self.table is not None:
            if not isinstance(value, str) or value not in self.table:
                return value
            key: Any = value
            value = self.table[value]
        elif isinstance(value, list) and all(isinstance(k, str) for k in value):
            key = tuple(value)
        else:
            key = None
        if key in self.made:
            return self.made[key]
        try:
            made = routing.make_group(name, value)
        except routing.RoutingError:
            return value
        if key is not None:
            self.made[key] = made
        return made


class RouteStore:
    def __init__(self, path: str):
        self.path = path
        self._encoded: dict[int, tuple[routing.Group, str, str]] = {}  # id -> (group, digest, JSON): save's

    # -- read (the loop: at start and reload) ----------------------------------------------
    def load(self) -> dict[str, Any]:
        """``{model: saved}`` with every state's groups as ``routing.Group`` objects (one per distinct
        group, shared by the states naming it); empty when nothing (readable) is saved."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nesting thousands deep
            log.error("routing state %s is unreadable (%s); using model.yaml routing", self.path,
                      type(exc).__name__ if isinstance(exc, RecursionError) else exc)
            return {}
        if (not isinstance(data, dict) or data.get("format") not in (1, FORMAT)
                or not isinstance(data.get("models"), dict)):
            log.error("routing state %s has an unknown format; using model.yaml routing", self.path)
            return {}
        groups = GroupReader(data.get("groups") if data["format"] == FORMAT else None)
        for saved in data["models"].values():
            if not isinstance(saved, dict):
                continue
            history = saved.get("history")
            for state in [saved.get("current")] + (history if isinstance(history, list) else []):
                if isinstance(state, dict) and isinstance(state.get("groups"), dict):
                    state["groups"] = {n: groups.read(n, v) for n, v in state["groups"].items()}
        return data["models"]

    # -- write (the state writer's thread only) ------------------------------------------------
    def encode(self, models: dict[str, Saved]) -> str:
        table: dict[str, str] = {}
        encoded: dict[int, tuple[routing.Group, str, str]] = {}

        def ref(g: routing.Group) -> str:
            hit = self._encoded.get(id(g))
            if hit is None or hit[0] is not g:
                hit = (g, *encode_group(g.order))
            encoded[id(g)] = hit
            table[hit[1]] = hit[2]
            return hit[1]

        body = {name: {"config_digest": s.config_digest, "current": s.current.public(ref),
                       "history": [h.public(ref) for h in s.history], "events": list(s.events)}
                for name, s in models.items()}
        self._encoded = encoded  # only groups still named: the cache is as bounded as the file
        groups = ", ".join(f'"{d}": {text}' for d, text in sorted(table.items()))
        return (f'{{"format": {FORMAT}, "saved_at": {json.dumps(time.time())}, '
                f'"models": {json.dumps(body, sort_keys=True, ensure_ascii=False)}, "groups": {{{groups}}}}}')

    def save(self, models: dict[str, Saved]) -> None:
        """Replace the file atomically; raises OSError."""
        write_atomically(self.path, self.encode(models).encode())


def write_atomically(path: str, body: bytes) -> None:
    d = os.path.dirname(path) or "."
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".routing-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
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
