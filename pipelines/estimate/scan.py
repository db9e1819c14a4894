"""The scanning half of `pagemill estimate`: read, hash, sniff, count pages and measure them, in plain
Python (no Beam pipeline), with the pipeline's own intake functions so that an object is rejected here for
exactly the reason `pagemill run` would reject it (the listing is intake's own `list_matching`, the page
sizes `transforms.pages.sizes`, the duplicates `transforms.intake.dedup.split_duplicates`).

Cost: every object under --max-bytes is read once in full (the sha256 that dedup and the cache need
cannot be had otherwise) and opened once more to measure its pages; nothing is rendered. Objects are
scanned by a thread pool (reads and hashing overlap; pdfium calls are serialised by its lock).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from pipelines.config.storage import StorageConfig
from pipelines.tables import sql
from schemas.reasons import RENDER_FAILED
from schemas.records import DocumentRecord, ListedObject, model_routes_sql
from schemas.statuses import OK, REJECTED, SUCCESS, sql_list
from transforms.intake.accept import size_gate
from transforms.intake.dedup import split_duplicates
from transforms.intake.inspection import IntakeLimits, inspect_document
from transforms.intake.reading import ObjectReader, ReadConfig, ReadFailed
from transforms.pages.sizes import PageSize, image_page_sizes, pdf_page_sizes


@dataclass(frozen=True)
class ScanSettings:
    limits: IntakeLimits
    dpi: float
    max_side: int
    max_page_points: float
    max_text_chars: int
    read_text: bool
    read: ReadConfig  # the run's own reads (S3 retries, keys): an object fails here as it would in the run


@dataclass(frozen=True)
class Scanned:
    """One listed object: `rejected` (with the intake reason code) or `accepted` with its pages."""

    uri: str
    size: int
    status: str
    reason_code: str | None = None
    doc_sha256: str | None = None
    format: str | None = None
    pages: tuple[PageSize, ...] = ()


def scan_object(obj: ListedObject, s: ScanSettings, reader: ObjectReader | None = None) -> Scanned:
    """One object, read as intake reads it (`ObjectReader`: storage_error after its retries, else unreadable)."""
    gated = size_gate(obj, s.limits)
    if gated is not None:
        return Scanned(obj.uri, max(obj.size, 0), REJECTED, gated.reason_code)
    try:
        data = (reader or ObjectReader(s.read)).read(obj.uri, s.limits.max_bytes)
    except ReadFailed as err:  # any storage error is this object's outcome, as in intake
        return Scanned(obj.uri, max(obj.size, 0), REJECTED, err.reason_code)
    return scan_data(obj, data, s)


def scan_data(obj: ListedObject, data: bytes, s: ScanSettings) -> Scanned:
    """Hash, sniff and validate bytes already read (`inspect_document`, as intake does), then measure pages."""
    result = inspect_document(obj, data, s.limits)
    if not isinstance(result, DocumentRecord):
        return Scanned(obj.uri, result.bytes, REJECTED, result.reason_code, result.doc_sha256, result.format)
    try:
        pages = tuple(_page_sizes(result, data, s))
    except Exception:  # noqa: BLE001 - intake opened it; if measuring fails, every page would fail to render
        pages = tuple(PageSize(i, reason_code=RENDER_FAILED) for i in range(result.page_count))
    return Scanned(obj.uri, result.size, "accepted", None, result.doc_sha256, result.format, pages)


def _page_sizes(doc: DocumentRecord, data: bytes, s: ScanSettings) -> Iterable[PageSize]:
    if doc.format == "pdf":
        return pdf_page_sizes(data, dpi=s.dpi, max_side=s.max_side, max_page_points=s.max_page_points,
                              read_text=s.read_text, max_text_chars=s.max_text_chars)
    return image_page_sizes(data, doc.page_count, max_side=s.max_side, max_image_pixels=s.limits.max_image_pixels)


def scan(objects: Sequence[ListedObject], s: ScanSettings, workers: int = 8) -> list[Scanned]:
    """Scan every object, in listing order. Threads overlap the reads (object stores are I/O bound)."""
    reader = ObjectReader(s.read)  # one reader, so one S3 client, for the whole scan (boto3 clients are thread-safe)
    if workers <= 1:
        return [scan_object(o, s, reader) for o in objects]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda o: scan_object(o, s, reader), objects, chunksize=16))


def duplicates(scanned: Iterable[Scanned]) -> dict[str, str]:
    """uri -> the uri it duplicates: the run's own rule (`transforms.intake.dedup.split_duplicates`) on the
    accepted copies of each sha256."""
    copies: dict[str, list[DocumentRecord]] = {}
    for d in scanned:
        if d.status == "accepted" and d.doc_sha256 is not None:
            copies.setdefault(d.doc_sha256, []).append(
                DocumentRecord(d.uri, d.size, d.doc_sha256, d.format or "", len(d.pages)))
    return {row.source_uri: row.duplicate_of or "" for same in copies.values() for row in split_duplicates(same)[1]}


@dataclass(frozen=True)
class CacheKeyParts:
    """What the document-level cache check matches on (a subset of the pipeline's cache key)."""

    tenant: str
    model: str
    model_revision: str | None
    schema_hash: str


def cached_documents(output: str, storage: StorageConfig, docs: dict[str, int], key: CacheKeyParts) -> set[str]:
    """doc_sha256s (of `docs`: sha -> page count) whose every page already has a reusable `pages` row under
    `output` for the same tenant, model, model revision and schema. The pipeline's own key also covers
    the prompt template, decoding parameters and render settings, so this can count a document as cached
    that a run with other --max-tokens or --dpi would extract again."""
    if not docs:
        return set()
    con = sql.connect(output, storage, typed=False)
    try:
        con.register("wanted", pa.table({"doc_sha256": list(docs), "page_count": list(docs.values())}))
        rows = con.execute(
            "SELECT w.doc_sha256 FROM wanted w JOIN pages p USING (doc_sha256) "
            "WHERE p.tenant = ? AND p.model = ? AND p.model_revision IS NOT DISTINCT FROM ? AND p.schema_hash = ? "
            f"AND p.status IN {sql_list(SUCCESS)} AND p.page_index < w.page_count "
            "GROUP BY w.doc_sha256, w.page_count HAVING count(DISTINCT p.page_index) = w.page_count",
            [key.tenant, key.model, key.model_revision, key.schema_hash]).fetchall()
    finally:
        con.close()
    return {r[0] for r in rows}


def measured_output_tokens(output: str, storage: StorageConfig, key: CacheKeyParts) -> tuple[float, int] | None:
    """(mean output tokens, pages) of pages extracted `ok` under `output` for the same tenant, model and schema
    (joined on tenant too: two tenants may hold the same run id)."""
    con = sql.connect(output, storage, typed=False)
    try:
        mean, n = con.execute(
            "SELECT avg(l.output_tokens), count(*) FROM ledger l "
            "JOIN pages p USING (tenant, run_id, doc_sha256, page_index) "
            f"WHERE {model_routes_sql('l.route')} AND p.status = '{OK}' AND p.tenant = ? AND p.model = ? "
            "AND p.schema_hash = ?",
            [key.tenant, key.model, key.schema_hash]).fetchone()
    finally:
        con.close()
    return (float(mean), int(n)) if n else None
