"""`pagemill estimate --engine openai-batch`: the bill before the run, at the provider's batch rate."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines import cli

REPO = Path(__file__).resolve().parents[3]


def test_a_batch_run_is_estimated_at_the_batch_rate_of_its_provider(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["estimate", "--format", "json", "--input", str(REPO / "samples"), "--pages-per-second", "2",
                     "--sample-pages", "0", "--engine", "openai-batch", "--api-price", "gpt-4o"]) == 0
    r = json.loads(capsys.readouterr().out)
    listed = next(h for h in r["hosted"] if h["provider"] == "gpt-4o")
    price = json.loads((REPO / "schemas" / "prices.json").read_text())["providers"]["gpt-4o"]
    # The provider's batch endpoint charges half its list price (OpenAI's Batch API), for the same tokens.
    expected = (listed["input_tokens"] * price["input_usd_per_mtok"]
                + listed["output_tokens"] * price["output_usd_per_mtok"]) / 1e6 * 0.5
    assert r["route"]["route"] == "api:gpt-4o@batch" and "batch price" in r["route"]["basis"]
    assert expected > 0 and r["route"]["usd"] == pytest.approx(expected, rel=1e-9)
    assert r["route"]["usd"] == pytest.approx(listed["usd"] / 2, rel=1e-6)
