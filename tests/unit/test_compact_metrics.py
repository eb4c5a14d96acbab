"""The compact metric families render what prometheus_client's own Histogram, Counter and Gauge render for
the same calls (the exposition is a contract: docs/metrics.md), series made on first use."""
import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from aieng.frontend.observe.compact import Counters, Gauges, Histograms
from aieng.frontend.observe.metrics import Metrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = [("a", "1", 0.0005), ("a", "1", 0.001), ("b", "2", 7.0), ("a", "1", 0.05), ("b", "2", math.nan),
          ("c", "1", -0.5), ("a", "1", math.inf)]


def lines(reg) -> list[str]:
    # the creation times differ between the two by construction; everything else must not
    return [line if "_created{" not in line else line.rsplit(" ", 1)[0]
            for line in generate_latest(reg).decode().splitlines()]


def rendered(hist, counter, gauge) -> list[str]:
    reg = CollectorRegistry(auto_describe=True)
    h = hist("x_seconds", "help text", ["model", "version"], buckets=BUCKETS, registry=reg)
    c = counter("x_requests", "requests", ["model", "code"], registry=reg)
    g = gauge("x_level", "a level", ["model", "digest"], registry=reg)
    for model, version, v in VALUES:
        h.labels(model, version).observe(v)
        c.labels(model, "OK").inc()
        g.labels(model, version).set(v if not math.isnan(v) else 3)
    h.labels("idle", "1")  # labelled, never observed: shown at zero
    c.labels("idle", "OK")
    c.labels("a", "TIMEOUT").inc(2.5)
    g.labels("idle", "x")
    g.remove("b", "2")
    return lines(reg)


def test_same_exposition_as_prometheus_client():
    ours, theirs = rendered(Histograms, Counters, Gauges), rendered(Histogram, Counter, Gauge)
    assert ours == theirs
    assert 'x_seconds_bucket{le="0.001",model="a",version="1"} 2.0' in ours
    assert 'x_seconds_count{model="idle",version="1"} 0.0' in ours
    assert 'x_requests_total{code="OK",model="a"} 4.0' in ours
    assert 'x_level{digest="x",model="idle"} 0.0' in ours
    assert not any(line.startswith("x_level{") and 'model="b"' in line for line in ours)


def test_a_model_shows_no_histogram_before_its_first_answer_then_twelve():
    m = Metrics()
    assert b'model="m"' not in m.render()
    m.answered("m", "1", {"total": 1500, "inference": 700}, 1, None)
    text = m.render().decode()
    assert 'aieng_request_duration_seconds_count{model="m",version="1"} 1.0' in text
    assert 'aieng_stage_duration_seconds_sum{model="m",stage="inference",version="1"} 0.0007' in text
    assert 'aieng_output_confidence_count{model="m",version="1"} 0.0' in text
    assert 'aieng_requests_total{code="OK",model="m",version="1"} 1.0' in text
    assert text.count('_count{model="m"') == 12
    assert text.count('aieng_stage_duration_seconds_count{model="m"') == 9


def test_routing_source_series_follow_the_digest():
    m = Metrics()
    m.routing_source("m", "abc", 1, local=False, refused=False)
    m.routing_source("m", "def", 2, local=True, refused=False, before=("abc", 1))
    text = m.render().decode()
    assert 'aieng_routing_generation{digest="def",model="m"} 2.0' in text and 'digest="abc"' not in text
    assert 'aieng_routing_local_change{model="m"} 1.0' in text
    assert 'aieng_routing_model_yaml_refused{model="m"} 0.0' in text


def test_a_histogram_series_shares_its_zeros_until_a_value_lands_in_a_bucket():
    h = Histograms("y_seconds", "help", ["model"], buckets=BUCKETS, registry=CollectorRegistry())
    idle, nan, used = h.labels("idle"), h.labels("nan"), h.labels("used")
    nan.observe(math.nan)  # counted in no bucket: still the shared zeros, its sum NaN
    used.observe(0.05)
    assert idle.counts is h.zeros and nan.counts is h.zeros and math.isnan(nan.sum)
    assert used.counts == [0, 0, 1, 0, 0] and h.zeros == (0,) * 5 and idle.state()[0] == [0] * 5
