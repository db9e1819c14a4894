"""The Arrow schema of every output table, defined once. Writers, readers and tests import these."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

import pyarrow as pa

from schemas.kept_row import ATTEMPT_SEQ
from schemas.records import DocumentRow, PageRow

# `evidence` (one row per extracted value: where its page shows it) is written before its page's `pages` row.
TABLES = ("documents", "pages", "ledger", "evidence")
# Which write of its key a row is (the writer records it; schemas/kept_row.py keeps the later attempt by it).
# Nullable: files written before this column read it as null, and rank below any attempt that has one.
ATTEMPT = pa.field(ATTEMPT_SEQ, pa.int64())

DOCUMENTS = pa.schema([
    ("run_id", pa.string()),
    ("tenant", pa.string()),
    ("source_uri", pa.string()),
    ("bytes", pa.int64()),
    ("doc_sha256", pa.string()),
    ("format", pa.string()),
    ("page_count", pa.int64()),
    ("outcome", pa.string()),
    ("reason_code", pa.string()),
    ("message", pa.string()),
    ("duplicate_of", pa.string()),
    ("quarantine_detail", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ATTEMPT,
])

PAGES = pa.schema([
    ("run_id", pa.string()),
    ("tenant", pa.string()),
    ("doc_sha256", pa.string()),
    ("source_uri", pa.string()),
    ("page_index", pa.int64()),
    ("page_hash", pa.string()),
    ("cache_key", pa.string()),
    ("config_key", pa.string()),
    ("status", pa.string()),
    ("reason_code", pa.string()),
    ("message", pa.string()),
    ("width", pa.int64()),
    ("height", pa.int64()),
    ("schema_id", pa.string()),
    ("schema_hash", pa.string()),
    ("model", pa.string()),
    ("model_revision", pa.string()),
    ("extraction", pa.string()),
    ("validation_errors", pa.list_(pa.string())),
    ("flags", pa.list_(pa.string())),
    ("hint_source", pa.string()),
    ("hint", pa.string()),
    ("hint_coverage", pa.float64()),
    ("detail", pa.string()),
    ("flag_detail", pa.list_(pa.string())),
    ("quarantine_detail", pa.string()),
    ("pdq_hash", pa.string()),
    ("rendered_at", pa.timestamp("us", tz="UTC")),
    ("extracted_at", pa.timestamp("us", tz="UTC")),
    ("created_at", pa.timestamp("us", tz="UTC")),
    # Markdown output (nullable; files written before these columns read them as null).
    ("markdown", pa.string()),
    ("primary_language", pa.string()),
    ("is_rotation_valid", pa.bool_()),
    ("rotation_correction", pa.int64()),
    ("is_table", pa.bool_()),
    ("is_diagram", pa.bool_()),
    # The PDQ of the page's low-detail rendition (--detail auto), which reuse re-checks as the gate does
    # (nullable; files written before this column read it as null, and their pages are gated again).
    ("pdq_hash_low", pa.string()),
    # Evidence (the `evidence` table): values looked for on the page, and those not found (null: not checked).
    ("evidence_values", pa.int64()),
    ("ungrounded_values", pa.int64()),
    ATTEMPT,
])

LEDGER = pa.schema([
    ("run_id", pa.string()),
    ("tenant", pa.string()),
    ("doc_sha256", pa.string()),
    ("source_uri", pa.string()),
    ("page_index", pa.int64()),
    ("route", pa.string()),
    ("model", pa.string()),
    ("image_tokens", pa.int64()),
    ("text_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("image_tokens_saved", pa.int64()),
    ("cached_prompt_tokens", pa.int64()),
    ("stop_reason", pa.string()),
    ("attempts", pa.int64()),
    ("gpu_seconds", pa.float64()),
    ("cost_usd", pa.float64()),
    ("api_equivalent_usd", pa.float64()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ATTEMPT,
])

# One row per non-empty leaf value of a page's extraction (schemas/evidence.py EvidenceRow), keyed like `pages`
# plus field_path; `status` is its page's, so that the kept row of a key follows its page's (schemas/kept_row.py).
EVIDENCE = pa.schema([
    ("run_id", pa.string()),
    ("tenant", pa.string()),
    ("doc_sha256", pa.string()),
    ("source_uri", pa.string()),
    ("page_index", pa.int64()),
    ("status", pa.string()),
    ("schema_id", pa.string()),
    ("field_path", pa.string()),
    ("value", pa.string()),
    ("quote", pa.string()),
    ("x0", pa.float64()),
    ("y0", pa.float64()),
    ("x1", pa.float64()),
    ("y1", pa.float64()),
    ("method", pa.string()),
    ("score", pa.float64()),
    ("grounded", pa.bool_()),
    ("created_at", pa.timestamp("us", tz="UTC")),
    ATTEMPT,
])

SCHEMAS: Mapping[str, pa.Schema] = {"documents": DOCUMENTS, "pages": PAGES, "ledger": LEDGER, "evidence": EVIDENCE}


def _project(row: Mapping[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """Keep exactly the schema's columns, so a record field that is not a column never leaks out."""
    return {name: row.get(name) for name in schema.names}


def document_row(row: DocumentRow, run: Mapping[str, Any]) -> dict[str, Any]:
    return _project({**asdict(row), **run}, DOCUMENTS)


def page_row(row: PageRow, run: Mapping[str, Any]) -> dict[str, Any]:
    d = asdict(replace(row, evidence=()))  # its own table's rows
    d["validation_errors"] = list(row.validation_errors)
    d["flags"] = list(row.flags)
    d["flag_detail"] = list(row.flag_detail)
    return _project({**d, **run}, PAGES)


def ledger_row(row: PageRow, run: Mapping[str, Any]) -> dict[str, Any]:
    return _project({**asdict(replace(row, evidence=())), **run}, LEDGER)


def evidence_rows(row: PageRow, run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `evidence` rows of a page's row (none for most statuses)."""
    page = {"doc_sha256": row.doc_sha256, "source_uri": row.source_uri, "page_index": row.page_index,
            "status": row.status, "schema_id": row.schema_id, **run}
    out = []
    for e in row.evidence:
        x0, y0, x1, y1 = e.box if e.box is not None else (None, None, None, None)
        out.append(_project({**page, "field_path": e.field_path, "value": e.value, "quote": e.quote, "x0": x0,
                             "y0": y0, "x1": x1, "y1": y1, "method": e.method, "score": e.score,
                             "grounded": e.grounded}, EVIDENCE))
    return out
