"""olmOCR-Bench's full math rule (pipelines/bench/olmocr_math.py): equations that render alike in KaTeX pass, others
fail. One headless Chromium for the module (a few seconds); scripts/setup_venv.sh installs what it needs (the
`bench-math` extra, and it refuses to finish without a `chromium`), so this test never skips.
benchmarks/bench_scorer_agreement.py compares these verdicts with the reference's own renderer."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.bench import command, olmocr_bench, olmocr_math
from pipelines.bench.olmocr_math import Rendered, Span, alike, mathml_core, same_layout
from pipelines.bench.olmocr_tests import MathRule, check, parse_test


@pytest.fixture(scope="module")
def rule() -> Iterator[MathRule]:
    with olmocr_math.math_rule() as (found, note):
        assert found is not None, note  # the extra and Chromium are part of the setup
        yield found


def math_test(latex: str) -> object:
    return parse_test({"pdf": "a.pdf", "page": 1, "id": "m", "type": "math", "math": latex})


CASES = [  # (expected LaTeX, page, passes under the full rule): each follows from what KaTeX draws
    ("a^{2}+b^{2}=c^{2}", "so $a^2 + b^2 = c^2$ holds", True),  # braces and spaces change nothing drawn
    ("\\frac{1}{2}", "half: \\[\\frac12\\]", True),
    ("a^{2}+b^{2}=c^{2}", "so $a^3 + b^2 = c^2$", False),  # another exponent
    ("\\frac{1}{2}", "\\(\\frac{2}{1}\\)", False),  # numerator and denominator swapped: 1 is no longer above 2
    ("a^{2}+b^{2}=c^{2}", "a^2 + b^2 = c^2 without delimiters", False),  # no equation on the page
    ("\\frac{1}{2", "any equation: $y$", True),  # KaTeX cannot parse the expected one: the reference passes any
]


@pytest.mark.parametrize(("latex", "page", "expected"), CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_rendered_rule(rule: MathRule, latex: str, page: str, expected: bool) -> None:
    test = math_test(latex)
    passed, why = check(test, page, rule)
    assert passed is expected, why
    assert check(test, page)[0] is False  # none of these pages holds the expected LaTeX verbatim


def test_same_layout_matches_characters_with_their_neighbours() -> None:
    a, b, two = Span("a", 0, 0, 10, 10), Span("b", 20, 0, 10, 10), Span("2", 10, -12, 6, 6)
    assert same_layout([a, b], [a, b])
    assert same_layout([a, b], [Span("c", -30, 0, 10, 10), a, b])  # extra characters in the hypothesis are fine
    assert not same_layout([a, b], [Span("b", 0, 0, 10, 10), Span("a", 20, 0, 10, 10)])  # order swapped
    assert not same_layout([a, b], [a])  # b missing
    assert not same_layout([a, Span("2", 2, -12, 6, 6)], [a, Span("2", 2, 12, 6, 6)])  # above against below
    assert same_layout([Span("ab", 0, 0, 20, 10)], [a, Span("b", 10, 0, 10, 10)])  # a span splits per character
    assert same_layout([], [two])  # nothing to place: the reference's quirk for a failed render


def test_mathml_core_drops_the_annotation_and_spaces() -> None:
    mathml = ('<math><semantics><mrow><mi>x</mi> <mo>+</mo></mrow>'
              '<annotation encoding="application/x-tex">x +</annotation></semantics></math>')
    assert mathml_core(mathml) == "<mrow><mi>x</mi><mo>+</mo></mrow>"
    inner = Rendered("<math><semantics><mi>x</mi></semantics></math>", ())
    assert alike(inner, Rendered(mathml, ()))  # the reference's MathML inside the hypothesis's
    plus = (Span("x", 0, 0, 10, 10), Span("+", 12, 0, 10, 10))
    assert not alike(Rendered(mathml, plus), inner)  # not contained, and "+" has nothing to match


def test_eval_scores_math_by_the_full_rule_and_says_so(tmp_path: Path) -> None:
    """`pagemill eval --bench olmocr-bench` (command.score_run) on a run whose page writes the expected equation
    differently: passed under the full rule, and the report's math line names the rule."""
    (tmp_path / "pdfs").mkdir()
    (tmp_path / "pdfs" / "doc.pdf").write_bytes(b"%PDF-1.4\n")  # only its name is read when scoring
    (tmp_path / "math.jsonl").write_text(json.dumps({"pdf": "doc.pdf", "page": 1, "id": "m1", "type": "math",
                                                     "math": "a^{2}+b^{2}=c^{2}"}) + "\n")
    uri = str(tmp_path / "pdfs" / "doc.pdf")
    run = {"pages": {(uri, 0): {"markdown": "Pythagoras: $a^2 + b^2 = c^2$.", "extraction": None}}, "uris": [uri]}
    result = command.score_run("olmocr-bench", tmp_path, run)
    assert result["verdicts"]["m1"] is True and result["exact_math_only"] is False
    assert any(line.startswith("  math: exact LaTeX match or alike in KaTeX") for line in olmocr_bench.render(result))
