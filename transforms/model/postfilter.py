"""Post-filter: strict parsing and JSON Schema validation of model output.

Constrained decoding should make every finished output valid, but the decoder has had bugs (xgrammar 0.2.8
let raw control characters through for `maxLength` strings) and an output cut off at `max_tokens` is never
valid. So the model's text is untrusted input here like any other: parsed strictly, validated in full,
and turned into data (a reason code and capped error strings) rather than an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jsonschema import ValidationError, validators

from schemas.extraction import ExtractionSchema
from schemas.reasons import INVALID_JSON, SCHEMA_INVALID, TRUNCATED

MAX_ERRORS = 20
MAX_ERROR_CHARS = 300  # messages quote the offending value, which is model output of any length


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    value: dict[str, Any] | None  # the parsed object when ok, else None
    errors: tuple[str, ...]
    reason_code: str | None  # None when ok; else INVALID_JSON, SCHEMA_INVALID or TRUNCATED


class SchemaValidator:
    """The compiled jsonschema validator for one schema. Build it once (e.g. in DoFn.setup) and reuse it:
    compiling resolves references and compiles regexes, which costs far more than validating one page."""

    def __init__(self, schema: ExtractionSchema, *, max_errors: int = MAX_ERRORS) -> None:
        self.schema = schema
        self.max_errors = max_errors
        base = validators.validator_for(schema.schema, default=validators.Draft202012Validator)
        cls = validators.extend(base, {"pattern": _ecma_pattern})
        # Formats are only annotations unless a checker is given; check them (a "date" must be a date).
        self._validator = cls(schema.schema, format_checker=base.FORMAT_CHECKER)

    # The extended validator class is made at run time and plain pickle cannot find it by name, so a
    # pickled SchemaValidator (a Beam DoFn attribute, say) carries only its inputs and compiles again.
    def __getstate__(self) -> dict[str, Any]:
        return {"schema": self.schema, "max_errors": self.max_errors}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["schema"], max_errors=state["max_errors"])  # type: ignore[misc]

    def parse_and_validate(self, text: str, finish_reason: str | None) -> ValidationResult:
        try:
            value = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
        except (ValueError, RecursionError) as e:
            # Cut off at max_tokens: say so, since the fix (a larger limit) differs from that for bad JSON.
            code = TRUNCATED if finish_reason == "length" else INVALID_JSON
            return ValidationResult(False, None, (_cap(_json_error(e)),), code)
        # From here the text parsed, so the document was complete even if finish_reason is "length"
        # (json.loads rejects any prefix of an object or array): its validity alone decides.
        # Sorted so that the same output always gives the same error strings (they are stored and diffed).
        errors = sorted(self._validator.iter_errors(value), key=lambda e: (_pointer(e), e.message))
        if errors:
            shown = tuple(_cap(f"{_pointer(e)}: {e.message}") for e in errors[: self.max_errors])
            if len(errors) > self.max_errors:
                shown += (f"... and {len(errors) - self.max_errors} more",)
            return ValidationResult(False, None, shown, SCHEMA_INVALID)
        if not isinstance(value, dict):  # the pipeline stores objects; a schema could allow other values
            return ValidationResult(False, None, ("/: not a JSON object",), SCHEMA_INVALID)
        return ValidationResult(True, value, (), None)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys; the text would then mean different things to different
    # readers, so it is not accepted.
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {dup!r}")
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # json.loads accepts NaN and Infinity unless told not to


def _json_error(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON: {e.msg} (line {e.lineno} column {e.colno}, char {e.pos})"
    if isinstance(e, RecursionError):
        return "not valid JSON: nested too deeply"
    return f"not valid JSON: {e}"


def _pointer(error: ValidationError) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in error.absolute_path)


def _cap(message: str) -> str:
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 3] + "..."


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    # JSON Schema patterns follow ECMA-262, where a final `$` matches only at the very end. Python's `$`
    # also matches before a trailing newline, so "ABC\n" would pass ^[A-Z]{3}$; `\Z` is ECMA's `$`.
    if not validator.is_type(instance, "string"):
        return
    backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    if pattern.endswith("$") and backslashes % 2 == 0:
        pattern = pattern[:-1] + r"\Z"
    if not re.search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {schema['pattern']!r}")


# --- Output flags ----------------------------------------------------------------------------------
# A valid extraction can still be a bad one: it may show that an injection worked (the model repeated
# its instructions or role text, or followed instructions found on the page), hold personal data that
# the schema never asked for, or be a refusal dressed as JSON. Each becomes a flag on the `pages` row
# (schemas/records.py FLAGS) with a line of evidence in `flag_detail`; the values themselves are
# masked there (digits -> 9, letters -> a), never copied.

REFUSAL = re.compile(
    r"\b(?:i'?m\s+sorry|i\s+am\s+sorry|i\s+apologi[sz]e|i\s+(?:can(?:'|no)?t|can\s+not|cannot|am\s+unable\s+to|"
    r"won'?t|will\s+not)\s+(?:help|assist|comply|provide|do\s+that|extract|process|fulfil+)|as\s+an\s+ai\b|"
    r"i'?m\s+not\s+able\s+to|against\s+my\s+(?:guidelines|policy|policies))"
    r"|\b(?:es\s+tut\s+mir\s+leid|ich\s+kann\s+(?:das|dabei|ihnen)\s+nicht|je\s+suis\s+désolé|je\s+ne\s+peux\s+pas|"
    r"lo\s+siento|no\s+puedo\s+ayudar|mi\s+dispiace|non\s+posso)",
    re.IGNORECASE)
# Words in a field's name, title or description that mean the schema asks for that kind of data.
ASKS_FOR = {
    "email": {"email", "e-mail", "mail"},
    "phone": {"phone", "telephone", "tel", "fax", "mobile", "contact"},
    "card": {"card", "pan"},
    "iban": {"iban", "bank", "account"},
    "national_id": {"ssn", "national", "nino", "passport", "tax", "dni", "nie", "identity", "id"},
}
LEAK_SHINGLE = 6  # words in a row of the system prompt that count as leaked


@dataclass(frozen=True)
class OutputFlags:
    flags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _shingles(text: str, n: int) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


def _asked(node: Any, names: tuple[str, ...]) -> set[str]:
    """The PII kinds a field asks for, from its path's names and its schema node's text."""
    words: set[str] = set()
    for name in names:
        words.update(_words(name.replace("_", " ")))
    if isinstance(node, dict):
        for key in ("title", "description"):
            if isinstance(node.get(key), str):
                words.update(_words(node[key]))
        if node.get("format") == "email":
            words.add("email")
    return {kind for kind, keys in ASKS_FOR.items() if words & keys}


def _strings(value: Any, node: Any, names: tuple[str, ...]) -> Iterator[tuple[str, Any, tuple[str, ...]]]:
    """(text, schema node, path names) of every string (and integer) in an extraction."""
    if isinstance(value, dict):
        props = node.get("properties", {}) if isinstance(node, dict) else {}
        for key, item in value.items():
            yield from _strings(item, props.get(key) if isinstance(props, dict) else None, (*names, str(key)))
    elif isinstance(value, list):
        items = node.get("items") if isinstance(node, dict) else None
        for item in value:
            yield from _strings(item, items, names)
    elif isinstance(value, str):
        yield value, node, names
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**8:
        yield str(value), node, names


def output_flags(extraction: str | None, schema: dict[str, Any], system_prompt: str = "") -> OutputFlags:
    """Flags for one extraction (JSON text): `injection_success`, `pii` + `pii_<kind>`, `refusal`."""
    if not extraction:
        return OutputFlags()
    from transforms.safety import injection, pii

    try:
        value = json.loads(extraction)
    except ValueError:
        return OutputFlags()
    leaked = _shingles(system_prompt, LEAK_SHINGLE) if system_prompt else set()
    flags: list[str] = []
    notes: list[str] = []
    for text, node, names in _strings(value, schema, ()):
        where = "/" + "/".join(names)
        hits = [m for m in injection.scan(text) if m.category in ("override", "role", "addressed", "system_prompt")]
        if hits:
            flags.append("injection_success")
            notes.append(f"injection_success: {where}: {hits[0].describe()}"[:200])
        if leaked and _shingles(text, LEAK_SHINGLE) & leaked:
            flags.append("injection_success")
            notes.append(f"injection_success: {where}: repeats the system prompt"[:200])
        if REFUSAL.search(text):
            flags.append("refusal")
            notes.append(f"refusal: {where}: {REFUSAL.search(text).group(0)!r}"[:200])  # type: ignore[union-attr]
        asked = _asked(node, names)
        for kind, values in pii.find(text).items():
            if kind in asked:
                continue
            flags += ["pii", f"pii_{kind}"]
            notes.append(f"pii_{kind}: {where}: {pii.mask(values[0])}"[:200])
    return OutputFlags(tuple(dict.fromkeys(flags)), tuple(dict.fromkeys(notes)))


MARKDOWN_NODE = {"type": "object", "properties": {"markdown": {"type": "string", "description": "page text"}}}


def markdown_flags(markdown: str | None, system_prompt: str = "") -> OutputFlags:
    """The same checks on markdown output (the page text as one field, `/markdown`): nothing in a page
    transcription asks for personal data, so any found there is flagged."""
    if not markdown:
        return OutputFlags()
    return output_flags(json.dumps({"markdown": markdown}), MARKDOWN_NODE, system_prompt)
