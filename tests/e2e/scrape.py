"""Reading a test server's probe port: a GET that returns (status, body) whatever the status, and the
/metrics samples keyed by (name, sorted labels)."""
from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def samples(base: str) -> dict:
    code, body = get(base + "/metrics")
    assert code == 200
    out: dict = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(s: dict, name: str, **labels) -> float:
    return s.get((name, tuple(sorted(labels.items()))), 0.0)


def total(s: dict, name: str) -> float:
    """The sum of a metric's samples over every label set."""
    return sum(v for (n, _), v in s.items() if n == name)
