"""benchmarks/bench_devices.py runs end to end on a few pages, one worker, and prints every figure (no timing
asserts): the baseline, then two simulated engines, each in its own service process, both of which answer pages."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_bench() -> ModuleType:
    # benchmarks/ is a folder of scripts, not a package: load the file itself.
    spec = importlib.util.spec_from_file_location("bench_devices", REPO / "benchmarks" / "bench_devices.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_two_devices_on_a_few_pages_print_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    returned = bench.main(["--devices", "2", "--pages-per-device", "4", "--baseline-pages", "6", "--slots", "1",
                           "--workers", "1", "--json"])
    out = capsys.readouterr().out
    assert "pagemill devices benchmark: CPU stages" in out and "2 device(s): 8 pages (8 ok)" in out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures == json.loads(json.dumps(returned))
    assert list(figures["pages_per_s"]) == ["2"] and figures["pages_per_s"]["2"] > 0
    (run,) = figures["runs"]
    assert [e["device"] for e in run["engines"]] == ["0", "1"]
    assert sum(e["pages"] for e in run["engines"]) == run["pages"] == 8  # every page answered by one engine
    assert len(figures["busy"]["2"]) == 2 and all(b is None or 0 < b <= 1 for b in figures["busy"]["2"])
