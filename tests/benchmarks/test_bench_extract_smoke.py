"""benchmarks/bench_extract.py runs end to end on two pages and reports every figure (no timing asserts)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import vllm_available

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]


def load_bench() -> ModuleType:
    # benchmarks/ is a folder of scripts, not a package: load the file itself.
    spec = importlib.util.spec_from_file_location("bench_extract", REPO / "benchmarks" / "bench_extract.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_two_pages_give_a_json_line_with_every_figure(test_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    # A small KV cache and GPU share, so this also runs beside other engines on a GPU machine.
    returned = bench.main(["--model", str(test_model_dir), "--pages", "2", "--max-tokens", "256",
                           "--kv-cache-gib", "0.25", "--gpu-memory-utilization", "0.2", "--enforce-eager", "--json"])
    out = capsys.readouterr().out
    assert "pagemill extraction benchmark" in out
    line = next(ln for ln in reversed(out.splitlines()) if ln.startswith('{"'))
    figures = json.loads(line)
    assert figures == json.loads(json.dumps(returned))
    missing = [k for k in bench.JSON_KEYS if k not in figures]
    assert not missing, missing
    assert figures["bench"] == "extract"
    assert figures["pages"] == 2 and figures["max_in_flight"] >= 2
    assert figures["ok"] + figures["invalid"] + figures["failed"] == 2
    assert figures["ok"] >= 1, figures
    for key in ("engine_start_s", "wall_s", "pages_per_s", "prompt_tokens_per_s", "output_tokens_per_s",
                "image_tokens", "text_tokens", "output_tokens", "engine_s", "engine_calls", "engine_busy_fraction",
                "usd_per_1m_pages", "api_usd_per_1m_pages", "api_cost_ratio"):
        assert figures[key] > 0, (key, figures[key])
    # Engine time is part of the extraction wall (a small tolerance for clock reads).
    assert figures["engine_busy_fraction"] <= 1.01
    assert figures["usd_per_1m_pages"] == pytest.approx(
        figures["wall_s"] / 2 * 1e6 / 3600 * figures["gpu_hourly_usd"], rel=0.01)
