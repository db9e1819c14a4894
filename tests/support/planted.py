"""Output roots with planted extractions, for the typed views' tests: `pages` rows written with the real
writer (transforms/store/write.py) and run manifests as `pagemill run` writes them (`options.schema`)."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from schemas import tables
from schemas.extraction import schema_hash
from schemas.layout import manifest_path, partition
from transforms.store.write import write_rows

T0 = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)

GOOD_INVOICE = {"vendor_name": "Contoso Print & Co", "invoice_number": "INV-7", "issue_date": "2026-11-03",
                "due_date": "2026-12-03", "currency": "GBP", "subtotal": 1431.2, "tax": 286.24, "total": 1717.44,
                "line_items": [{"description": "Posters", "quantity": 100, "unit_price": 12.5, "amount": 1250},
                               {"description": "Delivery", "quantity": 1, "unit_price": 181.2, "amount": 181.2}]}
# Three values that do not fit: a total with a comma and a currency, 30 February, a quantity in words.
BAD_INVOICE = {"vendor_name": "Fabrikam", "invoice_number": "F-1", "issue_date": "2026-02-30", "due_date": None,
               "currency": "EUR", "subtotal": None, "tax": None, "total": "12,30 EUR",
               "line_items": [{"description": "Paper", "quantity": "two", "unit_price": 6.15, "amount": 12.3}]}


def page(n: int, extraction: Any, schema_id: str = "invoice", status: str = "ok", run_id: str = "r1",
         tenant: str = "default", schema: Any = None, page_index: int = 0, minutes: int = 0) -> dict[str, Any]:
    """One `pages` row of document `d<n>`; `schema` (a JSON Schema) gives its schema_hash."""
    at = T0 + dt.timedelta(minutes=minutes)
    return {"run_id": run_id, "tenant": tenant, "doc_sha256": f"d{n}", "source_uri": f"s3://bucket/doc-{n}.pdf",
            "page_index": page_index, "status": status, "schema_id": schema_id,
            "schema_hash": schema_hash(schema) if schema is not None else f"hash-of-{schema_id}",
            "extraction": extraction if isinstance(extraction, str) or extraction is None else json.dumps(extraction),
            "rendered_at": at, "extracted_at": at, "created_at": at}


def write_pages(output: Path, rows: list[dict[str, Any]]) -> None:
    by_partition: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_partition.setdefault((row["tenant"], row["run_id"]), []).append(row)
    for (tenant, run_id), part in by_partition.items():
        write_rows(partition(str(output), "pages", tenant, run_id), tables.PAGES, part)


def write_manifest(output: Path, run_id: str, schema: str, tenant: str = "default") -> None:
    """A run manifest as far as the typed views read it: the run's `--schema` (a name or a file path)."""
    path = Path(manifest_path(str(output), tenant, run_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": run_id, "tenant": tenant, "options": {"tenant": tenant, "schema": schema}}))


def evidence(n: int, field_path: str, grounded: bool | None, box: tuple[float, float, float, float] | None = None,
             run_id: str = "r1", tenant: str = "default", schema_id: str = "invoice", status: str = "ok",
             minutes: int = 0, value: str = "v") -> dict[str, Any]:
    """One `evidence` row of document `d<n>`'s first page (as `page` plants it)."""
    x0, y0, x1, y1 = box if box is not None else (None, None, None, None)
    return {"run_id": run_id, "tenant": tenant, "doc_sha256": f"d{n}", "source_uri": f"s3://bucket/doc-{n}.pdf",
            "page_index": 0, "status": status, "schema_id": schema_id, "field_path": field_path, "value": value,
            "quote": value if grounded else None, "x0": x0, "y0": y0, "x1": x1, "y1": y1,
            "method": "none" if grounded is None else "text_layer", "score": 1.0 if grounded else 0.0,
            "grounded": grounded, "created_at": T0 + dt.timedelta(minutes=minutes)}


def write_evidence(output: Path, rows: list[dict[str, Any]]) -> None:
    by_partition: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_partition.setdefault((row["tenant"], row["run_id"]), []).append(row)
    for (tenant, run_id), part in by_partition.items():
        write_rows(partition(str(output), "evidence", tenant, run_id), tables.EVIDENCE, part)
