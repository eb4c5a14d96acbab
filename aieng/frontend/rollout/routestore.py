"""Routing state on disk: one JSON file, each group stored once, replaced atomically, read at start.

File: ``store_path`` = ``<state dir>/routing-<12 hex of sha256(realpath of the model repository)>.json``,
so servers of different repositories never share one and a restarted server finds its own.
Format 2 (``FORMAT``; format 1, each state holding its groups' keys, is still read): every model's
``config_digest``, ``current`` state, ``history`` and ``events``, and one ``groups`` table in which
each distinct group's keys are stored once under the sha256 of their JSON; states name their groups
by that digest.  ``save`` (on the state writer's thread, never the loop): a temp file in the same
directory, fsync, ``os.replace``, fsync the directory, so a crash leaves the old file or the new
one; a group's JSON and digest are computed once (in ``CHUNK``s) and reused while a state names it.
``load``: a missing file is "nothing saved"; an unreadable or malformed one is logged and ignored
(model.yaml's routing applies), never fatal.  The supervisor checks at start that the state dir can
be written (``runtime/statedir.py``), so it refuses to start where a change could be kept only in
memory.  The format in full, its bounds and the durability contract: docs/rollout.md, section 7.
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
from aieng.models.routing import Group, RoutingError, make_group

FORMAT = 2
CHUNK = 2000  # keys per json.dumps call when a group is encoded: the GIL can pass between calls
log = logging.getLogger("aieng.frontend.rollout.routestore")


def store_path(state_dir: str, model_repository: str) -> str:
    tag = hashlib.sha256(os.path.realpath(model_repository).encode()).hexdigest()[:12]
    return os.path.join(state_dir, f"routing-{tag}.json")


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
    """A saved state's groups as ``Group`` objects, one per distinct group: by digest from the file's
    table (format 2, ``table`` given) or by content (format 1: each state held its groups' keys)."""

    def __init__(self, table: Any):
        self.table = table if isinstance(table, dict) else None
        self.made: dict[Any, Group] = {}

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
            made = make_group(name, value)
        except RoutingError:
            return value
        if key is not None:
            self.made[key] = made
        return made


class RouteStore:
    def __init__(self, path: str):
        self.path = path
        self._encoded: dict[int, tuple[Group, str, str]] = {}  # id -> (group, digest, JSON): save's

    # -- read (the loop: at start and reload) ----------------------------------------------
    def load(self) -> dict[str, Any]:
        """``{model: saved}`` with every state's groups as ``Group`` objects (one per distinct
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
        encoded: dict[int, tuple[Group, str, str]] = {}

        def ref(g: Group) -> str:
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
