"""retries.py's settle and contradictions on part files written by hand, in seconds (mutants that the pipeline
runs of tests/pipelines/test_retries.py let through, `make mutate`; docs/development.md "Mutation score"): a run
without a repeated key settles with 0 retried rows, and a contradiction is found whatever the order of the tables
asked about (the ledger, which names no content, first)."""
from __future__ import annotations

from pathlib import Path

from pipelines.run.retries import contradictions, settle
from schemas import tables
from schemas.layout import partition
from transforms.store.write import write_rows


def write(out: str, table: str, rows: list[dict]) -> None:
    write_rows(partition(out, table, "acme", "r"), tables.SCHEMAS[table],
               [{"run_id": "r", "tenant": "acme", **row} for row in rows])


def one_page_each(out: str, page_hash: str = "p1") -> None:
    write(out, "documents", [{"source_uri": "a.pdf", "doc_sha256": "d1", "outcome": "extracted", "page_count": 1}])
    write(out, "pages", [{"source_uri": "a.pdf", "doc_sha256": "d1", "page_index": 0, "page_hash": page_hash,
                          "status": "ok"}])
    write(out, "ledger", [{"doc_sha256": "d1", "page_index": 0, "page_hash": page_hash}])


def test_a_run_without_a_repeated_key_settles_with_no_retried_rows(tmp_path: Path) -> None:
    one_page_each(str(tmp_path))
    counts, retried = settle(str(tmp_path), "acme", "r", None)
    assert retried == 0
    assert counts["duplicate_keys"] == {"documents": 0, "pages": 0, "ledger": 0, "evidence": 0}
    assert counts["errors"] == []


def test_a_contradiction_is_found_after_the_ledger_in_the_tables_asked_about(tmp_path: Path) -> None:
    out = str(tmp_path)
    one_page_each(out, "p1")
    one_page_each(out, "p2")  # the same keys again, the page naming other pixels
    (line,) = contradictions(out, "acme", "r", None, ["ledger", "pages"])
    assert line.startswith("pages: 1 key(s)") and "page_hash" in line
