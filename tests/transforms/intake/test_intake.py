"""Pure tests of intake: sniffing, the size gate, inspect_document and expand_input. No Beam pipeline."""
from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from schemas.records import REASON_CODES, DocumentRecord, DocumentRow, ListedObject
from schemas.statuses import REJECTED
from tests import docmaker
from transforms.intake.accept import IntakeDoFn, size_gate
from transforms.intake.formats import sniff_format
from transforms.intake.inspection import IntakeLimits, inspect_document, reject
from transforms.intake.listing import MISSING, ListObjects, _missing, expand_input, in_window, to_listed
from transforms.intake.reading import read_capped

LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)


def _inspect(name: str, data: bytes, limits: IntakeLimits = LIMITS) -> DocumentRecord | DocumentRow:
    return inspect_document(ListedObject(uri=f"/data/{name}", size=len(data)), data, limits)


def _rejected(name: str, data: bytes, reason: str, limits: IntakeLimits = LIMITS) -> DocumentRow:
    row = _inspect(name, data, limits)
    assert isinstance(row, DocumentRow), f"{name} was accepted: {row}"
    assert row.outcome == "rejected"
    assert row.reason_code == reason, row
    assert row.reason_code in REASON_CODES
    assert row.source_uri == f"/data/{name}"
    assert row.message
    return row


def _accepted(name: str, data: bytes, limits: IntakeLimits = LIMITS) -> DocumentRecord:
    rec = _inspect(name, data, limits)
    assert isinstance(rec, DocumentRecord), f"{name} was rejected: {rec}"
    assert rec.uri == f"/data/{name}"
    assert rec.size == len(data)
    assert rec.doc_sha256 == hashlib.sha256(data).hexdigest()
    return rec


# --- sniff_format --------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "expected"), [
    (docmaker.invoice_pdf, "pdf"),
    (docmaker.tiny_png, "png"),
    (docmaker.jpeg_cmyk, "jpeg"),
    (docmaker.exif_rotated_jpeg, "jpeg"),
    (docmaker.animated_gif, "gif"),
    (docmaker.bmp, "bmp"),
    (docmaker.multipage_tiff, "tiff"),
    (docmaker.webp, "webp"),
    (docmaker.huge_png_header, "png"),
    (docmaker.encrypted_pdf, "pdf"),
])
def test_sniff_real_files(make: Callable[[], bytes], expected: str) -> None:
    data = make()
    assert sniff_format(data[:1024]) == expected


def test_sniff_big_endian_tiff() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="TIFF")
    little = buf.getvalue()
    assert little[:4] == b"II*\x00"
    assert sniff_format(b"MM\x00*" + little[4:]) == "tiff"


@pytest.mark.parametrize("head", [
    b"",
    b"hello world, this is plain text\n",
    docmaker.random_bytes(1024, seed=3),
    b"BM" + b"\x00" * 10,  # a BMP header needs at least 26 bytes
    b"GIF90a" + b"\x00" * 20,
    b"RIFF\x00\x00\x00\x00WAVEfmt ",  # RIFF, but not WebP
    b"\x00\x00\x00\x18ftypmp42",  # ISO media, but a video brand
])
def test_sniff_rejects_non_documents(head: bytes) -> None:
    assert sniff_format(head) is None


def test_sniff_pdf_after_junk_within_first_kib() -> None:
    pdf = docmaker.invoice_pdf()
    assert sniff_format((b"\x00junk" * 100 + pdf)[:1024]) == "pdf"
    assert sniff_format((b"x" * 1100 + pdf)[:1024]) is None


def test_sniff_heic_and_avif_brands() -> None:
    assert sniff_format(b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00") == "heic"
    assert sniff_format(b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00") == "heic"
    assert sniff_format(b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00") == "avif"


def test_sniff_ignores_the_extension() -> None:
    # A text file named .png is not a PNG; a PDF named .jpg is a PDF. Only bytes count.
    assert sniff_format(b"not really a png\n") is None
    assert sniff_format(docmaker.invoice_pdf()[:1024]) == "pdf"


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


def test_reject_caps_the_message() -> None:
    row = reject(ListedObject(uri="/d/x", size=5), "unreadable", "x" * 5000)
    assert len(row.message or "") == 500


# --- inspect_document: rejections ----------------------------------------------------------------

def test_zero_bytes() -> None:
    row = _rejected("zero.pdf", b"", "empty")
    assert row.doc_sha256 is None


def test_data_longer_than_max_bytes_is_too_large() -> None:
    # The listing said 10 bytes, but the read returned more than the limit: the bytes decide.
    limits = IntakeLimits(max_bytes=100, max_pages=10, max_image_pixels=10_000)
    data = docmaker.invoice_pdf()
    row = inspect_document(ListedObject(uri="/data/liar.pdf", size=10), data, limits)
    assert isinstance(row, DocumentRow)
    assert row.reason_code == "too_large"


def test_truncated_pdf_is_unreadable() -> None:
    data = docmaker.truncated_pdf()
    row = _rejected("truncated.pdf", data, "unreadable")
    assert row.format == "pdf"
    assert row.doc_sha256 == hashlib.sha256(data).hexdigest()


def test_random_bytes_named_pdf() -> None:
    row = _rejected("random.pdf", docmaker.random_bytes(4096), "unsupported_format")
    assert row.format is None
    assert row.doc_sha256 is not None


def test_text_file_named_png() -> None:
    row = _rejected("notes.png", b"This is a text file, whatever its name says.\n" * 20, "unsupported_format")
    assert row.format is None


def test_encrypted_pdf() -> None:
    row = _rejected("locked.pdf", docmaker.encrypted_pdf(), "encrypted")
    assert row.format == "pdf"


def test_pdf_claiming_a_billion_pages_is_counted_by_its_real_pages() -> None:
    # PDFium ignores a /Count that large and counts the page tree's kids: one real page.
    rec = _accepted("billion.pdf", docmaker.billion_pages_pdf())
    assert (rec.format, rec.page_count) == ("pdf", 1)


def test_pdf_claiming_a_million_pages_is_too_many() -> None:
    row = _rejected("million.pdf", docmaker.billion_pages_pdf(1_000_000), "too_many_pages")
    assert row.page_count == 1_000_000
    assert "5,000" in (row.message or "")


def test_page_limit_boundary() -> None:
    data = docmaker.multipage_pdf(3)
    assert _accepted("three.pdf", data, IntakeLimits(10**6, 3, 10**6)).page_count == 3
    _rejected("three.pdf", data, "too_many_pages", IntakeLimits(10**6, 2, 10**6))


def test_multipage_tiff_over_the_page_limit() -> None:
    row = _rejected("pages.tiff", docmaker.multipage_tiff(4), "too_many_pages", IntakeLimits(10**6, 3, 10**6))
    assert (row.format, row.page_count) == ("tiff", 4)


def test_image_over_pillow_limit_is_a_decompression_bomb() -> None:
    # 20000 x 20000 is over twice Pillow's own limit: Pillow refuses it on open.
    row = _rejected("bomb.png", docmaker.huge_png_header(), "decompression_bomb")
    assert row.format == "png"


def test_image_over_our_pixel_limit_is_a_decompression_bomb() -> None:
    limits = IntakeLimits(max_bytes=10**6, max_pages=10, max_image_pixels=1_000_000)
    row = _rejected("big.png", docmaker.huge_png_header(1001, 1000), "decompression_bomb", limits)
    assert "1,001,000" in (row.message or "")


def test_pixel_limit_boundary() -> None:
    data = docmaker.webp()  # 64 x 48
    _accepted("pic.webp", data, IntakeLimits(10**6, 10, 64 * 48))
    _rejected("pic.webp", data, "decompression_bomb", IntakeLimits(10**6, 10, 64 * 48 - 1))


def test_truncated_image_is_unreadable() -> None:
    data = docmaker.scanned_png()
    row = _rejected("cut.png", data[: len(data) // 2], "unreadable")
    assert row.format == "png"


def test_sniffed_heic_that_pillow_cannot_open_is_unsupported() -> None:
    fake = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 200
    row = _rejected("photo.heic", fake, "unsupported_format")
    assert row.format == "heic"


# --- inspect_document: accepted ------------------------------------------------------------------

@pytest.mark.parametrize(("name", "make", "fmt", "pages"), [
    ("tiny.png", docmaker.tiny_png, "png", 1),
    ("cmyk.jpg", docmaker.jpeg_cmyk, "jpeg", 1),
    ("anim.gif", lambda: docmaker.animated_gif(3), "gif", 1),  # animated: frame 0 only
    ("scan.tiff", lambda: docmaker.multipage_tiff(3), "tiff", 3),  # every TIFF frame is a page
    ("scan5.tiff", lambda: docmaker.multipage_tiff(5), "tiff", 5),
    ("pic.webp", docmaker.webp, "webp", 1),
    ("pic.bmp", docmaker.bmp, "bmp", 1),
    ("rotated.jpg", docmaker.exif_rotated_jpeg, "jpeg", 1),
    ("invoice.pdf", docmaker.invoice_pdf, "pdf", 1),
    ("report.pdf", lambda: docmaker.multipage_pdf(4, terms_page=True), "pdf", 5),
    ("scan.png", docmaker.scanned_png, "png", 1),
])
def test_accepted(name: str, make: Callable[[], bytes], fmt: str, pages: int) -> None:
    rec = _accepted(name, make())
    assert (rec.format, rec.page_count) == (fmt, pages)


def test_pdf_named_jpg_is_a_pdf() -> None:
    assert _accepted("actually-a.jpg", docmaker.invoice_pdf()).format == "pdf"


def test_inspect_is_deterministic() -> None:
    data = docmaker.multipage_tiff(2)
    assert _inspect("a.tiff", data) == _inspect("a.tiff", data)


# --- expand_input --------------------------------------------------------------------------------

def test_expand_folder_becomes_recursive_glob(tmp_path: Path) -> None:
    assert expand_input(str(tmp_path)) == [f"{tmp_path}/**"]
    assert expand_input(f"{tmp_path}/") == [f"{tmp_path}/**"]
    assert expand_input("s3://bucket/prefix/") == ["s3://bucket/prefix/**"]


def test_expand_file_and_glob_are_kept(tmp_path: Path) -> None:
    f = tmp_path / "a.pdf"
    f.write_bytes(b"%PDF-1.4")
    assert expand_input(str(f)) == [str(f)]
    assert expand_input(f"{tmp_path}/*.pdf") == [f"{tmp_path}/*.pdf"]
    assert expand_input("s3://bucket/a.pdf") == ["s3://bucket/a.pdf"]
    assert expand_input(str(tmp_path / "missing.pdf")) == [str(tmp_path / "missing.pdf")]


def test_expand_at_file_list(tmp_path: Path) -> None:
    listing = tmp_path / "inputs.txt"
    listing.write_text("# documents for the January run\n"
                       "\n"
                       "/data/a.pdf\n"
                       "   s3://bucket/b.png   \n"
                       "  # an indented comment\n"
                       "/data/folder/*.tiff\n")
    assert expand_input(f"@{listing}") == ["/data/a.pdf", "s3://bucket/b.png", "/data/folder/*.tiff"]


def test_expand_empty_at_file(tmp_path: Path) -> None:
    listing = tmp_path / "empty.txt"
    listing.write_text("# nothing yet\n\n")
    assert expand_input(f"@{listing}") == []


# Inputs stay inside what was listed (issue 16, item 7).

def _tree(tmp_path: Path) -> Path:
    """in/a.pdf; in/inner.pdf -> a.pdf (inside); in/link.pdf -> ../out/secret.pdf (outside)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(docmaker.invoice_pdf())
    (tmp_path / "out" / "secret.pdf").write_bytes(docmaker.multipage_pdf(1, title="Secret"))
    (tmp_path / "in" / "inner.pdf").symlink_to("a.pdf")
    (tmp_path / "in" / "link.pdf").symlink_to(tmp_path / "out" / "secret.pdf")
    return tmp_path / "in"


@pytest.mark.parametrize("glob", ["{d}/**", "{d}/*.pdf", "{d}/l*"])
def test_symlink_out_of_a_listed_folder_is_not_followed(tmp_path: Path, glob: str) -> None:
    from transforms.intake.listing import OUTSIDE, match_pattern

    folder = _tree(tmp_path)
    listed = {Path(o.uri).name: o for o in match_pattern(glob.format(d=folder))}
    assert listed["link.pdf"].size == OUTSIDE
    row = size_gate(listed["link.pdf"], LIMITS)
    assert row is not None and (row.outcome, row.reason_code, row.bytes) == ("rejected", "outside_input", 0)
    assert row.reason_code in REASON_CODES and "outside" in (row.message or "")
    if "a.pdf" in listed:  # a symlink inside the folder to a file inside it is followed
        assert listed["inner.pdf"].size == listed["a.pdf"].size > 0
        assert size_gate(listed["inner.pdf"], LIMITS) is None


def test_a_file_named_on_its_own_is_followed(tmp_path: Path) -> None:
    from transforms.intake.listing import match_pattern

    folder = _tree(tmp_path)
    (listed,) = match_pattern(str(folder / "link.pdf"))  # named explicitly: the caller chose it
    assert listed.size == len((tmp_path / "out" / "secret.pdf").read_bytes())


# --- listing and the intake DoFn ----------------------------------------------------------------


@pytest.mark.parametrize(("modified", "since", "until", "taken"), [
    (None, 100.0, 200.0, True),  # an unknown time is always taken
    (100.0, 100.0, 200.0, True),  # since is inclusive
    (99.9, 100.0, 200.0, False),
    (199.9, 100.0, 200.0, True),
    (200.0, 100.0, 200.0, False),  # until is exclusive: back-to-back windows take each object once
    (5.0, None, 200.0, True), (500.0, 100.0, None, True), (5.0, 100.0, None, False), (500.0, None, 200.0, False),
    (5.0, None, None, True)])
def test_in_window(modified: float | None, since: float | None, until: float | None, taken: bool) -> None:
    assert in_window(ListedObject("s3://b/k.pdf", 10, modified), since, until) is taken


def test_to_listed_and_read_capped(tmp_path: Path) -> None:
    from apache_beam.io.filesystem import FileMetadata

    meta = FileMetadata(str(tmp_path / "a.pdf"), 1234, last_updated_in_seconds=17.5)
    assert to_listed(meta) == ListedObject(str(tmp_path / "a.pdf"), 1234, 17.5)
    path = tmp_path / "ten.bin"
    path.write_bytes(b"0123456789")
    assert read_capped(str(path), 4) == b"01234"  # limit + 1: enough to tell "over the limit"
    assert read_capped(str(path), 100) == b"0123456789"


def test_missing_literal_uris_are_listed_as_missing(tmp_path: Path) -> None:
    (tmp_path / "here.pdf").write_bytes(b"x")
    assert list(_missing(str(tmp_path / "here.pdf"))) == []
    assert list(_missing(str(tmp_path / "gone.pdf"))) == [ListedObject(str(tmp_path / "gone.pdf"), MISSING)]
    assert list(_missing("nosuchscheme://bucket/key.pdf")) == [ListedObject("nosuchscheme://bucket/key.pdf", MISSING)]


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


def test_list_objects_lists_each_object_once_and_reports_missing_names(tmp_path: Path) -> None:
    import os

    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
    from apache_beam.testing.util import assert_that, equal_to

    (tmp_path / "sub").mkdir()
    for name, mtime in (("a.pdf", 100), ("sub/b.png", 150), ("sub/c.pdf", 300)):
        (tmp_path / name).write_bytes(b"1234")
        os.utime(tmp_path / name, (mtime, mtime))
    patterns = [str(tmp_path), str(tmp_path / "a.pdf"), str(tmp_path / "sub" / "*.png"), str(tmp_path / "gone.pdf")]
    with BeamPipeline() as p:
        got = p | ListObjects(patterns) | beam.Map(lambda o: (Path(o.uri).name, o.size))
        assert_that(got, equal_to([("a.pdf", 4), ("b.png", 4), ("c.pdf", 4), ("gone.pdf", MISSING)]))
    with BeamPipeline() as p:
        got = p | ListObjects([str(tmp_path)], modified_since=100, modified_until=300) | beam.Map(
            lambda o: Path(o.uri).name)
        assert_that(got, equal_to(["a.pdf", "b.png"]))


@pytest.mark.parametrize(("since", "until"), [(None, None), (100, 300), (150, None)])
def test_the_estimate_lists_what_the_pipeline_lists(tmp_path: Path, since: float | None,
                                                    until: float | None) -> None:
    """`list_matching` (pagemill estimate) and the `ListObjects` transform give the same objects: a file
    named twice, a missing name, symlinks in and out of the folder, an @FILE listing and the time window."""
    import os

    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from transforms.intake.listing import OUTSIDE, list_matching

    folder = _tree(tmp_path)
    (folder / "sub").mkdir()
    (folder / "sub" / "b.png").write_bytes(docmaker.scanned_png())
    for path, mtime in ((folder / "a.pdf", 100), (folder / "sub" / "b.png", 150),
                        (tmp_path / "out" / "secret.pdf", 300)):  # the links list their targets' times
        os.utime(path, (mtime, mtime))
    listing = tmp_path / "listing.txt"
    listing.write_text(f"# named\n{folder / 'a.pdf'}\n{tmp_path / 'gone.pdf'}\n")
    patterns = [str(folder), str(folder / "sub" / "*.png"), f"@{listing}", str(tmp_path / "out" / "gone.pdf")]
    listed = list_matching(patterns, since, until)
    assert [o.uri for o in listed] == sorted(o.uri for o in listed)  # each URI once, in order
    with BeamPipeline() as p:
        got = p | ListObjects(patterns, modified_since=since, modified_until=until) | beam.Map(
            lambda o: (o.uri, o.size, o.last_modified))
        assert_that(got, equal_to([(o.uri, o.size, o.last_modified) for o in listed]))
    sizes = {Path(o.uri).name: o.size for o in listed}
    assert sizes["gone.pdf"] == MISSING and ("link.pdf" not in sizes or sizes["link.pdf"] == OUTSIDE)
    assert ("a.pdf" in sizes) == ("inner.pdf" in sizes) == (since is None or since <= 100)
    assert ("link.pdf" in sizes) == (until is None)


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


def test_data_of_exactly_max_bytes_is_accepted() -> None:
    data = docmaker.invoice_pdf()
    limits = IntakeLimits(max_bytes=len(data), max_pages=5, max_image_pixels=LIMITS.max_image_pixels)
    assert isinstance(inspect_document(ListedObject("u", len(data)), data, limits), DocumentRecord)
    small = IntakeLimits(max_bytes=len(data) - 1, max_pages=5, max_image_pixels=LIMITS.max_image_pixels)
    row = inspect_document(ListedObject("u", len(data)), data, small)
    assert isinstance(row, DocumentRow) and row.reason_code == "too_large"
    assert row.message == f"read more than {len(data) - 1:,} bytes"
