"""Typed views stay cheap (issue 32, finding 5): a deep and wide user schema is typed only as deep as a bounded
number of parts allows, the deeper part stays JSON (and is still readable), and a statement creates only the
typed views it reads. The schema is built here; expectations are counted here from the planted values."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.tables import sql as tables_sql
from pipelines.tables import typed_views
from schemas import sql_types
from schemas.sql_types import SqlType
from tests.support import planted

LEVELS, WIDTH = 12, 60  # 12 x 62 = 744 typed parts unbounded: past the bound


def level(d: int) -> dict[str, Any]:
    props: dict[str, Any] = {f"name_{d}": {"type": "string"}, f"amount_{d}": {"type": "number"}}
    props |= {f"f{d}_{i:02d}": {"type": "integer"} for i in range(WIDTH)}
    if d < LEVELS:
        props[f"next_{d}"] = level(d + 1)
    return {"type": "object", "properties": props}


BIG = {"title": "big", **level(1)}


def value(d: int) -> dict[str, Any]:
    """Level d's answer: its name is `level-<d>`, its amount `d`; level 1's f1_00 does not fit (text)."""
    out: dict[str, Any] = {f"name_{d}": f"level-{d}", f"amount_{d}": float(d)}
    out |= {f"f{d}_{i:02d}": i for i in range(WIDTH)}
    if d == 1:
        out["f1_00"] = "zero"
    if d < LEVELS:
        out[f"next_{d}"] = value(d + 1)
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bound")
    path = folder / "big.json"
    path.write_text(json.dumps(BIG))
    out = folder / "out"
    planted.write_pages(out, [planted.page(1, value(1), schema_id="big", schema=BIG)])
    planted.write_manifest(out, "r1", str(path))
    return out


def parts(t: SqlType, depth: int = 1) -> list[int]:
    """The depth of every part of a type (itself, its fields, its items), counted here."""
    children = [c for _, c in t.fields or ()] + ([t.items] if t.items else [])
    return [depth] + [d for c in children for d in parts(c, depth + 1)]


def sql(capsys: pytest.CaptureFixture[str], output: Path, query: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli.main(["sql", "--output", str(output), "--format", "json", query]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_deep_wide_schema_is_typed_within_the_bound() -> None:
    (view,) = [v for v in typed_views.plan({"big": ["h"]}, {"big": {"h": BIG}}) if v.schema_id == "big"]
    found = [d for c in view.columns for d in parts(c.type)]
    typed = [d for c in view.columns for d, t in zip(parts(c.type), _types(c.type), strict=True) if t != "JSON"]
    assert len(found) <= sql_types.MAX_PARTS < (WIDTH + 2) * LEVELS
    deepest = max(typed)
    assert 1 < deepest < LEVELS  # cut somewhere below the top, above the bottom
    assert any(f"typed {deepest} levels deep" in n for n in view.notes)
    # The statement grows with parts x depth: bounded whatever the schema's size.
    assert len(typed_views.view_sql(view)) < sql_types.MAX_PARTS * 600


def _types(t: SqlType) -> list[str | None]:
    children = [c for _, c in t.fields or ()] + ([t.items] if t.items else [])
    return [t.scalar] + [s for c in children for s in _types(c)]


def test_the_kept_columns_answer_and_the_deep_part_is_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (row,) = sql(capsys, root, "SELECT name_1, amount_1, f1_00, f1_59, next_1, unfit_columns, unfit_values FROM big")
    assert (row["name_1"], row["amount_1"], row["f1_00"], row["f1_59"]) == ("level-1", 1.0, None, 59)
    assert (row["unfit_columns"], row["unfit_values"]) == (["f1_00"], 1)  # "zero" is not an integer
    node, d = row["next_1"], 2
    while node[f"name_{d}"] == f"level-{d}":  # typed levels: STRUCTs of typed values
        assert node[f"f{d}_07"] == 7
        node, d = node[f"next_{d}"], d + 1
    assert d <= LEVELS  # something was past the bound: JSON text from there on, every level below inside it
    below = {k: json.loads(v) for k, v in node.items()} if isinstance(node, dict) else json.loads(node)
    for deep in range(d, LEVELS + 1):
        assert (below[f"name_{deep}"], below[f"f{deep}_07"]) == (f"level-{deep}", 7)
        below = below.get(f"next_{deep}")


def test_a_statement_creates_only_the_typed_views_it_reads(root: Path) -> None:
    def views(statement: str) -> set[str]:
        con = tables_sql.connect(str(root), typed=statement)
        try:
            return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        finally:
            con.close()

    assert {"big", "invoice"}.isdisjoint(views("SELECT 1"))
    read = views("SELECT count(*) FROM invoice_line_items")
    assert {"invoice", "invoice_line_items"} <= read and "big" not in read
    assert {"big", "invoice", "typed_columns"} <= views("SHOW TABLES")  # the catalog lists every view


def test_a_view_named_only_in_a_string_is_found(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sql(capsys, root, "SELECT count(*) AS n FROM query_table('big')") == [{"n": 1}]
