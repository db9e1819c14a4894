"""benchmarks/bench_scale.py runs end to end on a few objects, with waves and as one pipeline, and prints
every figure (no timing asserts)."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_bench() -> ModuleType:
    # benchmarks/ is a folder of scripts, not a package: load the file itself.
    spec = importlib.util.spec_from_file_location("bench_scale", REPO / "benchmarks" / "bench_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_small_scale_run_prints_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    assert len({bench.png(i) for i in range(50)}) == 50  # distinct objects: none is a duplicate
    bench.main(["--sizes", "12", "--baseline", "12", "--wave-objects", "5", "--keep", str(tmp_path),
                "--beam-arg=--workers=1"])
    out = capsys.readouterr().out
    runs = re.findall(r"^\s+12 objects, --wave-objects\s+(\S+): wall .* peak RSS tree\s+(\d+) MiB .*"
                      r"first page row\s+([\d.]+) s .* exit 0$", out, re.MULTILINE)
    assert {mode for mode, _, _ in runs} == {"5", "0"}
    assert all(int(rss) > 0 and float(first) > 0 for _, rss, first in runs)
    waves = (tmp_path / "out-12-5" / "listings" / "tenant=default" / "run_id=scale")
    assert len(list(waves.glob("wave-*.done"))) == 4  # 1, 5, 5 and 1 objects
