"""The result cache obeys today's safety gate (issue 16, item 1), end to end with the real tiny model.

Run 1 extracts an invoice, a photo, a picture of fine lines and a harmless gradient. Run 2 blocklists the
invoice's page by its page hash, the photo's page by its PDQ hash, and the lines with a PDQ entry 28 bits from
their low-detail rendition and 32 from the page as rendered (issue 22: the gate stops that, so reuse must too),
all read back from run 1's `pages` table: the pages must come back `quarantined` (reason `blocked_hash`),
never `cached`, and no request reaches the engine. Run 3
lowers `--nsfw-threshold` under the gradient's score: the gradient must be re-screened and quarantined,
not reused. A probe on the engine records every request it is given.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest

from pipelines.config.options import PagemillOptions
from pipelines.run.graph import build_pipeline
from pipelines.run.settings import run_settings
from pipelines.tables import sql
from tests.conftest import vllm_available
from tests.support import docmaker
from tests.support.pictures import encode, gradient, photo
from tests.support.probe_engine import ProbeEngine
from tests.support.stripes import entry_between, stripes
from transforms.engines.simulated import simulated
from transforms.extract.stage import EngineFactory
from transforms.safety.classifiers import NudeNetClassifier
from transforms.store.files import tenant_files


def with_vllm(test: Callable[..., None]) -> Callable[..., None]:
    """The end-to-end tests: the real tiny model."""
    for mark in (pytest.mark.vllm, pytest.mark.slow,
                 pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")):
        test = mark(test)
    return test


def rows(output: Path, query: str) -> list[dict[str, Any]]:
    columns, values = sql.query(str(output), query)
    return [dict(zip(columns, v, strict=True)) for v in values]


def run_once(root: Path, model: Path, run_id: str, extra: list[str],
             engine: EngineFactory | None = None) -> list[dict[str, Any]]:
    """One pipeline run over root/in into root/out; the engine's requests of this run (the real engine,
    probed), or none recorded with another `engine`."""
    output, log = root / "out", root / f"engine-{run_id}.jsonl"
    log.touch()
    options = PagemillOptions([
        "--input", str(root / "in"), "--output", str(output), "--run-id", run_id, "--schema", "invoice",
        "--model", str(model), "--model-revision", "tiny", "--max-tokens", "256", "--max-attempts", "1",
        "--kv-cache-gib", "0.25", "--max-side", "800", "--progress-every-s", "0", "--hints", "text_layer",
        "--nsfw-classifier", "nudenet", *extra])
    o = options.view_as(PagemillOptions)
    earlier = tenant_files(str(output), "pages", o.tenant)  # as `pagemill run` lists the result cache
    with beam.Pipeline(options=options) as p:
        build_pipeline(p, run_settings(o),
                       {"run_id": run_id, "tenant": o.tenant, "created_at": dt.datetime.now(dt.UTC)},
                       earlier_files=earlier, engine_factory=engine or functools.partial(ProbeEngine, log=str(log)))
    return [json.loads(line) for line in log.read_text().splitlines()]


def docs(output: Path, run_id: str) -> dict[str, dict[str, Any]]:
    found = rows(output, f"SELECT * FROM documents WHERE run_id = '{run_id}'")
    return {Path(d["source_uri"]).name: d for d in found}


def pages(output: Path, run_id: str) -> dict[str, dict[str, Any]]:
    found = rows(output, "SELECT p.*, l.route, l.cost_usd FROM pages p JOIN ledger l "
                         f"USING (run_id, doc_sha256, source_uri, page_index) WHERE run_id = '{run_id}'")
    return {Path(r["source_uri"]).name: r for r in found}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("cache-safety")
    (root / "in").mkdir()
    (root / "in" / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (root / "in" / "photo.png").write_bytes(encode(photo(5)))
    (root / "in" / "gradient.png").write_bytes(encode(gradient()))
    (root / "in" / "lines.png").write_bytes(encode(stripes(20)))  # 800x600 under --max-side 800: a low rendition
    score, _ = NudeNetClassifier().score(gradient())
    assert 0.01 < score < 0.9, score  # the probe needs a real score between the two thresholds below
    out = root / "out"
    first = run_once(root, test_model_dir, "r1", ["--nsfw-threshold", "0.95"])
    earlier = pages(out, "r1")
    blocklist = root / "today.txt"
    lines = earlier["lines.png"]
    blocklist.write_text(f"# listed after run 1, from its pages table\nsha256:{earlier['invoice.pdf']['page_hash']}\n"
                         f"pdq:{earlier['photo.png']['pdq_hash']}\n"
                         f"pdq:{entry_between(lines['pdq_hash'], lines['pdq_hash_low'])}\n")
    second = run_once(root, test_model_dir, "r2", ["--nsfw-threshold", "0.95", "--blocklist", str(blocklist)])
    third = run_once(root, test_model_dir, "r3", ["--nsfw-threshold", f"{score / 2:.4f}"])
    return {"out": out, "requests": {"r1": first, "r2": second, "r3": third}, "score": score}


@with_vllm
def test_first_run_extracts_everything(runs: dict[str, Any]) -> None:
    d = docs(runs["out"], "r1")
    assert {k: v["outcome"] for k, v in d.items()} == {"invoice.pdf": "extracted", "photo.png": "extracted",
                                                      "gradient.png": "extracted", "lines.png": "extracted"}
    p = pages(runs["out"], "r1")
    assert p["photo.png"]["pdq_hash"] and p["invoice.pdf"]["page_hash"]
    assert p["lines.png"]["pdq_hash_low"] and p["photo.png"]["pdq_hash_low"] is None  # 640 px: no smaller rendition
    assert len(runs["requests"]["r1"]) == 4


@with_vllm
def test_blocklisted_pages_are_quarantined_never_cached(runs: dict[str, Any]) -> None:
    d, p = docs(runs["out"], "r2"), pages(runs["out"], "r2")
    for name, kind in (("invoice.pdf", "sha256"), ("photo.png", "pdq"), ("lines.png", "pdq")):
        assert (d[name]["outcome"], d[name]["reason_code"]) == ("quarantined", "blocked_hash"), d[name]
        page = p[name]
        assert (page["status"], page["reason_code"], page["route"]) == ("quarantined", "blocked_hash", "quarantined")
        assert page["extraction"] is None and page["cost_usd"] == 0
        detail = json.loads(page["quarantine_detail"])
        assert detail["kind"] == kind and detail["list"].endswith("today.txt")
    # Before issue 22's fix the lines came back `cached`: reuse checked the full page only (32 bits: over 31).
    assert (json.loads(p["lines.png"]["quarantine_detail"])["where"], p["lines.png"]["pdq_hash_low"]) == \
        ("page at low detail", pages(runs["out"], "r1")["lines.png"]["pdq_hash_low"])
    # The control: a page no list names is still reused from run 1.
    assert d["gradient.png"]["outcome"] == "cached" and p["gradient.png"]["status"] == "cached"
    # Nothing reached the model: blocked pages were stopped by their stored hashes, the rest was cached.
    assert runs["requests"]["r2"] == []


@with_vllm
def test_lower_nsfw_threshold_rescreens_cached_pages(runs: dict[str, Any]) -> None:
    d, p = docs(runs["out"], "r3"), pages(runs["out"], "r3")
    assert (d["gradient.png"]["outcome"], d["gradient.png"]["reason_code"]) == ("quarantined", "blocked_nsfw")
    detail = json.loads(p["gradient.png"]["quarantine_detail"])
    assert detail["check"] == "nudenet" and detail["score"] >= detail["threshold"]
    assert not [r for r in runs["requests"]["r3"] if r["size"] == [200, 200]]  # the gradient was never sent
    # A stricter gate is a new cache configuration: nothing of run 3 is a copy of run 1's answers.
    assert "cached" not in {v["outcome"] for v in d.values()}
    assert p["invoice.pdf"]["config_key"] != pages(runs["out"], "r1")["invoice.pdf"]["config_key"]


# Without the model: the graph hands today's blocklists to the document cache -------------------------

ANSWER = json.dumps({"vendor_name": "V", "invoice_number": "1", "issue_date": None, "due_date": None,
                     "currency": None, "subtotal": None, "tax": None, "total": 1.0, "line_items": []})


def test_the_graph_rechecks_reused_documents_against_todays_blocklists(tmp_path: Path) -> None:
    """The same check as above on a simulated engine that answers a valid invoice (no vLLM, seconds): run 2
    lists the invoice's page by its hash from run 1; the document cache must quarantine it, not reuse it."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (tmp_path / "in" / "report.pdf").write_bytes(docmaker.multipage_pdf(2))
    engine = functools.partial(simulated, slots=4, seconds=0.01, text=ANSWER)
    flags = ["--model-family", "qwen2_vl", "--max-side", "400", "--nsfw-classifier", "none"]
    run_once(tmp_path, Path("simulated"), "r1", flags, engine)
    out = tmp_path / "out"
    assert {k: (v["status"], v["route"]) for k, v in pages(out, "r1").items()} == {"invoice.pdf": ("ok", "model"),
                                                                                  "report.pdf": ("ok", "model")}
    blocklist = tmp_path / "today.txt"
    blocklist.write_text(f"sha256:{pages(out, 'r1')['invoice.pdf']['page_hash']}\n")
    run_once(tmp_path, Path("simulated"), "r2", [*flags, "--blocklist", str(blocklist)], engine)
    d = docs(out, "r2")
    assert {k: (v["outcome"], v["reason_code"]) for k, v in d.items()} == {
        "invoice.pdf": ("quarantined", "blocked_hash"), "report.pdf": ("cached", None)}
    found = rows(out, "SELECT source_uri, page_index, status, route FROM pages JOIN ledger "
                      "USING (run_id, doc_sha256, source_uri, page_index) WHERE run_id = 'r2' ORDER BY 1, 2")
    assert [(Path(r["source_uri"]).name, r["page_index"], r["status"], r["route"]) for r in found] == [
        ("invoice.pdf", 0, "quarantined", "quarantined"), ("report.pdf", 0, "cached", "cache"),
        ("report.pdf", 1, "cached", "cache")]

