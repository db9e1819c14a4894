"""The SQL type of each property of an extraction JSON Schema: what the typed views of `pagemill sql`
(pipelines/tables/typed_views.py) give each column. Pure: no DuckDB here, only the types and the structure that
DuckDB's `json_transform` takes (docs/tables.md#typed-views has the table).

string -> VARCHAR (DATE for `format: date` or a pattern that admits only YYYY-MM-DD, TIMESTAMPTZ for
`format: date-time`); number -> DOUBLE (DECIMAL when `multipleOf` is a power of ten below 1); integer ->
BIGINT; boolean -> BOOLEAN; array -> LIST of its items' type; object with properties -> STRUCT. What has no
one SQL type (a free-form object, `oneOf`/`anyOf` of several types, a mixed `type` list, `allOf`, tuples, a
recursive or remote `$ref`) is JSON, and a note says where and why.

Bounded: a view's SQL grows with its typed parts (columns, struct fields, list items) times their depth, so
`bounded_properties` types a schema only as deep as keeps it within MAX_PARTS parts; deeper parts are JSON.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from re import _constants as sre  # type: ignore[attr-defined]  # the stdlib's own regex parser (3.11+)
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

JSON = "JSON"
_NUMERIC = ("BIGINT", "DOUBLE")
_SCALARS = {"integer": "BIGINT", "boolean": "BOOLEAN"}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIGITS = frozenset("0123456789")
MAX_DEPTH = 16  # deeper parts are JSON: the view's SQL grows with the depth (a run's schema has at most 64)
# Typed parts (columns, struct fields, list items) of one view: DuckDB spends ~1 ms of CPU a part binding the
# view's SQL when it is created (measured here, 2026-12), so a view within the bound costs at most ~0.5 s.
MAX_PARTS = 500


@dataclass(frozen=True)
class SqlType:
    """One SQL type: a leaf (`scalar`), a STRUCT (`fields`) or a LIST (`items`); exactly one is set."""

    scalar: str | None = None
    fields: tuple[tuple[str, SqlType], ...] | None = None
    items: SqlType | None = None
    nullable: bool = False
    note: str | None = None  # why this part is JSON

    def structure(self) -> Any:
        """What `json_transform` takes for this type (a type name, an object of fields, a one-item list)."""
        if self.fields is not None:
            return {name: t.structure() for name, t in self.fields}
        if self.items is not None:
            return [self.items.structure()]
        return self.scalar

    def notes(self) -> tuple[str, ...]:
        """Every note of this type and of its parts, outermost first."""
        children: list[SqlType] = [t for _, t in self.fields or ()] + ([self.items] if self.items else [])
        return ((self.note,) if self.note else ()) + tuple(n for c in children for n in c.notes())


def usable_name(name: str) -> bool:
    """Whether a property name can be a STRUCT field or column (DuckDB refuses an empty key in a structure)."""
    return bool(name) and not any(ord(c) < 0x20 for c in name)


def as_json(path: str, why: str, nullable: bool = True) -> SqlType:
    return SqlType(JSON, nullable=nullable, note=f"{path}: {why}, kept as JSON")


class _OverBudget(Exception):
    """More typed parts than the bound allows at this depth limit."""


class _Bound:
    """How deep to type (`limit`) and how many parts may be made (`parts`; None: any number); `cut` records
    whether the limit made anything JSON (if not, a deeper limit would change nothing)."""

    def __init__(self, limit: int = MAX_DEPTH, parts: int | None = None, of: int = MAX_PARTS) -> None:
        self.limit, self.left, self.of, self.cut = limit, parts, of, False

    def take(self) -> None:
        if self.left is not None:
            self.left -= 1
            if self.left < 0:
                raise _OverBudget

    def deeper(self, path: str) -> SqlType:
        self.cut = True
        if self.limit == MAX_DEPTH:
            return as_json(path, f"nested deeper than {MAX_DEPTH} levels")
        if self.limit == 0:
            return as_json(path, f"more columns than the view's bound of {self.of} typed parts")
        return as_json(path, f"nested deeper than {self.limit} levels (the view's bound of {self.of} typed parts)")


def properties(schema: Any, bound: _Bound | None = None) -> dict[str, SqlType] | None:
    """The SQL type of each top-level property, or None when the schema has no properties to make columns of."""
    if not isinstance(schema, Mapping):
        return None
    node = _resolve(schema, schema, frozenset())[0]
    props = node.get("properties") if isinstance(node, Mapping) else None
    if not isinstance(props, Mapping) or not props:
        return None
    return _fields(node, props, schema, "", frozenset(), 0, bound or _Bound())


def bounded_properties(versions: Iterable[Any], max_parts: int = MAX_PARTS) -> tuple[dict[str, SqlType], int]:
    """The properties of one schema's versions, merged (`merge`) and typed as deep as keeps their parts (every
    column, struct field and list item, JSON ones included) within `max_parts`: (the types, the depth typed).
    Each try stops as soon as it is over the bound, so a schema of any size costs at most MAX_DEPTH tries of
    `max_parts` parts. Depth 0 (even the columns alone are too many): every column is JSON."""
    schemas = list(versions)
    best: dict[str, SqlType] | None = None
    depth = 0
    for limit in range(1, MAX_DEPTH + 1):
        bound = _Bound(limit, max_parts, max_parts)
        try:
            best, depth = _merged(schemas, bound), limit
        except _OverBudget:
            break
        if not bound.cut:  # nothing was deeper than this: fully typed
            return best, MAX_DEPTH
    return (best, depth) if best is not None else (_merged(schemas, _Bound(0, None, max_parts)), 0)


def _merged(schemas: list[Any], bound: _Bound) -> dict[str, SqlType]:
    merged: dict[str, SqlType] = {}
    for schema in schemas:
        for prop, t in (properties(schema, bound) or {}).items():
            merged[prop] = merge(merged[prop], t, prop) if prop in merged else t
    return merged


def _fields(node: Mapping[str, Any], props: Mapping[str, Any], root: Mapping[str, Any], path: str,
            refs: frozenset[str], depth: int, bound: _Bound) -> dict[str, SqlType]:
    """The type of each property; one that `required` does not list may be absent, so it is nullable too."""
    given = node.get("required")
    required = {r for r in given if isinstance(r, str)} if isinstance(given, list) else set()
    types = {n: sql_type(c, root, f"{path}.{n}" if path else n, refs, depth + 1, bound) for n, c in props.items()}
    return {n: t if n in required or t.nullable else replace(t, nullable=True) for n, t in types.items()}


def sql_type(node: Any, root: Mapping[str, Any], path: str, refs: frozenset[str] = frozenset(),
             depth: int = 1, bound: _Bound | None = None) -> SqlType:
    """The SQL type of one JSON Schema node; `root` resolves local `$ref`s, `path` names the node in notes,
    `depth` counts the properties and items above it, `bound` limits depth and parts."""
    bound = bound or _Bound()
    bound.take()
    node, refs, why = _resolve(node, root, refs)
    if why:
        return as_json(path, why)
    if depth > bound.limit:
        return bound.deeper(path)
    if not isinstance(node, Mapping) or not node.keys() - {"description", "title", "$comment", "default"}:
        return as_json(path, "any value")
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            branches = [b for b in node[key] if not _is_null(b)]
            if len(branches) != 1:
                return as_json(path, f"{key} of several types")
            one = sql_type(branches[0], root, path, refs, depth, bound)
            return replace(one, nullable=one.nullable or len(branches) < len(node[key]))
    if "allOf" in node:
        return as_json(path, "allOf")
    types = _types(node)
    nullable = "null" in types
    kinds = {t for t in types if t != "null"}
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    if len(kinds) != 1:
        return as_json(path, f"several types ({', '.join(sorted(kinds))})" if kinds else "no type")
    kind = kinds.pop()
    if kind == "array":
        return _array(node, root, path, refs, nullable, depth, bound)
    if kind == "object":
        props = node.get("properties")
        if not isinstance(props, Mapping) or not props:
            return as_json(path, "an object without properties (free-form)", nullable)
        if len({n.lower() for n in props}) < len(props):  # a STRUCT's field names ignore case
            return as_json(path, "property names that differ only in case", nullable)
        if not all(usable_name(n) for n in props):
            return as_json(path, "a property name that is empty or has control characters", nullable)
        return SqlType(fields=tuple(_fields(node, props, root, path, refs, depth, bound).items()), nullable=nullable)
    if kind == "string":
        return SqlType(_string(node), nullable=nullable)
    if kind == "number":
        return SqlType(_number(node), nullable=nullable)
    if kind in _SCALARS:
        return SqlType(_SCALARS[kind], nullable=nullable)
    return as_json(path, f"type {kind!r}", nullable)


def _resolve(node: Any, root: Mapping[str, Any], refs: frozenset[str]) -> tuple[Any, frozenset[str], str | None]:
    """Follow local `$ref`s: (the node they lead to, the refs followed, why it cannot be followed)."""
    while isinstance(node, Mapping) and "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            return node, refs, "a $ref outside the schema"
        if ref in refs:
            return node, refs, "a recursive $ref"
        target: Any = root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, Mapping) else None
        if target is None:
            return node, refs, f"$ref {ref} not found"
        node, refs = target, refs | {ref}
    return node, refs, None


def _is_null(branch: Any) -> bool:
    return isinstance(branch, Mapping) and (branch.get("type") == "null" or branch.get("const", 0) is None)


def _types(node: Mapping[str, Any]) -> set[str]:
    given = node.get("type")
    if isinstance(given, str):
        return {given}
    if isinstance(given, list):
        return {t for t in given if isinstance(t, str)}
    if "properties" in node:
        return {"object"}
    if "items" in node or "prefixItems" in node:
        return {"array"}
    values = node["enum"] if isinstance(node.get("enum"), list) else [node["const"]] if "const" in node else []
    return {_json_kind(v) for v in values}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "unknown")


def _array(node: Mapping[str, Any], root: Mapping[str, Any], path: str, refs: frozenset[str],
           nullable: bool, depth: int, bound: _Bound) -> SqlType:
    if "prefixItems" in node or isinstance(node.get("items"), list):
        return as_json(path, "a tuple (items by position)", nullable)
    items = sql_type(node.get("items", True), root, f"{path}[]", refs, depth + 1, bound)
    return SqlType(items=items, nullable=nullable)


def _string(node: Mapping[str, Any]) -> str:
    fmt = node.get("format")
    if fmt == "date" or (isinstance(node.get("pattern"), str) and iso_date_pattern(node["pattern"])):
        return "DATE"
    return "TIMESTAMPTZ" if fmt == "date-time" else "VARCHAR"


def _number(node: Mapping[str, Any]) -> str:
    """DECIMAL(p, k) when `multipleOf` is 10^-k (0 < k <= 18): p is 18 when `minimum`/`maximum` keep every
    value under 10^(18-k), else 38. Otherwise DOUBLE."""
    step = node.get("multipleOf")
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        return "DOUBLE"
    try:
        sign, digits, exponent = Decimal(str(step)).normalize().as_tuple()
    except InvalidOperation:
        return "DOUBLE"
    if sign or digits != (1,) or not isinstance(exponent, int) or not -18 <= exponent < 0:
        return "DOUBLE"
    scale = -exponent
    bounds = [node.get(k) for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")]
    lows, highs = [b for b in bounds[:2] if _is_number(b)], [b for b in bounds[2:] if _is_number(b)]
    small = bool(lows and highs) and max(abs(max(lows)), abs(min(highs))) < 10 ** (18 - scale)
    return f"DECIMAL({18 if small else 38},{scale})"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def iso_date_pattern(pattern: str) -> bool:
    """Whether a regex admits only YYYY-MM-DD-shaped text: anchored at both ends, exactly ten characters,
    digits everywhere but `-` at the fifth and eighth. Read with the stdlib's regex parser, so any spelling
    (`[0-9]{4}`, `\\d\\d\\d\\d`, `(0[1-9]|1[0-2])`) counts; the values are still cast, so 2026-02-31 is unfit."""
    try:
        parsed = list(sre_parse.parse(pattern))
        ends = (sre.AT_END, sre.AT_END_STRING)
        if len(parsed) < 2 or parsed[0] != (sre.AT, sre.AT_BEGINNING) or parsed[-1][0] != sre.AT or \
                parsed[-1][1] not in ends:
            return False
        chars = _positions(parsed[1:-1])
    except (re.error, RecursionError, OverflowError):
        return False
    return chars is not None and len(chars) == 10 and all(
        c == frozenset("-") if i in (4, 7) else c <= _DIGITS for i, c in enumerate(chars))


def _positions(items: Iterable[tuple[Any, Any]]) -> list[frozenset[str]] | None:
    """The characters each position of a fixed-width regex admits, or None when its width varies or an
    item is not one of: literal, character class of literals/ranges/digits, fixed repeat, group, branch."""
    out: list[frozenset[str]] = []
    for op, av in items:
        if op == sre.LITERAL:
            out.append(frozenset(chr(av)))
        elif op == sre.IN:
            chars = _class(av)
            if chars is None:
                return None
            out.append(chars)
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and av[0] == av[1] and av[0] <= 16:
            inner = _positions(av[2])
            if inner is None:
                return None
            out += inner * av[0]
        elif op == sre.SUBPATTERN:
            inner = _positions(av[3])
            if inner is None:
                return None
            out += inner
        elif op == sre.BRANCH:
            alternatives = [_positions(alt) for alt in av[1]]
            if any(a is None for a in alternatives) or len({len(a or ()) for a in alternatives}) != 1:
                return None
            out += [frozenset().union(*cs) for cs in zip(*alternatives, strict=True)]  # type: ignore[arg-type]
        else:
            return None
    return out


def _class(members: Iterable[tuple[Any, Any]]) -> frozenset[str] | None:
    chars: set[str] = set()
    for op, av in members:
        if op == sre.LITERAL:
            chars.add(chr(av))
        elif op == sre.RANGE and av[1] - av[0] < 256:
            chars.update(chr(c) for c in range(av[0], av[1] + 1))
        elif op == sre.CATEGORY and av == sre.CATEGORY_DIGIT:
            chars.update(_DIGITS)
        else:  # a negated class, \w, \s, a wide range: not a fixed set of digits
            return None
    return frozenset(chars)


def merge(a: SqlType, b: SqlType, path: str) -> SqlType:
    """One type for a property that two versions of a schema type differently: the wider type where one
    holds both (BIGINT and DOUBLE: DOUBLE; DATE or TIMESTAMPTZ and VARCHAR: VARCHAR), fields united, else JSON."""
    nullable = a.nullable or b.nullable
    if a.fields is not None and b.fields is not None:
        mine = dict(a.fields)
        fields = [(n, merge(t, b_t, f"{path}.{n}") if (b_t := dict(b.fields).get(n)) else t) for n, t in a.fields]
        fields += [(n, t) for n, t in b.fields if n not in mine]
        return SqlType(fields=tuple(fields), nullable=nullable)
    if a.items is not None and b.items is not None:
        return SqlType(items=merge(a.items, b.items, f"{path}[]"), nullable=nullable)
    if a.scalar is None or b.scalar is None:
        return as_json(path, "versions of the schema disagree (a list or struct in one)")
    if JSON in (a.scalar, b.scalar):
        return a if a.scalar == JSON else b
    if a.scalar == b.scalar:
        return replace(a, nullable=nullable)
    pair = {a.scalar, b.scalar}
    if all(s in _NUMERIC or s.startswith("DECIMAL") for s in pair):
        return SqlType("DOUBLE", nullable=nullable)
    if "VARCHAR" in pair and pair <= {"VARCHAR", "DATE", "TIMESTAMPTZ"}:
        return SqlType("VARCHAR", nullable=nullable)
    return as_json(path, f"versions of the schema disagree ({' vs '.join(sorted(pair))})")


def identifier(name: str, taken: set[str]) -> str:
    """A plain SQL identifier for `name`, unique (case-insensitively, as DuckDB compares them) among `taken`,
    which it joins: letters, digits and `_` kept, anything else `_`, a leading digit prefixed, `_2`, `_3` ...
    on a clash. Callers quote it anyway (`quote`)."""
    base = name if _IDENTIFIER.fullmatch(name) else re.sub(r"[^A-Za-z0-9_]", "_", name)[:60]
    if not base or not (base[0].isalpha() or base[0] == "_"):
        base = "_" + base
    chosen, n = base, 1
    while chosen.lower() in taken:
        n += 1
        chosen = f"{base}_{n}"
    taken.add(chosen.lower())
    return chosen


def quote(name: str) -> str:
    """A SQL identifier quoted: a name from a schema is data, never SQL."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """A SQL string literal (DuckDB's standard strings: no backslash escapes, a quote is doubled)."""
    return "'" + text.replace("'", "''") + "'"
