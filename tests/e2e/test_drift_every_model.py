"""Drift for every model (issue 23), against the real server: minilm and orientation ship no reference
file, so each builds its reference from its first AIENG_DRIFT_REFERENCE_N answers; traffic like those
keeps every score below the documented 0.25, and shifted traffic (long texts of made-up words; very
dark, very wide images) moves the input scores past it and the output scores with them.  The scores
show in /metrics, /debug and the models op; a restart keeps the saved references.

Each phase cycles a small fixed pool of inputs, and waits for its answers before the next starts, so
the reference (the first N answers) and the scored window (the last N) hold the same inputs.
"""
from __future__ import annotations

import asyncio
import glob
import json
import os
import random

import numpy as np
import pytest

from aieng.client import AsyncClient, build_request
from tests.e2e.scrape import get, samples, value
from tests.waits import until

pytestmark = pytest.mark.e2e

N = 60  # AIENG_DRIFT_REFERENCE_N and AIENG_DRIFT_WINDOW: three rounds of a pool
POOL = 20  # distinct inputs per distribution
THRESHOLD = 0.25  # docs/metrics.md, 'Drift': a shift worth a look
# one client here: the reference rule (clients and span, test_reliability_v4_drift.py) off
ENV = {"AIENG_MODELS": "minilm,orientation", "AIENG_DRIFT_REFERENCE_N": str(N), "AIENG_DRIFT_WINDOW": str(N),
       "AIENG_DRIFT_REFERENCE_CLIENTS": "1", "AIENG_DRIFT_REFERENCE_SPAN_S": "0",
       "AIENG_SNAPSHOT_MS": "100"}
WORDS = ("the a man woman dog cat sat ran on in near park street house car small big red blue "
         "today yesterday morning evening walked talked saw found").split()


def english(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."


def made_up(rng: random.Random) -> str:
    def word() -> str:
        syllables = rng.randint(3, 5)
        return "".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiouy") for _ in range(syllables))
    return " ".join(word() for _ in range(60)) + "."


def photo(rng: np.random.Generator, h: int, w: int, level: int) -> bytes:
    import cv2

    img = np.clip(rng.normal(level, 25, (h, w, 3)), 0, 255).astype(np.uint8)
    return cv2.imencode(".jpg", img)[1].tobytes()


def pools(seed: int = 0) -> dict:
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    return {"english": [english(rng) for _ in range(POOL)], "made_up": [made_up(rng) for _ in range(POOL)],
            "photos": [photo(nrng, 240, 320, 90 + 3 * i) for i in range(POOL)],
            "dark_wide": [photo(nrng, 160, 640, 8) for _ in range(POOL)]}


def send(srv, requests: list[tuple[str, dict]]) -> None:
    """Every request answered OK, 16 in flight; returns once all are answered."""
    async def run() -> list:
        client = AsyncClient(srv.addr, timeout_s=60)
        gate = asyncio.Semaphore(16)

        async def one(i: int, model: str, inputs: dict) -> dict:
            async with gate:
                return await client.call(build_request(i, model, inputs), raise_on_error=False)
        try:
            return await asyncio.gather(*(one(i, m, x) for i, (m, x) in enumerate(requests)))
        finally:
            client.close()

    replies = asyncio.run(run())
    bad = [r for r in replies if not r.get("ok")]
    assert not bad, bad[:3]


def phase(srv, texts: list[str], images: list[bytes]) -> None:
    reqs = [("minilm", {"text": texts[i % len(texts)]}) for i in range(N)]
    reqs += [("orientation", {"image": images[i % len(images)]}) for i in range(N)]
    send(srv, reqs)


def models_drift(srv) -> dict:
    with srv.client() as c:
        return c.models()["drift"]


def debug_drift(srv) -> dict:
    code, body = get(srv.http + "/debug")
    assert code == 200
    return json.loads(body)["drift"]


def published(srv, answered: int) -> bool:
    """A snapshot of the loop published after the ``answered``-th answer (the collector serves it too)."""
    code, body = get(srv.http + "/debug")
    return code == 200 and json.loads(body)["counts"]["ok"] >= answered


def scored(srv, answered: int):
    """The /debug drift once a snapshot published after the ``answered``-th answer holds every score."""
    def ready():
        code, body = get(srv.http + "/debug")
        snap = json.loads(body) if code == 200 else {}
        if snap.get("counts", {}).get("ok", 0) < answered:
            return None
        d = snap["drift"]
        ok = all(d.get(m, {}).get("1", {}).get("psi", {}).get(part, {}).get(f) is not None
                 for m, part, f in (("minilm", "input", "oov_share"), ("minilm", "output", "distance"),
                                    ("orientation", "input", "brightness"),
                                    ("orientation", "output", "confidence")))
        return d if ok else None
    return until(ready, 20)


def test_minilm_and_orientation_build_references_score_drift_and_keep_them_across_a_restart(make_server):
    p = pools()
    srv = make_server(**ENV).start()
    before = models_drift(srv)
    for model in ("minilm", "orientation"):
        ref = before[model]["1"]["reference"]
        assert (ref["input"], ref["output"], ref["state"], ref["collected"], ref["size"]) == \
            ("traffic", "traffic", "collecting", 0, N)
    assert before["minilm"]["1"]["reference"]["centroid"] == "golden"

    phase(srv, p["english"], p["photos"])  # the reference: the first N answers of each model
    refs = models_drift(srv)
    assert [refs[m]["1"]["reference"]["state"] for m in ("minilm", "orientation")] == ["ready", "ready"]
    phase(srv, p["english"], p["photos"])  # the same traffic: scored, below the threshold
    stable = scored(srv, 4 * N)
    assert stable, debug_drift(srv)
    for model, part, feature in (("minilm", "input", "tokens"), ("minilm", "input", "oov_share"),
                                 ("minilm", "output", "distance"), ("orientation", "input", "brightness"),
                                 ("orientation", "input", "aspect"), ("orientation", "output", "confidence")):
        assert stable[model]["1"]["psi"][part][feature] < THRESHOLD, (model, feature, stable)

    phase(srv, p["made_up"], p["dark_wide"])  # shifted: the whole window is the new traffic
    assert until(lambda: published(srv, 6 * N), 20)
    s = samples(srv.http)  # what the snapshot after the last answer published
    for feature in ("tokens", "oov_share"):
        assert value(s, "aieng_input_drift_psi", model="minilm", version="1", feature=feature) > THRESHOLD, s
    for feature in ("brightness", "aspect", "width"):
        psi = value(s, "aieng_input_drift_psi", model="orientation", version="1", feature=feature)
        assert psi > THRESHOLD, (feature, psi)
    assert value(s, "aieng_output_drift_psi", model="minilm", version="1", output="distance") > THRESHOLD
    conf = value(s, "aieng_output_drift_psi", model="orientation", version="1", output="confidence")
    assert conf > stable["orientation"]["1"]["psi"]["output"]["confidence"], conf
    for model in ("minilm", "orientation"):
        assert value(s, "aieng_drift_reference_ready", model=model, version="1", source="traffic") == 1.0
        assert value(s, "aieng_drift_reference_collected", model=model, version="1") == N
    shifted = models_drift(srv)
    assert shifted["minilm"]["1"]["psi"]["input"]["oov_share"] > THRESHOLD
    assert shifted["orientation"]["1"]["psi"]["input"]["brightness"] > THRESHOLD

    assert until(lambda: glob.glob(os.path.join(srv.env["AIENG_STATE_DIR"], "drift-*.json")), 10)
    assert srv.stop() == 0, srv.output()
    again = make_server(**ENV).start()  # the same state dir: the references come back
    after = models_drift(again)
    for model in ("minilm", "orientation"):
        ref = after[model]["1"]["reference"]
        assert (ref["state"], ref["collected"]) == ("ready", N), after
        assert after[model]["1"]["psi"] == {"input": {}, "output": {}}  # nothing scored yet: a fresh window
    send(again, [("minilm", {"text": t}) for t in p["made_up"] * 3])  # 60 (50 score) on the saved reference
    d = until(lambda: debug_drift(again)["minilm"]["1"]["psi"]["input"].get("oov_share"), 20)
    assert d and d > THRESHOLD, debug_drift(again)
