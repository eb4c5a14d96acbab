"""Drift per model version: input features and outputs of recent answers against a reference population.

Inputs are what the preprocessing reports per request (``Preprocessed.features``, ``Result.features``:
token count and out-of-vocabulary share, image size, aspect and brightness, tabular features);
outputs are the answer's ``confidence`` (classifiers) and ``distance`` (embeddings: cosine distance to
the golden centroid).  Each version has its own reference, keyed by model, version and content hash:
input features from the file model.yaml names (``drift: {reference: drift.json}``), everything else
from ``reference_n`` answered requests (``collecting k/N``, then ``ready``).  No one client decides a
reference built from traffic (``ReferenceRule``): each client (``clients.peer_of``: a network address)
gives at most ``ceil(N / clients)`` answers, ``clients`` distinct clients are needed, and answers are
taken at most one per ``span_s / (N - 1)`` seconds, so the sample spans at least ``span_s``; until then
it stays ``collecting`` and says what it waits for.  A reference built from traffic records how
(``clients``, ``span_s``) and is handed to ``persist`` (the state writer, off the loop); it comes back
from ``saved`` at a restart when the version's hash still matches and it meets the rule in force (one
saved before the rule, or under a looser one, is collected again).  While collecting, at most
``reference_n`` values per feature are held; afterwards only bin indices (``driftref.Binned``, the last
``window`` per feature).  Scores: PSI per feature (``driftref``); docs/metrics.md, 'Drift'.  Shadow
copies and pipeline steps never reach ``observe`` (``requests/answers``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from aieng.frontend.observe.driftref import Binned, build, features_problem
from aieng.models import yaml_file
from aieng.models.golden import read_golden
from aieng.models.repo import ModelSpec
from aieng.models.served import ServedVersions
from aieng.models.spec import ModelError

MAX_REFERENCE_N = 100_000  # values held per feature while a reference is collected: a bound on memory
log = logging.getLogger("aieng.frontend.observe.drift")
MAX_REFERENCE_FILE_BYTES = 4 << 20  # a reference is bins per feature: kilobytes


def read_reference_file(path: str, key: str) -> dict | None:
    """A version's own reference file (model.yaml's ``drift.reference``), or None, logged, when it cannot be
    used: a drift file that cannot be read never stops the start or a load, as a state file's cannot; the
    version's reference is then built from traffic.  Read once per version (the caller keeps the result),
    from a regular file of bounded size, without blocking on what is not one."""
    try:
        ref = json.loads(yaml_file.read_bytes(path, MAX_REFERENCE_FILE_BYTES))
        why = features_problem(ref.get("features", {})) if isinstance(ref, dict) else "not a map"
        if why:
            raise ValueError(why)
        return ref
    except (OSError, ModelError, ValueError, RecursionError) as exc:  # JSON's errors are ValueErrors
        log.error("%s: drift reference %s not used, built from traffic instead: %s", key, path, exc)
        return None


@dataclass(frozen=True)
class ReferenceRule:
    """Who and when a reference built from traffic must come from (AIENG_DRIFT_REFERENCE_CLIENTS, _SPAN_S)."""
    clients: int = 1
    span_s: float = 0.0

    def share(self, n: int) -> int:
        """The most answers one client gives to a reference of ``n``."""
        return max(1, -(-n // max(1, self.clients)))

    def gap_s(self, n: int) -> float:
        """The least time between two answers taken: ``n`` of them span ``span_s``."""
        return self.span_s / max(1, n - 1)

    def met_by(self, built: dict, n: int) -> bool:
        """A saved reference was built this way (or stricter): its provenance says so."""
        clients, span = built.get("clients"), built.get("span_s")
        if not isinstance(clients, int) or isinstance(clients, bool) or not isinstance(span, (int, float)):
            return False  # built before the rule: collected again
        return clients >= self.clients and span >= self.gap_s(n) * (n - 1) * 0.999


class VersionDrift:
    """One version's reference (from its file, from saved traffic, or being collected) and windows."""

    def __init__(self, spec: ModelSpec, file_ref: dict | None, saved: dict | None, n: int, window: int,
                 rule: ReferenceRule = ReferenceRule()):
        self.digest, self.n, self.window, self.rule = spec.content_hash, n, window, rule
        self.file_features = set((file_ref or {}).get("features", {}))
        self.inputs = {k: Binned(f, window) for k, f in (file_ref or {}).get("features", {}).items()}
        self.outputs: dict[str, Binned] = {}
        embedding = spec.postprocess.type == "mean_pool"
        self.centroid = "golden" if embedding and _has_golden(spec) else None
        self.built: dict | None = None  # the traffic part of the reference, as persisted
        self.sample: dict[str, list] | None = {}  # feature -> values, while collecting
        self.collected = 0
        self.given: dict[str, int] = {}  # client -> answers it gave the sample (at most rule.share(n))
        self.first_at: float | None = None  # when the sample's first and last answers were taken
        self.last_at = float("-inf")
        if saved is not None and saved.get("digest") == self.digest:
            if rule.met_by(saved, n):
                self.adopt(saved)
            else:
                log.warning("drift reference of %s saved without the clients and span the rule asks "
                            "(%d clients, %gs): collected again", spec.key, rule.clients, rule.span_s)

    def adopt(self, built: dict) -> None:
        self.built, self.sample, self.collected = built, None, int(built.get("size", self.n))
        for name, ref in built.get("inputs", {}).items():
            if name not in self.file_features:
                self.inputs[name] = Binned(ref, self.window)
        self.outputs = {name: Binned(ref, self.window) for name, ref in built.get("outputs", {}).items()}

    def observe(self, features: dict, outputs: dict, client: str = "", now: float = 0.0) -> dict | None:
        """Bin this answer, or add it to the sample (when ``client`` is under its share and the gap since
        the last one taken has passed); the built reference when this one completed it."""
        if self.sample is None:
            for name, b in self.inputs.items():
                b.observe(features.get(name))
            for name, b in self.outputs.items():
                b.observe(outputs.get(name))
            return None
        for name, b in self.inputs.items():  # file features score from the first request on
            b.observe(features.get(name))
        given = self.given.get(client, 0)
        if given >= self.rule.share(self.n) or now - self.last_at < self.rule.gap_s(self.n):
            return None  # this client gave its share, or too soon after the last one taken
        self.given[client] = given + 1
        self.first_at = now if self.first_at is None else self.first_at
        self.last_at = now
        for part, values in (("in", features), ("out", outputs)):
            for name, v in values.items():
                if v is not None and not (part == "in" and name in self.file_features):
                    self.sample.setdefault(f"{part}:{name}", []).append(v)
        self.collected += 1
        if self.collected < self.n or len(self.given) < self.rule.clients:
            return None
        built: dict[str, Any] = {"digest": self.digest, "size": self.collected, "inputs": {}, "outputs": {},
                                 "clients": len(self.given), "span_s": round(now - self.first_at, 3)}
        for key, values in self.sample.items():
            ref = build(values)
            if ref is not None:
                part, name = key.split(":", 1)
                built["inputs" if part == "in" else "outputs"][name] = ref
        self.adopt(built)
        return built

    def view(self) -> dict:
        source = {"input": "file" if self.file_features else "traffic", "output": "traffic"}
        if self.file_features and self.built is not None and set(self.built["inputs"]) - self.file_features:
            source["input"] = "file+traffic"
        if self.centroid:
            source["centroid"] = self.centroid
        scores = {part: {k: round(s, 4) for k, b in feats.items() if (s := b.psi()) is not None}
                  for part, feats in (("input", self.inputs), ("output", self.outputs))}
        ready = self.sample is None
        clients = self.built.get("clients") if ready and self.built is not None else len(self.given)
        return {"reference": dict(source, state="ready" if ready else "collecting",
                                  collected=min(self.collected, self.n), size=self.n, clients=clients,
                                  clients_needed=self.rule.clients, client_share=self.rule.share(self.n)),
                "psi": scores}


def _has_golden(spec: ModelSpec) -> bool:
    try:
        return read_golden(spec.path) is not None
    except ModelError:
        return False


class DriftMonitor:
    def __init__(self, specs: ServedVersions, window: int = 1000, reference_n: int = 200,
                 saved: dict[str, dict] | None = None, persist: Callable[[dict], Any] | None = None,
                 rule: ReferenceRule = ReferenceRule()):
        """``specs`` is the live table (versions loaded at run time appear in it); ``saved``: the
        persisted traffic references by ``model:version``; ``persist(all)`` hands them to the writer;
        ``rule``: who and when a reference built from traffic comes from."""
        self.specs, self.window, self.reference_n = specs, window, min(max(1, reference_n), MAX_REFERENCE_N)
        self.rule = rule
        self.saved, self.persist = dict(saved or {}), persist
        self.versions: dict[tuple[str, str], VersionDrift] = {}
        for name, versions in specs.items():  # a bad reference file fails the start, not each answer
            for v in versions:
                self.version(name, v)

    def version(self, model: str, version: str) -> VersionDrift | None:
        spec = self.specs.get(model, version)
        vd = self.versions.get((model, version))
        if vd is not None and (spec is None or vd.digest == spec.content_hash):
            return vd
        if spec is None or spec.pipeline is not None:
            return None
        ref_file = spec.drift.reference
        file_ref = read_reference_file(spec.file(ref_file), spec.key) if ref_file else None
        saved = self.saved.get(spec.key)  # a new content hash starts a new reference
        vd = self.versions[(model, version)] = VersionDrift(spec, file_ref, saved, self.reference_n,
                                                            self.window, self.rule)
        return vd

    def observe(self, model: str, version: str, features: dict, confidence: float | None = None,
                distance: float | None = None, client: str = "", now: float = 0.0) -> None:
        """One answer of ``client`` (``clients.peer_of``) at ``now`` (monotonic seconds)."""
        vd = self.version(model, version)
        if vd is None:
            return
        built = vd.observe(features or {}, {"confidence": confidence, "distance": distance}, client, now)
        if built is not None:
            self.saved[f"{model}:{version}"] = built
            log.info("drift reference of %s:%s built from %d answers of %d clients over %gs", model, version,
                     built["size"], built["clients"], built["span_s"])
            if self.persist is not None:
                self.persist(dict(self.saved))

    def scores(self, part: str = "input") -> dict[tuple[str, str, str], float]:
        out = {}
        for (model, version), vd in self.versions.items():
            for name, b in (vd.inputs if part == "input" else vd.outputs).items():
                psi = b.psi()
                if psi is not None:
                    out[(model, version, name)] = psi
        return out

    def view(self) -> dict[str, dict[str, dict]]:
        """model -> version -> reference source and state, and the PSI per feature (models op, /debug)."""
        out: dict[str, dict[str, dict]] = {}
        for (model, version), vd in sorted(self.versions.items()):
            out.setdefault(model, {})[version] = vd.view()
        return out
