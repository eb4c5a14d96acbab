"""The plots extra: without matplotlib, ``aieng bench`` and ``aieng report --png`` print their tables and
then one line naming the extra (never a traceback); with it, the PNG is written."""
from __future__ import annotations

import sys

import pytest

from aieng.cli.main import main
from aieng.tools import report
from aieng.tools.bench.run import publish
from aieng.tools.plots import MissingExtra, pyplot

STATS = {"stages": ["queue", "infer"], "models": {"m": {
    "requests": 3, "seconds": 1.0, "mean_batch": 1.0, "padding_waste": 0.0, "batch_sizes": {"1": 3},
    "stages_us": {k: {"p50": 1000, "p95": 2000, "p99": 3000, "mean": 1500, "share": 0.5}
                  for k in ("queue", "infer", "total")}}}}


@pytest.fixture
def no_matplotlib(monkeypatch):
    """``import matplotlib`` raises ImportError, as in an install without the plots extra."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_missing_matplotlib_is_one_line_naming_the_extra(no_matplotlib):
    with pytest.raises(MissingExtra) as exc:
        pyplot()
    assert "\n" not in str(exc.value)
    assert "pip install 'aieng[plots]'" in str(exc.value)


def test_bench_prints_its_table_before_the_plot_and_survives_without_matplotlib(no_matplotlib, tmp_path,
                                                                               capsys):
    publish(str(tmp_path), "m", "| the | table |\n", lambda path: pyplot())
    out, err = capsys.readouterr()
    assert out.index("| the | table |") < out.index(f"wrote {tmp_path / 'm.md'}")
    assert ".png" not in out
    assert err.strip().splitlines() == ["aieng bench: no plot: matplotlib is not installed "
                                        "(pip install 'aieng[plots]')"]
    assert (tmp_path / "m.md").read_text() == "| the | table |\n"
    assert not (tmp_path / "m.png").exists()


def test_bench_writes_the_png_with_matplotlib(tmp_path, capsys):
    def draw(path: str) -> None:
        plt = pyplot()
        fig, ax = plt.subplots()
        ax.plot([1, 2], [3, 4])
        fig.savefig(path)
        plt.close(fig)

    publish(str(tmp_path), "m", "table\n", draw)
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"and {tmp_path / 'm.png'}" in capsys.readouterr().out


@pytest.fixture
def fake_server(monkeypatch):
    monkeypatch.setattr(report, "reachable", lambda addr: None)
    monkeypatch.setattr(report, "fetch", lambda *a, **kw: STATS)


def test_report_png_without_matplotlib_prints_the_table_then_one_line(fake_server, no_matplotlib, tmp_path,
                                                                      capsys):
    png = tmp_path / "r.png"
    assert main(["report", "--png", str(png)]) == 2
    out, err = capsys.readouterr()
    assert "## m: 3 requests" in out
    assert err == "aieng: no plot: matplotlib is not installed (pip install 'aieng[plots]')\n"
    assert not png.exists()


def test_report_png_with_matplotlib_writes_the_png(fake_server, tmp_path, capsys):
    png = tmp_path / "r.png"
    assert main(["report", "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## m: 3 requests" in capsys.readouterr().out
