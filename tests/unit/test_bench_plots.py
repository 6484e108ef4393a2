"""The benchmarks' pictures (bench/plots.py) and the demo's pointer to them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bench.plots import latency_percentiles, per_second, timeline

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def test_events_per_second_from_their_timestamps() -> None:
    times = [100.0, 100.2, 100.9, 101.5, 103.0, 99.0, 104.5]  # 99 before, 104.5 after
    assert per_second(times, 100.0, 103.5) == [(0.0, 3.0), (1.0, 1.0), (2.0, 0.0), (3.0, 1.0)]


def test_plots_are_pngs(tmp_path: Path) -> None:
    panels = [("rows / s", {"a": [(0.0, 1.0), (1.0, 2.0)]}),
              ("rows behind", {"b": [(0.0, 5.0), (1.0, 0.0)]})]  # fmt: skip
    t = timeline(tmp_path / "t.png", "title", panels)
    lat = latency_percentiles(tmp_path / "l.png", "title", {"x": [float(i) for i in range(1, 500)]})
    for path in (t, lat):
        assert path.read_bytes().startswith(PNG)
        assert path.stat().st_size > 10_000  # drawn, not an empty canvas


def test_the_demo_points_at_the_plots_or_says_how_to_draw_them(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("demo", REPO / "deploy/local/demo.py")
    assert spec is not None
    assert spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert "bench.kafka2search_bench" in "\n".join(demo.pictures(tmp_path))
    (tmp_path / "x-timeline.png").write_bytes(PNG)
    assert demo.pictures(tmp_path) == [f"  {tmp_path / 'x-timeline.png'}"]
