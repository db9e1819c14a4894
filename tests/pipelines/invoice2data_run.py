"""One run of the tiny model over the 11 invoice PDFs of invoice2data in the shared corpus, at the default
settings (`--hints auto`, `--detail auto`), made once per test session: test_eval scores it against the
truth from scripts/truth_from_invoice2data.py, test_estimate compares the estimate with its ledger."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import cli
from tests.conftest import CORPUS

INVOICE2DATA = CORPUS / "extraction_gt" / "invoice-x__invoice2data" / "tests" / "compare"
INPUT = str(INVOICE2DATA / "*.pdf")
# Only what keeps the CPU engine quick; every hint and detail setting is the default.
FLAGS = ["--max-tokens", "256"]
_made: dict[str, Path] = {}


def corpus_run(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path) -> Path:
    if "output" not in _made:
        output = tmp_path_factory.mktemp("invoice2data-run")
        code = cli.main(["run", "--input", INPUT, "--output", str(output), "--run-id", "i2d", "--schema", "invoice",
                         "--model", str(test_model_dir), "--kv-cache-gib", "0.25", "--progress-every-s", "0", *FLAGS])
        assert code == 0
        _made["output"] = output
    return _made["output"]
