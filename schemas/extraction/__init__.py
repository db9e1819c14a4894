"""JSON Schemas that extraction targets: loading, hashing, and checks for constrained decoding.

xgrammar 0.2.8 silently ignores some JSON Schema keywords (output then fails validation, page after page)
and vLLM refuses others (every request fails): `check_schema` reports both before any GPU time is spent.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from jsonschema import validators
from jsonschema.exceptions import SchemaError as _MetaSchemaError

SHIPPED_SCHEMAS: tuple[str, ...] = ("invoice", "receipt", "page_text")
MAX_SCHEMA_BYTES = 1 << 20  # user schema files are untrusted input
MAX_NESTING = 64  # vLLM's MAX_STRUCTURED_OUTPUT_JSON_NESTING; it refuses deeper schemas

# Accepted by xgrammar 0.2.8 but not enforced (vLLM also refuses uniqueItems/contains on arrays).
_IGNORED = frozenset({
    "allOf", "not", "if", "then", "else", "contains", "minContains", "maxContains", "uniqueItems",
    "dependencies", "dependentSchemas", "dependentRequired", "$dynamicRef", "$recursiveRef"})
# String formats vLLM lets through to xgrammar, and those of them whose grammar has a bounded length.
_FORMATS = frozenset({"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
                      "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"})
_BOUNDED_FORMATS = frozenset({"date", "time", "date-time", "uuid", "ipv4", "ipv6"})
_CHILD_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_CHILD_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_CHILD_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_LOOKAROUND = re.compile(r"(?<!\\)\(\?<?[=!]")
_CLASS_OR_ESCAPE = re.compile(r"\[(?:\\.|[^\]\\])*\]|\\.")
_UNBOUNDED_QUANTIFIER = re.compile(r"[*+]|\{\d+,\}")
_REPEAT_BOUND = re.compile(r"\{(?:\d+,)?(\d+)\}")  # the n of {n} and {m,n}
# xgrammar 0.2.8 unrolls a regex repeat of up to 128 into FSM states whose token masks it precomputes;
# above 128 it computes masks at every step instead: measured ~0.2 ms vs 100-300 ms a token (150k vocab).
MAX_REPEAT = 128
_XGRAMMAR_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


class SchemaError(ValueError):
    """A schema that is not valid JSON Schema or that constrained decoding cannot enforce."""

    def __init__(self, source: str, problems: list[str] | tuple[str, ...]) -> None:
        self.source = source
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"schema {source!r} cannot be used for constrained extraction:\n{lines}")


@dataclass(frozen=True)
class ExtractionSchema:
    schema_id: str
    schema_hash: str  # part of the cache key: any change to the schema re-extracts
    schema: Mapping[str, Any] = field(compare=False)  # read-only by convention; schema_hash stands for it
    source: str = field(compare=False)


def canonical_json(schema: Any) -> str:  # sorted keys: what schema_hash hashes
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def schema_hash(schema: Any) -> str:
    return hashlib.sha256(canonical_json(schema).encode("utf-8")).hexdigest()


def load_schema(name_or_path: str, *, strict: bool | None = None) -> ExtractionSchema:
    """A shipped schema by bare name ("invoice"), or a user's from a path or file:// URI. `strict` (see
    `check_schema`) defaults to True for shipped schemas only. Raises SchemaError listing every problem."""
    if name_or_path in SHIPPED_SCHEMAS:
        text: str | bytes = (resources.files(__name__) / f"{name_or_path}.json").read_text(encoding="utf-8")
        schema_id, source, strict = name_or_path, f"shipped:{name_or_path}", strict is not False
    else:
        path = local_path(name_or_path)
        schema_id, source, strict = path.stem, str(path), bool(strict)
        text = read_user_file(path, name_or_path)
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SchemaError(source, [f"not valid JSON: {type(e).__name__}: {e}"]) from None
    if not isinstance(schema, dict):
        raise SchemaError(source, ["the schema must be a JSON object"])
    if problems := check_schema(schema, strict=strict):
        raise SchemaError(source, problems)
    return ExtractionSchema(schema_id, schema_hash(schema), schema, source)


def local_path(name_or_path: str) -> Path:
    """The local file that --schema names (a path or a file:// URI); any other URI is an error."""
    parsed = urlparse(name_or_path)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(url2pathname(unquote(parsed.path)))
    if len(parsed.scheme) > 1:  # one letter is a Windows drive
        raise SchemaError(name_or_path, ["unsupported URI; use a path or a local file:// URI"])
    return Path(name_or_path)


def read_user_file(path: Path, given: str) -> bytes:
    """A user's schema file, at most MAX_SCHEMA_BYTES; a missing file names the shipped schemas."""
    if not path.is_file():
        if "/" not in given and "\\" not in given and "." not in given:
            shipped = ", ".join(SHIPPED_SCHEMAS)
            raise SchemaError(given, [f"no shipped schema named {given!r} (shipped: {shipped})"])
        raise SchemaError(given, [f"no such file: {path}"])
    with path.open("rb") as f:
        data = f.read(MAX_SCHEMA_BYTES + 1)
    if len(data) > MAX_SCHEMA_BYTES:
        raise SchemaError(given, [f"larger than {MAX_SCHEMA_BYTES} bytes"])
    return data  # json.loads decodes it, and reports bad UTF-8 as a ValueError


def check_schema(schema: Any, *, strict: bool = False, compile_grammar: bool = True) -> list[str]:
    """Why `schema` is unusable for constrained extraction (empty: fine). Always: invalid JSON Schema,
    keywords xgrammar ignores or vLLM refuses, lookarounds, remote `$ref`s, xgrammar compile errors. With
    `strict` also what lets output grow without bound (a random-weight model never stops) or grammar and
    validator disagree: unbounded strings/numbers/arrays, open/optional properties, oneOf, recursive $ref."""
    if not isinstance(schema, (dict, bool)):
        return [f"a schema must be a JSON object or boolean, not {type(schema).__name__}"]
    if isinstance(schema, dict) and _too_deep(schema):
        return [f"nested more than {MAX_NESTING} levels deep (vLLM refuses it)"]
    cls = validators.validator_for(schema, default=None)
    if cls is None and isinstance(schema, dict) and "$schema" in schema:
        return [f"unknown $schema {schema['$schema']!r}"]
    try:
        (cls or validators.Draft202012Validator).check_schema(schema)
    except _MetaSchemaError as e:
        return [f"not a valid JSON Schema at /{'/'.join(str(p) for p in e.path)}: {e.message}"]
    problems: list[str] = []
    if strict and not (isinstance(schema, dict) and schema.get("type") == "object"):
        problems.append("/: the top level must be an object schema")
    _walk(schema, "", strict, problems)
    if compile_grammar and not problems:
        problems.extend(_xgrammar_problems(schema))
    return problems


def _too_deep(value: dict[str, Any]) -> bool:
    level: list[Any] = [value]  # as vLLM counts; breadth-first, so a hostile file cannot exhaust the stack
    for _ in range(MAX_NESTING):
        level = [c for n in level for c in (n.values() if isinstance(n, dict) else n)
                 if isinstance(c, (dict, list))]
        if not level:
            return False
    return True


def _walk(node: Any, ptr: str, strict: bool, out: list[str]) -> None:
    if node is True and strict:
        out.append(f"{ptr or '/'}: `true` accepts any value (unbounded output)")
    if not isinstance(node, dict):
        return
    out.extend(f"{ptr or '/'}: {p}" for p in _problems(node, ptr, strict))
    for key in _CHILD_MAPS:
        if isinstance(node.get(key), dict):
            for name, child in node[key].items():
                _walk(child, f"{ptr}/{key}/{name.replace('~', '~0').replace('/', '~1')}", strict, out)
    for key in _CHILD_LISTS:
        for i, child in enumerate(node[key] if isinstance(node.get(key), list) else []):
            _walk(child, f"{ptr}/{key}/{i}", strict, out)
    for key in _CHILD_ONE:
        if isinstance(node.get(key), (dict, bool)):
            # propertyNames constrains keys, not output values: the boundedness rules do not apply.
            _walk(node[key], f"{ptr}/{key}", strict and key != "propertyNames", out)


def _problems(node: dict[str, Any], ptr: str, strict: bool) -> Iterator[str]:
    keys, ref, types = node.keys(), node.get("$ref"), node.get("type")
    types = {types} if isinstance(types, str) else set(types or [])
    pattern = node["pattern"] if isinstance(node.get("pattern"), str) else ""
    yield from (f"`{k}` is not supported: xgrammar does not enforce it" for k in sorted(_IGNORED & keys))
    for key in sorted({"maxLength", "minLength"} & keys):  # also ignored next to `pattern`
        yield (f"`{key}` is not supported: xgrammar's grammar for it admits raw control characters "
               "(mlc-ai/xgrammar#800); bound the string with `pattern`, e.g. ^[A-Za-z ]{0,40}$")
    if isinstance(ref, str) and not ref.startswith("#"):
        yield f"`$ref` {ref!r} is not local; xgrammar matches any value for it"
    if _LOOKAROUND.search(pattern):
        yield f"pattern {pattern!r}: lookaround assertions are silently dropped by xgrammar"
    if any(int(n) > MAX_REPEAT for n in _REPEAT_BOUND.findall(_CLASS_OR_ESCAPE.sub("", pattern))):
        yield f"pattern {pattern!r} repeats more than {MAX_REPEAT} times: xgrammar is ~1000x slower a token"
    # As vLLM 0.32's has_xgrammar_unsupported_json_features: backend "xgrammar" then fails each request.
    refused = "is not supported: vLLM refuses it for the xgrammar backend"
    if types & {"number", "integer"} and "multipleOf" in keys:
        yield f"`multipleOf` on numbers {refused}"
    if "string" in types and "format" in keys and node["format"] not in _FORMATS:
        yield f"string format {node['format']!r} {refused}"
    beside = {"properties", "patternProperties"} & keys or node.get("unevaluatedProperties", True) is not True
    if "object" in types and "propertyNames" in keys and beside:
        yield f"`propertyNames` beside properties, patternProperties or unevaluatedProperties {refused}"
    patterns = node.get("patternProperties")
    if "object" in types and isinstance(patterns, dict) and ("properties" in keys or len(patterns) > 1):
        yield f"`patternProperties` beside properties, or more than one pattern, {refused}"
    if strict:
        yield from _unbounded(node, ptr, types)


def _unbounded(node: dict[str, Any], ptr: str, types: set[str]) -> Iterator[str]:
    keys, ref, pattern = node.keys(), node.get("$ref"), node.get("pattern")
    if isinstance(ref, str) and (ptr + "/").startswith(ref[1:].rstrip("/") + "/"):
        yield f"recursive `$ref` {ref!r} (unbounded nesting)"
    if "oneOf" in keys:
        yield "`oneOf` is enforced as anyOf unless xgrammar proves the branches disjoint"
    if isinstance(pattern, str):
        # xgrammar always matches the whole string; the validator searches. Anchors make them agree.
        if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
            yield f"pattern {pattern!r} must be anchored with ^...$"
        if _UNBOUNDED_QUANTIFIER.search(_CLASS_OR_ESCAPE.sub("", pattern)):
            yield f"pattern {pattern!r} has an unbounded quantifier (*, + or {{n,}}); use {{m,n}}"
    if "enum" in keys or "const" in keys:
        return
    if not types and not {"$ref", "anyOf", "oneOf", "allOf"} & keys:
        yield "no `type`, `enum` or `const`: accepts any value (unbounded output)"
    if "string" in types and "pattern" not in keys and node.get("format") not in _BOUNDED_FORMATS:
        yield "unbounded string: add an anchored `pattern` with {m,n}, `enum` or bounded `format`"
    low, high = {"minimum", "exclusiveMinimum"} & keys, {"maximum", "exclusiveMaximum"} & keys
    if types & {"number", "integer"} and not (low and high):
        yield "unbounded number: add both `minimum` and `maximum`"
    closed_tuple = "prefixItems" in keys and node.get("items") is False
    if "array" in types and "maxItems" not in keys and not closed_tuple:
        yield "unbounded array: add `maxItems`"
    if "object" in types and node.get("additionalProperties") is not False:
        yield "open object: set `additionalProperties: false`"
    if "object" in types and "patternProperties" in keys:
        yield "`patternProperties` allows unboundedly many keys"
    missing = sorted(set(node.get("properties", {})) - set(node.get("required", [])))
    if "object" in types and missing:
        yield f"optional properties {missing}: make them required (nullable if absent)"


def _xgrammar_problems(schema: Any) -> list[str]:
    try:
        import xgrammar  # imports torch (seconds), so only here
    except ImportError:
        return []
    try:  # as vLLM compiles it with disable_any_whitespace
        xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
    except Exception as e:  # noqa: BLE001 - any failure here is a failure of the engine later
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [f"xgrammar cannot compile the schema: {_XGRAMMAR_LOG_PREFIX.sub('', first)}"]
    return []
