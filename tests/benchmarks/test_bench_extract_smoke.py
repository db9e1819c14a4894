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
    # Each attempt is one engine request; each answer has at least one token and at most --max-tokens.
    assert figures["engine_calls"] == figures["attempts"] and 2 <= figures["attempts"] <= 2 * 2
    assert figures["attempts"] <= figures["output_tokens"] <= figures["attempts"] * 256
    # Both generated pages (an invoice, a report page) are A4 at 150 dpi, 1241x1754 px, capped to 911x1288 by
    # --max-side 1288. Qwen2-VL (the engine's own count): 28-px units, round(911/28) x round(1288/28) = 33 x 46
    # = 1518 image tokens a page. GPT-4o's published rule: within 2048 px, shortest side to 768 (768x1086),
    # 512-px tiles 2 x 3: 85 + 170 x 6 = 1105 tokens a page; at $2.5 in and $10 out a million tokens.
    assert figures["image_tokens"] == 2 * 1518
    text, out = figures["text_tokens"], figures["output_tokens"]
    assert figures["api_usd_per_1m_pages"] == pytest.approx(((2 * 1105 + text) * 2.5 + out * 10) / 2, abs=0.01)
    # The rates are the counts over the measured wall (rounded as printed).
    wall = figures["wall_s"]
    assert figures["pages_per_s"] == pytest.approx(2 / wall, rel=2e-3)
    assert figures["prompt_tokens_per_s"] == pytest.approx((figures["image_tokens"] + text) / wall, rel=2e-3)
    assert figures["output_tokens_per_s"] == pytest.approx(out / wall, rel=2e-3, abs=0.1)
    # Engine time is part of the extraction wall (a small tolerance for clock reads).
    assert figures["engine_s"] > 0 and figures["engine_busy_fraction"] == pytest.approx(figures["engine_s"] / wall,
                                                                                       abs=2e-3)
    assert figures["engine_busy_fraction"] <= 1.01
    # The host steps (benchmarks/host_steps.py): each timed; 911 px is not a multiple of Qwen2-VL's 28-px grid
    # (32.5 units), so the processor resizes the page (to 924, 33 units) and its resize is not a no-op.
    always = {"decode", "prompt", "image_processor", "image_processor_on_grid", "engine_input", "detokenise"}
    assert always <= set(figures["host_ms"]) <= set(sys.modules["host_steps"].STEPS) | {"grammar_compile_once"}
    assert all(v >= 0 for v in figures["host_ms"].values())
    assert figures["host_resize_noop"] is False and figures["host_grid_sizes"] == ["924x1288"]
    assert figures["usd_per_1m_pages"] == pytest.approx(
        figures["wall_s"] / 2 * 1e6 / 3600 * figures["gpu_hourly_usd"], rel=0.01)
    assert figures["api_cost_ratio"] == pytest.approx(figures["api_usd_per_1m_pages"] / figures["usd_per_1m_pages"],
                                                      rel=0.01)
