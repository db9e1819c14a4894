"""The duplicate-key rule has one definition (transforms/store/duplicates.py) in two forms: the SQL the manifest
runs over a run's raw rows and the Python a wave's commit runs over its files' rows. Both, on the same rows
written as part files, name the keys the test planted twice, and nothing else."""
from __future__ import annotations

from pathlib import Path

from pipelines.tables import sql
from schemas import tables
from schemas.layout import partition
from transforms.store.compaction import key_problems, read_rows
from transforms.store.duplicates import duplicate_keys
from transforms.store.files import run_files
from transforms.store.write import write_rows


def _pages(run_id: str, keys: list[tuple[str, int]]) -> list[dict[str, object]]:
    return [{"tenant": "t", "run_id": run_id, "doc_sha256": d, "page_index": i} for d, i in keys]


def test_the_sql_and_the_python_forms_find_the_same_keys(tmp_path: Path) -> None:
    out = str(tmp_path)
    # Run r: (a, 0) three times and (b, 1) twice over three files; (a, 1), (b, 0), (c, 10), (c, 2) once each.
    # Another run of the same tenant repeats (c, 2): it is not r's duplicate.
    files = [[("a", 0), ("a", 1), ("b", 1)], [("a", 0), ("b", 0), ("c", 10)], [("a", 0), ("b", 1), ("c", 2)]]
    for keys in files:
        write_rows(partition(out, "pages", "t", "r"), tables.PAGES, _pages("r", keys))
    write_rows(partition(out, "pages", "t", "other"), tables.PAGES, _pages("other", [("c", 2), ("c", 2)]))
    planted = [("t", "r", "a", 0, 3), ("t", "r", "b", 1, 2)]  # counted by hand from `files`, in key order

    rows = read_rows(run_files(out, "pages", "t", "r"), "pages")
    assert len(rows) == 9
    in_python = duplicate_keys(rows, "pages")
    con = sql.connect(out, tenant="t", typed=False)
    try:
        n, in_sql = sql.duplicate_keys(con, "pages", "t", "r", limit=100)
    finally:
        con.close()
    assert in_python == planted
    assert (n, in_sql) == (len(planted), planted)
    assert key_problems(rows, "pages", None) == (True, 0)  # the commit's check reads the same rule


def test_no_key_twice_is_no_duplicate_in_either_form(tmp_path: Path) -> None:
    out = str(tmp_path)
    rows = [{"tenant": "t", "run_id": "r", "source_uri": f"s3://in/{i}.pdf"} for i in range(4)]
    write_rows(partition(out, "documents", "t", "r"), tables.DOCUMENTS, rows[:2])
    write_rows(partition(out, "documents", "t", "r"), tables.DOCUMENTS, rows[2:])
    con = sql.connect(out, tenant="t", typed=False)
    try:
        assert sql.duplicate_keys(con, "documents", "t", "r") == (0, [])
    finally:
        con.close()
    assert duplicate_keys(read_rows(run_files(out, "documents", "t", "r"), "documents"), "documents") == []
    assert key_problems(rows, "documents", None) == (False, 0)
