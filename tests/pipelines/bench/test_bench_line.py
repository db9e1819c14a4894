"""`pagemill bench`'s pasteable line and help, at unit level (the end-to-end runs are test_bench_run.py and
test_bench_kie_run.py): the line names the pages that were not answered, carries the math rule olmOCR-Bench was
scored by, and CORD's leads with the metric Donut publishes; `--help` says that run options may follow."""
from __future__ import annotations

import contextlib
import io
import re

import pytest

from pipelines import cli
from pipelines.bench import command, cord, olmocr_bench
from pipelines.bench.olmocr_tests import BenchTest
from pipelines.config.options import known_parser


def fields(line: str) -> list[str]:
    return [f.strip() for f in line.split("|")]


def run(statuses: dict[str, int]) -> dict:
    return {"ledger_pages": sum(statuses.values()), "wall_seconds": 4.0, "cost_usd": 0.0, "models": ["m"],
            "statuses": statuses}


def olmocr_result(math: bool) -> dict:
    test = BenchTest("m1", "a.pdf", 1, "math", spec={"math": "x^{2}"})
    data = olmocr_bench.Dataset(root=None, tests=(test,), category={"m1": "math"}, pdfs=("a.pdf",))  # type: ignore[arg-type]

    def alike(expected: str, equations: list[str]) -> bool:  # a stand-in for the rendered rule: x^2 is x^{2}
        return any(e.replace("{", "").replace("}", "") == expected.replace("{", "").replace("}", "")
                   for e in equations)

    return olmocr_bench.score(data, {("a.pdf", 1): "$x^2$"}, draws=10, math=alike if math else None)


def test_a_run_whose_pages_were_all_invalid_says_so() -> None:
    # The issue: two pages, both `invalid` (random weights), printed as plain `pages 2`.
    line = command.comparison_line("olmocr-bench", olmocr_result(False), run({"invalid": 2}))
    assert fields(line)[2] == "pages 2 (ok 0, invalid 2)"
    mixed = command.comparison_line("olmocr-bench", olmocr_result(False), run({"ok": 3, "failed": 1, "cached": 2}))
    assert fields(mixed)[2] == "pages 6 (ok 3, failed 1, cached 2)"


def test_the_olmocr_line_carries_the_math_rule() -> None:
    exact = fields(command.comparison_line("olmocr-bench", olmocr_result(False), run({"ok": 1})))[3]
    full = fields(command.comparison_line("olmocr-bench", olmocr_result(True), run({"ok": 1})))[3]
    assert exact.startswith("score 0.0%") and "math exact LaTeX only" in exact  # x^2 is not x^{2} verbatim
    assert full.startswith("score 100.0%") and "math exact or rendered alike" in full


def test_the_cord_line_leads_with_donuts_metric_and_names_both() -> None:
    truth = {"r1": {"menu": {"nm": "COFFEE", "price": "10"}}}
    pred = {"r1": {"menu": {"nm": "COFFEE", "price": "12"}}}  # one field of two right
    result = cord.score(truth, pred)
    f1 = 1 / (1 + 2 / 2)  # one true positive, one miss and one false positive: 1 / (1 + (1 + 1) / 2)
    score = fields(command.comparison_line("cord", result, run({"ok": 1})))[3]
    ted = float(re.match(r"nTED accuracy ([\d.]+)% \(Donut's published metric\)", score).group(1))
    assert 0 < ted < 100 and ted != pytest.approx(100 * f1, abs=0.05)  # the two metrics differ here
    assert score.endswith(f"field F1 {100 * f1:.1f}%")


def test_bench_help_says_run_options_may_follow(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done, contextlib.redirect_stderr(io.StringIO()):
        cli.main(["bench", "cord", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "[pagemill run options]" in text and "pagemill run --help" in text
    named = re.findall(r"--[a-z][\w-]+", text.split("pagemill run --help", 1)[1])
    run_options = known_parser()._option_string_actions
    assert named and all(n in run_options for n in named), named  # each example is a real run option
