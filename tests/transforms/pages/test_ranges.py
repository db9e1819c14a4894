"""Page ranges: a large PDF becomes several render units that cover every page once; each unit renders
only its pages, under its share of the document's time limit; the run still writes one `documents` row
a document, and the same `pages` rows as rendering it whole."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines import cli
from schemas.records import DocumentRecord, PageImage, PageRow
from tests.support import docmaker
from tests.support.raw import raw_rows
from tests.support.render_hangs import SETTINGS, first_page_then_hang
from transforms.child_process import wait_s
from transforms.document_work import timed
from transforms.document_work.timed import RenderLimits, RenderWorker, range_limit_s
from transforms.pages.ranges import MAX_RANGES, page_ranges
from transforms.pages.render import render_document


def _doc(pages: int, fmt: str = "pdf", data: bytes = b"x") -> DocumentRecord:
    return DocumentRecord(uri=f"/in/d.{fmt}", size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                          format=fmt, page_count=pages)


@pytest.mark.parametrize("pages,size", [(1, 50), (99, 50), (100, 50), (101, 50), (457, 50), (5000, 50),
                                        (10, 3), (7, 1), (30, 0)])
def test_ranges_cover_every_page_once(pages: int, size: int) -> None:
    units = list(page_ranges(_doc(pages), size))
    covered = [i for u in units for i in u.page_indices]
    assert covered == list(range(pages))
    assert len(units) <= MAX_RANGES
    if size == 0 or pages < 2 * size:
        assert units == [_doc(pages)]  # small documents stay one unit, unchanged
    else:
        assert len(units) >= 2 and all(len(u.page_indices) >= size for u in units)
        assert {replace(u, first_page=0, end_page=0) for u in units} == {_doc(pages)}


def test_images_are_never_split() -> None:
    assert list(page_ranges(_doc(400, fmt="tiff"), 50)) == [_doc(400, fmt="tiff")]


def test_a_range_renders_its_pages_as_the_whole_document_does() -> None:
    data = docmaker.multipage_pdf(7)
    whole = _doc(7, data=data)
    every = {p.page_index: p.page_hash for p in render_document(whole, data, SETTINGS) if isinstance(p, PageImage)}
    part = list(render_document(replace(whole, first_page=2, end_page=5), data, SETTINGS))
    assert [(p.page_index, p.page_hash) for p in part if isinstance(p, PageImage)] == \
        [(i, every[i]) for i in (2, 3, 4)]
    assert len(part) == 3


def test_a_range_gets_its_share_of_the_time_limit_and_fails_only_its_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    data = docmaker.multipage_pdf(8)
    unit = replace(_doc(8, data=data), first_page=4, end_page=8)
    assert range_limit_s(unit, 4.0) == 2.0 and range_limit_s(_doc(8), 4.0) == 4.0
    assert range_limit_s(_doc(1), 4.0) == 4.0  # a one-page document is its own whole range
    deadlines: list[float] = []  # the document deadline of every wait for the child's next page

    def spy(now: float, doc_deadline: float, page_deadline: float) -> float | None:
        deadlines.append(doc_deadline)
        return wait_s(now, doc_deadline, page_deadline)

    monkeypatch.setattr(timed, "wait_s", spy)
    worker = RenderWorker(RenderLimits(document_timeout_s=4), first_page_then_hang)
    try:
        worker._boot()  # booted beforehand: the child's start is off the clock, so the deadline is exact
        started = timed.time.monotonic()
        rows = list(worker.pages(unit, data, SETTINGS, started))
    finally:
        worker.stop()
    # Its share (half of the document's 4 s: 4 of its 8 pages), not the whole document's limit.
    assert deadlines[0] == started + 2.0
    assert [r.page_index for r in rows] == [4, 5, 6, 7]
    assert isinstance(rows[0], PageImage)
    assert all(isinstance(r, PageRow) and r.reason_code == "timeout" for r in rows[1:])
    assert "pages 5-8 of 8 had 2 s" in rows[1].message


@pytest.mark.slow  # two pipeline runs a case
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_split_run_writes_what_a_whole_run_writes(tmp_path: Path, workers: str) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "long.pdf").write_bytes(docmaker.multipage_pdf(9))
    (inputs / "short.pdf").write_bytes(docmaker.multipage_pdf(2, title="Short"))
    results = {}
    for name, size in (("whole", "0"), ("split", "2")):
        output = tmp_path / name
        assert cli.main(["run", "--input", str(inputs), "--output", str(output), "--extract", "false",
                         "--run-id", name, "--progress-every-s", "0", "--max-side", "400", "--nsfw-classifier", "none",
                         "--render-range-pages", size, "--workers", workers]) == 0
        docs = sorted((d["source_uri"], d["outcome"], d["page_count"]) for d in raw_rows(output, "documents"))
        pages = sorted((p["source_uri"], p["page_index"], p["status"], p["page_hash"])
                       for p in raw_rows(output, "pages"))
        results[name] = docs, pages
        manifest = json.loads((output / "runs" / "tenant=default" / f"{name}.json").read_text())
        assert manifest["exit_code"] == 0
    docs, pages = results["split"]
    assert [d[1:] for d in docs] == [("rendered", 9), ("rendered", 2)]  # one row a document
    assert len(pages) == 11 and len({p[:2] for p in pages}) == 11
    assert results["split"] == results["whole"]
