"""Post-filter: strict parsing, validation, reason codes and error strings."""

from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Any

import pytest

from schemas.extraction import ExtractionSchema, load_schema, schema_hash
from schemas.reasons import INVALID_JSON, SCHEMA_INVALID, TRUNCATED
from transforms.model.postfilter import MAX_ERROR_CHARS, SchemaValidator, ValidationResult

PAGE = {"language": "en", "lines": ["INVOICE No. 42", "Total: 10.50 EUR"], "tables": []}
PAGE_TEXT = json.dumps(PAGE)


def _schema(schema: dict[str, Any], schema_id: str = "test") -> ExtractionSchema:
    return ExtractionSchema(schema_id, schema_hash(schema), schema, "test")


@pytest.fixture(scope="module")
def page_text() -> SchemaValidator:
    return SchemaValidator(load_schema("page_text"))


@pytest.mark.parametrize("finish_reason", ["stop", None, "length"])
def test_valid_output(page_text: SchemaValidator, finish_reason: str | None) -> None:
    # "length" with a complete document: json.loads proves it was complete, so it stands.
    assert page_text.parse_and_validate(PAGE_TEXT, finish_reason) == ValidationResult(True, PAGE, (), None)


def test_validator_pickles(page_text: SchemaValidator) -> None:
    copy = pickle.loads(pickle.dumps(page_text))
    assert copy.schema == page_text.schema and copy.max_errors == page_text.max_errors
    assert copy.parse_and_validate(PAGE_TEXT, "stop").ok
    assert copy.parse_and_validate('{"lines": []}', "stop").reason_code == SCHEMA_INVALID


def test_result_is_frozen(page_text: SchemaValidator) -> None:
    result = page_text.parse_and_validate(PAGE_TEXT, "stop")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ok = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "Expecting value"),
        ("not json", "Expecting value"),
        ('{"language": "en"} trailing', "Extra data"),
        ('{"language": "en\x01", "lines": [], "tables": []}', "Invalid control character"),  # xgrammar#800
        ('{"language": null, "lines": [], "tables": [], "lines": ["x"]}', "duplicate key 'lines'"),
        ('{"language": null, "lines": [], "tables": [NaN]}', "NaN is not valid JSON"),
        ('{"language": null, "lines": [], "tables": [-Infinity]}', "-Infinity is not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_invalid_json(page_text: SchemaValidator, text: str, expected: str) -> None:
    result = page_text.parse_and_validate(text, "stop")
    assert (result.ok, result.value, result.reason_code) == (False, None, INVALID_JSON)
    assert len(result.errors) == 1 and result.errors[0].startswith("not valid JSON: ")
    assert expected in result.errors[0]


def test_truncated_output(page_text: SchemaValidator) -> None:
    cut = PAGE_TEXT[:25]
    assert page_text.parse_and_validate(cut, "length").reason_code == TRUNCATED
    assert page_text.parse_and_validate(cut, "stop").reason_code == INVALID_JSON
    # Complete but invalid is a schema failure whatever the finish reason.
    extra = json.dumps({**PAGE, "extra": 1})
    assert page_text.parse_and_validate(extra, "length").reason_code == SCHEMA_INVALID


def test_schema_errors_are_all_reported_with_paths(page_text: SchemaValidator) -> None:
    doc = {"language": "EN", "lines": ["ok", ""], "tables": [{"rows": [["a"] * 9]}], "extra": 1}
    result = page_text.parse_and_validate(json.dumps(doc), "stop")
    assert (result.ok, result.value, result.reason_code) == (False, None, SCHEMA_INVALID)
    assert [e.split(": ", 1)[0] for e in result.errors] == ["/", "/language", "/lines/1", "/tables/0/rows/0"]
    assert "'extra' was unexpected" in result.errors[0]
    assert "is too long" in result.errors[3]


def test_missing_property_and_wrong_type(page_text: SchemaValidator) -> None:
    result = page_text.parse_and_validate('{"language": 7, "lines": []}', "stop")
    assert result.errors == (
        "/: 'tables' is a required property",
        "/language: 7 is not of type 'string', 'null'",
    )


def test_errors_are_capped_in_number_and_length() -> None:
    schema = _schema({"type": "array", "items": {"type": "integer"}, "maxItems": 100})
    result = SchemaValidator(schema, max_errors=3).parse_and_validate(json.dumps(["x"] * 10), "stop")
    assert len(result.errors) == 4 and result.errors[-1] == "... and 7 more"
    long_line = {"language": "en", "lines": ["\t" * 5000], "tables": []}
    result = SchemaValidator(load_schema("page_text")).parse_and_validate(json.dumps(long_line), "stop")
    assert len(result.errors) == 1 and len(result.errors[0]) == MAX_ERROR_CHARS
    assert result.errors[0].endswith("...")


def test_non_object_output_is_rejected_even_if_the_schema_allows_it() -> None:
    result = SchemaValidator(_schema({"type": "array", "maxItems": 2})).parse_and_validate("[1]", "stop")
    assert (result.ok, result.reason_code) == (False, SCHEMA_INVALID)
    assert result.errors == ("/: not a JSON object",)


def test_pattern_dollar_matches_only_at_the_end() -> None:
    # Python's `$` also matches before a final newline; JSON Schema (ECMA-262) does not.
    validator = SchemaValidator(_schema({"type": "object", "properties": {"c": {"pattern": "^[A-Z]{3}$"}}}))
    assert validator.parse_and_validate('{"c": "EUR"}', "stop").ok
    result = validator.parse_and_validate('{"c": "EUR\\n"}', "stop")
    assert result.reason_code == SCHEMA_INVALID and result.errors[0].startswith("/c: 'EUR\\n' does not match")
    escaped = SchemaValidator(_schema({"properties": {"c": {"pattern": "^[A-Z]{3}\\$"}}}))
    assert escaped.parse_and_validate('{"c": "EUR$"}', "stop").ok  # a literal dollar is left alone


def test_formats_are_checked() -> None:
    validator = SchemaValidator(_schema({"type": "object", "properties": {"d": {"format": "date"}}}))
    assert validator.parse_and_validate('{"d": "2024-02-29"}', "stop").ok
    assert validator.parse_and_validate('{"d": "2023-02-29"}', "stop").reason_code == SCHEMA_INVALID


@pytest.mark.parametrize("name", ["invoice", "receipt"])
def test_shipped_schemas_validate(name: str) -> None:
    validator = SchemaValidator(load_schema(name))
    bad = validator.parse_and_validate("{}", "stop")
    assert bad.reason_code == SCHEMA_INVALID and all(e.startswith("/: ") for e in bad.errors)
    assert len(bad.errors) == len(load_schema(name).schema["required"])
