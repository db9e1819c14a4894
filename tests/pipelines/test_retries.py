"""Exactly once under retries (pipelines/run/retries.py): a bundle replayed after its flush (what a runner's
retry does: the rows it flushed are written again) leaves one row per key and exit 0, the manifest counts
the superseded rows; a key whose rows name different content is a contradiction (exit 1)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.run.retries import raw_rows as raw_counts
from schemas import tables
from schemas.layout import partition
from tests.pipelines.raw import one_row_per, raw_rows
from tests.pipelines.test_waves import RENDER_ONLY, make_inputs, manifest
from transforms.output.write import WriteParquetBundles, write_rows


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
    assert m["duplicate_keys"] == {"documents": 0, "pages": 0, "ledger": 0} and m["errors"] == []
    assert m["exit_code"] == 0 and not m["resumed"]


def test_a_contradiction_is_kept_and_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `documents` rows of one URI that name different bytes: not a retry. Both stay, exit 1."""
    make_inputs(tmp_path / "in", 3)
    out = tmp_path / "out"
    assert run(tmp_path / "in", out, "c") == 0
    (first, *_) = raw_rows(out, "documents", "c")
    planted: dict[str, Any] = {**first, "doc_sha256": "0" * 64}
    write_rows(partition(str(out), "documents", "default", "c"), tables.DOCUMENTS, [planted])
    assert run(tmp_path / "in", out, "c") == 1
    m = manifest(out, "c")
    assert any("rows name different doc_sha256" in e for e in m["errors"]) and m["exit_code"] == 1
    assert len(raw_rows(out, "documents", "c")) == 4  # the evidence stays


def test_raw_counts_from_run_counts() -> None:
    counts = {"documents": 5, "pages": {"ok": 3, "failed": 1}, "totals": {"pages": 4}}
    assert raw_counts(counts) == {"documents": 5, "pages": 4, "ledger": 4}
