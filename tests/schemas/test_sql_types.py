"""schemas/sql_types.py: the SQL type of each property of a JSON Schema. Expected types are written here by
hand from the schema files (read schemas/extraction/*.json beside each expectation), never computed."""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from schemas import sql_types
from schemas.sql_types import SqlType, iso_date_pattern, merge, properties


def shipped(name: str) -> dict[str, Any]:
    return json.loads((resources.files("schemas.extraction") / f"{name}.json").read_text(encoding="utf-8"))


def typed(schema: dict[str, Any]) -> dict[str, tuple[Any, bool]]:
    """(json_transform structure, nullable) of each top-level property."""
    found = properties(schema)
    assert found is not None
    return {name: (t.structure(), t.nullable) for name, t in found.items()}


# invoice.json: ["string","null"] -> nullable VARCHAR; the two dates are strings whose pattern is
# ^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$ -> DATE; ["number","null"] -> nullable DOUBLE;
# line_items: a required array (not nullable) of objects whose four properties are all required.
INVOICE = {
    "vendor_name": ("VARCHAR", True), "invoice_number": ("VARCHAR", True), "issue_date": ("DATE", True),
    "due_date": ("DATE", True), "currency": ("VARCHAR", True), "subtotal": ("DOUBLE", True),
    "tax": ("DOUBLE", True), "total": ("DOUBLE", True),
    "line_items": ([{"description": "VARCHAR", "quantity": "DOUBLE", "unit_price": "DOUBLE", "amount": "DOUBLE"}],
                   False),
}
RECEIPT = {
    "merchant": ("VARCHAR", True), "date": ("DATE", True), "address": ("VARCHAR", True),
    "currency": ("VARCHAR", True), "total": ("DOUBLE", True),
    "items": ([{"description": "VARCHAR", "quantity": "DOUBLE", "amount": "DOUBLE"}], False),
}
# page_text.json: language nullable string (pattern ^[a-z]{2}$: not a date); lines an array of strings;
# tables an array of objects whose `rows` is an array of arrays of strings.
PAGE_TEXT = {"language": ("VARCHAR", True), "lines": (["VARCHAR"], False), "tables": ([{"rows": [["VARCHAR"]]}], False)}


@pytest.mark.parametrize(("name", "expected"), [("invoice", INVOICE), ("receipt", RECEIPT), ("page_text", PAGE_TEXT)])
def test_shipped_schemas(name: str, expected: dict[str, tuple[Any, bool]]) -> None:
    assert typed(shipped(name)) == expected
    assert all(not t.notes() for t in (properties(shipped(name)) or {}).values())


def test_scalar_types() -> None:
    schema = {"type": "object", "required": ["s", "i", "b", "d", "ts", "t", "n", "e"], "properties": {
        "s": {"type": "string"}, "i": {"type": "integer"}, "b": {"type": "boolean"},
        "d": {"type": "string", "format": "date"}, "ts": {"type": "string", "format": "date-time"},
        "t": {"type": "string", "format": "time"}, "n": {"type": ["integer", "number"]},
        "e": {"enum": ["a", "b"]}, "optional": {"type": "integer"}}}
    assert typed(schema) == {"s": ("VARCHAR", False), "i": ("BIGINT", False), "b": ("BOOLEAN", False),
                             "d": ("DATE", False), "ts": ("TIMESTAMPTZ", False), "t": ("VARCHAR", False),
                             "n": ("DOUBLE", False), "e": ("VARCHAR", False),
                             "optional": ("BIGINT", True)}  # not required: may be absent


def test_decimal_where_multiple_of_says_so() -> None:
    money = {"type": "number", "multipleOf": 0.01, "minimum": -1e9, "maximum": 1e9}  # 12 digits fit in 18
    wide = {"type": "number", "multipleOf": 0.01}  # no bounds: 38 digits
    assert typed({"type": "object", "required": ["m", "w", "q", "x", "y"], "properties": {
        "m": money, "w": wide, "q": {"type": "number", "multipleOf": 0.001, "minimum": 0, "maximum": 1e20},
        "x": {"type": "number", "multipleOf": 0.5}, "y": {"type": "number", "multipleOf": 5}}}) == {
        "m": ("DECIMAL(18,2)", False), "w": ("DECIMAL(38,2)", False), "q": ("DECIMAL(38,3)", False),
        "x": ("DOUBLE", False), "y": ("DOUBLE", False)}


def test_what_has_no_one_type_is_json_and_says_why() -> None:
    schema = {"type": "object", "required": ["one", "free", "mixed", "tuple", "nullable", "ref", "loop", "all"],
              "$defs": {"money": {"type": "number"}, "node": {"type": "object", "properties": {
                  "child": {"$ref": "#/$defs/node"}}}},
              "properties": {
                  "one": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                  "free": {"type": "object"},
                  "mixed": {"type": ["string", "integer", "null"]},
                  "tuple": {"type": "array", "prefixItems": [{"type": "string"}]},
                  "nullable": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
                  "ref": {"$ref": "#/$defs/money"},
                  "loop": {"$ref": "#/$defs/node"},
                  "all": {"allOf": [{"type": "string"}]},
                  "cased": {"type": "object", "properties": {"Id": {"type": "string"}, "id": {"type": "integer"}}},
                  "blank": {"type": "object", "properties": {"": {"type": "string"}}}}}
    found = properties(schema)
    assert found is not None
    assert {n: t.structure() for n, t in found.items()} == {
        "one": "JSON", "free": "JSON", "mixed": "JSON", "tuple": "JSON", "nullable": "DATE", "ref": "DOUBLE",
        "loop": {"child": "JSON"}, "all": "JSON",  # node -> child -> node again: JSON
        "cased": "JSON", "blank": "JSON"}  # a STRUCT cannot hold both Id and id, nor a field without a name
    assert found["nullable"].nullable and not found["ref"].nullable
    assert found["one"].notes() == ("one: oneOf of several types, kept as JSON",)
    assert found["free"].notes() == ("free: an object without properties (free-form), kept as JSON",)
    assert found["mixed"].notes() == ("mixed: several types (integer, string), kept as JSON",)
    assert found["loop"].notes() == ("loop.child: a recursive $ref, kept as JSON",)
    assert found["cased"].notes() == ("cased: property names that differ only in case, kept as JSON",)
    assert found["blank"].notes() == ("blank: a property name that is empty or has control characters, kept as JSON",)


def test_deep_nesting_is_json_below_the_limit() -> None:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(20):  # 20 arrays of arrays: the 17th level and below are JSON
        node = {"type": "array", "items": node}
    found = properties({"type": "object", "required": ["deep"], "properties": {"deep": node}})
    assert found is not None
    expected: Any = "JSON"
    for _ in range(16):
        expected = [expected]
    assert found["deep"].structure() == expected
    assert found["deep"].notes() == ("deep" + "[]" * 16 + ": nested deeper than 16 levels, kept as JSON",)


@pytest.mark.parametrize("schema", [{}, {"type": "object"}, {"type": "object", "properties": {}}, {"type": "string"},
                                    [1, 2]])
def test_a_schema_without_properties_has_no_columns(schema: Any) -> None:
    assert properties(schema) is None


@pytest.mark.parametrize(("pattern", "is_date"), [
    (r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$", True),  # the shipped schemas' spelling
    (r"^\d{4}-\d\d-\d\d$", True),
    (r"^(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]\Z", True),
    (r"[0-9]{4}-[0-9]{2}-[0-9]{2}$", False),  # not anchored at the start
    (r"^[0-9]{4}-[0-9]{2}-[0-9]{2}", False),  # nor at the end
    (r"^[0-9]{4}/[0-9]{2}/[0-9]{2}$", False),
    (r"^[0-9]{4}-[0-9a-f]{2}-[0-9]{2}$", False),
    (r"^[0-9]{4,5}-[0-9]{2}-[0-9]{2}$", False),
    (r"^\w{4}-\d{2}-\d{2}$", False),
    (r"^[^x]{4}-\d{2}-\d{2}$", False),
    (r"^[A-Z]{3}$", False),
    (r"^(?:[0-9]{4}-[0-9]{2}-[0-9]{2}|x)$", False),  # branches of different widths
    (r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(", False),  # not a regex
])
def test_iso_date_pattern(pattern: str, is_date: bool) -> None:
    assert iso_date_pattern(pattern) is is_date


def test_merge_of_two_versions() -> None:
    v1 = {"n": SqlType("BIGINT"), "s": SqlType("DATE"), "b": SqlType("BOOLEAN"),
          "items": SqlType(items=SqlType(fields=(("a", SqlType("BIGINT")),)))}
    v2 = {"n": SqlType("DOUBLE", nullable=True), "s": SqlType("VARCHAR"),
          "items": SqlType(items=SqlType(fields=(("a", SqlType("DOUBLE")), ("c", SqlType("VARCHAR"))))),
          "b": SqlType("DATE")}
    merged = {name: merge(v1[name], v2[name], name) for name in v1}
    assert {n: t.structure() for n, t in merged.items()} == {
        "n": "DOUBLE", "s": "VARCHAR", "items": [{"a": "DOUBLE", "c": "VARCHAR"}], "b": "JSON"}
    assert merged["n"].nullable
    assert merged["b"].notes() == ("b: versions of the schema disagree (BOOLEAN vs DATE), kept as JSON",)


def test_identifiers_quotes_and_literals() -> None:
    taken = {"pages", "documents"}
    names = [sql_types.identifier(n, taken) for n in
             ("invoice", "Invoice", "my-schema v2", "pages", "2026 invoices", 'x"; DROP TABLE pages; --', "")]
    assert names == ["invoice", "Invoice_2", "my_schema_v2", "pages_2", "_2026_invoices", "x___DROP_TABLE_pages____",
                     "_"]
    assert sql_types.quote('a"b') == '"a""b"'
    assert sql_types.literal("it's") == "'it''s'"
