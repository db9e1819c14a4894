"""The markdown columns of `pages` (schemas/tables.py): rows written before them stay readable."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.tables import sql
from schemas import tables
from schemas.layout import partition
from schemas.records import PageRow

NEW = ("markdown", "primary_language", "is_rotation_valid", "rotation_correction", "is_table", "is_diagram")


def test_older_pages_files_read_with_null_markdown(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    run = {"run_id": "old", "tenant": "default", "created_at": now}
    row = tables.page_row(PageRow(doc_sha256="a" * 64, source_uri="a.pdf", page_index=0, status="ok",
                                  extraction="{}"), run)
    old_schema = pa.schema([f for f in tables.PAGES if f.name not in NEW])  # as written before the columns
    folder = Path(partition(str(tmp_path), "pages", "default", "old"))
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{k: row[k] for k in old_schema.names}], schema=old_schema),
                   folder / "part-0.parquet")
    new = tables.page_row(PageRow(doc_sha256="b" * 64, source_uri="b.md", page_index=0, status="ok",
                                  markdown="# Title", is_table=True, rotation_correction=90), {**run, "run_id": "new"})
    folder = Path(partition(str(tmp_path), "pages", "default", "new"))
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([new], schema=tables.PAGES), folder / "part-0.parquet")
    _, rows = sql.query(str(tmp_path), "SELECT run_id, markdown, is_table, rotation_correction FROM pages "
                                       "ORDER BY run_id")
    assert rows == [("new", "# Title", True, 90), ("old", None, None, None)]
