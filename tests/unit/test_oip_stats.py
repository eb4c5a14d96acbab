"""Failures in the statistics: the frontend's ``StageStats`` counts each admitted request answered with an
error per model and version (count, ns from receipt), outside the stage window, cleared by a reset; the
gateway's ``models.stats`` puts them in each version's ``inference_stats.fail``, next to ``success``."""
from __future__ import annotations

from aieng.frontend.observe.stats import StageStats
from aieng.gateway import models


def test_failures_are_counted_per_model_and_version_and_reset():
    st = StageStats(window=8)
    st.add_failure("tabular", "1", 2_000_000)
    st.add_failure("tabular", "1", 3_000_000)
    st.add_failure("tabular", "2", 500)
    st.add_failure("minilm", "1", -5)  # a clock that went back counts no time
    for _ in range(20):  # the stage window turns over; the failure counters do not
        st.add("tabular", {"inference": 10}, 1, 0, 0)
    out = st.summary()
    assert out["failures"] == {"tabular": {"1": {"count": 2, "ns": 5_000_000}, "2": {"count": 1, "ns": 500}},
                               "minilm": {"1": {"count": 1, "ns": 0}}}
    assert st.summary(since_s=0.001)["failures"]["tabular"]["1"]["count"] == 2  # not windowed in time either
    assert out["models"]["tabular"]["requests"] == 8
    st.reset()
    assert st.summary()["failures"] == {}


def _catalog() -> models.Catalog:
    pub = {"inputs": [{"name": "x", "kind": "number"}], "outputs": [{"name": "y", "kind": "number"}],
           "max_batch_size": 8}
    cat = models.Catalog()
    versions = {v: dict(pub, version=v) for v in ("1", "2")}
    cat.update({"tabular": {"default_version": "1", "versions": versions}})
    return cat


def test_oip_statistics_show_each_versions_failures_beside_the_successes():
    reply = {"models": {"tabular": {"requests": 3, "stages_us": {"total": {"mean": 100.0}},
                                    "batch_sizes": {"1": 3}}},
             "failures": {"tabular": {"1": {"count": 1, "ns": 7_000}, "2": {"count": 4, "ns": 9_000_000}}}}
    by_version = {s["version"]: s for s in models.stats(_catalog(), reply, "tabular", None)}
    one, two = by_version["1"]["inference_stats"], by_version["2"]["inference_stats"]
    assert one["success"] == {"count": 3, "ns": 300_000} and one["fail"] == {"count": 1, "ns": 7_000}
    assert two["success"] == {"count": 0, "ns": 0} and two["fail"] == {"count": 4, "ns": 9_000_000}
    assert by_version["1"]["inference_count"] == 3 and by_version["2"]["inference_count"] == 0
    only = models.stats(_catalog(), reply, "tabular", "2")
    assert [s["version"] for s in only] == ["2"] and only[0]["inference_stats"]["fail"]["count"] == 4


def test_no_failures_read_zero():
    reply = {"models": {}}  # a frontend of before this field: every fail is 0
    for s in models.stats(_catalog(), reply, None, None):
        assert s["inference_stats"]["fail"] == {"count": 0, "ns": 0}
