"""Typed views: one DuckDB view per extraction schema, with a column per top-level property in the SQL type
its JSON Schema implies (schemas/sql_types.py), and one view per array property with a row per item.

`pipelines.tables.sql.connect` calls `create` before it locks the connection. The schemas come from the output:
every schema id of an `ok` page, plus the shipped ones (empty views of the right shape before any run).
Each id's JSON Schema is the shipped file, a markdown format's front matter, or the user's file that a run
manifest names (`options.schema`); the versions whose hash the pages carry are united. Values are read with
DuckDB's `json_transform`: one that does not fit its type is NULL (TRY_CAST's rules), and each row counts
them (`unfit_values`) and names their columns (`unfit_columns`); `typed_unfit` has one row per such column.
`typed_views` and `typed_columns` say what each view holds, and where and why a column fell back to JSON.
Each top-level text, number or date column `<c>` also gets `<c>_grounded` and `<c>_box` (x0, y0, x1, y1) from the
`evidence` table's row of that field path on the page (null where none: not looked for, or an older run).
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import duckdb
import pyarrow as pa

from schemas import kept_row, sql_types
from schemas.extraction import SHIPPED_SCHEMAS, SchemaError, local_path, read_user_file, schema_hash
from schemas.sql_types import SqlType, literal, quote
from schemas.statuses import OK

KEYS = ("tenant", "run_id", "doc_sha256", "source_uri", "page_index", "extracted_at")
UNFIT_COLUMNS, UNFIT_VALUES, ITEM_INDEX = "unfit_columns", "unfit_values", "item_index"
WHOLE = "extraction"  # the column of a schema with no properties, and the unfit name of a non-object answer
RESERVED = ("documents", "pages", "ledger", "evidence", "documents_all", "pages_all", "ledger_all", "evidence_all",
            "runs", "reason_codes", "typed_views", "typed_columns", "typed_unfit")
# Words of a statement that may list or describe the views: it gets every view, as before they were lazy.
CATALOG = re.compile(r"\b(show|describe|summarize|pragma\w*|information_schema|pg_\w+|sqlite_\w+|duckdb_\w+|"
                     r"typed_views|typed_columns|typed_unfit)\b", re.IGNORECASE)
_PLANS: dict[str, list[tuple[View, str]]] = {}  # `_statements`, by digest of the schema versions
# The evidence of a top-level value: its `evidence` row's `grounded` and box (schemas/tables.py EVIDENCE).
GROUNDED, BOX = "_grounded", "_box"
EVIDENCE_KEYS = ("tenant", "run_id", "doc_sha256", "page_index")  # a page's key: the `evidence` rows' join
VIEWS = pa.schema([("view", pa.string()), ("schema_id", pa.string()), ("unnests", pa.string()),
                   ("schema_hashes", pa.list_(pa.string())), ("note", pa.string())])


@dataclass(frozen=True)
class Column:
    name: str  # the SQL column
    prop: str  # the JSON property it reads
    type: SqlType


@dataclass(frozen=True)
class Ground:
    """A column's evidence columns: `grounded` and `box` of the `evidence` row whose field path is `prop`."""

    prop: str
    grounded: str  # the SQL columns
    box: str


@dataclass(frozen=True)
class View:
    name: str
    schema_id: str
    columns: tuple[Column, ...]  # empty: the whole extraction as one JSON column
    hashes: tuple[str, ...]  # the schema versions it was typed from
    notes: tuple[str, ...]
    parent: str | None = None  # an item view: the typed view whose list column `columns[0].prop` it unnests
    grounds: tuple[Ground, ...] = ()  # evidence columns, after the unfit counts


def schema_files(manifests: Iterable[str]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """Every known version of every schema, by schema id and hash: the shipped files, the markdown formats'
    front matter, and the user files that the manifests name (those that can still be read)."""
    from transforms.model.markdown import MARKDOWN_FORMATS

    found: dict[str, dict[str, Mapping[str, Any]]] = {}
    for name in SHIPPED_SCHEMAS:
        schema = json.loads((resources.files("schemas.extraction") / f"{name}.json").read_text(encoding="utf-8"))
        found.setdefault(name, {})[schema_hash(schema)] = schema
    for fmt in MARKDOWN_FORMATS.values():
        found.setdefault(fmt.name, {})[fmt.schema.schema_hash] = fmt.schema.schema
    given = {_run_schema(m) for m in manifests}
    for source in sorted(s for s in given if isinstance(s, str) and s not in found):
        try:  # the run read this file once; it may have moved or changed since (then its hash will not match)
            path = local_path(source)
            schema = json.loads(read_user_file(path, source))
        except (SchemaError, OSError, ValueError, RecursionError):
            continue
        if isinstance(schema, dict):
            found.setdefault(path.stem, {})[schema_hash(schema)] = schema
    return found


def _run_schema(manifest: str) -> Any:
    """The `--schema` a manifest records, or None (a manifest is a file under the output root: any shape)."""
    options = json.loads(manifest).get("options")
    return options.get("schema") if isinstance(options, dict) else None


def plan(seen: Mapping[str, Iterable[str]], known: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[View]:
    """The views for the schema ids of `ok` pages (`seen`: id -> hashes) and the shipped ids: typed views
    first, then their item views, each name a unique SQL identifier (`sql_types.identifier`)."""
    taken = {r.lower() for r in RESERVED}
    ids = list(SHIPPED_SCHEMAS) + sorted(set(seen) - set(SHIPPED_SCHEMAS))
    views = [_typed_view(i, set(seen.get(i, ())), known.get(i, {}), taken) for i in ids]
    return views + [item for v in views for item in _item_views(v, taken)]


def _typed_view(schema_id: str, hashes: set[str], versions: Mapping[str, Mapping[str, Any]],
                taken: set[str]) -> View:
    notes = [f"no schema file with hash {h[:12]}... (pages of that version are typed with the others)"
             for h in sorted(hashes - set(versions)) if versions]
    used = {h: s for h, s in versions.items() if h in hashes} or dict(versions)
    merged, depth = sql_types.bounded_properties(schema for _, schema in sorted(used.items()))
    if depth < sql_types.MAX_DEPTH:
        notes.append(f"typed {depth} levels deep (the bound of {sql_types.MAX_PARTS} typed parts a view): "
                     "deeper parts are JSON, typed_columns.note says which")
    if not used:
        notes.append("no schema file found: the extraction as JSON")
    elif not merged:
        notes.append("the schema has no properties: the extraction as JSON")
    names = {k.lower() for k in (*KEYS, UNFIT_COLUMNS, UNFIT_VALUES)}
    columns = []
    for prop, t in merged.items():
        if not sql_types.usable_name(prop):
            notes.append(f"property {prop!r}: a name that is empty or has control characters is not a column")
            continue
        columns.append(Column(sql_types.identifier(prop, names), prop, t))
    # Named after every property's column, so a property `total_grounded` keeps its name.
    grounds = tuple(Ground(c.prop, sql_types.identifier(c.name + GROUNDED, names),
                           sql_types.identifier(c.name + BOX, names)) for c in columns if _groundable(c.type))
    return View(sql_types.identifier(schema_id, taken), schema_id, tuple(columns), tuple(sorted(used)),
                tuple(notes), grounds=grounds)


def _groundable(t: SqlType) -> bool:
    """A scalar the evidence looks for on the page: text, numbers, dates (not booleans, not JSON: a list's or
    an object's values are evidence rows of their own paths, `line_items[0].amount`)."""
    return t.scalar is not None and t.scalar not in (sql_types.JSON, "BOOLEAN")


def _item_views(view: View, taken: set[str]) -> list[View]:
    return [View(sql_types.identifier(f"{view.name}_{c.name}", taken), view.schema_id, (c,), view.hashes, (),
                 parent=view.name) for c in view.columns if c.type.items is not None]


def view_sql(view: View) -> str:
    """The CREATE VIEW statement of a typed view or an item view. Names and schema text reach the SQL only
    quoted (`quote`) or as literals (`literal`)."""
    keys = ", ".join(KEYS)
    if view.parent is not None:
        return _item_view_sql(view)
    source = (f"SELECT {keys}, extraction AS e, CASE WHEN json_valid(extraction) THEN extraction END AS j "
              f"FROM pages WHERE status = {literal(OK)} AND schema_id = {literal(view.schema_id)}")
    not_object = "(e IS NOT NULL AND coalesce(json_type(j), '') <> 'OBJECT')::BIGINT"
    if not view.columns:
        return (f"CREATE VIEW {quote(view.name)} AS SELECT {keys}, j::JSON AS {WHOLE}, "
                f"list_filter([CASE WHEN {not_object} > 0 THEN {literal(WHOLE)} END], lambda c: c IS NOT NULL) "
                f"AS {UNFIT_COLUMNS}, {not_object} AS {UNFIT_VALUES} FROM ({source})")
    batch = _batches(view.columns)
    parsed = ", ".join(
        f"json_transform(j, {literal(json.dumps({c.prop: c.type.structure() for c in cs}))}) AS v{i}, "
        f"json_transform(j, {literal(json.dumps({c.prop: sql_types.JSON for c in cs}))}) AS r{i}"
        for i, cs in enumerate(_grouped(view.columns, batch)))
    checked = [(c.name, _unfit(f"struct_extract(r{batch[c]}, {literal(c.prop)})", "", c.type, 1))
               for c in view.columns]
    unfit = [(WHOLE, not_object)] + [(name, expr) for name, expr in checked if expr is not None]
    named = ", ".join(f"CASE WHEN {expr} > 0 THEN {literal(name)} END" for name, expr in unfit)
    columns = ", ".join(f"struct_extract(v{batch[c]}, {literal(c.prop)}) AS {quote(c.name)}" for c in view.columns)
    grounds = "".join(f", struct_extract(g{i}, 'g') AS {quote(g.grounded)}, struct_extract(g{i}, 'b') AS {quote(g.box)}"
                      for i, g in enumerate(view.grounds))
    return (f"CREATE VIEW {quote(view.name)} AS SELECT {keys}, {columns}, "
            f"list_filter([{named}], lambda c: c IS NOT NULL) AS {UNFIT_COLUMNS}, "
            f"{_sum([expr for _, expr in unfit])}::BIGINT AS {UNFIT_VALUES}{grounds} "
            f"FROM (SELECT *, {parsed} FROM ({source})){_evidence_join(view)}")


def _evidence_join(view: View) -> str:
    """A LEFT JOIN of the view's pages to the `evidence` rows of their top-level values (of the view's schema),
    pivoted to a row per page: one hash join a view, whatever its number of columns. Each field path's kept row
    (schemas/kept_row.py) is picked by `arg_max` over its key's rows: a grouped pick that costs a third of the
    `evidence` view's window (benchmarks/bench_typed_views.py --evidence-pages)."""
    if not view.grounds:
        return ""
    paths = ", ".join(literal(g.prop) for g in view.grounds)
    found = "{'g': grounded, 'b': CASE WHEN x0 IS NOT NULL THEN {'x0': x0, 'y0': y0, 'x1': x1, 'y1': y1} END}"
    pivoted = ", ".join(f"arg_max_null(found, k) FILTER (WHERE field_path = {literal(g.prop)}) AS g{i}"
                        for i, g in enumerate(view.grounds))
    keys = ", ".join(EVIDENCE_KEYS)
    rows = (f"SELECT {keys}, field_path, {found} AS found, {kept_row.rank_sql('evidence')} AS k FROM evidence_all "
            f"WHERE field_path IN ({paths}) AND schema_id = {literal(view.schema_id)}")
    # Its keys renamed (`ON`, not `USING`): DuckDB then drops the join from a query that reads none of its columns.
    named = ", ".join(f"{k} AS ev_{k}" for k in EVIDENCE_KEYS)
    on = " AND ".join(f"{k} = ev_{k}" for k in EVIDENCE_KEYS)
    return f" LEFT JOIN (SELECT {named}, {pivoted} FROM ({rows}) GROUP BY {keys}) ON {on}"


def _batches(columns: tuple[Column, ...]) -> dict[Column, int]:
    """Which `json_transform` reads each column: DuckDB's struct fields ignore case, so properties whose
    names differ only in case (`Total`, `total`) go to different ones; JSON keys themselves match exactly."""
    seen: dict[str, int] = {}
    batch = {}
    for c in columns:
        batch[c] = seen.get(c.prop.lower(), 0)
        seen[c.prop.lower()] = batch[c] + 1
    return batch


def _grouped(columns: tuple[Column, ...], batch: dict[Column, int]) -> list[list[Column]]:
    return [[c for c in columns if batch[c] == i] for i in range(max(batch.values()) + 1)]


def _unfit(anchor: str, pointer: str, t: SqlType, depth: int) -> str | None:
    """SQL counting the values under one property that do not fit their type, or None for a JSON part (any
    value fits). The property's JSON is `anchor` (a column's JSON, or a list item's) at a JSON Pointer. Lists
    and structs are walked item by item and field by field, so a bad amount in one line item counts once; a
    leaf is cast on its own (`json_transform` to its type: the cast the view's column makes). Each part names
    its JSON by pointer and never reads the typed STRUCT, so the SQL and DuckDB's work to bind it grow with
    parts x depth (main's parent-within-child SQL made a 156 KiB schema cost 16-20 s and 4 GB)."""
    if t.scalar == sql_types.JSON:
        return None
    raw = f"json_extract({anchor}, {literal(pointer)})" if pointer else anchor
    absent = f"coalesce(json_type({raw}), 'NULL') = 'NULL'"  # a missing key (SQL NULL) or a JSON null
    if t.scalar is not None:
        return f"(NOT {absent} AND json_transform({raw}, {literal(json.dumps(t.scalar))}) IS NULL)::BIGINT"
    if t.fields is not None:
        inner = [_unfit(anchor, f"{pointer}/{_pointer_step(n)}", ft, depth) for n, ft in t.fields]
        return (f"(CASE WHEN {absent} THEN 0 WHEN json_type({raw}) <> 'OBJECT' THEN 1 "
                f"ELSE {_sum([i for i in inner if i is not None] or ['0'])} END)")
    assert t.items is not None
    z = f"z{depth}"  # one lambda variable a level: nested lists see their parents' items
    item = _unfit(z, "", t.items, depth + 1)
    items = f"json_transform({raw}, '[\"JSON\"]')"
    counted = f"coalesce(list_sum(list_transform({items}, lambda {z}: {item})), 0)" if item else "0"
    return f"(CASE WHEN {absent} THEN 0 WHEN json_type({raw}) <> 'ARRAY' THEN 1 ELSE {counted} END)"


def _pointer_step(name: str) -> str:
    """One key as a JSON Pointer step (RFC 6901: `~` is `~0`, `/` is `~1`)."""
    return name.replace("~", "~0").replace("/", "~1")


def _sum(terms: list[str]) -> str:
    """`terms` added as a balanced tree: a left-deep chain of thousands passes DuckDB's expression depth limit."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return f"({_sum(terms[:half])} + {_sum(terms[half:])})"


def item_columns(view: View) -> tuple[Column, ...]:
    """The columns of an item view after its keys and `item_index`: the item's fields, or `value`."""
    (column,) = view.columns
    item = column.type.items
    assert item is not None
    if item.fields is None:
        return (Column("value", "", item),)  # prop: the item's field ("": the item itself)
    names = {k.lower() for k in (*KEYS, ITEM_INDEX)}
    return tuple(Column(sql_types.identifier(f, names), f, t) for f, t in item.fields)


def _item_view_sql(view: View) -> str:
    assert view.parent is not None
    values = ", ".join(f"struct_extract(item, {literal(c.prop)}) AS {quote(c.name)}" if c.prop else
                       f"item AS {quote(c.name)}" for c in item_columns(view))
    keys, column, parent = ", ".join(KEYS), quote(view.columns[0].name), quote(view.parent)
    # unnest and generate_subscripts side by side: measured 2-6x quicker here than a lateral WITH ORDINALITY
    return (f"CREATE VIEW {quote(view.name)} AS SELECT {keys}, i - 1 AS {ITEM_INDEX}, {values} FROM ("
            f"SELECT {keys}, unnest({column}) AS item, generate_subscripts({column}, 1) AS i FROM {parent})")


def create(con: duckdb.DuckDBPyConnection, manifests: Iterable[str], statement: str | None = None) -> None:
    """Create the typed views in `con` (which has `pages`): every one, with `typed_views`, `typed_columns` and
    `typed_unfit`; or, given the one `statement` the connection is for, only the views it reads (`tables_read`):
    DuckDB binds a view's SQL when it is created, so a statement pays only for the views it uses.
    A view DuckDB refuses becomes the extraction as JSON, with the reason as its note."""
    named = None if statement is None else tables_read(con, statement)
    if named is not None and named <= {r.lower() for r in RESERVED}:
        return  # `SELECT 1`, or only the tables: no schema need be read
    seen = dict(con.execute(
        "SELECT schema_id, coalesce(list(DISTINCT schema_hash) FILTER (WHERE schema_hash IS NOT NULL), []) "
        f"FROM pages_all WHERE status = {literal(OK)} AND schema_id IS NOT NULL GROUP BY ALL").fetchall())
    planned = _statements(seen, schema_files(manifests))
    wanted = None if named is None else _with_parents(named, [v for v, _ in planned])
    made = [_made(con, view, ddl) for view, ddl in planned if wanted is None or view.name in wanted]
    if wanted is not None:
        return
    views = [{"view": v.name, "schema_id": v.schema_id, "unnests": v.parent, "schema_hashes": list(v.hashes),
              "note": "; ".join(v.notes) or None} for v in made if v is not None]
    columns = [row for v in made if v is not None for row in _column_rows(v)]
    con.register("typed_views", pa.Table.from_pylist(views, schema=VIEWS))
    # Types as DuckDB states them (duckdb_columns binds a view only when this is read, not at every connect).
    described = ", ".join(f"({literal(r['view'])}, {literal(r['column'])}, {_sql_value(r['nullable'])}, "
                          f"{_sql_value(r['property'])}, {_sql_value(r['note'])})" for r in columns)
    con.execute(
        'CREATE VIEW typed_columns AS SELECT c.table_name AS "view", c.column_name AS "column", c.data_type AS type, '
        "m.nullable::BOOLEAN AS nullable, m.property::VARCHAR AS property, m.note::VARCHAR AS note "
        f"FROM duckdb_columns() c JOIN (VALUES {described}) m(v, col, nullable, property, note) "
        "ON m.v = c.table_name AND m.col = c.column_name "
        "WHERE c.database_name = current_database() AND c.schema_name = current_schema() "
        "ORDER BY c.table_name, c.column_index")
    unfit = " UNION ALL ".join(
        f"SELECT tenant, run_id, doc_sha256, source_uri, page_index, {literal(v['view'])} AS {quote('view')}, "
        f"unnest({UNFIT_COLUMNS}) AS {quote('column')} FROM {quote(v['view'])}" for v in views if not v["unnests"])
    con.execute(f"CREATE VIEW typed_unfit AS {unfit}")


def _made(con: duckdb.DuckDBPyConnection, view: View, ddl: str) -> View | None:
    """Create one view; one DuckDB refuses becomes the extraction as JSON (an item view: none)."""
    try:
        con.execute(ddl)
        return view
    except duckdb.Error as err:
        if view.parent is not None:
            return None
        why = " ".join(str(err).split())[:200]
        view = View(view.name, view.schema_id, (), view.hashes, (*view.notes, f"DuckDB refused the types: {why}"))
        con.execute(view_sql(view))
        return view


def _statements(seen: Mapping[str, Iterable[str]],
                known: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[tuple[View, str]]:
    """`plan` and each view's SQL, made once per process for the same schemas (keyed by their hashes)."""
    digest = hashlib.sha256(json.dumps([sorted((k, sorted(v)) for k, v in seen.items()),
                                        sorted((k, sorted(v)) for k, v in known.items())]).encode()).hexdigest()
    if digest not in _PLANS:
        if len(_PLANS) >= 16:  # a long-lived process (a notebook) over many roots: keep the newest few
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[digest] = [(v, view_sql(v)) for v in plan(seen, known)]
    return _PLANS[digest]


def tables_read(con: duckdb.DuckDBPyConnection, statement: str) -> set[str] | None:
    """The tables and views one statement reads (lower case), or None for all of them: a statement that may
    list the catalog (SHOW, DESCRIBE, information_schema, duckdb_views(), typed_columns ...) or whose tables
    DuckDB cannot name. A view named only inside a string (`query_table('invoice')`) is missed: the caller
    retries such a statement with every view (pipelines/tables/sql.py `query`)."""
    if CATALOG.search(statement):
        return None
    try:
        return {n.lower() for n in con.get_table_names(statement)}
    except duckdb.Error:
        return None


def _with_parents(named: set[str], views: list[View]) -> set[str]:
    chosen = {v.name for v in views if v.name.lower() in named}
    return chosen | {v.parent for v in views if v.name in chosen and v.parent is not None}


def _column_rows(view: View) -> list[dict[str, Any]]:
    """One typed_columns row per column of a view: the keys, the typed columns, the unfit counts."""
    own = item_columns(view) if view.parent is not None else view.columns
    parent = f"{view.columns[0].prop}[]" if view.parent is not None else ""
    meta = [*KEYS, *((ITEM_INDEX,) if parent else ()), *((WHOLE,) if not own else ())]
    rows = [{"view": view.name, "column": name, "nullable": None, "property": None, "note": None} for name in meta]
    rows += [{"view": view.name, "column": c.name, "nullable": c.type.nullable,
              "property": (f"{parent}.{c.prop}" if c.prop else parent) if parent else c.prop,
              "note": "; ".join(c.type.notes()) or None} for c in own]
    if not parent:
        rows += [{"view": view.name, "column": n, "nullable": None, "property": None, "note": None}
                 for n in (UNFIT_COLUMNS, UNFIT_VALUES)]
    for g in view.grounds:  # read from the `evidence` table, not from the extraction: no property
        rows += [{"view": view.name, "column": name, "nullable": None, "property": None,
                  "note": f"evidence of {g.prop!r}: {what} (the evidence table; null: not looked for)"}
                 for name, what in ((g.grounded, "found on its page"), (g.box, "its box on the page, 0-1"))]
    return rows


def _sql_value(value: str | bool | None) -> str:
    if value is None:
        return "NULL"
    return str(value).upper() if isinstance(value, bool) else literal(value)
