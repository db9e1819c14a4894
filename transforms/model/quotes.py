"""Model quotes (`--evidence-quotes`, or a preset's `evidence_quotes`): the model is asked, beside each value, for
the verbatim text of the page it read the value from, so that a value it normalised (`ACME LTD` for `Acme
Limited`) can still be traced to the page.

The model answers a generated sidecar schema: the extraction schema plus one property `_quotes`, an object from
field path (`total`, `line_items[0].amount`, as the `evidence` table spells them) to the quoted text. The answer
is validated against the sidecar; then `_quotes` is taken out, so the stored extraction is the schema's own
(its schema_id and schema_hash unchanged), and the quotes go to the evidence matcher
(transforms/model/evidence.py), which counts a quote only when it is itself found on the page (method
`model_quote`). Pure.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from schemas.extraction import ExtractionSchema, schema_hash

QUOTES = "_quotes"
# A quote is a few words of the page: bounded by a pattern (xgrammar's `maxLength` lets control characters
# through, and it unrolls repeats of at most schemas/extraction MAX_REPEAT), no quotes or backslashes, as the
# shipped schemas' text fields.
MAX_QUOTE_CHARS = 120
QUOTE_PATTERN = f"^[^\\x00-\\x1f\"\\\\]{{1,{MAX_QUOTE_CHARS}}}$"
MAX_QUOTES = 400  # as many as the matcher looks at (evidence.MAX_VALUES)
DESCRIPTION = ("For each field you filled: the exact text of the page you read its value from, copied verbatim, "
               "keyed by the field's path (`total`, `line_items[0].amount`). Leave out fields you did not read "
               "from the page.")


def problems(schema: Mapping[str, Any]) -> list[str]:
    """Why the schema cannot take quotes (empty: it can)."""
    found = []
    if schema.get("type") not in ("object", None) or not isinstance(schema.get("properties", {}), Mapping):
        found.append("model quotes need an object schema")
    elif QUOTES in schema.get("properties", {}):
        found.append(f"the schema has a property {QUOTES!r}, which model quotes would take")
    return found


def sidecar(schema: ExtractionSchema) -> ExtractionSchema:
    """The schema the model answers when quotes are asked for: `schema` with the `_quotes` object, required where
    the schema lists required properties (so constrained decoding writes it). Same schema_id; its own hash."""
    quotes = {"type": "object", "description": DESCRIPTION,
              "additionalProperties": {"type": "string", "pattern": QUOTE_PATTERN}}
    made = {**schema.schema, "properties": {**schema.schema.get("properties", {}), QUOTES: quotes}}
    if isinstance(schema.schema.get("required"), list):
        made["required"] = [*schema.schema["required"], QUOTES]
    return ExtractionSchema(schema.schema_id, schema_hash(made), made, f"{schema.source} (with model quotes)")


def split(extraction: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A valid sidecar answer (JSON text of an object) as the stored extraction, without `_quotes`, and the quotes
    (field path, text) in the answer's order; non-text quotes are dropped. Text that is not such an answer is
    returned as it is, with no quotes."""
    try:
        value = json.loads(extraction)
    except ValueError:
        return extraction, ()
    if not isinstance(value, dict) or QUOTES not in value:
        return extraction, ()
    given = value.pop(QUOTES)
    quotes = tuple((str(k), v[:MAX_QUOTE_CHARS]) for k, v in (given.items() if isinstance(given, dict) else ())
                   if isinstance(v, str) and v.strip())[:MAX_QUOTES]
    return json.dumps(value, ensure_ascii=False), quotes
