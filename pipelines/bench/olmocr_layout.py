"""olmOCR-Bench's layout match of two KaTeX renderings (allenai/olmocr `olmocr/bench/katex/render.py`,
`compare_rendered_equations` after the MathML check): every character of the expected rendering must map to a
distinct equal character of the page's whose nearest neighbours above, below, left and right agree.

The reference decides this with a plain depth-first search over the characters in order, which is exponential:
characters without neighbours (nested superscripts) are tried in every order, and 11 of them took 20 s. The
question it answers does not depend on that order, so it is decided here the same way, bounded:
- a character's own conditions (equal text; a neighbour on each side where the expected one has one, of the same
  text) filter its candidates before any search;
- the conditions between two characters (the reference checks a neighbour of character i against the match of
  the neighbour when that neighbour comes before i) are kept arc consistent (a candidate that no candidate of a
  paired character agrees with goes), and only characters in such pairs are searched, most constrained first;
- that no two characters share a match is checked as a bipartite matching of every unplaced character, so
  characters with no neighbour are never searched at all, and a dead end is seen as soon as it is one.
The search counts the matches it tries; past `MAX_STEPS` it stops and the verdict is unscored (None) rather than
a guess. Where it finishes, the verdict is the reference's (benchmarks/bench_scorer_agreement.py).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

NEIGHBOUR_TOLERANCE_PX = 5
MAX_STEPS = 20_000  # tried matches; a real equation pair needs far fewer (docs/benchmarks.md)
SIDES = ("up", "down", "left", "right")
_SPACES = re.compile(r"[\s\u200a-\u200d\u2060\ufeff]+", re.UNICODE)


@dataclass(frozen=True)
class Span:
    text: str
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class LayoutMatch:
    matched: bool | None  # None: unscored, the search gave up after `steps`
    steps: int  # matches tried by the search


def no_spaces(text: str) -> str:
    return _SPACES.sub("", text)


def characters(spans: Sequence[Span]) -> list[Span]:
    """Each span split into one span a character, the span's width shared equally (the reference's expansion)."""
    out = []
    for span in spans:
        text = no_spaces(span.text)
        out += [Span(c, span.x + span.width * i / len(text), span.y, span.width / len(text), span.height)
                for i, c in enumerate(text)]
    return out


def neighbours(chars: Sequence[Span], tol: float = NEIGHBOUR_TOLERANCE_PX) -> list[dict[str, int | None]]:
    """For each character, the nearest one above, below, left and right of it (centres within `tol` px)."""
    centres = [(c.x + c.width / 2, c.y + c.height / 2) for c in chars]
    found = []
    for i, (cx, cy) in enumerate(centres):
        best: dict[str, tuple[float, int] | None] = dict.fromkeys(SIDES)
        for j, (ox, oy) in enumerate(centres):
            if i == j:
                continue
            for side, ok, dist in (("up", oy < cy and abs(ox - cx) <= tol, cy - oy),
                                   ("down", oy > cy and abs(ox - cx) <= tol, oy - cy),
                                   ("left", ox < cx and abs(oy - cy) <= tol, cx - ox),
                                   ("right", ox > cx and abs(oy - cy) <= tol, ox - cx)):
                if ok and (best[side] is None or dist < best[side][0]):
                    best[side] = (dist, j)
        found.append({side: (b[1] if b else None) for side, b in best.items()})
    return found


class _GaveUp(Exception):
    pass


def _augment(start: int, domains: Sequence[frozenset[int]], taken: set[int], match: dict[int, int],
             owner: dict[int, int]) -> bool:
    """Extend the matching (character -> page character, and back) to `start` along an alternating path found
    breadth-first (no recursion: an equation can have hundreds of characters); `taken` are never used."""
    reached: dict[int, int] = {}  # page character -> the character whose search reached it
    queue = [start]
    for var in queue:
        for j in sorted(domains[var]):
            if j in taken or j in reached:
                continue
            reached[j] = var
            if j not in owner:
                while True:  # flip the path back to `start`
                    var = reached[j]
                    previous = match.get(var)
                    match[var], owner[j] = j, var
                    if var == start:
                        return True
                    j = previous  # type: ignore[assignment]  # every var on the path but start was matched
            queue.append(owner[j])
    return False


def layout_match(reference: Sequence[Span], hypothesis: Sequence[Span], max_steps: int = MAX_STEPS) -> LayoutMatch:
    """Whether every reference character maps to a distinct equal hypothesis character whose neighbours agree,
    decided without the reference's exponential search; unscored (None) past `max_steps` tried matches."""
    ref, hyp = characters(reference), characters(hypothesis)
    if not ref:
        return LayoutMatch(True, 0)
    if any(not any(h.text == r.text for h in hyp) for r in ref):
        return LayoutMatch(False, 0)
    ref_nb, hyp_nb = neighbours(ref), neighbours(hyp)

    def fits(i: int, j: int) -> bool:  # i's own conditions on j
        for side, r in ref_nb[i].items():
            if r is not None and ((h := hyp_nb[j][side]) is None or hyp[h].text != ref[r].text):
                return False
        return hyp[j].text == ref[i].text

    domains = [frozenset(j for j in range(len(hyp)) if fits(i, j)) for i in range(len(ref))]
    # (i, side, r): i's neighbour on `side` is r, which comes before i, so match(r) must be match(i)'s neighbour
    # there (the reference checks it when placing i; a later r it checks by text only, done in `fits`).
    pairs = [(i, side, r) for i in range(len(ref)) for side, r in ref_nb[i].items() if r is not None and r < i]
    touching: list[list[tuple[int, str, int]]] = [[] for _ in ref]
    for pair in pairs:
        touching[pair[0]].append(pair)
        touching[pair[2]].append(pair)
    searched = [i for i in range(len(ref)) if touching[i]]
    steps = 0

    def narrow(domains: list[frozenset[int]], changed: list[int]) -> bool:
        """Drop, in place, every candidate that no candidate of a paired character agrees with (arc consistency);
        False when a character is left with none."""
        queue = list(changed)
        while queue:
            var = queue.pop()
            for i, side, r in touching[var]:
                new_r = domains[r] & {hyp_nb[x][side] for x in domains[i]}
                new_i = frozenset(x for x in domains[i] if hyp_nb[x][side] in new_r)
                for v, new in ((r, new_r), (i, new_i)):
                    if new != domains[v]:
                        if not new:
                            return False
                        domains[v] = frozenset(new)
                        queue.append(v)
        return True

    def solve(domains: list[frozenset[int]], placed: dict[int, int], match: dict[int, int]) -> bool:
        nonlocal steps
        taken = set(placed.values())
        match = {v: j for v, j in match.items() if v not in placed and j in domains[v] and j not in taken}
        owner = {j: v for v, j in match.items()}
        for var in range(len(ref)):
            if var not in placed and var not in match and not _augment(var, domains, taken, match, owner):
                return False  # two characters would need the same match
        open_ = [v for v in searched if v not in placed]
        if not open_:
            return True
        var = min(open_, key=lambda v: (len(domains[v] - taken), v))
        for j in sorted(domains[var] - taken):
            steps += 1
            if steps > max_steps:
                raise _GaveUp
            narrowed = list(domains)
            narrowed[var] = frozenset((j,))
            if narrow(narrowed, [var]) and solve(narrowed, {**placed, var: j}, match):
                return True
        return False

    if not narrow(domains, searched):
        return LayoutMatch(False, 0)
    try:
        return LayoutMatch(solve(domains, {}, {}), steps)
    except (_GaveUp, RecursionError):
        return LayoutMatch(None, steps)


def same_layout(reference: Sequence[Span], hypothesis: Sequence[Span]) -> bool | None:
    """layout_match's verdict: True, False, or None when unscored."""
    return layout_match(reference, hypothesis).matched
