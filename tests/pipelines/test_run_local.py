"""End to end, in process: `pagemill run --extract false` over a folder of docmaker files, then the tables,
the manifest and `pagemill sql` are checked against each other and against what each file should become."""
from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.run.run import summary
from pipelines.tables import sql
from schemas.reasons import REASON_CODES
from schemas.statuses import OUTCOMES, PAGE_STATUSES
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows

MAX_BYTES = 1_000_000
MAX_SIDE = 640  # smaller than the default: quicker, and checks that the flag reaches the page stage
RUNNERS = {
    "in_memory": ["--direct_running_mode=in_memory"],
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
}


@dataclass(frozen=True)
class Expected:
    outcome: str
    reason: str | None = None
    pages: int | None = None  # page_count in the documents row
    fmt: str | None = None


def _huge_middle_page_pdf() -> bytes:
    """Three A4 pages, the middle one 20,000 pt wide (over --max-page-points), xref rebuilt exactly."""
    pdf = docmaker.multipage_pdf(3, title="Wide middle")
    box = list(re.finditer(rb"/MediaBox \[0 0 \d+ \d+\]", pdf))[1]
    body = pdf[: box.start()] + b"/MediaBox [0 0 20000 842]" + pdf[box.end():]
    head = body[: body.index(b"xref\n")]
    offsets = [m.start() for m in re.finditer(rb"(?m)^\d+ 0 obj\n", head)]
    xref = b"xref\n0 %d\n0000000000 65535 f \n" % (len(offsets) + 1)
    xref += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    return head + xref + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(offsets) + 1,
                                                                                           len(head))


# Relative path under the input folder -> (maker, expectation). Duplicates are added separately.
FILES: dict[str, tuple[Callable[[], bytes], Expected]] = {
    "zero.pdf": (lambda: b"", Expected("rejected", "empty")),
    "truncated.pdf": (docmaker.truncated_pdf, Expected("rejected", "unreadable", fmt="pdf")),
    "random.pdf": (lambda: docmaker.random_bytes(4096, seed=1), Expected("rejected", "unsupported_format")),
    "notes.png": (lambda: b"just some text, not a PNG\n" * 30, Expected("rejected", "unsupported_format")),
    "locked.pdf": (docmaker.encrypted_pdf, Expected("rejected", "encrypted", fmt="pdf")),
    "million.pdf": (lambda: docmaker.billion_pages_pdf(1_000_000),
                    Expected("rejected", "too_many_pages", 1_000_000, "pdf")),
    "bomb.png": (docmaker.huge_png_header, Expected("rejected", "decompression_bomb", fmt="png")),
    "big.pdf": (lambda: docmaker.random_bytes(MAX_BYTES + 1, seed=2), Expected("rejected", "too_large")),
    "billion.pdf": (docmaker.billion_pages_pdf, Expected("rendered", None, 1, "pdf")),
    "tiny.png": (docmaker.tiny_png, Expected("rendered", None, 1, "png")),
    "cmyk.jpg": (docmaker.jpeg_cmyk, Expected("rendered", None, 1, "jpeg")),
    "anim.gif": (docmaker.animated_gif, Expected("rendered", None, 1, "gif")),
    "scan.tiff": (lambda: docmaker.multipage_tiff(3), Expected("rendered", None, 3, "tiff")),
    "pic.webp": (docmaker.webp, Expected("rendered", None, 1, "webp")),
    "pic.bmp": (docmaker.bmp, Expected("rendered", None, 1, "bmp")),
    "rotated.jpg": (docmaker.exif_rotated_jpeg, Expected("rendered", None, 1, "jpeg")),
    "wide.pdf": (_huge_middle_page_pdf, Expected("partial", "page_too_large", 3, "pdf")),
    "sub/report.pdf": (lambda: docmaker.multipage_pdf(3, terms_page=True), Expected("rendered", None, 4, "pdf")),
    "sub/deeper/receipt.png": (docmaker.scanned_png, Expected("rendered", None, 1, "png")),
}
# The same invoice three times: the smallest URI is kept, the others are `duplicate` rows pointing at it.
DUPLICATES = ("invoice.pdf", "sub/deeper/invoice-copy.pdf", "a-copy-of-invoice.pdf")


@dataclass
class Corpus:
    root: Path
    inputs: list[str]  # --input values
    expected: dict[str, Expected]  # source_uri -> expectation (duplicates excluded)
    duplicates: list[str]  # source URIs of the identical invoices


def make_corpus(root: Path) -> Corpus:
    folder = root / "in"
    expected: dict[str, Expected] = {}
    for rel, (make, exp) in FILES.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(make())
        expected[str(path)] = exp
    invoice = docmaker.invoice_pdf(seed=3)
    duplicates = []
    for rel in DUPLICATES:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(invoice)
        duplicates.append(str(path))
    # Outside the folder, reached only through the @FILE list.
    extra = root / "extra"
    extra.mkdir()
    listed = extra / "listed.pdf"
    listed.write_bytes(docmaker.text_pdf([["Listed by name", "Reached through an @FILE list."]]))
    expected[str(listed)] = Expected("rendered", None, 1, "pdf")
    missing = extra / "missing.pdf"
    expected[str(missing)] = Expected("rejected", "not_found")
    listing = root / "inputs.txt"
    listing.write_text(f"# extra inputs\n\n{listed}\n  {missing}  \n# listed twice: counted once\n"
                       f"{folder / 'tiny.png'}\n")
    return Corpus(root=root, inputs=[str(folder), f"@{listing}"], expected=expected, duplicates=duplicates)


def run_pipeline(corpus: Corpus, output: Path, run_id: str, runner: list[str]) -> int:
    argv = ["run", "--output", str(output), "--extract", "false", "--run-id", run_id,
            "--max-bytes", str(MAX_BYTES), "--max-side", str(MAX_SIDE), "--progress-every-s", "0", *runner]
    for value in corpus.inputs:
        argv += ["--input", value]
    return cli.main(argv)


def rows(output: Path, query: str) -> list[dict[str, Any]]:
    columns, found = sql.query(str(output), query)
    return [dict(zip(columns, r, strict=True)) for r in found]


@dataclass
class Run:
    corpus: Corpus
    output: Path
    run_id: str
    runner: str


@pytest.fixture(scope="module", params=list(RUNNERS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp(f"local-{request.param}")
    corpus = make_corpus(root)
    output = root / "out"
    assert run_pipeline(corpus, output, "r1", RUNNERS[request.param]) == 0
    return Run(corpus, output, "r1", request.param)


def _documents(r: Run) -> dict[str, dict[str, Any]]:
    """The run's documents by source URI, from the raw Parquet rows: a second row for one URI fails here."""
    return one_row_per(raw_rows(r.output, "documents", r.run_id), "source_uri")


def test_one_documents_row_per_object(run: Run) -> None:
    docs = _documents(run)
    listed = set(run.corpus.expected) | set(run.corpus.duplicates)
    assert set(docs) == listed
    assert len(raw_rows(run.output, "documents")) == len(listed) == len(FILES) + len(DUPLICATES) + 2


def test_each_outcome_and_reason(run: Run) -> None:
    docs = _documents(run)
    wrong = {}
    for uri, exp in run.corpus.expected.items():
        d = docs[uri]
        got = (d["outcome"], d["reason_code"])
        if got != (exp.outcome, exp.reason):
            wrong[uri] = (got, d["message"])
            continue
        if exp.pages is not None:
            assert d["page_count"] == exp.pages, uri
        if exp.fmt is not None:
            assert d["format"] == exp.fmt, uri
        assert d["outcome"] in OUTCOMES
        assert d["reason_code"] is None or d["reason_code"] in REASON_CODES
        if d["outcome"] == "rejected":
            assert d["message"], uri
        assert (d["run_id"], d["tenant"]) == (run.run_id, "default")
        assert d["created_at"] is not None
    assert not wrong, wrong
    path = Path(next(u for u in docs if u.endswith("/big.pdf")))
    assert docs[str(path)]["bytes"] == path.stat().st_size  # too_large: sized from the listing
    assert docs[str(path)]["doc_sha256"] is None  # and never read


def test_duplicates_point_at_the_smallest_uri(run: Run) -> None:
    docs = _documents(run)
    kept = min(run.corpus.duplicates)
    assert docs[kept]["outcome"] == "rendered"
    assert docs[kept]["duplicate_of"] is None
    for uri in run.corpus.duplicates:
        if uri == kept:
            continue
        d = docs[uri]
        assert (d["outcome"], d["duplicate_of"]) == ("duplicate", kept)
        assert d["doc_sha256"] == docs[kept]["doc_sha256"]
    pages = rows(run.output, f"SELECT DISTINCT source_uri FROM pages WHERE doc_sha256 = '{docs[kept]['doc_sha256']}'")
    assert [p["source_uri"] for p in pages] == [kept]  # only the kept copy is rendered


def test_pages_add_up(run: Run) -> None:
    docs = _documents(run)
    rendered_docs = [d for d in docs.values() if d["outcome"] in ("rendered", "partial")]
    pages = rows(run.output, f"SELECT * FROM pages WHERE run_id = '{run.run_id}'")
    assert len(pages) == sum(d["page_count"] for d in rendered_docs)
    per_doc = Counter(p["doc_sha256"] for p in pages)
    for d in rendered_docs:
        assert per_doc[d["doc_sha256"]] == d["page_count"], d["source_uri"]
        indexes = sorted(p["page_index"] for p in pages if p["doc_sha256"] == d["doc_sha256"])
        assert indexes == list(range(d["page_count"]))
    for p in pages:
        assert p["status"] in PAGE_STATUSES
        if p["status"] == "rendered":
            assert p["page_hash"] and max(p["width"], p["height"]) <= MAX_SIDE
            assert p["reason_code"] is None
        else:
            assert p["status"] == "failed" and p["reason_code"] in REASON_CODES
    wide = next(d for u, d in docs.items() if u.endswith("/wide.pdf"))
    wide_pages = {p["page_index"]: p for p in pages if p["doc_sha256"] == wide["doc_sha256"]}
    assert [wide_pages[i]["status"] for i in range(3)] == ["rendered", "failed", "rendered"]
    assert wide_pages[1]["reason_code"] == "page_too_large"
    # Nothing that failed intake, and no duplicate copy, reached the page stage.
    reached = {p["source_uri"] for p in pages}
    assert reached == {d["source_uri"] for d in rendered_docs}


def test_ledger_matches_pages(run: Run) -> None:
    pages = rows(run.output, "SELECT doc_sha256, page_index FROM pages ORDER BY 1, 2")
    ledger = rows(run.output, "SELECT doc_sha256, page_index, route, cost_usd FROM ledger ORDER BY 1, 2")
    assert [(p["doc_sha256"], p["page_index"]) for p in pages] == [(x["doc_sha256"], x["page_index"]) for x in ledger]
    assert {x["route"] for x in ledger} <= {"none", "failed"}
    assert sum(x["cost_usd"] for x in ledger) == 0


def test_manifest_matches_tables(run: Run) -> None:
    manifest = json.loads((run.output / "runs" / "tenant=default" / f"{run.run_id}.json").read_text())
    assert manifest["run_id"] == run.run_id
    docs = _documents(run)
    assert manifest["documents"] == len(docs)
    assert manifest["outcomes"] == dict(Counter(d["outcome"] for d in docs.values()))
    reasons = Counter(d["reason_code"] for d in docs.values() if d["outcome"] == "rejected")
    assert manifest["reject_reasons"] == dict(reasons)
    pages = one_row_per(raw_rows(run.output, "pages", run.run_id), "doc_sha256", "page_index")
    assert manifest["pages"] == dict(Counter(p["status"] for p in pages.values()))
    ledger_rows = len(one_row_per(raw_rows(run.output, "ledger", run.run_id), "doc_sha256", "page_index"))
    assert manifest["totals"]["pages"] == ledger_rows == sum(manifest["pages"].values())
    assert manifest["duplicate_keys"] == {"documents": 0, "pages": 0, "ledger": 0, "evidence": 0}
    assert manifest["errors"] == [] and manifest["tenant"] == "default"
    assert manifest["totals"]["model_calls"] == 0
    assert manifest["options"]["extract"] is False
    assert manifest["options"]["max_bytes"] == MAX_BYTES
    assert manifest["versions"]["pypdfium2"]
    timings = manifest["stage_timings"]
    if not timings.get("unavailable"):
        assert timings["documents_done"] == len(docs)
        assert timings["pages_done"] == ledger_rows


def test_sql_command_formats(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT outcome, count(*) AS n FROM documents GROUP BY 1 ORDER BY 1"
    expected = sorted(Counter(d["outcome"] for d in _documents(run).values()).items())
    capsys.readouterr()
    assert cli.main(["sql", "--output", str(run.output), "--format", "csv", query]) == 0
    parsed = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert parsed[0] == ["outcome", "n"]
    assert [(o, int(n)) for o, n in parsed[1:]] == expected
    assert cli.main(["sql", "--output", str(run.output), "--format", "json", query]) == 0
    assert [(r["outcome"], r["n"]) for r in json.loads(capsys.readouterr().out)] == expected
    assert cli.main(["sql", "--output", str(run.output), query]) == 0
    table = capsys.readouterr().out
    assert f"({len(expected)} rows)" in table and "rendered" in table
    assert cli.main(["sql", "--output", str(run.output), "SELECT nope FROM documents"]) == 1
    assert "nope" in capsys.readouterr().err


def test_rerun_same_run_id_replaces_rows(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path)
    output = tmp_path / "out"
    runner = RUNNERS["in_memory"]
    assert run_pipeline(corpus, output, "again", runner) == 0
    first = rows(output, "SELECT source_uri, outcome, reason_code, doc_sha256 FROM documents ORDER BY 1")
    pages = rows(output, "SELECT doc_sha256, page_index, page_hash FROM pages ORDER BY 1, 2")
    assert run_pipeline(corpus, output, "again", runner) == 0
    assert rows(output, "SELECT source_uri, outcome, reason_code, doc_sha256 FROM documents ORDER BY 1") == first
    assert rows(output, "SELECT doc_sha256, page_index, page_hash FROM pages ORDER BY 1, 2") == pages
    # Raw rows, not the views (which keep one row per key): the re-run replaced rows, it did not add any.
    assert len(raw_rows(output, "documents", "again")) == len(first)
    assert len(raw_rows(output, "pages", "again")) == len(raw_rows(output, "ledger", "again")) == len(pages)
    # Another run id adds a partition beside it.
    assert run_pipeline(corpus, output, "other", runner) == 0
    counts = dict(sql.query(str(output), "SELECT run_id, count(*) FROM documents GROUP BY 1")[1])
    assert counts == {"again": len(first), "other": len(first)}
    assert sorted(p.name for p in (output / "runs" / "tenant=default").glob("*.json")) == ["again.json", "other.json"]


def test_sql_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sql", "--output", str(tmp_path), "--format", "json", "SELECT count(*) AS n FROM pages"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 0}]


# --- job files -----------------------------------------------------------------------------------

def _small_folder(folder: Path, seed: int) -> list[str]:
    folder.mkdir(parents=True)
    files = {"a.pdf": docmaker.invoice_pdf(seed), "b.png": docmaker.tiny_png() if seed == 0 else docmaker.webp()}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return sorted(str(folder / n) for n in files)


def test_job_file_and_cli_override(tmp_path: Path) -> None:
    job_inputs = _small_folder(tmp_path / "job-in", 0)
    cli_inputs = _small_folder(tmp_path / "cli-in", 1)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    job = jobs / "nightly.yaml"
    # Relative paths in a job file are relative to the job folder's parent.
    job.write_text("input:\n  - job-in\noutput: out\nextract: false\nrun_id: from-job\nprogress_every_s: 0\n"
                   "max_side: 500\nworkers: 1\n")
    output = tmp_path / "out"

    assert cli.main(["run", "--job", str(job)]) == 0
    docs = rows(output, "SELECT run_id, source_uri, outcome FROM documents ORDER BY 2")
    assert [(d["run_id"], d["source_uri"], d["outcome"]) for d in docs] == [
        ("from-job", u, "rendered") for u in job_inputs]
    (widest,) = sql.query(str(output), "SELECT max(greatest(width, height)) FROM pages")[1][0]
    assert widest == 500  # max_side from the job reached the page stage

    # A flag on the command line wins over the job's value; --input replaces the job's list.
    assert cli.main(["run", "--job", str(job), "--run-id", "from-cli", "--input", str(tmp_path / "cli-in"),
                     "--max-side", "300", "--direct_num_workers", "2"]) == 0
    manifests = sorted(p.name for p in (output / "runs" / "tenant=default").glob("*.json"))
    assert manifests == ["from-cli.json", "from-job.json"]
    docs = rows(output, "SELECT source_uri FROM documents WHERE run_id = 'from-cli' ORDER BY 1")
    assert [d["source_uri"] for d in docs] == cli_inputs
    (widest,) = sql.query(str(output), "SELECT max(greatest(width, height)) FROM pages WHERE run_id = 'from-cli'")[1][0]
    assert widest == 300
    manifest = json.loads((output / "runs" / "tenant=default" / "from-cli.json").read_text())
    assert manifest["options"]["extract"] is False
    # pagemill's options and the Beam flags given, not Beam's 200-odd defaults (Dataflow's among them).
    assert len(manifest["options"]) <= 90, sorted(manifest["options"])
    assert manifest["options"]["direct_num_workers"] == 2 and manifest["options"]["max_side"] == 300
    assert "dataflow_endpoint" not in manifest["options"] and "flink_master" not in manifest["options"]


def test_missing_input_and_output_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--extract", "false"]) == 2
    assert "--input and --output are required" in capsys.readouterr().err


def test_a_duplicate_raw_row_fails_the_checks_and_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Plant a second `documents` row for one file, with a contradictory outcome, in a second Parquet file
    of the run's partition: the views still show one row, but the raw-row check and the manifest catch it."""
    from pipelines.tables.manifest import run_counts
    from schemas import tables
    from schemas.layout import partition
    from transforms.store.write import write_rows

    inputs = _small_folder(tmp_path / "in", 0)
    output = tmp_path / "out"
    assert cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(output), "--extract", "false",
                     "--run-id", "dup", "--progress-every-s", "0", "--workers", "1"]) == 0
    clean = run_counts(str(output), "dup", tenant="default")
    assert clean["errors"] == [] and clean["documents"] == len(inputs)
    (original,) = [r for r in raw_rows(output, "documents", "dup") if r["source_uri"] == inputs[0]]
    assert original["outcome"] == "rendered"
    planted = {**original, "outcome": "rejected", "reason_code": "unreadable", "message": "planted"}
    write_rows(partition(str(output), "documents", "default", "dup"), tables.DOCUMENTS, [planted])

    # The deduplicating view hides it: that is why the invariants are not checked there.
    (count,) = sql.query(str(output), "SELECT count(*) FROM documents WHERE run_id = 'dup'")[1][0]
    assert count == len(inputs)
    with pytest.raises(AssertionError, match="more than one raw row"):
        one_row_per(raw_rows(output, "documents", "dup"), "source_uri")
    counts = run_counts(str(output), "dup", tenant="default")
    assert counts["documents"] == len(inputs) + 1  # raw rows are counted
    assert counts["duplicate_keys"] == {"documents": 1, "pages": 0, "ledger": 0, "evidence": 0}
    (error,) = counts["errors"]
    assert error.startswith("documents: 1 key(s)") and inputs[0] in error
    assert "ERRORS:   1" in summary(counts, 1.0, str(output), "runs/dup.json")

    # A resume whose compaction is broken (a fault injected here) leaves the duplicate: the run exits 1,
    # says why, and its manifest records the error.
    monkeypatch.setattr("transforms.store.compaction.compact_run", lambda *a, **k: {})
    capsys.readouterr()
    assert cli.main(["run", "--input", str(tmp_path / "in"), "--output", str(output), "--extract", "false",
                     "--run-id", "dup", "--progress-every-s", "0", "--workers", "1"]) == 1
    assert "error: documents: 1 key(s) with more than one row" in capsys.readouterr().err
    manifest = json.loads((output / "runs" / "tenant=default" / "dup.json").read_text())
    assert manifest["resumed"] and manifest["duplicate_keys"]["documents"] == 1 and len(manifest["errors"]) == 1
