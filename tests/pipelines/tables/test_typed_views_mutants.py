"""Typed views' plan, without a run (mutants that stopped reading the manifests' schema files at the first one
gone, let an item field named like a key column through, or lost the reason DuckDB refused a view, survived
`make mutate`, as did `typed_columns` without the `extraction` column of a view that fell back to JSON;
docs/development.md "Mutation score")."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pipelines import cli
from pipelines.tables import typed_views
from pipelines.tables.typed_views import ITEM_INDEX, KEYS, View, item_columns, plan, schema_files
from schemas.extraction import schema_hash
from tests.support import planted
from tests.support.planted import page

ROWS = {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "object", "properties": {
    "tenant": {"type": "string"}, "item_index": {"type": "integer"}, "Run_Id": {"type": "string"},
    "amount": {"type": "number"}}}}}}


def manifest(schema: str) -> str:
    return json.dumps({"run_id": "r", "options": {"schema": schema}})


def test_a_schema_file_gone_does_not_hide_the_next_one(tmp_path: Path) -> None:
    kept = tmp_path / "b_kept.json"
    kept.write_text(json.dumps(ROWS), encoding="utf-8")
    found = schema_files([manifest(str(tmp_path / "a_gone.json")), manifest(str(kept))])
    assert found["b_kept"] == {schema_hash(ROWS): ROWS} and "a_gone" not in found


def test_item_fields_named_like_the_keys_get_their_own_columns() -> None:
    """An item view has the page's keys and `item_index` first: a field of the same name (in any case) must
    not take those columns' names (DuckDB compares names without case)."""
    views = plan({"rows_schema": {schema_hash(ROWS)}}, {"rows_schema": {schema_hash(ROWS): ROWS}})
    (items,) = [v for v in views if v.parent is not None and v.schema_id == "rows_schema"]
    names = [c.name.lower() for c in item_columns(items)]
    assert len(names) == 4 and len(set(names)) == 4
    assert not set(names) & {k.lower() for k in (*KEYS, ITEM_INDEX)}
    assert "amount" in names


def test_a_view_duckdb_refuses_becomes_json_with_the_reason() -> None:
    """The refusal is injected (a statement DuckDB cannot bind); the view falls back to the extraction as JSON."""
    con = duckdb.connect()
    con.execute("CREATE TABLE pages (tenant VARCHAR, run_id VARCHAR, doc_sha256 VARCHAR, source_uri VARCHAR, "
                "page_index BIGINT, extracted_at TIMESTAMPTZ, extraction VARCHAR, status VARCHAR, schema_id VARCHAR)")
    con.execute("INSERT INTO pages VALUES ('t', 'r', 'd', 'u', 0, NULL, '{\"a\": 1}', 'ok', 's')")
    view = View("s", "s", (), ("h",), ("typed 3 levels deep",))
    made = typed_views._made(con, view, "CREATE VIEW s AS SELECT no_such_column FROM pages")
    assert made is not None and made.columns == () and made.notes[0] == "typed 3 levels deep"
    assert made.notes[-1].startswith("DuckDB refused the types: ") and "no_such_column" in made.notes[-1]
    assert con.execute("SELECT extraction->>'a' FROM s").fetchall() == [("1",)]


def test_typed_columns_lists_the_json_column_of_a_view_without_properties(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    free = {"type": "object"}
    (tmp_path / "free.json").write_text(json.dumps(free))
    out = tmp_path / "out"
    planted.write_manifest(out, "r1", str(tmp_path / "free.json"))
    planted.write_pages(out, [page(1, {"anything": [1, 2]}, schema_id="free", schema=free)])
    capsys.readouterr()
    assert cli.main(["sql", "--output", str(out), "--format", "json",
                     "SELECT \"column\", type FROM typed_columns WHERE \"view\" = 'free'"]) == 0
    columns = {r["column"]: r["type"] for r in json.loads(capsys.readouterr().out)}
    assert columns["extraction"] == "JSON"
    assert {*KEYS, "extraction", "unfit_columns", "unfit_values"} == set(columns)
