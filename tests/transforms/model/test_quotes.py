"""Model quotes (transforms/model/quotes.py): the sidecar schema the model answers, taking the quotes out of the
stored answer, and the matcher counting a quote only where the page prints it (transforms/model/evidence.py).
Words and their boxes are laid out here (tests/transforms/model/test_evidence.py's `page`)."""
from __future__ import annotations

import json

import pytest

from schemas.evidence import PageWords, encode_words
from schemas.extraction import check_schema, load_schema
from schemas.records import PageRow
from transforms.engines.base import Answer
from transforms.extract.feed import judge
from transforms.model import quotes
from transforms.model.evidence import FLAG, match, with_evidence
from transforms.model.postfilter import SchemaValidator

LINE_H = 0.02


def page(lines: list[str]) -> PageWords:
    """One word after another, 0.1 wide each, one line every 0.05 of the page."""
    texts, boxes = [], []
    for row, line in enumerate(lines):
        for col, word in enumerate(line.split()):
            texts.append(word)
            boxes.append((0.1 * col, 0.05 * row, 0.1 * col + 0.08, 0.05 * row + LINE_H))
    return PageWords("text_layer", tuple(texts), tuple(boxes))


def by_path(rows) -> dict:
    return {r.field_path: r for r in rows}


WORDS = page(["INVOICE", "Northwind Traders Ltd", "Total due: £1,717.44", "VAT 20%: £286.24"])


@pytest.mark.parametrize("name", ["invoice", "receipt"])
def test_the_sidecar_is_the_schema_plus_quotes_and_decoding_can_use_it(name: str) -> None:
    schema = load_schema(name)
    side = quotes.sidecar(schema)
    assert side.schema_id == schema.schema_id and side.schema_hash != schema.schema_hash
    assert {k: v for k, v in side.schema["properties"].items() if k != "_quotes"} == schema.schema["properties"]
    assert side.schema["required"] == [*schema.schema["required"], "_quotes"]
    assert check_schema(side.schema) == []  # vLLM takes it and xgrammar compiles it
    assert "_quotes" not in schema.schema["properties"]  # the loaded schema is left as it was


def test_a_schema_that_cannot_take_quotes_says_why() -> None:
    assert quotes.problems({"type": "object", "properties": {"_quotes": {"type": "string"}}}) == [
        "the schema has a property '_quotes', which model quotes would take"]
    assert quotes.problems({"type": "array"}) == ["model quotes need an object schema"]
    assert quotes.problems(load_schema("invoice").schema) == []


def test_split_takes_the_quotes_out_of_the_answer() -> None:
    answer = {"total": 1717.44, "vendor": "Northwind", "_quotes": {"total": "£1,717.44", "vendor": "Northwind Ltd",
                                                                   "note": "   "}}
    stored, said = quotes.split(json.dumps(answer))
    assert json.loads(stored) == {"total": 1717.44, "vendor": "Northwind"}
    assert said == (("total", "£1,717.44"), ("vendor", "Northwind Ltd"))  # a blank quote is no quote
    assert quotes.split('{"total": 1}') == ('{"total": 1}', ())
    assert quotes.split("not json") == ("not json", ())


def test_judge_validates_against_the_sidecar_and_stores_the_answer_without_quotes() -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["total"],
              "properties": {"total": {"type": "number"}}}
    plain = load_schema_from(schema)
    text = json.dumps({"total": 3.5, "_quotes": {"total": "3.50"}})
    r = judge(Answer(text, "stop", 0, 0, 0), SchemaValidator(quotes.sidecar(plain)), 1, with_quotes=True)
    assert (r.status, json.loads(r.extraction or "null"), r.quotes) == ("ok", {"total": 3.5}, (("total", "3.50"),))
    refused = judge(Answer(text, "stop", 0, 0, 0), SchemaValidator(plain), 1)  # the plain schema has no `_quotes`
    assert refused.status == "invalid" and refused.quotes == ()


def load_schema_from(schema: dict):
    from schemas.extraction import ExtractionSchema, schema_hash

    return ExtractionSchema("t", schema_hash(schema), schema, "test")


def test_a_quote_found_on_the_page_grounds_its_value_there() -> None:
    """The value was normalised (not printed as such); its quote is printed: grounded where the quote stands."""
    rows = by_path(match({"vendor": "NORTHWIND TRADING COMPANY", "total": 1717.44},
                         WORDS, {"vendor": "Northwind Traders Ltd", "total": "Total due: £1,717.44"}))
    assert rows["vendor"].grounded and rows["vendor"].method == "model_quote"
    assert rows["vendor"].quote == "Northwind Traders Ltd"
    assert rows["vendor"].box == pytest.approx((0.0, 0.05, 0.28, 0.05 + LINE_H))
    assert rows["total"].grounded and rows["total"].box == pytest.approx((0.0, 0.1, 0.28, 0.1 + LINE_H))
    unquoted = by_path(match({"vendor": "NORTHWIND TRADING COMPANY"}, WORDS))  # the value alone is not found
    assert unquoted["vendor"].grounded is False and unquoted["vendor"].method == "text_layer"


def test_a_made_up_quote_is_not_grounded_even_where_the_value_is_printed() -> None:
    rows = by_path(match({"tax": 286.24, "total": 1717.44}, WORDS, {"tax": "VAT paid in full on 1 March"}))
    assert rows["tax"].grounded is False and rows["tax"].method == "model_quote" and rows["tax"].box is None
    assert rows["total"].grounded and rows["total"].method == "text_layer"  # no quote: its value is looked for


def test_with_evidence_flags_a_page_whose_quote_is_made_up() -> None:
    row = PageRow(doc_sha256="d", source_uri="s3://b/x.pdf", page_index=0, status="ok",
                  extraction=json.dumps({"tax": 286.24, "total": 1717.44}))
    done = with_evidence(row, encode_words(WORDS), (("tax", "VAT paid in full"), ("total", "£1,717.44")))
    assert FLAG in done.flags and done.ungrounded_values == 1
    assert {e.field_path: (e.method, e.grounded) for e in done.evidence} == {
        "tax": ("model_quote", False), "total": ("model_quote", True)}
