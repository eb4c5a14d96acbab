"""The compact histogram family renders what prometheus_client's own Histogram renders for the same
observations (the exposition is a contract: docs/metrics.md), series made on first use."""
import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from aieng.frontend.observe.histograms import Histograms
from aieng.frontend.observe.metrics import Metrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = [("a", "1", 0.0005), ("a", "1", 0.001), ("b", "2", 7.0), ("a", "1", 0.05), ("b", "2", math.nan),
          ("c", "1", -0.5), ("a", "1", math.inf)]


def rendered(cls) -> list[str]:
    reg = CollectorRegistry(auto_describe=True)
    h = cls("x_seconds", "help text", ["model", "version"], buckets=BUCKETS, registry=reg)
    for model, version, v in VALUES:
        h.labels(model, version).observe(v)
    h.labels("idle", "1")  # labelled, never observed: shown at zero
    # the creation times differ between the two by construction; everything else must not
    return [line if "_created{" not in line else line.rsplit(" ", 1)[0]
            for line in generate_latest(reg).decode().splitlines()]


def test_same_exposition_as_prometheus_client_histogram():
    ours, theirs = rendered(Histograms), rendered(Histogram)
    assert ours == theirs
    assert 'x_seconds_bucket{le="0.001",model="a",version="1"} 2.0' in ours
    assert 'x_seconds_count{model="idle",version="1"} 0.0' in ours


def test_a_model_shows_no_histogram_before_its_first_answer_then_twelve():
    m = Metrics()
    assert b'model="m"' not in m.render()
    m.answered("m", "1", {"total": 1500, "inference": 700}, 1, None)
    text = m.render().decode()
    assert 'aieng_request_duration_seconds_count{model="m",version="1"} 1.0' in text
    assert 'aieng_stage_duration_seconds_sum{model="m",stage="inference",version="1"} 0.0007' in text
    assert 'aieng_output_confidence_count{model="m",version="1"} 0.0' in text
    assert text.count('_count{model="m"') == 12
    assert text.count('aieng_stage_duration_seconds_count{model="m"') == 9
