"""Evidence: each non-empty leaf value of a page's extraction traced to the page's words (the text layer's, or
Tesseract's), with the quoted words and their union box, or marked as not found there.

- A value is looked for in the printed forms of transforms/model/values.py (`1,717.44` for 1717.44,
  `25/12/2018` for 2018-12-25); a text value that is not found as printed may still match a run of words
  at least GROUNDED_MIN similar (an OCR misread), with that similarity as its score.
- A value found more than once takes the place nearest (on the page's vertical axis) to the values of its own
  object that were found once: a line item's quantity `1` is the `1` on its description's row. Otherwise the
  first in reading order.
- A value spread over several words or lines gets the union of their boxes.
- A value the model quoted (--evidence-quotes, transforms/model/quotes.py) is looked for by its quote instead,
  as text (method `model_quote`): found, it is grounded where the quote stands; a quote not found on the page is
  not grounded, whether or not the value is printed there (the model's claim of where it read it is wrong).
- A page with no words (no text layer, no OCR) cannot be checked: its rows say `grounded` null, method `none`.
- The page gets the flag `ungrounded_values` when at least one of its values is not found on it
  (`pages.ungrounded_values` counts them), with the field paths (never the values) in `flag_detail`.
Bounded work: at most MAX_VALUES values a page are checked; each lookup is a dictionary probe, and near
matches (of at most MAX_NEAR values a page, of at most MAX_NEAR_TOKENS tokens) are scored in rapidfuzz's C loop.
Pure.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from rapidfuzz import fuzz, process

from schemas.evidence import Box, EvidenceRow, PageWords, decode_words
from schemas.records import PageRow
from transforms.model import values

GROUNDED_MIN = 0.85  # a near match at least this similar is found (one misread letter in eight)
MAX_VALUES = 400  # leaf values checked per page; the rest get no row
MAX_VALUE_CHARS = 300  # a longer text value is looked for by its first characters only
MAX_NEAR_TOKENS = 24  # a longer text value must be found as printed (near matches of long runs cost the most)
MAX_NEAR = 24  # text values a page that may be near-matched; later ones must be found as printed
FLAG = "ungrounded_values"
NOTE_PATHS = 8  # field paths named in the flag's note
Occurrence = tuple[int, int, float]  # first word, last word, score


@dataclass
class PageIndex:
    """A page's words as tokens, looked up by token text and by numeric value."""

    words: PageWords
    toks: list[str] = field(default_factory=list)
    word_of: list[int] = field(default_factory=list)
    by_token: dict[str, list[int]] = field(default_factory=dict)
    by_number: dict[Decimal, list[int]] = field(default_factory=dict)
    windows: dict[int, list[str]] = field(default_factory=dict)  # k -> the text of each k-token run (lazily)
    near_left: int = MAX_NEAR

    @classmethod
    def of(cls, words: PageWords) -> PageIndex:
        page = cls(words)
        for w, text in enumerate(words.texts):
            for tok in values.tokens(text):
                p = len(page.toks)
                page.toks.append(tok)
                page.word_of.append(w)
                page.by_token.setdefault(tok, []).append(p)
                if tok[0].isdigit():
                    for number in values.numbers(tok):
                        page.by_number.setdefault(number, []).append(p)
        return page

    def window(self, k: int) -> list[str]:
        if k not in self.windows:
            self.windows[k] = [" ".join(self.toks[p: p + k]) for p in range(max(0, len(self.toks) - k + 1))]
        return self.windows[k]


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(field path, value) of each non-empty leaf: text that is not blank, and numbers. Booleans are no printed
    value, so they are not looked for."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    elif isinstance(value, str):
        if value.strip():
            yield path, value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


def occurrences(page: PageIndex, value: str | int | float) -> list[Occurrence]:
    """Where the page prints `value`: every exact occurrence, else the best near match (text only), else []."""
    if not isinstance(value, str):
        number = values.number_of(value)
        found = page.by_number.get(number, []) if number is not None else []
        return [(page.word_of[p], page.word_of[p], 1.0) for p in found]
    text = value.strip()[:MAX_VALUE_CHARS]
    out: list[Occurrence] = []
    for form in values.printed_forms(text):
        k = len(form)
        for p in page.by_token.get(form[0], ()):
            if page.toks[p: p + k] == form:
                out.append((page.word_of[p], page.word_of[p + k - 1], 1.0))
    symbol = values.CURRENCY_SYMBOLS.get(text.upper()) if len(text) == 3 else None
    if not out and symbol:
        out = [(w, w, 1.0) for w, t in enumerate(page.words.texts) if symbol in t]
    form = values.tokens(text)
    if out or values.is_date(text) or len(form) > MAX_NEAR_TOKENS or page.near_left <= 0:
        return sorted(set(out))
    page.near_left -= 1
    return near(page, form)


def near(page: PageIndex, form: list[str]) -> list[Occurrence]:
    """The run of page tokens most like `form` (one token more or fewer allowed: OCR splits and joins words)."""
    if not form:
        return []
    query, best = " ".join(form), None
    for k in dict.fromkeys((len(form), len(form) - 1, len(form) + 1)):
        if k < 1 or k > len(page.toks):
            continue
        hit = process.extractOne(query, page.window(k), scorer=fuzz.ratio, score_cutoff=GROUNDED_MIN * 100)
        if hit is not None and (best is None or hit[1] > best[0]):
            best = (hit[1], hit[2], k)
    if best is None:
        return []
    score, p, k = best
    return [(page.word_of[p], page.word_of[p + k - 1], round(score / 100, 4))]


def union(boxes: list[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def choose(found: dict[str, list[Occurrence]], words: PageWords) -> dict[str, Occurrence]:
    """One occurrence per path: a single one as it is; of several, the nearest to its own object's single ones."""
    chosen = {path: occ[0] for path, occ in found.items() if len(occ) == 1}

    def middle(o: Occurrence) -> float:
        return (words.boxes[o[0]][1] + words.boxes[o[1]][3]) / 2

    anchors: dict[str, list[float]] = {}
    for path, o in chosen.items():
        anchors.setdefault(path.rpartition(".")[0], []).append(middle(o))
    taken = {o[:2] for o in chosen.values()}
    for path, occ in found.items():  # in the answer's order, which is mostly the page's: unit price before amount
        if len(occ) < 2:
            continue
        parent = path.rpartition(".")[0]
        ys = anchors.get(parent, []) if parent else []
        # A place another value already took is the last choice (a quantity of 1: unit price and amount agree).
        chosen[path] = min(occ, key=lambda o: (o[:2] in taken, min((abs(middle(o) - y) for y in ys), default=0.0),
                                               o[0]))
        taken.add(chosen[path][:2])
    return chosen


def match(extraction: Any, words: PageWords | None,
          quotes: Mapping[str, str] | None = None) -> tuple[EvidenceRow, ...]:
    """One row per non-empty leaf value of `extraction` (parsed JSON), found in `words` or not; a value with a
    model quote (`quotes`: field path -> text) is looked for by its quote."""
    items = list(leaves(extraction))[:MAX_VALUES]
    quoted = {p: q for p, q in (quotes or {}).items() if q.strip()}
    if words is None:
        return tuple(EvidenceRow(path, _text(v), "none", 0.0, None) for path, v in items)
    page = PageIndex.of(words)
    found = {path: occurrences(page, quoted.get(path, v)) for path, v in items}
    chosen = choose({p: o for p, o in found.items() if o}, words)
    rows = []
    for path, v in items:
        o = chosen.get(path)
        method = "model_quote" if path in quoted else words.source
        if o is None or o[2] < GROUNDED_MIN:
            rows.append(EvidenceRow(path, _text(v), method, o[2] if o else 0.0, False))
            continue
        first, last, score = o
        rows.append(EvidenceRow(path, _text(v), method, score, True,
                                quote=" ".join(words.texts[first: last + 1]),
                                box=union(list(words.boxes[first: last + 1]))))
    return tuple(rows)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def with_evidence(row: PageRow, words: bytes, quotes: tuple[tuple[str, str], ...] = ()) -> PageRow:
    """`row` with the evidence of its extraction on the page whose `words` (schemas/evidence.py's encoding) are
    given, its counts, and the flag when a value is not found; `quotes`: the model's (field path, quote). A row
    with no JSON object answer is as it was."""
    if not row.extraction or row.markdown is not None:
        return row
    try:
        parsed = json.loads(row.extraction)
    except ValueError:
        return row
    if not isinstance(parsed, dict):
        return row
    page_words = decode_words(words)
    rows = match(parsed, page_words, dict(quotes))
    missing = [r.field_path for r in rows if r.grounded is False]
    flags, notes = row.flags, row.flag_detail
    if missing:
        named = ", ".join(missing[:NOTE_PATHS]) + (" ..." if len(missing) > NOTE_PATHS else "")
        flags = tuple(dict.fromkeys((*flags, FLAG)))
        notes = tuple(dict.fromkeys((*notes, f"{FLAG}: {len(missing)} of {len(rows)} values not found on the "
                                              f"page: {named}")))  # a reused row may carry the note already
    return replace(row, evidence=rows, evidence_values=len(rows), flags=flags, flag_detail=notes,
                   ungrounded_values=len(missing) if page_words is not None else None)
