"""Part files written as numbered attempts of a run: write_attempt, page, spend.
Moved from tests/transforms/store/test_compaction.py, which other test files imported."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from schemas.layout import partition
from transforms.store.write import FlushPolicy, WriteParquetBundles

# One invocation: every row it writes has the same created_at (its start), so only the attempt can order them.
STARTED = dt.datetime(2026, 12, 3, 2, 0, tzinfo=dt.UTC)


SPEND = ("image_tokens", "text_tokens", "output_tokens", "attempts", "gpu_seconds", "cost_usd", "api_equivalent_usd")


def write_attempt(out: str, table: str, rows: list[dict[str, Any]], name: str) -> None:
    """`rows` as the real writer writes them (it numbers the attempt), in one part file renamed to `name`,
    so a test decides how the files sort."""
    folder = Path(partition(out, table, "t", "r"))
    before = set(folder.glob("*.parquet")) if folder.exists() else set()
    writer = WriteParquetBundles(str(folder), table, FlushPolicy(rows=0, seconds=0))
    writer.setup()
    writer.start_bundle()
    for row in rows:
        list(writer.process({"run_id": "r", "tenant": "t", "created_at": STARTED, **row}))
    writer.finish_bundle()
    (new,) = set(folder.glob("*.parquet")) - before
    new.rename(folder / name)


def page(doc: str, index: int, status: str, **more: Any) -> dict[str, Any]:
    return {"doc_sha256": doc, "source_uri": f"s3://in/{doc}.pdf", "page_index": index, "status": status,
            "page_hash": f"{doc}-{index}", **more}


def spend(doc: str, index: int, route: str, cost: tuple[int, int, int, int, float, float, float]) -> dict[str, Any]:
    return {"doc_sha256": doc, "source_uri": f"s3://in/{doc}.pdf", "page_index": index, "route": route,
            **dict(zip(SPEND, cost, strict=True))}
