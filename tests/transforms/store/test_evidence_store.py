"""The evidence table goes through the store's rules as every other table does: a file whose rows are not its
folder's is nobody's, and a retried page's evidence compacts to the kept attempt's rows (schemas/kept_row.py)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.tables import sql
from schemas import layout, tables
from tests.support.attempts import write_attempt
from transforms.store import files
from transforms.store.compaction import compact_run


def evidence(doc: str, field: str, value: str, status: str, grounded: bool) -> dict:
    return {"doc_sha256": doc, "source_uri": f"s3://in/{doc}.pdf", "page_index": 0, "status": status,
            "schema_id": "invoice", "field_path": field, "value": value, "quote": value if grounded else None,
            "method": "text_layer", "grounded": grounded}


def test_an_evidence_file_planted_in_alphas_run_folder_with_bravos_rows_is_nobodys(tmp_path: Path) -> None:
    folder = Path(layout.partition(str(tmp_path), "evidence", "alpha", "a1"))
    folder.mkdir(parents=True)
    own, planted = folder / "part-own.parquet", folder / "part-planted.parquet"
    base = evidence("d1", "total", "1717.44", "ok", True)
    pq.write_table(pa.Table.from_pylist([{**base, "tenant": "alpha", "run_id": "a1"}], schema=tables.EVIDENCE), own)
    forged = {**base, "tenant": "bravo", "run_id": "b1", "value": "FORGED", "quote": "FORGED"}
    pq.write_table(pa.Table.from_pylist([forged], schema=tables.EVIDENCE), planted)
    assert files.run_files(str(tmp_path), "evidence", "alpha", "a1") == [str(own)]
    assert str(planted) in files.misfiled_run_files(str(tmp_path), "alpha", "a1")
    for tenant in (None, "alpha", "bravo"):  # as alpha, as bravo, and as an analyst of every tenant
        _, found = sql.query(str(tmp_path), "SELECT value FROM evidence", tenant=tenant)
        values = [v for (v,) in found]
        assert "FORGED" not in values
        assert values == ([] if tenant == "bravo" else ["1717.44"])


@pytest.mark.parametrize("later_file_first", [False, True])
def test_a_retried_pages_evidence_compacts_to_the_answered_attempts_rows(tmp_path: Path,
                                                                        later_file_first: bool) -> None:
    out = str(tmp_path)
    names = ("part-b.parquet", "part-a.parquet") if later_file_first else ("part-a.parquet", "part-b.parquet")
    # First attempt: an invalid answer whose total was made up; then the retry answered with the printed total.
    write_attempt(out, "evidence", [evidence("d1", "total", "9999.00", "invalid", False),
                                    evidence("d2", "total", "12.50", "ok", True)], names[0])
    write_attempt(out, "evidence", [evidence("d1", "total", "1717.44", "ok", True)], names[1])
    compacted = compact_run(out, "t", "r")
    assert compacted.get("evidence") == 2
    (only,) = files.run_files(out, "evidence", "t", "r")
    kept = {r["doc_sha256"]: (r["value"], r["grounded"]) for r in pq.read_table(only).to_pylist()}
    assert kept == {"d1": ("1717.44", True), "d2": ("12.50", True)}
