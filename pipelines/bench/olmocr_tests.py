"""olmOCR-Bench's test kinds, each a pure check of one page's markdown: `check(test, markdown) -> (passed, why)`.

Written from the definitions in allenai/olmocr `olmocr/bench/tests.py` (the benchmark's reference scorer), with
the same fuzzy primitives (rapidfuzz's `partial_ratio`/`ratio`, fuzzysearch's `find_near_matches`), so that a
verdict here is the reference's verdict: benchmarks/bench_scorer_agreement.py runs both on the same markdown.

`math` tests: the reference passes one when an equation of the page equals the expected LaTeX, or when the two
*render* alike in KaTeX inside a headless Chromium. `check` applies the first rule alone unless it is handed the
full rule (pipelines/bench/olmocr_math.py, where Playwright and a Chromium are installed); under the first rule
alone, a page whose equation is written differently but renders the same fails here and passes there, and the
report says which rule it used (docs/benchmarks.md).
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.bench.olmocr_tables import Cell, Table, html_tables, markdown_tables

KINDS = ("present", "absent", "order", "table", "math", "baseline", "format", "footnote")
_FANCY = {"‘": "'", "’": "'", "‚": "'", "“": '"', "”": '"', "„": '"', "＿": "_", "–": "-", "—": "-", "‑": "-",
          "‒": "-", "−": "-", "\u00b5": "\u03bc"}
# CJK ideographs, kana and emoji: the baseline test fails a page that holds any (the benchmark is English).
_DISALLOWED = re.compile("[\u4e00-\u9fff\u3040-\u309f\u30a0-\u30ff\U0001f600-\U0001f64f\U0001f300-\U0001f5ff"
                         "\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff]")
_MATH_DELIMITERS = (r"\\\((.+?)\\\)", r"\\\[(.+?)\\\]")
_DOLLAR_DELIMITERS = (r"\$\$(.+?)\$\$", r"\$(.+?)\$")
_SUPERSCRIPT = dict(zip("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹", strict=True))


# (expected LaTeX, the page's equations) -> passed; None: unscored (the rendered comparison could not decide in
# its bound, pipelines/bench/olmocr_layout.py), which `check` reports as passed None.
MathRule = Callable[[str, Sequence[str]], bool | None]


class BadTest(ValueError):
    """A test line the benchmark itself would refuse (its ValidationError)."""


@dataclass(frozen=True)
class BenchTest:
    """One line of a benchmark .jsonl file: the fields every kind has, and the rest as `spec`."""
    id: str
    pdf: str
    page: int
    kind: str
    max_diffs: int = 0
    spec: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.spec.get(key, default)
        return default if value is None else value


def normalize(text: str) -> str:
    """The benchmark's text normalisation: `<br>` to a space, bold/italic markers and `<b>`/`<i>` tags dropped,
    whitespace runs to one space, NFC, typographic quotes and dashes to ASCII, micro sign to mu."""
    text = re.sub(r"<br/?>", " ", text)
    text = re.sub(r"\*\*(.*?)\*\*", r"\1", text)
    text = re.sub(r"__(.*?)__", r"\1", text)
    text = re.sub(r"</?b>", "", text)
    text = re.sub(r"</?i>", "", text)
    text = re.sub(r"(\*\*|__)(.*?)\1", r"\2", text)
    text = re.sub(r"(\*|_)(.*?)\1", r"\2", text)
    text = unicodedata.normalize("NFC", re.sub(r"\s+", " ", text))
    for fancy, plain in _FANCY.items():
        text = text.replace(fancy, plain)
    return text


def parse_test(obj: Mapping[str, Any]) -> BenchTest:
    """A test from one parsed .jsonl line; raises BadTest as the benchmark's loader would."""
    kind, pdf, test_id = obj.get("type"), obj.get("pdf"), obj.get("id")
    if kind not in KINDS:
        raise BadTest(f"unknown test type {kind!r}")
    if not isinstance(pdf, str) or not pdf or not isinstance(test_id, str) or not test_id:
        raise BadTest("a test needs a non-empty 'pdf' and 'id'")
    page, max_diffs = obj.get("page"), obj.get("max_diffs", 0)
    if not isinstance(page, int) or isinstance(page, bool):
        raise BadTest(f"test {test_id}: 'page' must be an integer")
    if not isinstance(max_diffs, int) or isinstance(max_diffs, bool) or max_diffs < 0:
        raise BadTest(f"test {test_id}: 'max_diffs' must be a non-negative integer")
    spec = {k: v for k, v in obj.items() if k not in ("type", "pdf", "id", "page", "max_diffs")}
    for key in {"present": ("text",), "absent": ("text",), "format": ("text",), "order": ("before", "after"),
                "table": ("cell",), "math": ("math",), "footnote": ("marker",)}.get(kind, ()):
        if not isinstance(spec.get(key), str) or not normalize(spec[key]).strip():
            raise BadTest(f"test {test_id}: {key!r} must be non-empty text")
    if kind == "order" and max_diffs > min(len(normalize(spec["before"])), len(normalize(spec["after"]))) // 2:
        raise BadTest(f"test {test_id}: 'max_diffs' above half the text it searches")
    return BenchTest(test_id, pdf, page, kind, max_diffs, spec)


def _threshold(test: BenchTest, text: str) -> float:
    return 1.0 - test.max_diffs / (len(text) if text else 1)


def _presence(test: BenchTest, md: str) -> tuple[bool, str]:
    from rapidfuzz import fuzz

    query, content = normalize(test.spec["text"]), normalize(md)
    if not test.get("case_sensitive", True):
        query, content = query.lower(), content.lower()
    first, last = test.get("first_n"), test.get("last_n")
    if first and last:
        content = content[:first] + content[-last:]
    elif first:
        content = content[:first]
    elif last:
        content = content[-last:]
    threshold, ratio = _threshold(test, query), fuzz.partial_ratio(query, content) / 100.0
    found = ratio >= threshold
    if test.kind == "present":
        return found, "" if found else f"best match of {query[:40]!r} {ratio:.3f} < {threshold:.3f}"
    return not found, "" if not found else f"{query[:40]!r} found ({ratio:.3f} >= {threshold:.3f})"


def _order(test: BenchTest, md: str) -> tuple[bool, str]:
    from fuzzysearch import find_near_matches

    before, after, content = normalize(test.spec["before"]), normalize(test.spec["after"]), normalize(md)
    b = find_near_matches(before, content, max_l_dist=test.max_diffs)
    a = find_near_matches(after, content, max_l_dist=test.max_diffs)
    if not b or not a:
        return False, f"{(before if not b else after)[:40]!r} not found"
    ok = any(x.start < y.start for x in b for y in a)
    return ok, "" if ok else f"{before[:40]!r} never before {after[:40]!r}"


def _related(table: Table, cell: Cell, want: str, neighbours: set[Cell] | frozenset[Cell], max_diffs: int) -> bool:
    from rapidfuzz import fuzz

    need = max(0.5, 1.0 - max_diffs / (len(want) if want else 1))
    return any(fuzz.ratio(want, normalize(table.cells[n])) / 100.0 >= need for n in neighbours)


def _table(test: BenchTest, md: str) -> tuple[bool, str]:
    from rapidfuzz import fuzz

    target = normalize(test.spec["cell"])
    threshold = max(0.5, _threshold(test, target))
    tables = ([] if test.get("ignore_markdown_tables", False) else markdown_tables(md)) + html_tables(md)
    if not tables:
        return False, "no table on the page"
    wants = {k: normalize(test.get(k, "")) for k in ("up", "down", "left", "right", "top_heading", "left_heading")}
    for table in tables:
        for cell, text in table.cells.items():
            if fuzz.ratio(target, normalize(text)) / 100.0 < threshold:
                continue
            looks: dict[str, Callable[[Cell], Any]] = {
                "up": table.up.__getitem__, "down": table.down.__getitem__, "left": table.left.__getitem__,
                "right": table.right.__getitem__, "top_heading": table.top_heading, "left_heading": table.left_heading}
            if all(_related(table, cell, want, looks[k](cell), test.max_diffs) for k, want in wants.items() if want):
                return True, ""
    return False, f"no cell {target[:40]!r} with the expected neighbours"


def repeats_at_end(text: str, max_size: int = 5) -> list[int]:
    """For n = 1..max_size: how many times the text's last n characters repeat back to back at its end
    (whitespace runs as one space), as olmOCR's RepeatDetector counts them."""
    text = re.sub(r"\s+", " ", text)
    counts = []
    for size in range(1, max_size + 1):
        if len(text) < size:
            counts.append(0)
            continue
        tail, count, pos = text[-size:], 0, len(text) - size
        while pos >= 0 and text[pos:pos + size] == tail:
            count, pos = count + 1, pos - size
        counts.append(count)
    return counts


def _baseline(test: BenchTest, md: str) -> tuple[bool, str]:
    max_length = test.spec.get("max_length")
    counted = re.sub(r"!\[.*?\]\(.*?\)", "", md) if max_length is not None and \
        test.get("max_length_skips_image_alt_tags", False) else md
    alnum = len("".join(c for c in counted if c.isalnum()).strip())
    if max_length is not None:  # a blank-page test: nothing else is checked
        return alnum <= max_length, "" if alnum <= max_length else f"{alnum} characters on a blank page"
    if alnum == 0:
        return False, "no alphanumeric character"
    worst = max(repeats_at_end(md))
    if worst > test.get("max_repeats", 30):
        return False, f"ends with {worst} repeats"
    if test.get("check_disallowed_characters", True) and _DISALLOWED.search(md):
        return False, "disallowed characters"
    return True, ""


def equations(md: str, dollars: bool = True) -> list[str]:
    """Every delimited equation of the page (`\\(..\\)`, `\\[..\\]`, then `$$..$$` and `$..$`), stripped, each
    delimiter's matches removed before the next is searched (as the reference does)."""
    found: list[str] = []
    for pattern in _MATH_DELIMITERS + (_DOLLAR_DELIMITERS if dollars else ()):
        found += [e.strip() for e in re.findall(pattern, md, re.DOTALL)]
        md = re.sub(pattern, "", md, flags=re.DOTALL)
    return found


def _math(test: BenchTest, md: str, rule: MathRule | None = None) -> tuple[bool | None, str]:
    found = equations(md, not test.get("ignore_dollar_delimited", False))
    ok = rule(test.spec["math"], found) if rule else test.spec["math"] in found
    if ok is None:
        return None, f"unscored: no equation matched {test.spec['math'][:40]!r}, and one was too costly to compare"
    return ok, "" if ok else (f"no equation {'rendering like' if rule else 'equal to'} {test.spec['math'][:40]!r}"
                              + ("" if rule else " (rendered comparison not run)"))


def _format(test: BenchTest, md: str) -> tuple[bool, str]:
    from rapidfuzz import fuzz

    fmt = test.spec.get("format")
    patterns = {"heading": [(r"^#{1,6}\s+(.+?)$", re.MULTILINE), (r"<h[1-6][^>]*>(.*?)</h[1-6]>", re.I | re.S)],
                "bold": [(r"\*\*(.*?)\*\*", re.S), (r"__(.*?)__", re.S), (r"<b[^>]*>(.*?)</b>", re.I | re.S),
                         (r"<strong[^>]*>(.*?)</strong>", re.I | re.S)],
                "italic": [(r"(?<!\*)\*(?!\*)(.*?)(?<!\*)\*(?!\*)", re.S), (r"(?<!_)_(?!_)(.*?)(?<!_)_(?!_)", re.S),
                           (r"<i[^>]*>(.*?)</i>", re.I | re.S), (r"<em[^>]*>(.*?)</em>", re.I | re.S)]}.get(fmt)
    if patterns is None:
        return False, f"unknown format {fmt!r}"
    texts = [normalize(t) for p, flags in patterns for t in re.findall(p, md, flags)]
    want = normalize(test.spec["text"])
    if not test.get("case_sensitive", True):
        want, texts = want.lower(), [t.lower() for t in texts]
    threshold = _threshold(test, want)
    ok = any(fuzz.partial_ratio(want, t) / 100.0 >= threshold for t in texts)
    return ok, "" if ok else f"{want[:40]!r} not found as {fmt}"


def _clean(text: str) -> str:
    return "".join(c for c in normalize(text) if c.isalnum()).lower()


def _footnote(test: BenchTest, md: str) -> tuple[bool, str]:
    from rapidfuzz import fuzz

    marker = test.spec["marker"]
    spans = [(m.start(), m.end()) for m in re.finditer(rf"\[\^{re.escape(marker)}\](?!:)", md)]
    spans += [(m.start(), m.end()) for m in re.finditer(rf"<sup[^>]*>{re.escape(marker)}</sup>", md, re.I)]
    if all(c in _SUPERSCRIPT for c in marker):
        spans += [(m.start(), m.end()) for m in re.finditer(re.escape("".join(_SUPERSCRIPT[c] for c in marker)), md)]
    if not spans:
        return False, f"footnote marker {marker!r} not found"
    for key, before in (("appears_before_marker", True), ("appears_after_marker", False)):
        want = normalize(test.spec[key]) if test.spec.get(key) else ""
        if not want:
            continue
        target, threshold, ok = _clean(want), 1.0 - test.max_diffs / len(want), False
        for start, end in spans:
            near = _clean(md[max(0, start - 200):start] if before else md[end:min(len(md), end + 200)])
            if near:
                n = min(len(near), len(target) * 2)
                ok = fuzz.partial_ratio(target, near[-n:] if before else near[:n]) / 100.0 >= threshold
            if ok:
                break
        if not ok:
            return False, f"{want[:40]!r} not {'before' if before else 'after'} the marker"
    return True, ""


# Math tests go through `check`'s rule argument (_math), not this table.
_CHECKS: Mapping[str, Callable[[BenchTest, str], tuple[bool, str]]] = {
    "present": _presence, "absent": _presence, "order": _order, "table": _table,
    "baseline": _baseline, "format": _format, "footnote": _footnote}


def check(test: BenchTest, markdown: str, math: MathRule | None = None) -> tuple[bool | None, str]:
    """Whether `markdown` (one page) passes `test`, and why not; `math` decides math tests when given (the
    reference's full rule), else they pass on an equal equation only. None: unscored (only a math test under the
    full rule, whose layout comparison gave up)."""
    if test.kind == "math":
        return _math(test, markdown, math)
    return _CHECKS[test.kind](test, markdown)
