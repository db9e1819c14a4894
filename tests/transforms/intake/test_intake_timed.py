"""Intake under --document-timeout-s: the page count runs in a child process. A counter that hangs ends its
document `failed`/`timeout` and the next document in the same run is counted; a counter that crashes the
child ends its document `worker_crashed`; and over the corpus the child gives exactly the in-process rows."""
from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from schemas.reasons import REASON_CODES, SYSTEM_REASONS
from schemas.records import DocumentRecord, DocumentRow, ListedObject
from schemas.statuses import REJECTED
from tests.conftest import CORPUS
from tests.support import docmaker
from tests.support.intake_hangs import MARK, hangs_on_mark
from transforms.intake.accept import IntakeDoFn
from transforms.intake.inspection import IntakeLimits, count_pages
from transforms.intake.timed import TimedIntakeDoFn

LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)


def crashes_on_mark(data: bytes, fmt: str, limits: IntakeLimits) -> int:
    """Fault injection (runs in the child): a segfault inside the parser of a marked document."""
    if MARK in data:
        os.kill(os.getpid(), signal.SIGSEGV)
    return count_pages(data, fmt, limits)


def _listed(path: Path) -> ListedObject:
    return ListedObject(uri=str(path), size=path.stat().st_size)


def _outputs(dofn: IntakeDoFn, objs: list[ListedObject]) -> list[DocumentRecord | DocumentRow]:
    """The DoFn's outputs, called the way a runner calls it (setup, process, teardown)."""
    dofn.setup()
    try:
        out = [getattr(o, "value", o) for obj in objs for o in dofn.process(obj)]
    finally:
        dofn.teardown()
    return out


def test_hung_page_count_times_out_and_the_run_goes_on(tmp_path: Path) -> None:
    hung = tmp_path / "hung.pdf"
    hung.write_bytes(docmaker.multipage_pdf(2) + MARK)
    fine_pdf, fine_png = tmp_path / "fine.pdf", tmp_path / "fine.png"
    fine_pdf.write_bytes(docmaker.multipage_pdf(3))
    fine_png.write_bytes(docmaker.scanned_png())
    objs = [_listed(p) for p in (hung, fine_pdf, fine_png)]
    dofn = TimedIntakeDoFn(LIMITS, timeout_s=3, count=hangs_on_mark)
    with beam.Pipeline() as p:  # one run: the document after the hung one is counted by a fresh child
        out = (p | beam.Create(objs) | beam.ParDo(dofn).with_outputs(REJECTED, main="accepted"))
        accepted = out.accepted | "Accepted" >> beam.Map(lambda r: (Path(r.uri).name, r.format, r.page_count))
        failed = out[REJECTED] | "Failed" >> beam.Map(lambda r: (Path(r.source_uri).name, r.outcome, r.reason_code,
                                                                r.doc_sha256, r.format))
        assert_that(accepted, equal_to([("fine.pdf", "pdf", 3), ("fine.png", "png", 1)]), label="accepted")
        sha = hashlib.sha256(hung.read_bytes()).hexdigest()
        assert_that(failed, equal_to([("hung.pdf", "failed", "timeout", sha, "pdf")]), label="failed")
    assert "timeout" in SYSTEM_REASONS  # so a run with such documents exits 1, not 0


def test_timeout_row_says_which_stage_and_the_limit(tmp_path: Path) -> None:
    hung = tmp_path / "hung.pdf"
    hung.write_bytes(docmaker.multipage_pdf(1) + MARK)
    after = tmp_path / "after.pdf"
    after.write_bytes(docmaker.multipage_pdf(2))
    dofn = TimedIntakeDoFn(LIMITS, timeout_s=2, count=hangs_on_mark)
    row, record = _outputs(dofn, [_listed(hung), _listed(after)])
    assert isinstance(row, DocumentRow) and (row.outcome, row.reason_code) == ("failed", "timeout")
    assert "count its pages" in row.message and "--document-timeout-s 2" in row.message, row.message
    assert isinstance(record, DocumentRecord) and record.page_count == 2
    assert dofn.worker.started == 2  # the killed child was replaced


def test_crash_in_the_page_count_fails_that_document_only(tmp_path: Path) -> None:
    crash, after = tmp_path / "crash.pdf", tmp_path / "after.png"
    crash.write_bytes(docmaker.multipage_pdf(1) + MARK)
    after.write_bytes(docmaker.scanned_png())
    row, record = _outputs(TimedIntakeDoFn(LIMITS, timeout_s=60, count=crashes_on_mark),
                           [_listed(crash), _listed(after)])
    assert isinstance(row, DocumentRow) and (row.outcome, row.reason_code) == ("failed", "worker_crashed"), row
    assert row.reason_code in REASON_CODES and str(-signal.SIGSEGV) in row.message, row.message
    assert isinstance(record, DocumentRecord) and record.format == "png"


def test_child_gives_the_in_process_rows_over_the_corpus() -> None:
    """Every corpus file (hostile ones included: bombs, truncations, encryption) gets the same record or
    row, message included, whether its pages are counted here or in the child."""
    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.stat().st_size <= LIMITS.max_bytes)
    assert len(files) > 100, f"the corpus at {CORPUS} looks incomplete"
    objs = [_listed(p) for p in files]
    local = _outputs(IntakeDoFn(LIMITS), objs)
    timed = _outputs(TimedIntakeDoFn(LIMITS, timeout_s=120), objs)
    assert len(local) == len(timed) == len(objs)
    differ = [(a, b) for a, b in zip(local, timed, strict=True) if a != b]
    assert not differ, differ[:3]
    kinds = {type(r).__name__ for r in local}
    assert kinds == {"DocumentRecord", "DocumentRow"}  # both paths were exercised
