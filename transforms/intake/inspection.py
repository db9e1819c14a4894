"""Intake's inspection of bytes already read: hash, sniff, open the document to count its pages, validate.

Pure functions, no Beam (transforms/intake/accept.py is the DoFn). This module imports only what opening a
document needs, because with a time limit on the page count runs in a child process
(transforms/intake/timed.py) that imports it: a light child starts in a fraction of a second.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pypdfium2 as pdfium
from PIL import Image, UnidentifiedImageError

from schemas.reasons import (
    DECOMPRESSION_BOMB,
    EMPTY,
    ENCRYPTED,
    TOO_LARGE,
    TOO_MANY_PAGES,
    UNREADABLE,
    UNSUPPORTED_FORMAT,
)
from schemas.records import DocumentRecord, DocumentRow, ListedObject
from schemas.statuses import REJECTED
from transforms.intake.formats import (
    IMAGE_FORMATS,
    PdfPasswordError,
    image_page_count,
    open_image,
    open_pdf,
    seek_frame,
    sniff_format,
)


@dataclass(frozen=True)
class IntakeLimits:
    max_bytes: int
    max_pages: int
    max_image_pixels: int


# (data, format, limits) -> pages; raises what pdfium and Pillow raise on a document they cannot open.
PageCounter = Callable[[bytes, str, IntakeLimits], int]
# (obj, data, format, sha256, limits) -> pages, or the row of a document that cannot be opened.
Counted = Callable[[ListedObject, bytes, str, str, IntakeLimits], int | DocumentRow]


def reject(obj: ListedObject, reason_code: str, message: str, **known: object) -> DocumentRow:
    return DocumentRow(source_uri=obj.uri, bytes=max(obj.size, 0), outcome=REJECTED, reason_code=reason_code,
                       message=message[:500], **known)  # type: ignore[arg-type]


def count_pages(data: bytes, fmt: str, limits: IntakeLimits) -> int:
    """Open the document and count its pages; an image's frames are walked (headers) and frame 0 decoded."""
    if fmt == "pdf":
        with open_pdf(data) as doc:
            return len(doc)
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"no reader for {fmt}")
    with open_image(data, limits.max_image_pixels) as img:
        count = image_page_count(img, fmt)
        if count > limits.max_pages:
            return count  # rejected as too_many_pages without walking the frames
        for index in range(1, count):  # headers only: each frame has its own declared size
            seek_frame(img, index, limits.max_image_pixels)
        img.seek(0)
        img.load()  # decodes frame 0 now, so a truncated image is rejected here, not mid-run
        return count


def header_page_count(data: bytes, fmt: str, limits: IntakeLimits) -> int:
    """The page count without decoding a pixel (a PDF's page tree, an image's frame headers): what the launcher
    asks of a small listing's objects to tell a small run (pipelines/run/local_workers.py), not a validation."""
    if fmt == "pdf":
        with open_pdf(data) as doc:
            return len(doc)
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"no reader for {fmt}")
    with open_image(data, limits.max_image_pixels) as img:
        return image_page_count(img, fmt)


def count_or_reject(obj: ListedObject, data: bytes, fmt: str, sha: str, limits: IntakeLimits,
                    count: PageCounter = count_pages) -> int | DocumentRow:
    """The page count, or the rejected row of a document that cannot be opened."""
    known = {"doc_sha256": sha, "format": fmt}
    try:
        return count(data, fmt, limits)
    except PdfPasswordError:
        return reject(obj, ENCRYPTED, "the PDF is password protected", **known)
    except Image.DecompressionBombError as err:
        return reject(obj, DECOMPRESSION_BOMB, str(err), **known)
    except UnidentifiedImageError:
        # Pillow's own message names a BytesIO address, which would differ on every run.
        if fmt in ("heic", "avif"):
            return reject(obj, UNSUPPORTED_FORMAT, f"{fmt}: no decoder installed (pillow-heif)", **known)
        return reject(obj, UNREADABLE, f"{fmt}: Pillow cannot decode this image", **known)
    except (pdfium.PdfiumError, OSError, ValueError, SyntaxError, EOFError) as err:
        return reject(obj, UNREADABLE, f"{fmt}: {type(err).__name__}: {err}", **known)


def counted_in_child(obj: ListedObject, data: bytes, fmt: str, sha: str, limits: IntakeLimits,
                     count: PageCounter = count_pages) -> Iterator[int | DocumentRow]:
    """count_or_reject as the work of a child process (transforms/child_process.py): its one reply."""
    yield count_or_reject(obj, data, fmt, sha, limits, count)


def inspect_document(obj: ListedObject, data: bytes, limits: IntakeLimits,
                     counted: Counted = count_or_reject) -> DocumentRecord | DocumentRow:
    """Hash, sniff and validate bytes already read. Pure: no I/O, no Beam. `counted`: how the pages are
    counted; transforms/intake/timed.py passes one that runs count_or_reject in a child under a deadline."""
    if len(data) > limits.max_bytes:  # the listing under-reported the size
        return reject(obj, TOO_LARGE, f"read more than {limits.max_bytes:,} bytes")
    if not data:
        return reject(obj, EMPTY, "the object has zero bytes")
    sha = hashlib.sha256(data).hexdigest()
    fmt = sniff_format(data[:1024])
    if fmt is None:
        return reject(obj, UNSUPPORTED_FORMAT, "magic bytes match no supported PDF or image format",
                      doc_sha256=sha)
    pages = counted(obj, data, fmt, sha, limits)
    if isinstance(pages, DocumentRow):
        return pages
    known = {"doc_sha256": sha, "format": fmt}
    if pages < 1:
        return reject(obj, UNREADABLE, f"{fmt} has no pages", **known)
    if pages > limits.max_pages:
        return reject(obj, TOO_MANY_PAGES, f"{pages:,} pages is over the limit of {limits.max_pages:,}",
                      page_count=pages, **known)
    return DocumentRecord(uri=obj.uri, size=len(data), doc_sha256=sha, format=fmt, page_count=pages)
