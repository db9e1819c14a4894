"""Pure tests of intake's accept stage: the size gate and the intake DoFn. No Beam pipeline."""
from __future__ import annotations

from pathlib import Path

from schemas.records import DocumentRecord, DocumentRow, ListedObject
from schemas.statuses import REJECTED
from tests.support import docmaker
from tests.support.intake_limits import LIMITS
from transforms.intake.accept import IntakeDoFn, size_gate
from transforms.intake.inspection import IntakeLimits, inspect_document
from transforms.intake.listing import MISSING

# --- size_gate -----------------------------------------------------------------------------------

def test_size_gate_too_large_from_listing_alone() -> None:
    limits = IntakeLimits(max_bytes=1000, max_pages=10, max_image_pixels=10_000)
    row = size_gate(ListedObject(uri="s3://b/big.pdf", size=1001), limits)
    assert row is not None
    assert (row.outcome, row.reason_code, row.bytes) == ("rejected", "too_large", 1001)
    assert "1,001" in (row.message or "")
    assert size_gate(ListedObject(uri="s3://b/ok.pdf", size=1000), limits) is None  # the limit itself is fine


def test_size_gate_zero_bytes_and_missing() -> None:
    empty = size_gate(ListedObject(uri="/d/zero.pdf", size=0), LIMITS)
    assert empty is not None and empty.reason_code == "empty"
    missing = size_gate(ListedObject(uri="/d/gone.pdf", size=MISSING), LIMITS)
    assert missing is not None and missing.reason_code == "not_found"
    assert missing.bytes == 0  # never a negative byte count in the table


# --- the intake DoFn ------------------------------------------------------------------------

def test_intake_dofn_accepts_rejects_and_survives_read_errors(tmp_path: Path) -> None:
    from apache_beam.pvalue import TaggedOutput

    good, empty = tmp_path / "good.pdf", tmp_path / "notes.txt"
    good.write_bytes(docmaker.invoice_pdf())
    empty.write_bytes(b"plain text")
    fn = IntakeDoFn(LIMITS)

    def run(obj: ListedObject) -> object:
        (out,) = list(fn.process(obj))
        return out

    accepted = run(ListedObject(str(good), good.stat().st_size))
    assert isinstance(accepted, DocumentRecord) and accepted.page_count == 1
    for obj, reason in ((ListedObject(str(empty), 10), "unsupported_format"),
                        (ListedObject(str(tmp_path / "x.pdf"), LIMITS.max_bytes + 1), "too_large"),
                        (ListedObject(str(tmp_path / "vanished.pdf"), 10), "unreadable")):
        out = run(obj)
        assert isinstance(out, TaggedOutput) and out.tag == REJECTED, obj
        assert isinstance(out.value, DocumentRow) and out.value.reason_code == reason, (obj, out.value)
    assert "read failed: " in (run(ListedObject(str(tmp_path / "vanished.pdf"), 10)).value.message or "")


def test_reject_messages_say_what_happened() -> None:
    """The message is what a person reads in the `documents` row: each reason's wording, exactly."""
    obj = ListedObject("s3://b/x", 10)
    cases = [(docmaker.encrypted_pdf(), "encrypted", "the PDF is password protected"),
             (b"hello world", "unsupported_format", "magic bytes match no supported PDF or image format"),
             (docmaker.truncated_pdf(), "unreadable", "pdf: PdfiumError: Failed to load document (PDFium: Data "
                                                      "format error)."),
             (docmaker.billion_pages_pdf(count=1_000_000), "too_many_pages", "1,000,000 pages is over the limit "
                                                                             "of 5,000"),
             (b"", "empty", "the object has zero bytes")]
    for data, reason, message in cases:
        row = inspect_document(obj, data, LIMITS)
        assert isinstance(row, DocumentRow) and (row.reason_code, row.message) == (reason, message), row
        assert row.source_uri == "s3://b/x" and row.outcome == "rejected"
    assert size_gate(ListedObject("s3://b/x", MISSING), LIMITS).message == \
        "the object was listed by name but does not exist"  # type: ignore[union-attr]
    assert size_gate(ListedObject("s3://b/x", 0), LIMITS).message == "the object has zero bytes"  # type: ignore[union-attr]
