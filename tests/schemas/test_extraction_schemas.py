"""The shipped extraction schemas, the schema loader and its checks, and what xgrammar 0.2.8 enforces.

The grammar tests use xgrammar's own matcher (`xgrammar.testing._is_grammar_accept_string`): a string
the grammar rejects is one the engine can never emit under constrained decoding.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from schemas.extraction import (
    SHIPPED_SCHEMAS,
    ExtractionSchema,
    SchemaError,
    check_schema,
    load_schema,
    schema_hash,
)

try:  # the grammar tests need xgrammar (it comes with vllm); everything else runs without it
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string as _accepts
except ImportError:
    xgr = None
    _accepts = None
needs_matcher = pytest.mark.skipif(_accepts is None, reason="needs xgrammar's _is_grammar_accept_string")

VALID: dict[str, dict[str, Any]] = {
    "invoice": {
        "vendor_name": "Müller & Söhne GmbH",
        "invoice_number": "INV-2024/0042",
        "issue_date": "2024-05-03",
        "due_date": None,
        "currency": "EUR",
        "subtotal": 1037.39,
        "tax": 197.11,
        "total": 1234.5,
        "line_items": [
            {"description": "Consulting (May)", "quantity": 10, "unit_price": 100.0, "amount": 1000.0},
            {"description": "Travel: Berlin → Köln", "quantity": 1, "unit_price": None, "amount": 37.39},
        ],
    },
    "receipt": {
        "merchant": "Café Central",
        "date": "2024-01-31",
        "address": "Herrengasse 14, 1010 Wien",
        "currency": None,
        "total": 10.5,
        "items": [{"description": "Coffee", "quantity": 2, "amount": 7.0}],
    },
    "page_text": {
        "language": "de",
        "lines": ["RECHNUNG Nr. 2024-0042", "Sehr geehrte Damen und Herren,", "Summe: 1.234,50 €"],
        "tables": [{"rows": [["Pos", "Menge", "Betrag"], ["1", "10", ""]]}],
    },
}
# A free-text string field of each schema, to poke at: (path of keys/indices).
TEXT_FIELD = {"invoice": ("vendor_name",), "receipt": ("merchant",), "page_text": ("lines", 0)}


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


INVALID: list[tuple[str, dict[str, Any]]] = [
    ("invoice", {k: v for k, v in VALID["invoice"].items() if k != "due_date"}),  # required
    ("invoice", {**VALID["invoice"], "notes": None}),  # additionalProperties
    ("invoice", {**VALID["invoice"], "issue_date": "2024-13-01"}),
    ("invoice", {**VALID["invoice"], "issue_date": "03.05.2024"}),
    ("invoice", {**VALID["invoice"], "issue_date": ""}),  # absent is null, not ""
    ("invoice", {**VALID["invoice"], "currency": "eur"}),
    ("invoice", {**VALID["invoice"], "total": 1e10}),
    ("invoice", {**VALID["invoice"], "total": "1234.50"}),
    ("invoice", {**VALID["invoice"], "invoice_number": "INV@42"}),
    ("invoice", {**VALID["invoice"], "line_items": VALID["invoice"]["line_items"] * 11}),  # 22 > 20
    ("invoice", _set(VALID["invoice"], ("line_items", 0, "quantity"), 2e6)),
    ("receipt", {**VALID["receipt"], "merchant": "x" * 81}),
    ("receipt", {**VALID["receipt"], "merchant": "tab\there"}),
    ("receipt", {**VALID["receipt"], "merchant": 'say "hi"'}),
    ("receipt", {**VALID["receipt"], "items": [{"description": "x", "amount": 1}]}),
    ("page_text", {**VALID["page_text"], "language": "deu"}),
    ("page_text", {**VALID["page_text"], "lines": [""]}),
    ("page_text", {**VALID["page_text"], "lines": ["x"] * 61}),
    ("page_text", {**VALID["page_text"], "tables": [{"rows": [["c"] * 9]}]}),
]


def _validator(name: str) -> Draft202012Validator:
    schema = load_schema(name).schema
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _write(tmp_path: Path, schema: Any, name: str = "user.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(schema), encoding="utf-8")
    return path


def _user_schema(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@pytest.mark.parametrize("name", SHIPPED_SCHEMAS)
def test_shipped_schema_loads_and_passes_strict_checks(name: str) -> None:
    loaded = load_schema(name)
    assert loaded.schema_id == name
    assert loaded.source == f"shipped:{name}"
    assert loaded.schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert loaded.schema["title"] == f"pagemill/extraction/{name}/v1"
    canonical = json.dumps(loaded.schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert loaded.schema_hash == hashlib.sha256(canonical.encode()).hexdigest() == schema_hash(loaded.schema)
    assert check_schema(loaded.schema, strict=True) == []


def test_schema_hash_ignores_key_order_and_keys_dicts() -> None:
    a = load_schema("receipt")
    reordered = dict(reversed(list(a.schema.items())))
    assert schema_hash(reordered) == a.schema_hash
    same = ExtractionSchema("receipt", a.schema_hash, reordered, "elsewhere")
    assert {a: 1}[same] == 1  # eq/hash go by id and hash, so a DoFn can cache per schema


@pytest.mark.parametrize("name", SHIPPED_SCHEMAS)
def test_valid_example_validates(name: str) -> None:
    assert list(_validator(name).iter_errors(VALID[name])) == []


@pytest.mark.parametrize(("name", "doc"), INVALID, ids=[f"{n}-{i}" for i, (n, _) in enumerate(INVALID)])
def test_invalid_example_fails(name: str, doc: dict[str, Any]) -> None:
    assert list(_validator(name).iter_errors(doc)) != []


# --- user schemas -------------------------------------------------------------------------------------


def test_user_schema_by_path_and_file_uri(tmp_path: Path) -> None:
    schema = _user_schema(title={"type": "string"})  # unbounded, but allowed outside strict mode
    path = _write(tmp_path, schema, "my_form.json")
    by_path = load_schema(str(path))
    by_uri = load_schema(path.as_uri())
    assert by_path == by_uri
    assert by_path.schema_id == "my_form"
    assert by_path.source == str(path)
    with pytest.raises(SchemaError, match="unbounded string"):
        load_schema(str(path), strict=True)


def test_user_schema_with_max_length_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, _user_schema(name={"type": "string", "maxLength": 20}))
    with pytest.raises(SchemaError, match="maxLength") as info:
        load_schema(str(path))
    assert info.value.problems[0].startswith("/properties/name: `maxLength` is not supported")
    assert "control characters" in str(info.value)


def test_min_length_is_rejected_even_with_pattern() -> None:
    schema = _user_schema(name={"type": "string", "pattern": "^[a-z]{0,9}$", "minLength": 2})
    assert any("minLength" in p for p in check_schema(schema))


def test_invalid_json_schema_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, {"type": 12})
    with pytest.raises(SchemaError, match="not a valid JSON Schema") as info:
        load_schema(str(path))
    assert str(path) in str(info.value)
    assert check_schema({"type": "object", "properties": {"a": {"pattern": "("}}}) != []  # bad regex


@pytest.mark.parametrize(
    ("text", "expected"),
    [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object"), ("\xff", "UnicodeDecodeError")],
)
def test_unreadable_user_file(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(SchemaError, match=expected):
        load_schema(str(path))


def test_unknown_names_and_schemes() -> None:
    shipped = r"no shipped schema named 'invoices' \(shipped: invoice, receipt, page_text\)"
    with pytest.raises(SchemaError, match=shipped):
        load_schema("invoices")
    with pytest.raises(SchemaError, match="no such file"):
        load_schema("missing/invoice.json")
    with pytest.raises(SchemaError, match="unsupported URI"):
        load_schema("gs://bucket/schema.json")
    assert check_schema({"$schema": "https://example.com/nope"}) == ["unknown $schema 'https://example.com/nope'"]


E = {"type": "string", "enum": ["a", "b"]}


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"allOf": [E, {"const": "a"}]}, "allOf"),
        ({**E, "not": {"const": "a"}}, "not"),
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        ({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, "dependentSchemas"),
        ({"type": "array", "items": E, "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "items": E, "contains": {"const": "b"}}, "contains"),
        ({"$ref": "https://example.com/schema.json"}, "$ref"),
        ({"type": "string", "pattern": "^(?!x)[a-z]{0,3}$"}, "lookaround"),
        ({"type": "array", "items": E, "uniqueItems": False}, "uniqueItems"),  # vLLM refuses even false
        ({"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5}, "multipleOf"),
        ({"type": "string", "format": "regex"}, "format 'regex'"),
        ({"type": "object", "properties": {"a": E}, "patternProperties": {"^x": E}}, "patternProperties"),
        ({"type": "object", "patternProperties": {"^x": E, "^y": E}}, "patternProperties"),
        ({"type": "object", "properties": {"a": E}, "propertyNames": {"enum": ["a"]}}, "propertyNames"),
        ({"type": "string", "pattern": "^[a-z]{1,129}$"}, "more than 128 times"),
        ({"type": "string", "pattern": "^([a-z]{1,8} ){200}$"}, "more than 128 times"),
    ],
)
def test_keywords_xgrammar_ignores_are_rejected(schema: dict[str, Any], keyword: str) -> None:
    problems = check_schema(_user_schema(field=schema))
    assert any(keyword in p and p.startswith("/properties/field") for p in problems), problems


def test_supported_keywords_pass_for_user_schemas() -> None:
    schema = _user_schema(
        a={"anyOf": [E, {"type": "null"}]},
        b={"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
        c={"type": "integer", "exclusiveMinimum": 0, "maximum": 100},
        d={"type": "string", "format": "date", "pattern": "^[0-9-]{0,128}$"},
        e={"type": "array", "items": E, "minItems": 1, "maxItems": 3},
        f={"$ref": "#/$defs/e"},
    )
    schema["$defs"] = {"e": E}
    assert check_schema(schema) == []


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ({"type": "string"}, "unbounded string"),
        ({"type": "string", "pattern": "[a-z]{0,4}"}, "anchored"),
        ({"type": "string", "pattern": "^[a-z]+$"}, "unbounded quantifier"),
        ({"type": "string", "pattern": "^[a-z]{2,}$"}, "unbounded quantifier"),
        ({"type": "string", "format": "email"}, "unbounded string"),
        ({"type": "number", "minimum": 0}, "unbounded number"),
        ({"type": "array", "items": E}, "unbounded array"),
        ({"type": "object", "properties": {"a": E}, "required": ["a"]}, "open object"),
        ({"type": "object", "properties": {"a": E}, "additionalProperties": False}, "optional properties"),
        ({"oneOf": [E, {"type": "null"}]}, "oneOf"),
        ({}, "accepts any value"),
        ({"$ref": "#"}, "recursive"),
    ],
)
def test_strict_mode_rejects_unbounded_output(field: dict[str, Any], expected: str) -> None:
    schema = _user_schema(field=field)
    assert check_schema(schema) == []  # fine for a user schema: real models stop; random ones may not
    problems = check_schema(schema, strict=True)
    assert any(expected in p for p in problems), problems


def test_strict_mode_allows_bounded_patterns_with_brackets_and_escapes() -> None:
    field = {"type": ["string", "null"], "pattern": "^[*+]{0,3}\\+?[0-9]{1,4}(\\.[0-9]{1,2})?$"}
    assert check_schema(_user_schema(field=field), strict=True) == []


# --- what xgrammar's grammar for each shipped schema admits --------------------------------------------

def _grammar(schema: Any) -> Any:
    # As vLLM 0.32 compiles it with disable_any_whitespace: compact JSON, "," and ":" without spaces.
    return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))


@pytest.fixture(scope="module", params=SHIPPED_SCHEMAS)
def shipped(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, _grammar(load_schema(request.param).schema)


def _text(doc: Any) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


@needs_matcher
def test_grammar_accepts_valid_example(shipped: tuple[str, Any]) -> None:
    name, grammar = shipped
    assert _accepts(grammar, _text(VALID[name]))
    # xgrammar emits properties in schema order only; any other order is never generated.
    reordered = dict(reversed(list(VALID[name].items())))
    assert not _accepts(grammar, _text(reordered))


@needs_matcher
@pytest.mark.parametrize("control", ["\x00", "\x01", "\x0c", "\t", "\n"])
def test_grammar_rejects_control_characters_in_strings(shipped: tuple[str, Any], control: str) -> None:
    name, grammar = shipped
    marked = _text(_set(VALID[name], TEXT_FIELD[name], "ab@@cd"))
    assert _accepts(grammar, marked.replace("@@", "x"))  # the probe itself is fine
    assert not _accepts(grammar, marked.replace("@@", control))  # raw: not even strict JSON
    escaped = json.dumps(control)[1:-1]  # \u0000, \t, \n ...
    assert not _accepts(grammar, marked.replace("@@", escaped))


@needs_matcher
def test_grammar_rejects_quote_and_backslash_escapes() -> None:
    # xgrammar never emits escapes inside pattern strings; the text class excludes " and \ to match.
    grammar = _grammar(load_schema("receipt").schema)
    for value in ['say \\"hi\\"', "back\\\\slash", "\\u0041"]:
        assert not _accepts(grammar, _text(VALID["receipt"]).replace("Café Central", value))


@needs_matcher
@pytest.mark.parametrize(
    ("name", "path", "value"),
    [
        ("invoice", ("invoice_number",), "INV@42"),  # '@' is outside the class
        ("invoice", ("currency",), "EUR1"),
        ("invoice", ("currency",), "eur"),
        ("invoice", ("issue_date",), "2024-13-01"),
        ("invoice", ("issue_date",), ""),
        ("invoice", ("total",), 1e10),
        ("invoice", ("vendor_name",), "x" * 81),
        ("receipt", ("items", 0, "quantity"), 2e6),
        ("page_text", ("language",), "EN"),
        ("page_text", ("lines", 0), ""),
        ("page_text", ("tables", 0, "rows", 0, 0), "y" * 41),
    ],
)
def test_grammar_rejects_out_of_bounds_values(name: str, path: tuple[Any, ...], value: Any) -> None:
    grammar = _grammar(load_schema(name).schema)
    assert not _accepts(grammar, _text(_set(VALID[name], path, value)))


@needs_matcher
def test_grammar_rejects_extra_items_and_properties() -> None:
    grammar = _grammar(load_schema("invoice").schema)
    assert not _accepts(grammar, _text({**VALID["invoice"], "notes": None}))
    items = [VALID["invoice"]["line_items"][0]] * 21
    assert not _accepts(grammar, _text({**VALID["invoice"], "line_items": items}))
    assert _accepts(grammar, _text({**VALID["invoice"], "line_items": items[:20]}))


@needs_matcher
@pytest.mark.parametrize(
    ("pattern", "dot", "other"), [("^[.]{0,3}$", '"."', '"!"'), ("^[A-Z.]{0,3}$", '"A.B"', '"A!B"'),
                                  ("^A\\.B$", '"A.B"', '"AxB"'), ("^A[.]B$", '"A.B"', '"AxB"')],
)
def test_grammar_takes_dot_in_a_class_literally(pattern: str, dot: str, other: str) -> None:
    # Reported as a pitfall ("[.] is read as any char"); in 0.2.8 all these forms match a literal dot only.
    grammar = _grammar({"type": "string", "pattern": pattern})
    assert _accepts(grammar, dot)
    assert not _accepts(grammar, other)


@needs_matcher
@pytest.mark.parametrize(
    ("schema", "violating"),
    [
        ({"type": "string", "maxLength": 5}, '"a\x01b"'),  # mlc-ai/xgrammar#800: raw control char
        ({"type": "string", "pattern": "^[a-z]{0,9}$", "maxLength": 2}, '"abcd"'),
        ({"allOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"const": 9}]}, "1"),
        ({"type": "string", "enum": ["a", "b"], "not": {"const": "a"}}, '"a"'),
        ({"type": "array", "items": {"enum": ["a"]}, "uniqueItems": True, "maxItems": 3}, '["a","a"]'),
        ({"type": "string", "pattern": "^(?!x)[a-z]{0,3}$"}, '"xa"'),
        ({"$ref": "https://example.com/x.json"}, "12"),
    ],
)
def test_xgrammar_still_ignores_what_check_schema_rejects(schema: dict[str, Any], violating: str) -> None:
    # If one of these starts failing, xgrammar now enforces the keyword: check_schema may stop rejecting it.
    if "$ref" not in schema:  # jsonschema would try to fetch the remote reference
        try:
            assert list(Draft202012Validator(schema).iter_errors(json.loads(violating))) != []
        except json.JSONDecodeError:
            pass  # a raw control character: not even strict JSON
    assert _accepts(_grammar(schema), violating)
    assert check_schema(schema) != []


@pytest.mark.skipif(xgr is None, reason="needs xgrammar")
def test_xgrammar_compile_errors_are_reported() -> None:
    problems = check_schema(_user_schema(word={"type": "string", "pattern": "^\\bab$"}))
    assert len(problems) == 1 and problems[0].startswith("xgrammar cannot compile the schema: ")
    assert "Word boundary" in problems[0] and "json_schema_converter" not in problems[0]


def test_deeply_nested_schema_is_rejected_without_recursing(tmp_path: Path) -> None:
    nested: dict[str, Any] = E
    for _ in range(32):  # 65 levels of JSON objects; vLLM refuses more than 64
        nested = {"type": "object", "properties": {"a": nested}}
    assert check_schema(nested) == ["nested more than 64 levels deep (vLLM refuses it)"]
    assert check_schema(nested["properties"]["a"]) == []
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SchemaError, match="not valid JSON: RecursionError"):
        load_schema(str(path))


@pytest.mark.slow
def test_check_schema_rejects_whatever_vllm_refuses_for_xgrammar() -> None:
    backend = pytest.importorskip("vllm.v1.structured_output.backend_xgrammar")
    refuses = backend.has_xgrammar_unsupported_json_features
    for name in SHIPPED_SCHEMAS:
        assert not refuses(load_schema(name).schema)
    candidates = [
        {"type": "number", "minimum": 0, "maximum": 9, "multipleOf": 0.5},
        {"type": "array", "items": E, "uniqueItems": False},
        {"type": "array", "items": E, "contains": E},
        {"type": "string", "format": "regex"},
        {"type": "string", "pattern": "^[a-z]{0,5}$", "maxLength": 3},
        {"type": "string", "format": "date", "minLength": 3},
        {"type": "object", "propertyNames": {"pattern": "^a$"}, "properties": {"a": E}},
        {"type": "object", "propertyNames": {"pattern": "^a$"}, "unevaluatedProperties": False},
        {"type": "object", "properties": {"a": E}, "patternProperties": {"^x": E}},
        {"type": "object", "patternProperties": {"^x": E, "^y": E}},
        {"allOf": [E, {"const": "a"}]},
    ]
    for field in candidates:
        schema = _user_schema(field=field)
        assert refuses(schema), field  # else vLLM changed: the rule may be stale
        assert check_schema(schema, compile_grammar=False) != [], field
