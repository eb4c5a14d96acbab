"""``aieng bench --transport``: the comparison table, the plain progress lines and the OIP tensors the
load generator sends (no server)."""
from __future__ import annotations

import struct

from aieng.tools import loadgen
from aieng.tools.bench import transports as bench_transports


def _row(c: int, t: str, rps: float, p50: float) -> dict:
    return {"concurrency": c, "transport": t, "rps": rps, "p50_ms": p50, "p95_ms": p50, "p99_ms": p50,
            "cpu": {"total": 10.0}, "errors": {}, "requests": 10}


def test_transport_table_compares_with_zmq_at_each_level():
    text = bench_transports.fmt_transports("minilm", [_row(1, "zmq", 100, 10), _row(1, "http", 95, 10.5),
                                           _row(64, "zmq", 200, 300), _row(64, "grpc", 190, 320)], 10)
    assert "| 1 | http | 95.0 | 0.95 | 10.50 | +0.50 | 10.50 | 10.50 | 10.00 | 0.00 | 0.00 | - |" in text
    assert "| 64 | grpc | 190.0 | 0.95 | 320.00 | +20.00 |" in text


def test_plain_progress_lines(capsys, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    p = loadgen.Progress("http c=1", 3, every_s=0.0)
    for _ in range(3):
        p.step()
    p.close()
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("  http c=1: 3/3 requests, ") and out[-1].endswith(" req/s now")


def test_oip_tensors_of_native_rows():
    (name, dt, shape, raw), = loadgen.oip_tensors({"text": "héllo"})
    assert (name, dt, shape) == ("text", "BYTES", [1]) and raw == struct.pack("<I", 6) + "héllo".encode()
    kinds = {n: (d, s) for n, d, s, _ in loadgen.oip_tensors({"bill_length_mm": 40.0, "island": "Dream"})}
    assert kinds == {"bill_length_mm": ("FP32", [1]), "island": ("BYTES", [1])}


def test_rounds_merge_into_one_row():
    import numpy as np

    a = {"concurrency": 4, "transport": "http", "requests": 10, "seconds": 1.0, "rps": 10.0,
         "errors": {"HTTP_503": 1}, "latencies_ms": np.full(10, 5.0), "mean_batch": 0.0}
    b = dict(a, requests=30, seconds=1.0, rps=30.0, errors={"HTTP_503": 2}, latencies_ms=np.full(30, 9.0))
    r = loadgen.merge_levels([a, b])
    assert (r["requests"], r["rps"], r["p50_ms"], r["errors"]) == (40, 20.0, 9.0, {"HTTP_503": 3})
    assert r["round_rps"] == [10.0, 30.0]  # each round's own, in order
    # the mean batch over every request (it was the first round's), every round's hop timings
    a.update(mean_batch=1.0, hops=[{"total": 1}])
    b.update(mean_batch=3.0, hops=[{"total": 2}, {"total": 3}])
    r = loadgen.merge_levels([a, b])
    assert (r["mean_batch"], r["hops"]) == (2.5, [{"total": 1}, {"total": 2}, {"total": 3}])


def test_tls_options_go_together():
    import pytest

    from aieng.cli.main import build_parser
    from aieng.tools.checks import UsageError

    parse = build_parser().parse_args
    args = parse(["bench", "--transport", "http,grpc", "--tls-cert", "c.pem", "--tls-key", "k.pem",
                  "--tls-ca", "ca.pem"])
    assert bench_transports.tls_files(args) == ("c.pem", "k.pem", "ca.pem")
    assert bench_transports.tls_files(parse(["bench", "--transport", "http"])) is None
    with pytest.raises(UsageError, match="--tls-cert, --tls-key and --tls-ca go together"):
        bench_transports.tls_files(parse(["bench", "--transport", "http", "--tls-cert", "c.pem"]))
