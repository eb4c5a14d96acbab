"""The frontend's routing of every model: current state, history, canary watch, persistence.

One ``model.Model`` per served model (state, history, events, watch, generation).  ``route`` picks
each request's version.  A model's routing comes from model.yaml's ``routing`` section (none: 100 %
to the default version, pinning allowed; its sha256 is the *config digest*) unless the saved state
(``routestore``) was derived from the same digest and names only versions still served.  A change
(admin op, auto-rollback, load, unload, reload, a model.yaml the watcher saw change: ``follow``)
builds a new state and swaps the pointer, then hands every model's routing to the state writer
(``save`` -> a ``Ticket``; no file I/O on the loop); a failed write leaves the change in force.
Rollback swaps back to the newest history entry.  ``tick`` applies the watcher's model.yaml
changes, rolls a worse canary back to weight 0 and exports each model's generation.  Where
routing comes from, restarts, reloads, a fleet, and why a failed write is not undone:
docs/rollout.md, sections 4, 5, 7 and 11.
"""
from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any

from aieng.frontend.rollout import routing
from aieng.frontend.rollout.generation import Refused, source_view
from aieng.frontend.rollout.model import Model, digest, dump, within_budget
from aieng.frontend.rollout.routestore import RouteStore
from aieng.frontend.rollout.statewriter import StateWriter, Ticket
from aieng.frontend.rollout.watcher import ConfigWatcher, FileChange
from aieng.models import repo as model_repo
from aieng.models.repo import ModelSpec
from aieng.models.served import ServedVersions
from aieng.wire import protocol as p

FLUSH_S = 10.0  # a reload waits this long at most for the writer before reading the file
MIN_PREFIX = 12  # hex digits of a sha256 prefix that may name a version
log = logging.getLogger("aieng.frontend.rollout.rollout")


class Rollout:
    def __init__(self, specs: ServedVersions, store: RouteStore | None,
                 writer: StateWriter | None = None, metrics=None, watcher: ConfigWatcher | None = None):
        """``store`` is read here and on reload; ``writer`` writes it (both None: nothing is saved);
        ``watcher``'s model.yaml changes are applied in ``tick`` (None: only at start and reload)."""
        self.store, self.writer, self.metrics, self.watcher = store, writer, metrics, watcher
        self.exported: dict[str, tuple] = {}  # model -> what the metrics show of its source
        saved = store.load() if store else {}
        self.models: dict[str, Model] = {}
        for name, versions in specs.items():
            routing = next(iter(versions.values())).routing  # model-wide: every version holds it
            config = routing.section() if routing is not None else None
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
        """model.yaml changes the watcher saw; auto-rollback: a canary worse than stable over the window goes
        to weight 0; the metrics of where each model's routing came from."""
        for change in self.watcher.take() if self.watcher is not None else ():
            self.follow(change)
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
        self.export()

    def follow(self, change: FileChange) -> bool:
        """Apply a model.yaml that changed (the watcher's): a new routing section wins over any local
        change and routes as the section alone says (the baseline, not moved from the state in force);
        one that cannot be used is refused, logged once and shown, and the routing in force stays."""
        m = self.models.get(change.model)
        if m is None:
            return False
        error, config = change.error, (change.settings or {}).get("routing")
        if change.missing:
            error = None if m.config is None else (f"{change.path} is missing: the routing in force stays "
                                                   "(a model.yaml without 'routing' means the default)")
        elif error is None:
            try:
                model_repo.check_routing(config, m.versions, f"model {m.name}: {change.path}")
            except model_repo.ModelError as exc:
                error = str(exc)
        if error is not None:
            if m.refused is None or (m.refused.digest, m.refused.error) != (change.digest, error):
                log.error("model.yaml of %s refused, routing unchanged (generation %d): %s", m.name,
                          m.generation.number, error)
                m.refused = Refused(change.digest, error)
                m.event("model_yaml_refused", reason=error)
            return False
        m.refused = None
        if change.missing or digest(config) == m.config_digest:
            return False
        prev = m.state
        m.apply_config(config)
        if m.baseline.routes_as(prev):
            m.state = m.baseline  # the same routing, now the generation's: no history entry
        else:
            m.push(m.baseline)
        m.event("model_yaml", reason=f"generation {m.generation.number} ({m.generation.short})",
                weights=dict(m.state.weights))
        self.save()
        log.warning("routing of %s follows model.yaml generation %d (%s): weights %s", m.name,
                    m.generation.number, m.generation.short, m.state.weights)
        return True

    def source(self, name: str) -> dict:
        m = self.models[name]
        return source_view(m.generation, m.local(), m.state.reason, m.refused)

    def export(self) -> None:
        if self.metrics is None:
            return
        for name, m in self.models.items():
            shown = (m.generation.short, m.generation.number, m.local(), m.refused is not None)
            if self.exported.get(name) != shown:
                self.metrics.routing_source(name, *shown, before=self.exported.get(name))
                self.exported[name] = shown

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
        """Re-read routing from model.yaml (``{model: settings}``) and the saved state; what changed since the
        last reload (a generation the watcher applied first counts too).  The saved state is read once the
        writer has written what it was handed (else it would be older than memory)."""
        current = self.writer is None or self.writer.flush(FLUSH_S)
        saved = self.store.load() if self.store and current else {}
        for name, m in self.models.items():  # all or nothing: check every model first
            model_repo.check_routing(settings.get(name, {}).get("routing"), m.versions, f"model {name}")
        changed = []
        for name, m in self.models.items():
            config = settings.get(name, {}).get("routing")
            if digest(config) != m.config_digest or self._saved_differs(m, saved.get(name)):
                prev = m.state
                m.apply_config(config)
                if not m.restore(saved.get(name)):
                    m.push(m.baseline)
                elif m.state != prev:
                    m.history = within_budget(name, m.state, m.history + [prev])
            elif m.generation.number == m.reloaded:
                continue
            m.reloaded = m.generation.number
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
        out.update({"source": self.source(name), "stable": m.state.stable,
                    "previous": dump(m.history[-1]) if m.history else None,
                    "history": len(m.history), "events": m.events,
                    "auto_rollback": m.watch.policy.public() if m.watch else None,
                    "window": m.watch.views(now) if m.watch else {}})
        return out

    def view(self) -> dict:
        """What /debug shows: each model's weights, stable version, rules, routing events and whether an
        auto-rollback watches its canaries."""
        return {name: {"weights": dict(m.state.weights), "stable": m.state.stable,
                       "rules": [r.name for r in m.state.rules], "allow_pinned": m.state.allow_pinned,
                       "reason": m.state.reason, "events": list(m.events),
                       "auto_rollback": m.watch is not None,
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
        """The model's shadow setting now (``models/routing.py``'s ``ShadowConfig``), or None."""
        return self.models[model].state.shadow

    def add_version(self, name: str, version: str, reason: str) -> None:
        """A loaded version becomes routable (weight 0 until set); the event is saved."""
        m = self.models[name]
        m.versions.add(version)
        m.event("loaded", version=version, reason=reason)
        self.save()

    def add_model(self, name: str, versions: Any, reason: str) -> None:
        """A model the start left out, loaded at run time (``versions``: its live view of the served
        versions): routed as at a start, by its model.yaml's ``routing`` (none: 100 % to its version)."""
        routing = next(iter(versions.values())).routing
        self.models[name] = m = Model(name, versions, routing.section() if routing is not None else None)
        m.event("loaded", version=next(iter(versions)), reason=reason)
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
        return model_dirs({name: m.specs for name, m in self.models.items()})


def model_dirs(specs: dict[str, dict[str, ModelSpec]]) -> dict[str, str]:
    """Each model's directory (its model-wide model.yaml's), from the path of any of its versions."""
    return {name: os.path.dirname(next(iter(versions.values())).path) for name, versions in specs.items()}
