"""``aieng bench --model ocr|layout``'s pure parts: the report table, the target ratios, step reading."""
from __future__ import annotations

from aieng.tools.bench import layout as bench_layout
from aieng.tools.bench import ocr as bench_ocr
from aieng.tools.bench import pages as bench_pages


def _srv(c: int, rate: float, p50: float, steps: dict, batch=None) -> dict:
    return {"c": c, "rate": rate, "p50": p50, "p95": p50 * 1.2, "errors": {}, "steps": steps,
            "batch": batch, "cpu": {"total": 2.0, "executor": 1.5}}


def test_the_report_names_both_targets_against_the_best_reference_row():
    ref = [{"rate": 0.8, "p50": 1.2, "mean": 1.25, "steps": {"det": 0.3, "rec": 0.9}, "cpu": 2.1},
           {"rate": 0.7, "p50": 1.3, "mean": 1.35, "steps": {"det": 0.31, "rec": 0.95}, "cpu": 2.2}]
    steps = {"textdet": 0.28, "crop": 0.1, "textrec": 0.9, "join": 0.0001}
    srv = [_srv(1, 0.82, 1.18, steps, 4.0), _srv(4, 0.96, 4.1, steps, 2.5)]
    text = bench_pages.fmt(bench_ocr.REPORT, ref, srv, 40)
    assert "Throughput at saturation: 1.20 x rapidocr (best level c=4; target >= 1.1)." in text
    assert "Concurrency-1 p50 latency: 0.98 x rapidocr's (target <= 1.10)." in text
    assert "| before | 0.80 | 1200 | 1250 | 300 | 900 | 2.10 |" in text
    assert "| 4 | 0.96 | 1.20 | 4100 | 4920 | 280 | 100 | 900 | 0.10 | 2.50 | 2.00 (1.50) |  |" in text


def test_without_the_package_the_report_has_no_ratios():
    srv = [_srv(1, 6.0, 0.16, {"preprocess": 0.02, "inference": 0.12, "postprocess": 0.007, "queue": 0.004})]
    text = bench_pages.fmt(bench_layout.REPORT, [None, None], srv, 12)
    assert "rapid_layout is not available" in text and "x rapid_layout |" in text
    assert "Throughput at saturation" not in text and "| 1 | 6.00 | - | 160 |" in text


def test_steps_are_read_from_the_servers_timing():
    ocr = {"timing_us": {"textdet": 280_000, "crop": 50_000, "textrec": 900_000, "join": 100, "total": 1},
           "crop_batch_mean": 3.5}
    assert bench_ocr.steps_of(ocr) == ({"textdet": 0.28, "crop": 0.05, "textrec": 0.9, "join": 0.0001}, 3.5)
    layout = {"timing_us": {"preprocess": 20_000, "inference": 100_000, "postprocess": 5_000,
                            "frontend_in": 1_000, "total": 130_000}}
    got, batch = bench_layout.steps_of(layout)
    assert batch is None and abs(got["queue"] - 0.005) < 1e-9 and got["inference"] == 0.1


def test_pages_are_distinct_pngs_and_layout_pages_carry_a_figure():
    plain, fig = bench_pages.pages(2), bench_pages.pages(2, figure=True)
    assert all(p.startswith(b"\x89PNG") for p in plain + fig)
    assert plain[0] != plain[1] and plain[0] != fig[0]
