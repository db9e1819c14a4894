"""The safety gate and the hints under the time limit: a document's pages are rendered, gated and hinted in
the render worker process, so a check or an OCR call that hangs is stopped at the deadline like a slow
render; a quarantined page never reaches OCR; the classifier and checks are built once per process."""
from __future__ import annotations

import hashlib
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from schemas.records import DocumentRecord, PageImage, PageRow
from tests.support import docmaker
from transforms.document_work.timed import RenderLimits, RenderWorker
from transforms.document_work.work import DocumentWork, PageStages, ahead
from transforms.hints.choose import HintSettings
from transforms.hints.ocr import OcrResult, OcrSettings
from transforms.pages.render import RenderSettings, render_document
from transforms.safety.blocklist import Blocklists
from transforms.safety.gate import SafetyConfig, Verdict

SETTINGS = RenderSettings(dpi=72, max_side=640, jpeg_quality=80, max_text_chars=2000, max_page_points=14400,
                          max_image_pixels=89_478_485, max_bytes=50 * 2**20)
LOG = "PAGEMILL_CHECK_TEST_LOG"  # reaches the render process: CHILD_ENV_PREFIXES


def _doc(data: bytes, pages: int, name: str = "d.pdf") -> DocumentRecord:
    return DocumentRecord(uri=f"/in/{name}", size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                          format="pdf", page_count=pages)


class FirstThenHang:
    """Fault injection (an OCR that runs in the render process): the first call answers, later ones hang."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, image: bytes, s: OcrSettings) -> OcrResult:
        self.calls += 1
        if self.calls > 1:
            time.sleep(3600)
        return OcrResult("ok", text="Invoice 17", mean_conf=90.0)


class HangingCheck:
    """Fault injection (a --safety-check, e.g. a vendor service that stops answering): page 1 hangs."""

    name = "hanging_probe"

    def __init__(self, only: str = "") -> None:
        self.only = only

    def check(self, page: PageImage, image: Image.Image) -> Verdict | None:
        if page.page_index == 1 and page.source_uri.endswith(self.only):
            time.sleep(3600)
        return None


def hanging_check() -> HangingCheck:
    return HangingCheck()


class CountingCheck:
    """Appends its process id to the file named by $PAGEMILL_CHECK_TEST_LOG each time it is built."""

    name = "counting_probe"

    def __init__(self) -> None:
        with open(os.environ[LOG], "a") as log:
            log.write(f"{os.getpid()}\n")

    def check(self, page: PageImage, image: Image.Image) -> Verdict | None:
        return None


def hangs_in_hangs_pdf() -> HangingCheck:
    """The pipeline drill's check (tests/pipelines/test_timeouts.py): hangs on page 1 of hangs.pdf only."""
    return HangingCheck(only="hangs.pdf")


def counting_check() -> CountingCheck:
    return CountingCheck()


def broken_check() -> CountingCheck:
    raise RuntimeError("vendor key missing")


def run_in_worker(work: DocumentWork, limits: RenderLimits, *docs: tuple[DocumentRecord, bytes]) -> list[list]:
    worker = RenderWorker(limits, work)
    try:
        return [list(worker.pages(doc, data, SETTINGS)) for doc, data in docs]
    finally:
        worker.stop()


def test_hung_ocr_is_stopped_at_the_document_deadline() -> None:
    data = docmaker.multipage_pdf(4)
    work = DocumentWork(PageStages(SafetyConfig(), HintSettings(mode="ocr"), FirstThenHang()), Blocklists())
    start = time.monotonic()
    hung, after = run_in_worker(work, RenderLimits(document_timeout_s=4), (_doc(data, 4), data),
                                (_doc(data, 4, "next.pdf"), data))
    elapsed = time.monotonic() - start
    assert isinstance(hung[0], PageImage) and (hung[0].hint_source, hung[0].hint) == ("ocr", "Invoice 17")
    assert [(r.page_index, r.status, r.reason_code) for r in hung[1:]] == [(i, "failed", "timeout") for i in (1, 2, 3)]
    assert "safety checks and hints" in hung[1].message and "--document-timeout-s 4" in hung[1].message
    # The next document gets a fresh process (a fresh OCR, whose first call answers again): the run goes on.
    assert isinstance(after[0], PageImage) and after[0].hint_source == "ocr"
    assert elapsed < 600, elapsed  # stopped: each hung call would have slept an hour


def test_hung_safety_check_is_stopped_at_the_page_deadline() -> None:
    data = docmaker.multipage_pdf(3)
    cfg = SafetyConfig(checks=(f"{__name__}:hanging_check",))
    work = DocumentWork(PageStages(cfg, HintSettings(mode="text_layer")), Blocklists())
    [rows] = run_in_worker(work, RenderLimits(document_timeout_s=0, page_timeout_s=3), (_doc(data, 3), data))
    assert isinstance(rows[0], PageImage) and rows[0].hint_source == "text_layer"
    assert [(r.page_index, r.reason_code) for r in rows[1:]] == [(1, "timeout"), (2, "timeout")]
    assert "--page-timeout-s 3" in rows[1].message


def test_checks_are_built_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "built.log"
    monkeypatch.setenv(LOG, str(log))
    data = docmaker.multipage_pdf(2)
    cfg = SafetyConfig(checks=(f"{__name__}:counting_check",))
    work = DocumentWork(PageStages(cfg, HintSettings(mode="none")), Blocklists())
    worker = RenderWorker(RenderLimits(document_timeout_s=60), work)
    try:
        for name in ("a.pdf", "b.pdf", "c.pdf"):
            assert all(isinstance(p, PageImage) for p in worker.pages(_doc(data, 2, name), data, SETTINGS))
        child = worker.proc.pid
    finally:
        worker.stop()
    assert log.read_text().split() == [str(child)]  # built once, in the render process, for three documents


def test_a_check_that_cannot_be_built_stops_the_run_with_its_message() -> None:
    data = docmaker.multipage_pdf(1)
    work = DocumentWork(PageStages(SafetyConfig(checks=(f"{__name__}:broken_check",)), HintSettings()), Blocklists())
    with pytest.raises(RuntimeError, match="vendor key missing"):
        run_in_worker(work, RenderLimits(document_timeout_s=60), (_doc(data, 1), data))


def test_quarantined_page_never_reaches_ocr(tmp_path: Path) -> None:
    data = docmaker.multipage_pdf(2)
    doc = _doc(data, 2)
    listed = [p for p in render_document(doc, data, SETTINGS)][1]
    lists = Blocklists(sha256={listed.page_hash: ("list.txt", 1)})
    seen: list[int] = []

    def ocr(image: bytes, s: OcrSettings) -> OcrResult:  # in process here: a closure may record
        seen.append(len(image))
        return OcrResult("ok", text="read", mean_conf=90.0)

    rows = list(DocumentWork(PageStages(SafetyConfig(), HintSettings(mode="ocr"), ocr), lists)(doc, data, SETTINGS))
    assert isinstance(rows[0], PageImage) and rows[0].hint_source == "ocr"
    assert isinstance(rows[1], PageRow) and (rows[1].status, rows[1].reason_code) == ("quarantined", "blocked_hash")
    assert len(seen) == 1


def test_work_crosses_to_the_process_without_its_built_checks() -> None:
    work = DocumentWork(PageStages(SafetyConfig(), HintSettings(mode="none")), Blocklists())
    work.prepare()
    copy = pickle.loads(pickle.dumps(work))
    assert work._checks is not None and copy._checks is None and copy.stages == work.stages


def test_pages_rendered_ahead_keep_their_order_and_errors() -> None:
    assert list(ahead(iter(range(50)), 2)) == list(range(50))

    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("pdfium said no")

    got = ahead(broken(), 2)
    assert next(got) == 1
    with pytest.raises(ValueError, match="pdfium said no"):
        next(got)
