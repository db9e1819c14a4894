"""`pagemill run --preset olmocr` over samples/ with a tiny random Qwen2.5-VL (olmOCR-2's architecture) through
the real vLLM engine: markdown pages, front-matter columns, --write-markdown files, the result cache, and the
estimate's tokens against the engine's."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.run.markdown_files import write_markdown
from pipelines.tables import sql
from tests.conftest import REPO, vllm_available
from tests.support.raw import one_row_per, raw_rows
from transforms.model.markdown import MARKDOWN_FORMATS

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]
MAX_TOKENS = 200  # the front matter: ~75 tokens of the tiny tokenizer, at most 114 (a character each); then the cap
FLAGS = ["--preset", "olmocr", "--max-tokens", str(MAX_TOKENS), "--kv-cache-gib", "0.25", "--progress-every-s", "0",
         "--workers", "1"]


@pytest.fixture(scope="module")
def qwen25_dir(tiny_model: Callable[[str], Path]) -> Path:
    return tiny_model("qwen2_5_vl")


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("samples")
    for f in (REPO / "samples").iterdir():
        if f.suffix in (".pdf", ".png"):
            shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, qwen25_dir: Path, samples: Path) -> Path:
    output = tmp_path_factory.mktemp("out")
    code = cli.main(["run", "--input", str(samples), "--output", str(output), "--run-id", "md1",
                     "--model", str(qwen25_dir), "--write-markdown", *FLAGS])
    assert code == 0
    return output


def test_pages_hold_markdown_and_front_matter_columns(run: Path) -> None:
    pages = one_row_per(raw_rows(run, "pages", "md1"), "doc_sha256", "page_index")
    done = [p for p in pages.values() if p["status"] in ("ok", "duplicate")]
    assert len(done) >= 4, [p["status"] for p in pages.values()]
    fmt = MARKDOWN_FORMATS["olmocr"]
    for p in done:
        assert p["schema_id"] == "olmocr" and p["schema_hash"] == fmt.schema.schema_hash
        assert p["markdown"] is not None
        front = json.loads(p["extraction"])
        assert front == {k: p[k] for k in front}  # the front matter, also in its own columns
        assert p["rotation_correction"] in (0, 90, 180, 270)
        assert p["primary_language"] is None or len(p["primary_language"]) == 2
        assert isinstance(p["is_table"], bool) and isinstance(p["is_diagram"], bool)
    ledger = one_row_per(raw_rows(run, "ledger", "md1"), "doc_sha256", "page_index")
    for key, p in pages.items():
        if p["status"] == "ok":  # cut off at the cap <=> flagged
            assert ("truncated_output" in p["flags"]) == (ledger[key]["output_tokens"] == MAX_TOKENS)


def test_markdown_files_one_per_document(run: Path) -> None:
    folder = run / "markdown" / "tenant=default"
    files = sorted(folder.iterdir())
    assert all(f.suffix == ".md" for f in files)  # written under a temporary name, then moved: none left
    _, docs = sql.query(str(run), "SELECT DISTINCT doc_sha256 FROM pages WHERE run_id = 'md1' "
                                  "AND markdown IS NOT NULL")
    assert sorted(f.name for f in files) == sorted(f"{d}.md" for (d,) in docs)
    _, rows = sql.query(str(run), "SELECT doc_sha256, page_index, markdown FROM pages WHERE run_id = 'md1' "
                                  "AND markdown IS NOT NULL")
    for sha, index, text in rows:
        content = (folder / f"{sha}.md").read_text()
        assert f"<!-- page {index + 1} -->\n{text}" in content
    before = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in files}
    assert write_markdown(str(run), "default", "md1") == len(files)  # idempotent: nothing rewritten
    assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in folder.iterdir()} == before


def test_second_run_reuses_markdown_from_the_cache(run: Path, qwen25_dir: Path, samples: Path) -> None:
    code = cli.main(["run", "--input", str(samples), "--output", str(run), "--run-id", "md2",
                     "--model", str(qwen25_dir), *FLAGS])
    assert code == 0
    first = one_row_per(raw_rows(run, "pages", "md1"), "doc_sha256", "page_index")
    second = one_row_per(raw_rows(run, "pages", "md2"), "doc_sha256", "page_index")
    reused = [k for k, p in second.items() if p["status"] == "cached"]
    assert reused and all(second[k]["markdown"] == first[k]["markdown"] for k in reused)
    assert all(second[k]["is_table"] == first[k]["is_table"] for k in reused)


def test_estimate_image_tokens_equal_the_engines(run: Path, qwen25_dir: Path, samples: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _, rows = sql.query(str(run), "SELECT source_uri, page_index, image_tokens, text_tokens FROM ledger "
                                  "WHERE run_id = 'md1' AND route = 'model'")
    engine = {(u, i): (img, txt) for u, i, img, txt in rows}
    assert len(engine) >= 4
    capsys.readouterr()
    assert cli.main(["estimate", "--format", "json", "--per-page", "--input", str(samples),
                     "--model", str(qwen25_dir), *FLAGS[:4]]) == 0
    r = json.loads(capsys.readouterr().out)
    est = {(p["source_uri"], p["page_index"]): (p["image_tokens"], p["text_tokens"])
           for p in r["per_page"] if p["status"] == "model"}
    assert {k: est[k] for k in engine} == engine
