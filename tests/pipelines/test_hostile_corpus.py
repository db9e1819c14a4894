"""The hostile corpus (`../shared/corpus/hostile` beside the repository, or `$PAGEMILL_CORPUS/hostile`: fuzzed,
broken, encrypted and bomb PDFs and images) through a render-only run. Every file must come out as exactly one
`documents` row with an outcome from the vocabulary, and the run must neither crash nor hang.

What is counted: every file on disk under the folder, because that is what `pagemill run --input FOLDER`
lists, LICENSE and README files included (they are objects in the bucket too, and must be rejected, not
skipped). manifest.csv is used as a cross-check: each of its hostile rows is one of those files, its `input`
rows are the documents under test, and its other rows (licence, docs, ground truth) must be rejected as
`unsupported_format`.

The pipeline runs in a subprocess with a wall-clock limit, because a hang inside pdfium or a Pillow decoder is
C code that a signal-based pytest timeout cannot interrupt.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipelines.tables import sql
from schemas.reasons import REASON_CODES
from schemas.statuses import OUTCOMES, PAGE_STATUSES
from tests.conftest import CORPUS
from tests.support.raw import one_row_per, raw_rows

HOSTILE = CORPUS / "hostile"
REPO = Path(__file__).resolve().parents[2]
LIMIT_S = 600  # measured: about 15-25 s on 2 cores for 354 files; the limit only catches hangs
SUPPORTED_IMAGES = {"PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP"}

pytestmark = pytest.mark.skipif(not HOSTILE.is_dir(),
                                reason=f"{HOSTILE} is absent (set PAGEMILL_CORPUS, or lay shared/ beside the clone)")


def _files_on_disk() -> set[str]:
    return {str(p) for p in HOSTILE.rglob("*") if p.is_file()}


def _manifest_rows() -> dict[str, dict[str, str]]:
    path = CORPUS / "manifest.csv"
    if not path.is_file():
        return {}
    with path.open(newline="") as handle:
        return {str(CORPUS / r["local_path"]): r for r in csv.DictReader(handle) if r["category"] == "hostile"}


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    output = tmp_path_factory.mktemp("hostile") / "out"
    argv = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(HOSTILE), "--output", str(output),
            "--extract", "false", "--run-id", "hostile", "--progress-every-s", "10"]
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S, check=False)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-3000:] if isinstance(err.stderr, bytes) else (err.stderr or "")[-3000:]
        pytest.fail(f"the run over {HOSTILE} did not finish in {LIMIT_S} s (a hang?); stderr tail:\n{tail}")
    wall = time.perf_counter() - started
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    manifest = json.loads((output / "runs" / "tenant=default" / "hostile.json").read_text())
    timings = manifest.get("stage_timings", {})
    print(f"\nhostile corpus: {manifest['documents']} documents, {manifest['totals']['pages']} pages in {wall:.1f} s; "
          f"slowest page render {timings.get('render_ms', {}).get('max')} ms; outcomes {manifest['outcomes']}")
    return {"output": output, "manifest": manifest, "wall": wall}


def _documents(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """From the raw Parquet rows, not the deduplicating view: a second row for one file fails here."""
    return one_row_per(raw_rows(run["output"], "documents"), "source_uri")


def test_every_file_has_exactly_one_documents_row(hostile_run: dict[str, Any]) -> None:
    docs = _documents(hostile_run)
    on_disk = _files_on_disk()
    missing, extra = sorted(on_disk - set(docs)), sorted(set(docs) - on_disk)
    assert not missing and not extra, {"missing": missing[:20], "extra": extra[:20]}
    assert hostile_run["manifest"]["documents"] == len(on_disk)


def test_manifest_csv_agrees_with_the_folder(hostile_run: dict[str, Any]) -> None:
    listed = _manifest_rows()
    if not listed:
        pytest.skip("no manifest.csv beside the corpus")
    docs = _documents(hostile_run)
    assert set(listed) == _files_on_disk()
    inputs = [uri for uri, r in listed.items() if r["role"] == "input"]
    assert inputs and all(uri in docs for uri in inputs)
    others = {uri: (docs[uri]["outcome"], docs[uri]["reason_code"])
              for uri, r in listed.items() if r["role"] != "input"}
    assert set(others.values()) <= {("rejected", "unsupported_format")}, others


def test_outcomes_and_reasons_are_in_the_vocabulary(hostile_run: dict[str, Any]) -> None:
    docs = _documents(hostile_run)
    bad = {}
    for uri, d in docs.items():
        ok = d["outcome"] in OUTCOMES and d["outcome"] != "extracted"  # render-only: nothing is extracted
        if d["outcome"] in ("rejected", "failed", "partial"):
            ok = ok and d["reason_code"] in REASON_CODES and bool(d["message"])
        elif d["outcome"] == "duplicate":
            ok = ok and d["duplicate_of"] in docs and docs[d["duplicate_of"]]["doc_sha256"] == d["doc_sha256"]
        else:
            ok = ok and d["reason_code"] is None
        if not ok:
            bad[uri] = (d["outcome"], d["reason_code"], d["message"])
    assert not bad, bad
    counts = Counter(d["outcome"] for d in docs.values())
    assert counts["rendered"] > 0 and counts["rejected"] > 0  # the corpus has both; none is a sign of breakage


def test_pages_add_up(hostile_run: dict[str, Any]) -> None:
    docs = _documents(hostile_run)
    output = str(hostile_run["output"])
    _, found = sql.query(output, "SELECT doc_sha256, status, reason_code, count(*) FROM pages GROUP BY ALL")
    per_doc: Counter[str] = Counter()
    for sha, status, reason, n in found:
        assert status in PAGE_STATUSES
        assert status == "rendered" or reason in REASON_CODES, (sha, status, reason)
        per_doc[sha] += n
    reached = [d for d in docs.values() if d["outcome"] in ("rendered", "partial", "failed")]
    assert {d["doc_sha256"]: d["page_count"] for d in reached} == dict(per_doc)
    one_row_per(raw_rows(output, "pages"), "doc_sha256", "page_index")
    ledger = len(one_row_per(raw_rows(output, "ledger"), "doc_sha256", "page_index"))
    manifest = hostile_run["manifest"]
    assert manifest["errors"] == []
    assert ledger == sum(per_doc.values()) == manifest["totals"]["pages"]
    assert manifest["outcomes"] == dict(Counter(d["outcome"] for d in docs.values()))


def test_images_pillow_can_decode_are_rendered(hostile_run: dict[str, Any]) -> None:
    """manifest.csv's probe says which images Pillow decoded in a sandbox; those in a format pagemill
    supports must render, not be rejected."""
    listed = _manifest_rows()
    if not listed:
        pytest.skip("no manifest.csv beside the corpus")
    docs = _documents(hostile_run)
    wrong = {}
    for uri, r in listed.items():
        probe = json.loads(r["probe"]) if r.get("probe") else {}
        if probe.get("kind") == "image" and probe.get("decoded") and probe.get("format") in SUPPORTED_IMAGES:
            if docs[uri]["outcome"] not in ("rendered", "duplicate"):
                wrong[uri] = (docs[uri]["outcome"], docs[uri]["reason_code"], docs[uri]["message"])
    assert not wrong, wrong


def test_known_hostile_files(hostile_run: dict[str, Any]) -> None:
    """A few files whose fate is certain from what they are. Each must be in the corpus: a named file that is
    absent fails (the corpus changed under the test, which then checks nothing), it is not skipped."""
    docs = _documents(hostile_run)
    pillow = HOSTILE / "python-pillow__Pillow" / "Tests" / "images"
    expectations = {
        pillow / "decompression_bomb.gif": ("rejected", "decompression_bomb"),
        pillow / "truncated_image.png": ("rejected", "unreadable"),
        pillow / "hopper.png": ("rendered", None),
        pillow / "pil_sample_cmyk.jpg": ("rendered", None),
    }
    absent = [str(path) for path in expectations if str(path) not in docs]
    assert not absent, f"named files not in the run (is the corpus complete?): {absent}"
    got = {path: (docs[str(path)]["outcome"], docs[str(path)]["reason_code"]) for path in expectations}
    assert got == expectations
    encrypted = [d for d in docs.values() if d["reason_code"] == "encrypted"]
    assert encrypted, "the corpus holds password-protected PDFs; none was rejected as encrypted"
