"""Exactly once under retries (pipelines/run/retries.py): a bundle replayed after its flush (what a runner's
retry does: the rows it flushed are written again) leaves one row per key and exit 0, the manifest counts
the superseded rows; a key whose rows name different content is a contradiction (exit 1)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.run.retries import raw_rows as raw_counts
from pipelines.run.retries import settle
from schemas import tables
from schemas.layout import partition
from tests.support.raw import one_row_per, raw_rows
from tests.support.wave_inputs import RENDER_ONLY, make_inputs, manifest
from transforms.store.write import WriteParquetBundles, write_rows


def replay_first_flush(monkeypatch: pytest.MonkeyPatch, table: str) -> list[int]:
    """The fault: the first flush of `table`'s writer is written a second time, as a retried bundle would."""
    replayed: list[int] = []
    flush = WriteParquetBundles.flush

    def twice(self: WriteParquetBundles) -> None:
        rows = list(self.rows)
        flush(self)
        if self.table == table and rows and not replayed:
            replayed.append(len(rows))
            self.rows = rows
            flush(self)

    monkeypatch.setattr(WriteParquetBundles, "flush", twice)
    return replayed


def run(inputs: Path, output: Path, run_id: str, *flags: str) -> int:
    return cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", run_id,
                     "--progress-every-s", "0", *RENDER_ONLY, *flags])


@pytest.mark.parametrize("table", ["pages", "documents"])
def test_a_replayed_bundle_leaves_one_row_per_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  table: str) -> None:
    make_inputs(tmp_path / "in", 6)
    replayed = replay_first_flush(monkeypatch, table)
    assert run(tmp_path / "in", tmp_path / "out", "r") == 0
    assert replayed and replayed[0] > 0  # the fault happened
    documents = one_row_per(raw_rows(tmp_path / "out", "documents", "r"), "source_uri")
    pages = one_row_per(raw_rows(tmp_path / "out", "pages", "r"), "doc_sha256", "page_index")
    assert len(documents) == len(pages) == 6
    m = manifest(tmp_path / "out", "r")
    assert m["retried_rows"] == replayed[0]
    assert m["duplicate_keys"] == {"documents": 0, "pages": 0, "ledger": 0, "evidence": 0} and m["errors"] == []
    assert m["exit_code"] == 0 and not m["resumed"]


@pytest.mark.parametrize(("table", "column"), [("documents", "doc_sha256"), ("pages", "page_hash")])
def test_a_contradiction_is_kept_and_fails_the_run(tmp_path: Path, table: str, column: str) -> None:
    """Two rows of one key that name different content (a URI's bytes, a page's pixels): not a retry. Both
    stay, exit 1. (Before, only `documents` was tested: a `pages` contradiction could be compacted silently.)"""
    make_inputs(tmp_path / "in", 3)
    out = tmp_path / "out"
    assert run(tmp_path / "in", out, "c") == 0
    rows = raw_rows(out, table, "c")
    planted: dict[str, Any] = {**rows[0], column: "0" * 64}
    write_rows(partition(str(out), table, "default", "c"), tables.SCHEMAS[table], [planted])
    assert run(tmp_path / "in", out, "c") == 1
    m = manifest(out, "c")
    assert any(e.startswith(f"{table}: 1 key(s) whose rows name different {column}") for e in m["errors"])
    assert m["exit_code"] == 1
    assert len(raw_rows(out, table, "c")) == len(rows) + 1  # the evidence stays


def test_a_pages_contradiction_leaves_pages_raw_and_the_ledger_sums_both_attempts(tmp_path: Path) -> None:
    """The ledger has no content column: a contradiction shows in `pages` (same key), whose rows stay as
    evidence; the ledger's two rows of that key are compacted with both attempts' spend, so the bill holds."""
    out = str(tmp_path)
    key = {"run_id": "r", "tenant": "t", "doc_sha256": "d", "source_uri": "a.pdf", "page_index": 0}
    write_rows(partition(out, "documents", "t", "r"), tables.DOCUMENTS,
               [{**{k: key[k] for k in ("run_id", "tenant", "doc_sha256", "source_uri")}, "outcome": "extracted"}])
    for page_hash, cost, seq in (("h1", 0.25, 1), ("h2", 0.5, 2)):
        write_rows(partition(out, "pages", "t", "r"), tables.PAGES,
                   [{**key, "status": "ok", "page_hash": page_hash, "attempt_seq": seq}])
        write_rows(partition(out, "ledger", "t", "r"), tables.LEDGER,
                   [{**key, "route": "model", "cost_usd": cost, "attempt_seq": seq}])
    counts, removed = settle(out, "t", "r", None)
    assert [e for e in counts["errors"] if "different" in e] == [
        "pages: 1 key(s) whose rows name different page_hash (a contradiction, not a retry)"]
    assert len(raw_rows(out, "pages", "r")) == 2 and removed == 1
    (ledger,) = raw_rows(out, "ledger", "r")
    assert ledger["cost_usd"] == pytest.approx(0.75)  # 0.25 + 0.5


def test_raw_counts_from_run_counts() -> None:
    counts = {"documents": 5, "pages": {"ok": 3, "failed": 1}, "totals": {"pages": 4}}
    assert raw_counts(counts) == {"documents": 5, "pages": 4, "ledger": 4}
