"""The SQL views keep the row that compaction keeps (schemas/kept_row.py's rule), before any compaction: the typed
views read that kept row per key, not every raw row, and `cost-by-run` counts every attempt's spend once."""
from __future__ import annotations

import datetime as dt
import itertools
import json
import random
import shutil
from importlib import resources
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.tables import queries, sql
from schemas import tables
from schemas.extraction import schema_hash
from schemas.layout import partition
from tests.support.attempts import page, spend, write_attempt
from transforms.store.compaction import compact_run
from transforms.store.files import run_files
from transforms.store.write import write_rows

INVOICE_HASH = schema_hash(json.loads((resources.files("schemas.extraction") / "invoice.json").read_text("utf-8")))


def invoice(total: float) -> str:
    return json.dumps({"vendor_name": "Contoso", "invoice_number": "7", "issue_date": "2026-12-01",
                       "due_date": "2026-12-31", "currency": "EUR", "subtotal": total, "tax": 0, "total": total,
                       "line_items": []})


def test_typed_views_read_the_kept_row_per_key(tmp_path: Path) -> None:
    """Page 0 answered twice (same pixels, two attempts) and then failed a third time; page 1 once. The
    invoice view has one row a page: page 0's is the later answer (an answer beats the later failure)."""
    out = str(tmp_path)
    typed = {"schema_id": "invoice", "schema_hash": INVOICE_HASH}
    write_attempt(out, "pages", [page("a", 0, "ok", extraction=invoice(1.0), **typed),
                                 page("a", 1, "ok", extraction=invoice(5.0), **typed)], "part-2.parquet")
    write_attempt(out, "pages", [page("a", 0, "ok", extraction=invoice(2.0), **typed)], "part-1.parquet")
    write_attempt(out, "pages", [page("a", 0, "failed", reason_code="engine_timeout", **typed)], "part-0.parquet")
    con = sql.connect(out, tenant="t")
    try:
        rows = con.execute("SELECT page_index, total FROM invoice ORDER BY ALL").fetchall()
        (raw,) = con.execute("SELECT count(*) FROM pages_all").fetchone()
    finally:
        con.close()
    assert raw == 4
    assert rows == [(0, 2.0), (1, 5.0)]


def test_cost_by_run_is_the_bill_of_every_attempt(tmp_path: Path) -> None:
    """Two 2-page documents; document a's bundle ran twice (its first attempt timed out on page 1), and one
    part file was written twice (a replayed flush: the same attempt, counted once). The bill is what each
    attempt spent, added up here from the rows written; `cost-by-run` says the same before and after
    compaction."""
    out = str(tmp_path)
    cost = {("a", "first"): 0.5, ("b", "first"): 0.25, ("a", "retry"): 0.125}
    first = [page(d, i, "failed" if (d, i) == ("a", 1) else "ok", extraction="{}") for d in "ab" for i in range(2)]
    write_attempt(out, "pages", first, "part-1.parquet")
    write_attempt(out, "ledger", [spend(r["doc_sha256"], r["page_index"], "failed" if r["status"] == "failed"
                                        else "model", (10, 1, 1, 1, 0.5, cost[(r["doc_sha256"], "first")], 0.0))
                                  for r in first], "part-1.parquet")
    write_attempt(out, "pages", [page("a", i, "ok", extraction="{}") for i in range(2)], "part-0.parquet")
    write_attempt(out, "ledger", [spend("a", i, "model", (10, 1, 1, 1, 0.5, cost[("a", "retry")], 0.0))
                                  for i in range(2)], "part-0.parquet")
    folder = tmp_path / "ledger" / "tenant=t" / "run_id=r"
    shutil.copy(folder / "part-0.parquet", folder / "part-00.parquet")  # the replayed flush
    bill = 2 * cost[("a", "first")] + 2 * cost[("b", "first")] + 2 * cost[("a", "retry")]  # 1.75

    def cost_by_run() -> tuple[int, int, float]:
        columns, rows = queries.run(out, "cost-by-run", tenant="t")
        (row,) = (dict(zip(columns, r, strict=True)) for r in rows)
        return row["pages"], row["output_tokens"], row["cost_usd"]

    # 4 pages; output tokens: 4 pages in the first attempt, 2 in the retry, one each.
    assert cost_by_run() == (4, 6, pytest.approx(bill))
    compact_run(out, "t", "r")
    assert cost_by_run() == (4, 6, pytest.approx(bill))


@pytest.mark.parametrize("table", ["pages", "ledger"])
def test_the_views_and_compaction_keep_the_same_row_of_every_key(tmp_path: Path, table: str) -> None:
    """Random rows (seeded): endings failed / reused / did the work / unknown, created_at and attempt_seq set
    or null (older files), spread over files; the view's row of each key is the one compaction keeps."""
    out, rng = str(tmp_path), random.Random(32)
    column, endings = {"pages": ("status", ["ok", "cached", "failed", None]),
                       "ledger": ("route", ["model", "cache", "failed", None])}[table]
    starts = [None, dt.datetime(2026, 12, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 2, tzinfo=dt.UTC)]
    files: list[list[dict[str, object]]] = [[] for _ in range(4)]
    for index in range(40):
        attempts = rng.sample(list(itertools.product(starts, [None, 1, 2, 3])), rng.randint(1, 4))
        for created, seq in attempts:  # distinct attempts: no two rows of a key tie
            rng.choice(files).append({"run_id": "r", "tenant": "t", "doc_sha256": "d", "page_index": index,
                                      column: rng.choice(endings), "created_at": created, "attempt_seq": seq,
                                      "cost_usd": rng.randint(1, 9) / 8, "page_hash": "h"})
    for rows in files:
        write_rows(partition(out, table, "t", "r"), tables.SCHEMAS[table], rows)
    con = sql.connect(out, tenant="t", typed=False)
    try:
        viewed = sorted(con.sql(f"SELECT * FROM {table}").to_arrow_table().to_pylist(), key=lambda r: r["page_index"])
    finally:
        con.close()
    compact_run(out, "t", "r")
    (only,) = run_files(out, table, "t", "r")
    kept = sorted(pq.read_table(only).to_pylist(), key=lambda r: r["page_index"])
    assert len(kept) == 40
    assert viewed == kept  # costs are eighths: their sums are exact in either order
