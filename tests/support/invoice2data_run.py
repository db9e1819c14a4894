"""One run of the tiny model over the 11 invoice PDFs of invoice2data in the shared corpus, at the default
settings (`--hints auto`, `--detail auto`), made once per test run (tests.conftest.made_once): test_eval scores
it against the truth from scripts/truth_from_invoice2data.py, test_estimate compares the estimate with its
ledger."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import cli
from tests.conftest import CORPUS, made_once

INVOICE2DATA = CORPUS / "extraction_gt" / "invoice-x__invoice2data" / "tests" / "compare"
INPUT = str(INVOICE2DATA / "*.pdf")
# Only what keeps the CPU engine quick; every hint and detail setting is the default.
FLAGS = ["--max-tokens", "256"]
# The run only: one worker process (no worker pool and engine service to start; every page is distinct).
RUN_FLAGS = [*FLAGS, "--workers", "1"]


def corpus_run(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path) -> Path:
    def make(output: Path) -> None:
        code = cli.main(["run", "--input", INPUT, "--output", str(output), "--run-id", "i2d", "--schema", "invoice",
                         "--model", str(test_model_dir), "--kv-cache-gib", "0.25", "--progress-every-s", "0",
                         *RUN_FLAGS])
        assert code == 0

    return made_once(tmp_path_factory, "invoice2data-run", make)
