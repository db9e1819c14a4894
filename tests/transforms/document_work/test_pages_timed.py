"""The render worker process: same pages as rendering in process; a deadline kills the work and accounts
for every page; a crash of the child fails its document only and the next document renders."""
from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from schemas.records import DocumentRecord, PageImage, PageRow
from tests.support import docmaker
from tests.support.render_hangs import SETTINGS, first_page_then_hang
from transforms.child_process import child_env, wait_s
from transforms.document_work import timed
from transforms.document_work.timed import RenderLimits, RenderWorker, missing_pages, reply_problem
from transforms.pages.render import RenderSettings, render_document


def _doc(data: bytes, pages: int, name: str = "d.pdf") -> DocumentRecord:
    return DocumentRecord(uri=f"/in/{name}", size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                          format="pdf", page_count=pages)


def crash_on_second_page(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    """Fault injection (runs in the child): a segfault inside the renderer, for documents named crash*."""
    for page in render_document(doc, data, s):
        if doc.uri.endswith("crash.pdf") and page.page_index == 1:
            os.kill(os.getpid(), signal.SIGSEGV)
        yield page


def first_page_only(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    """Fault injection (runs in the child): a renderer that ends after the first page, saying nothing of the rest."""
    yield next(iter(render_document(doc, data, s)))


def pages_of_another_document(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    """Fault injection (runs in the child): the first page answered as a page of another document."""
    for page in render_document(doc, data, s):
        yield replace(page, doc_sha256="0" * 64) if page.page_index == 0 else page


def test_wait_is_the_nearer_deadline() -> None:
    assert wait_s(10.0, 15.0, 12.0) == 2.0
    assert wait_s(10.0, 9.0, float("inf")) == 0.0
    assert wait_s(10.0, float("inf"), float("inf")) is None


def test_child_env_has_the_import_path_and_no_credentials() -> None:
    worker = {"PATH": "/usr/bin", "HOME": "/h", "PIPELINE_OPTIONS": '{"s3_secret_access_key": "s"}',
              "AWS_SECRET_ACCESS_KEY": "s", "HF_TOKEN": "t"}
    assert child_env(worker, ["", "/repo", "/venv/site"]) == {"PATH": "/usr/bin", "HOME": "/h",
                                                               "PYTHONPATH": os.pathsep.join(["/repo", "/venv/site"])}


def test_missing_pages_fills_the_gaps_only() -> None:
    doc = _doc(b"x", 4)
    rows = list(missing_pages(doc, {0, 2}, "timeout", "m"))
    assert [(r.page_index, r.status, r.reason_code) for r in rows] == [(1, "failed", "timeout"),
                                                                      (3, "failed", "timeout")]


def test_worker_renders_the_same_pages_as_in_process() -> None:
    data = docmaker.multipage_pdf(3)
    doc = _doc(data, 3)
    worker = RenderWorker(RenderLimits(document_timeout_s=120))
    try:
        remote = list(worker.pages(doc, data, SETTINGS))
        again = list(worker.pages(doc, data, SETTINGS))  # the same child serves the next document
    finally:
        worker.stop()
    local = list(render_document(doc, data, SETTINGS))
    assert [p.page_hash for p in remote] == [p.page_hash for p in local] == [p.page_hash for p in again]
    assert all(isinstance(p, PageImage) for p in remote)
    assert worker.started == 1


def test_document_deadline_keeps_finished_pages_and_times_out_the_rest() -> None:
    data = docmaker.multipage_pdf(4)
    doc = _doc(data, 4)
    worker = RenderWorker(RenderLimits(document_timeout_s=3), first_page_then_hang)
    start = time.monotonic()
    try:
        rows, hung = [], None
        for row in worker.pages(doc, data, SETTINGS):
            hung = hung or worker.proc.pid
            rows.append(row)
        elapsed = time.monotonic() - start
        with pytest.raises(ProcessLookupError):  # the hung child was killed (and reaped), not left running
            os.kill(hung, 0)
        assert worker.proc is not None and worker.proc.pid != hung  # its successor is already booting
        after = list(worker.pages(_doc(data, 4, "next.pdf"), data, SETTINGS))  # a fresh child starts
    finally:
        worker.stop()
    assert isinstance(rows[0], PageImage) and rows[0].page_index == 0
    assert [(r.page_index, r.reason_code) for r in rows[1:]] == [(1, "timeout"), (2, "timeout"), (3, "timeout")]
    assert "--document-timeout-s 3" in rows[1].message
    assert elapsed < 3600 / 10  # it stopped: the injected render would have hung for an hour
    assert isinstance(after[0], PageImage) and worker.started >= 2


def gated(doc: DocumentRecord, data: bytes, s: RenderSettings) -> Iterator[PageImage | PageRow]:
    """Fault injection (runs in the child): page i+1 is rendered only once the parent's consumer has finished
    with page i (it creates `<uri>.<i+1>`), so the child cannot run ahead into the pipe while the consumer
    works, and the deadline, not a page already waiting, decides."""
    for page in render_document(doc, data, s):
        if page.page_index > 0:
            gate = Path(f"{doc.uri}.{page.page_index}")
            for _ in range(6000):
                if gate.exists():
                    break
                time.sleep(0.01)
            time.sleep(0.2)  # the page's own rendering time, after the consumer let it start
        yield page


class SlowModelClock:
    """The worker's clock, with `skew` seconds added by a consumer that 'spends' them (a slow model fused
    into the stage) without the test waiting for them."""

    def __init__(self) -> None:
        self.skew = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skew


def test_time_spent_by_later_stages_is_not_charged_to_the_document(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    data = docmaker.multipage_pdf(3)
    doc = replace(_doc(data, 3), uri=str(tmp_path / "d.pdf"))
    clock = SlowModelClock()
    monkeypatch.setattr(timed, "time", clock)
    worker = RenderWorker(RenderLimits(document_timeout_s=60), gated)
    rows = []
    try:
        for page in worker.pages(doc, data, SETTINGS):
            rows.append(page)
            clock.skew += 100.0  # the model spends 100 s on this page: past the document's 60 s
            Path(f"{doc.uri}.{page.page_index + 1}").touch()  # only now may the child render the next page
    finally:
        worker.stop()
    # Each page's own work (~0.2 s) is on the clock, the model's 300 s are not: no page times out.
    assert [(type(r).__name__, r.page_index) for r in rows] == [("PageImage", 0), ("PageImage", 1),
                                                                ("PageImage", 2)]


def test_an_abandoned_document_leaves_nothing_for_the_next() -> None:
    data = docmaker.multipage_pdf(3)
    worker = RenderWorker(RenderLimits(document_timeout_s=60))
    try:
        pages = worker.pages(_doc(data, 3, "first.pdf"), data, SETTINGS)
        next(pages)
        pages.close()  # what happens when a later stage raises while holding the first page
        rows = list(worker.pages(_doc(data, 3, "second.pdf"), data, SETTINGS))
    finally:
        worker.stop()
    assert [(Path(r.source_uri).name, r.page_index) for r in rows] == [("second.pdf", i) for i in range(3)]


def test_page_deadline() -> None:
    data = docmaker.multipage_pdf(2)
    worker = RenderWorker(RenderLimits(document_timeout_s=0, page_timeout_s=2), first_page_then_hang)
    try:
        rows = list(worker.pages(_doc(data, 2), data, SETTINGS))
    finally:
        worker.stop()
    assert isinstance(rows[0], PageImage)
    assert (rows[1].reason_code, rows[1].status) == ("timeout", "failed")
    assert "--page-timeout-s 2" in rows[1].message


def test_a_crash_fails_its_document_only() -> None:
    data = docmaker.multipage_pdf(3)
    worker = RenderWorker(RenderLimits(document_timeout_s=120), crash_on_second_page)
    try:
        crashed = list(worker.pages(_doc(data, 3, "crash.pdf"), data, SETTINGS))
        fine = list(worker.pages(_doc(data, 3, "fine.pdf"), data, SETTINGS))
    finally:
        worker.stop()
    assert isinstance(crashed[0], PageImage)
    assert [(r.page_index, r.reason_code) for r in crashed[1:]] == [(1, "worker_crashed"), (2, "worker_crashed")]
    assert "exit code -11" in crashed[1].message
    assert all(isinstance(p, PageImage) for p in fine) and len(fine) == 3


@pytest.mark.slow
def test_slow_pdf_is_stopped() -> None:
    """The real thing: pdfium drawing a shared 400 kB content stream, several seconds a page here."""
    data = docmaker.slow_pdf(30, stream_bytes=400_000)
    doc = _doc(data, 30, "slow.pdf")
    worker = RenderWorker(RenderLimits(document_timeout_s=5))
    try:
        rows = list(worker.pages(doc, data, SETTINGS))
    finally:
        worker.stop()
    assert len(rows) == 30 and {r.page_index for r in rows} == set(range(30))
    timed_out = [r for r in rows if isinstance(r, PageRow) and r.reason_code == "timeout"]
    assert timed_out, "every page rendered within 5 s: the document is not slow on this machine"
    # Stopped, not slowed: every page after the first one cut off is cut off too (the child was killed).
    first_cut = min(r.page_index for r in timed_out)
    assert all(isinstance(r, PageRow) and r.reason_code == "timeout" for r in rows if r.page_index >= first_cut)


def test_a_render_reply_must_be_a_new_page_of_its_document() -> None:
    # The child parses untrusted bytes: a reply that is not a page of this document, or answers a page twice,
    # fails the document's remaining pages `worker_crashed` (and the child is replaced) instead of being written.
    doc = _doc(b"x", 3)
    page = PageRow.of_index(doc.doc_sha256, doc.uri, 1, "failed")
    assert reply_problem(doc, set(), page) is None
    assert reply_problem(doc, {1}, page) == "a reply for page 1 of another or an already answered page"
    assert reply_problem(doc, set(), replace(page, page_index=7)) is not None
    assert reply_problem(doc, set(), replace(page, doc_sha256="0" * 64)) is not None
    assert reply_problem(doc, set(), 5) == "a reply of type int"


def test_a_page_the_renderer_skipped_fails_as_render_failed() -> None:
    data = docmaker.multipage_pdf(2)
    worker = RenderWorker(RenderLimits(document_timeout_s=60), first_page_only)
    try:
        rows = list(worker.pages(_doc(data, 2), data, SETTINGS))
    finally:
        worker.stop()
    assert isinstance(rows[0], PageImage) and rows[0].page_index == 0
    assert [(r.page_index, r.status, r.reason_code, r.message) for r in rows[1:]] == \
        [(1, "failed", "render_failed", "the renderer produced no row for this page")]


def test_a_reply_for_another_document_fails_the_document_and_replaces_the_child() -> None:
    data = docmaker.multipage_pdf(2)
    worker = RenderWorker(RenderLimits(document_timeout_s=60), pages_of_another_document)
    try:
        rows = list(worker.pages(_doc(data, 2, "first.pdf"), data, SETTINGS))
        started = worker.started
        again = list(worker.pages(_doc(data, 2, "second.pdf"), data, SETTINGS))
    finally:
        worker.stop()
    assert [(Path(r.source_uri).name, r.page_index, r.reason_code) for r in rows] == \
        [("first.pdf", 0, "worker_crashed"), ("first.pdf", 1, "worker_crashed")]
    assert all(r.message.startswith("the render worker broke the protocol on this document: a reply for page 0")
               for r in rows)
    assert worker.started == started + 1  # a new child for the next document, which fails the same way alone
    assert [(Path(r.source_uri).name, r.reason_code) for r in again] == [("second.pdf", "worker_crashed")] * 2


def test_a_child_gone_before_its_document_fails_that_document_only() -> None:
    data = docmaker.multipage_pdf(2)
    worker = RenderWorker(RenderLimits(document_timeout_s=60))
    try:
        assert all(isinstance(r, PageImage) for r in worker.pages(_doc(data, 2, "first.pdf"), data, SETTINGS))
        assert worker.requests is not None
        worker.requests.close()  # the pipe to the idle child is gone (as when it dies between documents)
        lost = list(worker.pages(_doc(data, 2, "second.pdf"), data, SETTINGS))
        fine = list(worker.pages(_doc(data, 2, "third.pdf"), data, SETTINGS))
    finally:
        worker.stop()
    assert [(Path(r.source_uri).name, r.page_index, r.status, r.reason_code) for r in lost] == \
        [("second.pdf", i, "failed", "worker_crashed") for i in range(2)]
    assert all(r.message.startswith("render worker unavailable: ") and "(exit " in r.message for r in lost)
    assert [(Path(r.source_uri).name, type(r).__name__) for r in fine] == [("third.pdf", "PageImage")] * 2


def test_the_time_reported_for_a_timeout_leaves_out_what_later_stages_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    data = docmaker.multipage_pdf(2)
    clock = SlowModelClock()
    monkeypatch.setattr(timed, "time", clock)
    worker = RenderWorker(RenderLimits(document_timeout_s=2), first_page_then_hang)
    rows = []
    try:
        for row in worker.pages(_doc(data, 2), data, SETTINGS):
            rows.append(row)
            clock.skew += 100.0  # the model spends 100 s on the first page; then the second page hangs
    finally:
        worker.stop()
    assert isinstance(rows[0], PageImage) and rows[1].reason_code == "timeout"
    reported = int(rows[1].message.split("stopped after ")[1].split(" s ")[0])
    assert 2 <= reported < 100  # the document's own 2 s (and a little), not the model's 100 s


@pytest.mark.parametrize("with_stages", [False, True])
def test_the_dofn_renders_in_its_worker_and_with_stages_gates_and_hints(tmp_path: Path, with_stages: bool) -> None:
    """The Beam DoFn without Beam: it reads the document, its worker renders it (with `stages`, also the gate and
    the hints: each page comes back hashed and with its text-layer hint), and teardown stops the worker."""
    from transforms.document_work.timed import TimedRenderPagesDoFn
    from transforms.document_work.work import PageStages
    from transforms.hints.choose import HintSettings
    from transforms.safety.gate import SafetyConfig

    data = docmaker.multipage_pdf(2)
    (tmp_path / "d.pdf").write_bytes(data)
    doc = replace(_doc(data, 2), uri=str(tmp_path / "d.pdf"))
    stages = PageStages(SafetyConfig(), HintSettings(mode="text_layer")) if with_stages else None
    dofn = TimedRenderPagesDoFn(SETTINGS, RenderLimits(document_timeout_s=60), stages=stages)
    dofn.setup()
    try:
        assert dofn.worker.proc is not None and dofn.worker.limits == RenderLimits(document_timeout_s=60)
        pages = list(dofn.process(doc))
    finally:
        dofn.teardown()
    assert dofn.worker.proc is None  # stopped
    assert [(type(p).__name__, p.page_index) for p in pages] == [("PageImage", 0), ("PageImage", 1)]
    if with_stages:
        assert [p.hint_source for p in pages] == ["text_layer", "text_layer"]
        assert pages[1].hint.startswith("Quarterly report, section 2")
        assert all(p.pdq_hash is not None for p in pages)  # the gate hashed them in the worker
    else:
        assert [(p.hint_source, p.pdq_hash) for p in pages] == [("none", None), ("none", None)]


def test_the_dofn_fails_what_its_worker_could_not_finish_in_time(tmp_path: Path) -> None:
    from apache_beam.pvalue import TaggedOutput

    from transforms.document_work.timed import TimedRenderPagesDoFn

    data = docmaker.multipage_pdf(2)
    (tmp_path / "d.pdf").write_bytes(data)
    doc = replace(_doc(data, 2), uri=str(tmp_path / "d.pdf"))
    dofn = TimedRenderPagesDoFn(SETTINGS, RenderLimits(document_timeout_s=0, page_timeout_s=2), first_page_then_hang)
    dofn.setup()
    try:
        out = list(dofn.process(doc))
    finally:
        dofn.teardown()
    assert isinstance(out[0], PageImage)
    assert isinstance(out[1], TaggedOutput) and out[1].tag == "failed_pages"
    assert (out[1].value.page_index, out[1].value.reason_code) == (1, "timeout")
