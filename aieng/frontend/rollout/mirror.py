"""Shadow traffic in the frontend: copying a request to a candidate version, pairing, reporting.

When a model's routing has a shadow setting (``models.routing.ShadowConfig``), a primary that entered the
pipeline is drawn (``percent``) at admission (``after_admit``), and its copy is sent only **once the
primary has been answered** (``primary_end``): a primary never waits for its copy, and one that
failed gets none (``primary_failed``).  The copy is an internal ``Request`` (``Kind.SHADOW``, no
envelope, no id, ``link`` = the primary's rid) for the candidate, on the table's normal slot paths, with its
own deadline (``timeout_ms`` from its send) and none of the model's bookkeeping; its end comes back
here (``shadow_end``) and is never sent.  Shed first: it is sent only if the candidate did not fail
to load, the server is not draining, the primary was not degraded and everything in flight is below
``max_load x max_inflight``; else ``shed``.  A primary routed to the candidate gets no copy.  Pairs
are keyed by the primary's rid and live until the copy ends, so they are bounded by the requests in
flight; outcomes are ``compared`` (``shadow.compare``), ``timeout``, ``error``, ``shed`` and
``primary_failed``, kept in ``Tally``s and the ``aieng_shadow_*`` metrics (registered here).
The behaviour and the numbers: docs/rollout.md, section 8; docs/metrics.md.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import msgpack
from prometheus_client import CollectorRegistry, Counter, Histogram

from aieng.frontend.requests.table import SHADOW, Request
from aieng.frontend.rollout.shadow import Tally, compare
from aieng.wire import protocol as p

if TYPE_CHECKING:  # pragma: no cover
    from aieng.config import Config
    from aieng.frontend.requests.admission import Admission
    from aieng.frontend.requests.table import RequestTable
    from aieng.frontend.rollout.rollout import Rollout
    from aieng.models.served import ServedVersions

COSINE_BUCKETS = (0.0, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0)
DIFF_BUCKETS = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)
DELTA_BUCKETS = (-1.0, -0.1, -0.025, -0.01, -0.005, -0.001, 0.0, 0.001, 0.005, 0.01, 0.025, 0.1, 1.0)
log = logging.getLogger("aieng.frontend.rollout.mirror")


@dataclass(slots=True)
class Pair:
    model: str
    version: str  # the shadow's
    timeout_ms: int
    max_load: float
    body: Any = None  # the client's request frame, until the shadow copy is sent
    primary: tuple | None = None  # (outputs, latency s) once the primary was answered OK
    shadow: tuple | None = None  # (outputs or None, code, latency s)


def _outputs(packed: bytes) -> dict:
    """A worker's packed ``outputs`` map (our own postprocess wrote it: no size limits needed)."""
    out = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    if not isinstance(out, dict):
        raise ValueError("outputs are not a map")
    return out


class Mirror:
    def __init__(self, cfg: Config, specs: ServedVersions, rollout: Rollout,
                 admission: Admission, table: RequestTable, start: Callable[[Request], None],
                 registry: CollectorRegistry):
        """``start`` sends a request down the pipeline (the shadow copy, once its primary is answered)."""
        self.cfg, self.specs, self.rollout, self.admission, self.table = cfg, specs, rollout, admission, table
        self.start = start
        self.pairs: dict[int, Pair] = {}
        self.tallies: dict[tuple[str, str], Tally] = {}
        r = registry
        self.m_requests = Counter("aieng_shadow_requests", "Shadow copies by outcome (compared, shed, "
                                  "timeout, error, primary_failed)", ["model", "version", "outcome"],
                                  registry=r)
        self.m_labels = Counter("aieng_shadow_label_pairs", "Label outputs compared, by agreement",
                                ["model", "version", "agree"], registry=r)
        self.m_cosine = Histogram("aieng_shadow_cosine", "Cosine similarity of float tensor outputs "
                                  "(shadow vs primary)", ["model", "version"], buckets=COSINE_BUCKETS,
                                  registry=r)
        self.m_diff = Histogram("aieng_shadow_max_abs_diff", "Max absolute difference of numeric outputs "
                                "per pair", ["model", "version"], buckets=DIFF_BUCKETS, registry=r)
        self.m_delta = Histogram("aieng_shadow_latency_delta_seconds", "Shadow latency minus its primary's "
                                 "(negative: the shadow was faster)", ["model", "version"],
                                 buckets=DELTA_BUCKETS, registry=r)

    def tally(self, model: str, version: str) -> Tally:
        t = self.tallies.get((model, version))
        if t is None:
            t = self.tallies[(model, version)] = Tally()
        return t

    def count(self, model: str, version: str, outcome: str) -> None:
        self.tally(model, version).count(outcome)
        self.m_requests.labels(model, version, outcome).inc()

    # -- choosing and making the copy ------------------------------------------------------------
    def after_admit(self, primary: Request, body: Any) -> None:
        """``primary`` was just started in the pipeline with the client's ``body``: draw whether it
        gets a shadow copy (sent once the primary has been answered, see ``primary_end``)."""
        conf = self.rollout.shadow_of(primary.model)
        if conf is None or conf.version == primary.version or random.random() * 100 >= conf.percent:
            return
        spec, cfg = self.specs[primary.model][conf.version], self.cfg
        timeout_ms = conf.timeout_ms or min(spec.timeout_ms or cfg.default_timeout_ms, cfg.max_timeout_ms)
        self.pairs[primary.rid] = Pair(primary.model, conf.version, timeout_ms, conf.max_load, body)

    def primary_end(self, req: Request, outputs: bytes | None, now: float) -> None:
        """The primary was answered (``outputs``) or failed (None); its answer has been sent."""
        pair = self.pairs.get(req.rid)
        if pair is None:
            return
        if outputs is None:
            del self.pairs[req.rid]
            return self.count(pair.model, pair.version, "primary_failed")
        if (self.admission.refuses(f"{pair.model}:{pair.version}") or req.degraded
                or len(self.table) >= pair.max_load * self.cfg.max_inflight):
            del self.pairs[req.rid]
            return self.count(pair.model, pair.version, "shed")
        pair.primary, body, pair.body = (outputs, now - req.received), pair.body, None
        t = time.monotonic()
        copy = Request(self.table.new_rid(), None, None, pair.model, pair.version, t + pair.timeout_ms / 1000,
                       t, req.params, trace=req.trace, body=body, route="shadow", kind=SHADOW, link=req.rid)
        self.start(copy)

    def shadow_end(self, req: Request, outputs: bytes | None, code: str, now: float) -> None:
        pair = self.pairs.get(req.link)  # the primary's rid
        if pair is not None:
            if outputs is not None and now > req.deadline:  # answered after its own deadline, before the
                outputs, code = None, p.TIMEOUT              # sweep saw it: a timeout all the same
            pair.shadow = (outputs, code, now - req.received)
            self._resolve(req.link, pair)

    def _resolve(self, rid: int, pair: Pair) -> None:
        del self.pairs[rid]
        (p_out, p_s), (s_out, code, s_s) = pair.primary, pair.shadow
        if s_out is None:
            return self.count(pair.model, pair.version, "timeout" if code == p.TIMEOUT else "error")
        try:
            c = compare(_outputs(p_out), _outputs(s_out))
        except Exception:  # an undecodable answer is the candidate's problem, never the frontend's
            log.exception("comparing a shadow answer of %s:%s failed", pair.model, pair.version)
            return self.count(pair.model, pair.version, "error")
        delta = s_s - p_s
        self.tally(pair.model, pair.version).add(c, delta)
        labels = (pair.model, pair.version)
        self.m_requests.labels(*labels, "compared").inc()
        if c.labels:
            self.m_labels.labels(*labels, "true").inc(c.agree)
            self.m_labels.labels(*labels, "false").inc(c.labels - c.agree)
        for x in c.cosines:
            self.m_cosine.labels(*labels).observe(x)
        if c.max_abs_diff is not None:
            self.m_diff.labels(*labels).observe(c.max_abs_diff)
        self.m_delta.labels(*labels).observe(delta)

    # -- reports ------------------------------------------------------------------------------
    def view(self, model: str | None = None) -> dict:
        """``{model: {version: tally view}}`` (or one model's ``{version: ...}``)."""
        out: dict[str, dict] = {}
        for (name, version), t in sorted(self.tallies.items()):
            out.setdefault(name, {})[version] = t.view()
        return out if model is None else out.get(model, {})

    def reset(self) -> None:
        self.tallies.clear()
