"""`pagemill bench` end to end with the tiny random Qwen2.5-VL (olmOCR-2's architecture) over a two-page benchmark
folder in olmOCR-Bench's layout, one run shared by the module; `pagemill eval --bench` re-scores the same run.
Random weights score near zero: what is checked is that every test is scored and the comparison line is printed."""
from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines import cli
from tests.conftest import vllm_available
from tests.support.docmaker import text_pdf

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]
FLAGS = ["--max-tokens", "48", "--kv-cache-gib", "0.25", "--progress-every-s", "0", "--workers", "1"]
TESTS = [{"pdf": "doc.pdf", "page": 1, "id": "p1", "type": "present", "text": "Quarterly revenue"},
         {"pdf": "doc.pdf", "page": 1, "id": "a1", "type": "absent", "text": "Page 1 of 1"},
         {"pdf": "doc.pdf", "page": 2, "id": "o2", "type": "order", "before": "Second", "after": "page"}]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory, tiny_model: Callable[[str], Path]) -> tuple[Path, Path, str]:
    data = tmp_path_factory.mktemp("olmocr-bench")
    (data / "pdfs").mkdir()
    (data / "pdfs" / "doc.pdf").write_bytes(text_pdf([["Quarterly revenue"], ["Second page"]]))
    (data / "text.jsonl").write_text("\n".join(json.dumps(t) for t in TESTS) + "\n")
    output = tmp_path_factory.mktemp("out")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = cli.main(["bench", "olmocr-bench", "--data", str(data), "--output", str(output), "--run-id", "b1",
                         "--model", str(tiny_model("qwen2_5_vl")), *FLAGS])
    assert code == 0, buffer.getvalue()
    return data, output, buffer.getvalue()


def test_bench_prints_the_comparison_line(bench_run: tuple[Path, Path, str]) -> None:
    _, _, printed = bench_run
    line = printed.strip().splitlines()[-1]
    fields = [f.strip() for f in line.split("|")]
    assert fields[0] == "olmocr-bench" and fields[1].startswith("model ") and "qwen2_5_vl" in fields[1]
    # the two pages of doc.pdf, one ledger row each, with the statuses the pages table holds (random weights
    # break olmOCR's front matter: usually `invalid`), `ok` always named
    from pipelines.tables import sql

    _, statuses = sql.query(str(bench_run[1]), "SELECT status, count(*) FROM pages WHERE run_id = 'b1' GROUP BY 1")
    assert fields[2].startswith("pages 2 (ok ")
    assert all(f"{status} {count}" in fields[2] for status, count in statuses)
    assert fields[3].startswith("score ") and "95% CI" in fields[3] and "; math exact" in fields[3]
    assert fields[4].startswith("$/1k pages $") and fields[5].startswith("pages/s ")
    assert float(fields[5].split()[-1]) > 0


def test_eval_bench_scores_every_test_of_the_run(bench_run: tuple[Path, Path, str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    data, output, _ = bench_run
    assert cli.main(["eval", "--bench", "olmocr-bench", "--data", str(data), "--output", str(output),
                     "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["run_id"] == "b1" and result["tests"] == len(TESTS) + 1  # and doc.pdf's baseline
    # A page counts as missing when its row has no markdown (random weights break olmOCR's front matter: the page
    # is `invalid`); the tests of pages that have markdown are all run on it.
    from pipelines.tables import sql

    _, rows = sql.query(str(output), "SELECT page_index FROM pages WHERE run_id = 'b1' AND markdown IS NOT NULL")
    with_markdown = {r[0] + 1 for r in rows}
    pages_of_tests = [t["page"] for t in TESTS] + [1]  # the baseline's page
    assert result["pages_missing_tests"] == sum(p not in with_markdown for p in pages_of_tests)
    assert set(result["verdicts"]) == {"p1", "a1", "o2", "doc.pdf_baseline"}
    assert result["cost"]["pages"] == 2


def test_bench_refuses_a_folder_that_is_not_the_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "olmocr-bench", "--data", str(tmp_path), "--output", str(tmp_path / "o")]) == 2
    assert "pdfs/" in capsys.readouterr().err
