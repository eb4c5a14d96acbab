"""One model's routing: the state in force, its history, events, canary watch and generation.

``Model`` holds the current ``routing.RoutingState`` (a pointer), the previous states (newest
last), its last ``EVENTS`` events, the ``baseline`` (the routing model.yaml's ``routing`` section
gives, built from no previous state, so a function of the section alone), its ``generation``
(``generation.py``) and, when model.yaml configures ``auto_rollback``, a ``canary.Watch``.
History: at most ``HISTORY`` states, fewer when their groups with the current state's would pass
``SAVED_GROUP_CHARS`` (``within_budget``; the previous routing is always kept).  ``restore``
takes a saved state (``routestore``) back when it was derived from the same section digest and
names only versions still served.  Owned and changed by ``rollout.Rollout`` only; docs/rollout.md,
sections 4, 7 and 11.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from aieng.frontend.rollout import routing
from aieng.frontend.rollout.canary import Watch
from aieng.frontend.rollout.generation import Generation, Refused
from aieng.frontend.rollout.routestore import Saved
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.models.routing import (
    MAX_GROUP_CHARS,
    AutoRollback,
    RoutingError,
    check_weights,
    parse_rules,
    parse_shadow,
)
from aieng.wire import protocol as p

HISTORY = 16
SAVED_GROUP_CHARS = 2 * MAX_GROUP_CHARS  # one model's current state and history together
EVENTS = 20
log = logging.getLogger("aieng.frontend.rollout.model")


def digest(raw: Any) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def dump(state: routing.RoutingState) -> dict:
    return state.public()


def load(raw: dict, versions: set[str]) -> routing.RoutingState:
    """A saved state back (``RoutingError``/``ValueError`` when it no longer fits the versions)."""
    owner = routing.from_ranges({str(v): r for v, r in raw["ranges"].items()})
    if not set(owner) <= versions:
        raise RoutingError("names a version no longer served")
    weights = check_weights(raw["weights"], versions)
    if routing.targets(weights) != {v: owner.count(v) for v in weights}:
        raise RoutingError("bucket ranges do not match the weights")
    rules, groups = parse_rules({"rules": raw["rules"], "groups": raw["groups"]}, versions)
    return routing.RoutingState(weights, routing.Ownership(owner), routing.to_ranges(owner), rules, groups,
                                bool(raw["allow_pinned"]), str(raw.get("reason", "")),
                                parse_shadow(raw.get("shadow"), versions))


def within_budget(name: str, current: routing.RoutingState, history: list) -> list:
    """The newest ``HISTORY`` entries of ``history`` whose groups, with ``current``'s, hold at most
    ``SAVED_GROUP_CHARS`` characters (each group object once): older ones are dropped, and logged."""
    history = history[-HISTORY:]
    seen = {id(g): g.chars for g in current.groups.values()}
    total, keep = sum(seen.values()), 0
    for state in reversed(history):
        extra = {id(g): g.chars for g in state.groups.values() if id(g) not in seen}
        if total + sum(extra.values()) > SAVED_GROUP_CHARS:
            log.warning("routing history of %s keeps its %d newest entries: with older ones its groups would "
                        "hold over %d characters", name, keep, SAVED_GROUP_CHARS)
            break
        seen.update(extra)
        total += sum(extra.values())
        keep += 1
    return history[len(history) - keep:]


def _without(weights: dict[str, float], version: str) -> dict[str, float]:
    return {v: w for v, w in weights.items() if v != version}


def as_list(value: Any) -> list:
    """A saved list, or empty when the file holds something else there (logged and ignored, never fatal)."""
    return value if isinstance(value, list) else []


class Model:
    def __init__(self, name: str, specs: dict[str, ModelSpec], config: dict | None):
        self.name, self.specs = name, specs
        self.versions = set(specs)
        self.history: list[routing.RoutingState] = []
        self.events: list[dict] = []
        self.generation: Generation | None = None
        self.refused: Refused | None = None  # the model.yaml last refused, while no later one was applied
        self._local: tuple = (None, False)  # (serials, local) of the last ``local()``
        self.apply_config(config)
        self.state = self.baseline
        self.reloaded = self.generation.number  # the generation the last reload (or the start) reported

    def apply_config(self, config: dict | None) -> None:
        cfg = config or {}
        self.config, self.config_digest = config, digest(config)
        self.generation = (Generation(self.config_digest) if self.generation is None
                           else self.generation.next(self.config_digest))
        self.baseline = routing.build(
            None, self.versions, cfg.get("weights") or {model_repo.latest(self.specs): 100},
            {"rules": cfg.get("rules") or [], "groups": cfg.get("groups") or {}}, cfg.get("allow_pinned"),
            reason="model.yaml", shadow=parse_shadow(cfg.get("shadow"), self.versions))
        policy = AutoRollback.parse(cfg.get("auto_rollback"))
        if policy is None:
            self.watch = None
        elif getattr(self, "watch", None) is None or self.watch.policy != policy:
            self.watch = Watch(policy)

    def local(self) -> bool:
        """Does the routing in force differ from the generation's (a change made here after it)?"""
        key = (self.state.serial, self.baseline.serial)
        if self._local[0] != key:
            self._local = (key, not self.state.routes_as(self.baseline))
        return self._local[1]

    def push(self, new: routing.RoutingState) -> None:
        self.history = within_budget(self.name, new, self.history + [self.state])
        self.state = new

    def event(self, kind: str, **fields: Any) -> None:
        self.events = (self.events + [dict(fields, kind=kind, at=time.time())])[-EVENTS:]

    def drop_version(self, version: str) -> None:
        """``version`` leaves the routable set; refused (``RequestError``) while weights or rules send
        traffic to it.  Old routings that did can no longer be rolled back to."""
        key, state = f"{self.name}:{version}", self.state
        if state.weights.get(version, 0) > 0:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} has weight {state.weights[version]:g}%: set "
                                 "it to 0 first (aieng rollout set-weights); nothing changed")
        named = [r.name for r in state.rules if r.version == version]
        if named:
            raise p.RequestError(p.INVALID_REQUEST, f"{key} is named by rules {named}: change them first; "
                                                  f"nothing changed")
        self.versions.discard(version)
        self.state = routing.build(state, self.versions, _without(state.weights, version),
                                   reason=state.reason)
        history = [s for s in self.history if not s.weights.get(version)
                   and all(r.version != version for r in s.rules)]
        self.history = [routing.build(s, self.versions, _without(s.weights, version), reason=s.reason)
                        for s in history]

    def saved(self) -> Saved:
        return Saved(self.config_digest, self.state, tuple(self.history), tuple(self.events))

    def restore(self, saved: dict | None) -> bool:
        if not isinstance(saved, dict) or saved.get("config_digest") != self.config_digest:
            return False
        try:
            current = load(saved["current"], self.versions)
            history = []
            for raw in as_list(saved.get("history")):
                try:
                    history.append(load(raw, self.versions))
                except (RoutingError, ValueError, KeyError, TypeError, AttributeError):
                    pass  # an old state naming a version no longer served is just dropped
        except (RoutingError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("saved routing of %s not restored (%s); using model.yaml", self.name, exc)
            return False
        self.state, self.history = current, within_budget(self.name, current, history)
        self.events = [e for e in as_list(saved.get("events")) if isinstance(e, dict)][-EVENTS:]
        return True


