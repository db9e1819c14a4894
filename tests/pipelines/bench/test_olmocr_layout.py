"""The bounded layout match of olmOCR-Bench's math rule (pipelines/bench/olmocr_layout.py): the reference's
verdict, found without its exponential search. The reference's search is written out here as the reference
writes it (allenai/olmocr `compare_rendered_equations`, its `backtrack`) and run on small random layouts, where
it finishes; the layouts that made it run for ever are checked by the number of matches the new search tries."""
from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from pipelines.bench import olmocr_bench
from pipelines.bench.olmocr_layout import Span, layout_match
from pipelines.bench.olmocr_tests import BenchTest


def reference_backtrack(ref: Sequence[Span], hyp: Sequence[Span]) -> bool:
    """The reference's search, one span a character (the inputs here are single characters already)."""
    def centre(s: Span) -> tuple[float, float]:
        return s.x + s.width / 2, s.y + s.height / 2

    def around(spans: Sequence[Span]) -> list[dict[str, int | None]]:
        out = []
        for i, a in enumerate(spans):
            (cx, cy), near = centre(a), {}
            for side in ("up", "down", "left", "right"):
                best = None
                for j, b in enumerate(spans):
                    ox, oy = centre(b)
                    if i == j:
                        continue
                    d = {"up": cy - oy, "down": oy - cy, "left": cx - ox, "right": ox - cx}[side]
                    off = abs(ox - cx) if side in ("up", "down") else abs(oy - cy)
                    if d > 0 and off <= 5 and (best is None or d < best[0]):
                        best = (d, j)
                near[side] = best[1] if best else None
            out.append(near)
        return out

    candidates = [[j for j, h in enumerate(hyp) if h.text == r.text] for r in ref]
    if not all(candidates):
        return False
    r_nb, h_nb, used, assignment = around(ref), around(hyp), [False] * len(hyp), {}

    def backtrack(i: int) -> bool:
        if i == len(ref):
            return True
        for cand in candidates[i]:
            if used[cand]:
                continue
            assignment[i], used[cand] = cand, True
            valid = True
            for side in ("up", "down", "left", "right"):
                want, got = r_nb[i][side], h_nb[cand][side]
                if want is None:
                    continue
                if got is None or (assignment[want] != got if want in assignment else hyp[got].text != ref[want].text):
                    valid = False
                    break
            if valid and backtrack(i + 1):
                return True
            used[cand] = False
            del assignment[i]
        return False

    return backtrack(0)


def scattered(text: str) -> list[Span]:
    """Characters on a diagonal, 20 px apart both ways: none has a neighbour within 5 px (nested superscripts)."""
    return [Span(c, 20 * k, -20 * k, 10, 10) for k, c in enumerate(text)]


def row(text: str, x: float = 0, y: float = 0) -> list[Span]:
    return [Span(c, x + 12 * k, y, 10, 10) for k, c in enumerate(text)]


def test_characters_without_neighbours_are_never_searched() -> None:
    # The case: 11 such characters took the reference's search 20 s, each more multiplying it by ~n;
    # 40 would never finish. With no neighbour there is nothing to search: only a matching.
    missing_one = layout_match(scattered("x" * 40), scattered("x" * 39))
    assert missing_one.matched is False and missing_one.steps == 0
    enough = layout_match(scattered("x" * 40), scattered("x" * 40))
    assert enough.matched is True and enough.steps == 0
    mixed = layout_match(scattered("xy" * 20), scattered("y" * 20 + "x" * 19 + "z"))
    assert mixed.matched is False and mixed.steps == 0


def test_a_row_is_matched_in_steps_linear_in_its_length() -> None:
    n = 30
    found = layout_match(row("a" * n), row("a" * (n + 3)))
    assert found.matched is True and found.steps <= 2 * n
    # The same row against rows that are each one character short: no match; the reference would try them all.
    short = layout_match(row("a" * n), row("a" * (n - 1)) + row("a" * (n - 1), y=40) + row("a" * (n - 1), y=80))
    assert short.matched is False and short.steps <= 4 * n


def test_past_its_bound_the_verdict_is_unscored_not_guessed() -> None:
    ref, hyp = row("ab"), row("ab")
    assert layout_match(ref, hyp).matched is True
    gave_up = layout_match(ref, hyp, max_steps=0)
    assert gave_up.matched is None and gave_up.steps == 1


def random_layout(rng: random.Random, size: int, alphabet: str) -> list[Span]:
    """Characters on a coarse grid (12 px cells, so neighbours are common), some nudged by up to 7 px."""
    cells = rng.sample([(x, y) for x in range(4) for y in range(3)], size)
    return [Span(rng.choice(alphabet), 12 * x + rng.choice((0, 0, 0, 3, 7)), 12 * y, 10, 10) for x, y in cells]


def test_the_verdict_is_the_reference_searchs_on_random_layouts() -> None:
    rng = random.Random(42)
    seen = {True: 0, False: 0}
    for _ in range(600):
        ref = random_layout(rng, rng.randint(1, 6), "ab")
        if rng.random() < 0.5:  # the reference's own characters, shuffled and some moved or added
            hyp = [s if rng.random() < 0.8 else Span(s.text, s.x + 12, s.y, 10, 10) for s in ref]
            hyp += random_layout(rng, rng.randint(0, 3), "abc")
            rng.shuffle(hyp)
        else:
            hyp = random_layout(rng, rng.randint(1, 8), "abc")
        want = reference_backtrack(ref, hyp)
        got = layout_match(ref, hyp)
        assert got.matched is want, (ref, hyp)
        seen[want] += 1
    assert min(seen.values()) > 50  # both verdicts were exercised


def test_an_unscored_math_test_is_counted_failed_and_reported() -> None:
    tests = (BenchTest("m1", "a.pdf", 1, "math", spec={"math": "x^{y^{z}}"}),
             BenchTest("m2", "a.pdf", 1, "math", spec={"math": "a"}))
    data = olmocr_bench.Dataset(root=None, tests=tests, category={"m1": "math", "m2": "math"},  # type: ignore[arg-type]
                                pdfs=("a.pdf",))

    def gives_up(expected: str, equations: Sequence[str]) -> bool | None:  # a rule whose comparison gave up
        return True if expected in equations else None

    result = olmocr_bench.score(data, {("a.pdf", 1): "$a$ and $x^y$"}, draws=10, math=gives_up, math_note="rule")
    assert result["unscored"] == ["m1"] and result["verdicts"] == {"m1": False, "m2": True}
    assert result["passed"] == 1 and [f["id"] for f in result["failures"]] == ["m1"]
    assert result["failures"][0]["why"].startswith("unscored")
    assert any("unscored: 1 math tests" in line for line in olmocr_bench.render(result))


@pytest.mark.parametrize("n", [6, 8])
def test_small_scattered_cases_agree_with_the_reference(n: int) -> None:
    # Small enough for the reference's search to finish: the same verdicts both ways.
    for ref, hyp in ((scattered("x" * n), scattered("x" * (n - 1))), (scattered("xy" * (n // 2)), scattered("yx" * n))):
        assert layout_match(ref, hyp).matched is reference_backtrack(ref, hyp)
