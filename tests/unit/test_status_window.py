"""The status page's last minute (``observe/window.RollingWindow``): counts, errors, requests a second and
percentiles per version and per model; seconds older than a minute fall out; memory stays bounded."""
from __future__ import annotations

import numpy as np

from aieng.frontend.observe.window import SECONDS, RollingWindow


def test_counts_rate_and_percentiles_per_version_and_model():
    w = RollingWindow(clock_start=1000.0)
    rng = np.random.default_rng(0)
    lat = rng.uniform(0.001, 0.1, size=600)  # 1 to 100 ms
    for i, s in enumerate(lat):
        w.add("tab", "1" if i % 3 else "2", "OK", float(s), 1000.0 + i * 0.1)  # 60 s of answers
    w.add("tab", "1", "TIMEOUT", 5.0, 1059.0)
    view = w.view(1059.9)
    model, v1, v2 = view["tab"][""], view["tab"]["1"], view["tab"]["2"]
    assert (model.requests, model.errors) == (601, 1)
    assert (v1.requests, v2.requests) == (401, 200)
    assert model.window_s == 59.9 and model.rps == round(601 / 59.9, 3)  # seconds 1000..1059.9
    # log bins 2^(1/8) wide: within 5% of numpy's percentiles (the error's 5 s is not an answer's time)
    assert abs(model.p50_ms - np.percentile(lat, 50) * 1000) / (np.percentile(lat, 50) * 1000) < 0.05
    assert abs(model.p99_ms - np.percentile(lat, 99) * 1000) / (np.percentile(lat, 99) * 1000) < 0.05


def test_the_first_minute_counts_since_the_start():
    w = RollingWindow(clock_start=500.0)
    for i in range(20):
        w.add("m", "1", "OK", 0.002, 500.0 + i * 0.5)
    t = w.view(510.0)["m"]["1"]
    assert t.requests == 20 and t.window_s == 10.0 and t.rps == 2.0


def test_seconds_older_than_a_minute_fall_out_and_slots_are_reused():
    w = RollingWindow(clock_start=0.0)
    for sec in range(100):
        w.add("m", "1", "OK", 0.01, float(sec))
    t = w.view(99.5)["m"]["1"]
    assert t.requests == SECONDS  # seconds 40..99
    assert len(w.rings[("m", "1")]) == SECONDS
    assert w.view(99.5 + SECONDS) == {}  # nothing in the last minute: the model is left out


def test_only_errors_give_no_percentiles():
    w = RollingWindow(clock_start=0.0)
    w.add("m", "1", "INVALID_INPUT", 0.0001, 1.0)
    t = w.view(2.0)["m"][""]
    assert (t.requests, t.errors, t.p50_ms, t.p99_ms) == (1, 1, None, None)
