"""The frontend's routing of every model: current state, history, canary watch, persistence.

One ``Model`` per served model holds the current ``routing.RoutingState`` (a pointer), the
previous states (newest last), its last ``EVENTS`` events and, when model.yaml configures
``auto_rollback``, a ``canary.Watch`` (``tick`` rolls a worse canary back to weight 0).
``route`` picks each request's version.  A model's routing comes from model.yaml's ``routing``
section (none: 100 % to the default version, pinning allowed; its sha256 is the *config digest*)
unless the saved state (``routestore``) was derived from the same digest and names only versions
still served.  A change (admin op, auto-rollback, load, unload, reload) builds a new state and
swaps the pointer, then hands every model's routing to the state writer (``save`` -> a
``Ticket``; no file I/O on the loop); a failed write leaves the change in force.  Rollback swaps
back to the newest history entry.  History: at most ``HISTORY`` states, fewer when their groups
with the current state's would pass ``SAVED_GROUP_CHARS`` (``within_budget``; the previous
routing is always kept).  Where routing comes from, restarts, reloads and why a failed write is
not undone: docs/rollout.md, sections 4, 5 and 7.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
from typing import Any

from aieng import model_repo
from aieng.frontend.rollout import routing, shadow
from aieng.frontend.rollout.canary import AutoRollback, Watch
from aieng.frontend.rollout.routestore import RouteStore, Saved
from aieng.frontend.rollout.statewriter import StateWriter, Ticket
from aieng.model_repo import ModelSpec
from aieng.wire import protocol as p

HISTORY = 16
SAVED_GROUP_CHARS = 2 * routing.MAX_GROUP_CHARS  # one model's current state and history together
EVENTS = 20
FLUSH_S = 10.0  # a reload waits this long at most for the writer before reading the file
MIN_PREFIX = 12  # hex digits of a sha256 prefix that may name a version
log = logging.getLogger("aieng.frontend.rollout.rollout")


def digest(raw: Any) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def dump(state: routing.RoutingState) -> dict:
    return state.public()


def load(raw: dict, versions: set[str]) -> routing.RoutingState:
    """A saved state back (``RoutingError``/``ValueError`` when it no longer fits the versions)."""
    owner = routing.from_ranges({str(v): r for v, r in raw["ranges"].items()})
    if not set(owner) <= versions:
        raise routing.RoutingError("names a version no longer served")
    weights = routing.check_weights(raw["weights"], versions)
    if routing.targets(weights) != {v: owner.count(v) for v in weights}:
        raise routing.RoutingError("bucket ranges do not match the weights")
    rules, groups = routing.parse_rules({"rules": raw["rules"], "groups": raw["groups"]}, versions)
    return routing.RoutingState(weights, tuple(owner), routing.to_ranges(owner), rules, groups,
                                bool(raw["allow_pinned"]), str(raw.get("reason", "")),
                                shadow.parse_config(raw.get("shadow"), versions))


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
        self.apply_config(config)
        self.state = self.baseline

    def apply_config(self, config: dict | None) -> None:
        cfg = config or {}
        self.config, self.config_digest = config, digest(config)
        self.baseline = routing.build(
            None, self.versions, cfg.get("weights") or {model_repo.latest(self.specs): 100},
            {"rules": cfg.get("rules") or [], "groups": cfg.get("groups") or {}}, cfg.get("allow_pinned"),
            reason="model.yaml", shadow=shadow.parse_config(cfg.get("shadow"), self.versions))
        policy = AutoRollback.parse(cfg.get("auto_rollback"))
        if policy is None:
            self.watch = None
        elif getattr(self, "watch", None) is None or self.watch.policy != policy:
            self.watch = Watch(policy)

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
                except (routing.RoutingError, ValueError, KeyError, TypeError, AttributeError):
                    pass  # an old state naming a version no longer served is just dropped
        except (routing.RoutingError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("saved routing of %s not restored (%s); using model.yaml", self.name, exc)
            return False
        self.state, self.history = current, within_budget(self.name, current, history)
        self.events = [e for e in as_list(saved.get("events")) if isinstance(e, dict)][-EVENTS:]
        return True


class Rollout:
    def __init__(self, specs: dict[str, dict[str, ModelSpec]], store: RouteStore | None,
                 writer: StateWriter | None = None, metrics=None):
        """``store`` is read here and on reload; ``writer`` writes it (both None: nothing is saved)."""
        self.store, self.writer, self.metrics = store, writer, metrics
        saved = store.load() if store else {}
        self.models: dict[str, Model] = {}
        for name, versions in specs.items():
            config = next(iter(versions.values())).extra.get("routing")
            self.models[name] = m = Model(name, versions, config)
            if m.restore(saved.get(name)):
                log.info("routing of %s restored from %s: %s", name, store.path, m.state.weights)

    # -- the data path ---------------------------------------------------------------
    def version_of(self, model: str, name: str) -> str:
        """A version named by the client: its directory name, or ``sha256:<hex>`` (>= 12 digits)."""
        m = self.models[model]
        if name in m.specs:
            return name
        if name.startswith("sha256:"):
            prefix = name[7:].lower()
            if len(prefix) < MIN_PREFIX:
                raise p.RequestError(p.INVALID_REQUEST, f"a sha256 version needs at least {MIN_PREFIX} hex "
                                                        f"digits, got {len(prefix)}")
            hits = [v for v, s in m.specs.items() if s.content_hash.startswith(prefix)]
            if len(hits) == 1:
                return hits[0]
            if hits:
                raise p.RequestError(p.MODEL_NOT_FOUND, f"{name!r} matches versions {sorted(hits)} of "
                                                        f"{model!r}: give more digits")
        raise p.RequestError(p.MODEL_NOT_FOUND, f"model {model!r} has no version {name!r}")

    def route(self, model: str, req: dict, params: dict, key: str | None) -> tuple[str, str]:
        """(version, route) for an ``infer`` request already checked for shape."""
        m = self.models[model]
        pinned = req.get("version")
        if pinned is not None:
            if not isinstance(pinned, str):
                raise p.RequestError(p.MODEL_NOT_FOUND, f"model {model!r} has no version {pinned!r}")
            pinned = self.version_of(model, pinned)
            if not m.state.allow_pinned:
                raise p.RequestError(p.INVALID_REQUEST, f"model {model!r} does not accept a pinned version "
                                                        f"(routing.allow_pinned is false); omit 'version'")
        if key is None:  # no routing_key: the request id, else its trace id, else a random spread
            fallback = req.get("id") if req.get("id") is not None else req.get("trace_id")
            fallback = str(fallback) if fallback is not None else secrets.token_hex(8)
        else:
            fallback = ""
        version, why = m.state.decide(key, fallback, pinned, params, req["inputs"])
        if self.metrics is not None:
            self.metrics.routed(model, version, why)
        return version, why

    def observe(self, model: str, version: str, code: str, latency_s: float) -> None:
        m = self.models.get(model)
        if m is not None and m.watch is not None:
            m.watch.observe(version, time.monotonic(), code, latency_s)

    def tick(self, now: float) -> None:
        """Auto-rollback: a canary worse than stable over the window goes to weight 0."""
        for m in self.models.values():
            if m.watch is None:
                continue
            stable = m.state.stable
            canaries = [v for v, w in m.state.weights.items() if w > 0 and v != stable]
            bad = m.watch.verdict(now, stable, canaries) if canaries else None
            if bad is None:
                continue
            version, why = bad
            weights = dict(m.state.weights)
            weights[stable] += weights[version]
            weights[version] = 0.0
            # Safety first: the change stands even if it cannot be saved (the writer logs and retries).
            m.push(routing.build(m.state, m.versions, weights, reason=f"auto-rollback of {version}: {why}"))
            m.watch.forget(version)
            m.event("auto_rollback", version=version, reason=why, weights=weights)
            self.save()
            log.error("auto-rollback of %s:%s: %s; its weight is now 0", m.name, version, why)
            if self.metrics is not None:
                self.metrics.auto_rollback(m.name, version)

    # -- changes ---------------------------------------------------------------------------
    def save(self) -> Ticket:
        """Hand every model's routing to the writer; the ticket is done once the file holds it."""
        if self.writer is None:
            return Ticket.finished()
        return self.writer.submit({name: m.saved() for name, m in self.models.items()})

    def saved_ticket(self) -> Ticket:
        """Done once the file holds the routing in force (at once when it does): for an answer that
        changed nothing, so a retried command still learns that its earlier change is not saved."""
        return self.writer.barrier() if self.writer is not None else Ticket.finished()

    def change(self, m: Model, new: routing.RoutingState) -> Ticket:
        """Swap in ``new`` and save.  A change that routes as the current state does (a retried script, an
        idempotent reconciler) is no change: no history entry, so ``rollback`` still reaches the real
        previous routing."""
        if new.routes_as(m.state):
            return self.saved_ticket()
        m.push(new)
        return self.save()

    def rollback(self, m: Model) -> Ticket:
        m.state, m.history = m.history[-1], m.history[:-1]  # the pointer flip
        return self.save()

    def reload(self, settings: dict[str, dict]) -> list[str]:
        """Re-read routing from model.yaml (``{model: settings}``) and the saved state; what changed.  The
        file is read once the writer has written what it was handed (else it would be older than memory)."""
        current = self.writer is None or self.writer.flush(FLUSH_S)
        saved = self.store.load() if self.store and current else {}
        for name, m in self.models.items():  # all or nothing: check every model first
            model_repo.check_routing(settings.get(name, {}).get("routing"), m.versions, f"model {name}")
        changed = []
        for name, m in self.models.items():
            config = settings.get(name, {}).get("routing")
            if digest(config) == m.config_digest and not self._saved_differs(m, saved.get(name)):
                continue
            prev = m.state
            m.apply_config(config)
            if not m.restore(saved.get(name)):
                m.push(m.baseline)
            elif m.state != prev:
                m.history = within_budget(name, m.state, m.history + [prev])
            m.event("reload", weights=dict(m.state.weights))
            changed.append(name)
        if changed:
            self.save()
        return changed

    @staticmethod
    def _saved_differs(m: Model, saved: Any) -> bool:
        return isinstance(saved, dict) and saved.get("current") not in (None, m.state.public(lambda g: g))

    def status(self, name: str, now: float) -> dict:
        m = self.models[name]
        out = dump(m.state)
        out.update({"stable": m.state.stable, "previous": dump(m.history[-1]) if m.history else None,
                    "history": len(m.history), "events": m.events,
                    "auto_rollback": m.watch.policy.public() if m.watch else None,
                    "window": m.watch.views(now) if m.watch else {}})
        return out

    def view(self) -> dict:
        """What /debug shows: each model's weights, stable version, rules and routing events."""
        return {name: {"weights": dict(m.state.weights), "stable": m.state.stable,
                       "rules": [r.name for r in m.state.rules], "allow_pinned": m.state.allow_pinned,
                       "reason": m.state.reason, "events": list(m.events),
                       "shadow": m.state.shadow.public() if m.state.shadow else None}
                for name, m in self.models.items()}

    def model(self, name: Any) -> Model | None:
        return self.models.get(name) if isinstance(name, str) else None

    def names(self) -> list[str]:
        return sorted(self.models)

    def serials(self) -> tuple:
        """Changes whenever some model's routing changes (a cache key for answers built from it)."""
        return tuple(m.state.serial for m in self.models.values())

    def weights(self, name: str) -> tuple[str, dict[str, float]]:
        """The model's stable version and weights now."""
        state = self.models[name].state
        return state.stable, state.weights

    def shadow_of(self, model: str) -> Any:
        """The model's shadow setting now (``shadow.ShadowConf``), or None."""
        return self.models[model].state.shadow

    def add_version(self, name: str, version: str, reason: str) -> None:
        """A loaded version becomes routable (weight 0 until set); the event is saved."""
        m = self.models[name]
        m.versions.add(version)
        m.event("loaded", version=version, reason=reason)
        self.save()

    def remove_version(self, name: str, version: str, reason: str) -> None:
        """``Model.drop_version``, logged as ``unloading`` and saved."""
        m = self.models[name]
        m.drop_version(version)
        m.event("unloading", version=version, reason=reason)
        self.save()

    def event(self, name: str, kind: str, **fields: Any) -> None:
        m = self.models.get(name)
        if m is not None:
            m.event(kind, **fields)

    def reload_from_disk(self) -> list[str]:
        """``reload`` with every model's model.yaml read again (all or nothing)."""
        return self.reload({name: model_repo.model_settings(d) for name, d in self.model_dirs().items()})

    def model_dirs(self) -> dict[str, str]:
        return {name: os.path.dirname(next(iter(m.specs.values())).path) for name, m in self.models.items()}
