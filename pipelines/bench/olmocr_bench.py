"""olmOCR-Bench in its own folder layout: `DIR/*.jsonl` (one file a category: arxiv_math, tables, old_scans, ...)
and `DIR/pdfs/**.pdf`. Scored the way the benchmark's `benchmark.py` reports: a test passes or fails on its page's
markdown (a page with no markdown fails it); every PDF without a baseline test gets one (`<pdf>_baseline`, page 1,
category `baseline`); a category's score is its share of passed tests, the overall score is the mean of the
categories' scores, with a 95% bootstrap interval that resamples tests within each category (1,000 draws; seeded
here, so a re-score prints the same interval).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.bench.olmocr_tests import BadTest, BenchTest, MathRule, check, parse_test

BOOTSTRAP_DRAWS = 1000
BASELINE = "baseline"


@dataclass(frozen=True)
class Dataset:
    root: Path
    tests: tuple[BenchTest, ...]
    category: Mapping[str, str]  # test id -> its .jsonl file's stem
    pdfs: tuple[str, ...]  # paths under pdfs/, as the tests name them


def read_tests(lines: Sequence[str], source: str) -> list[BenchTest]:
    """The tests of one .jsonl file; raises ValueError naming the file and line."""
    tests = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source} line {n}: not JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{source} line {n}: not a JSON object")
        try:
            tests.append(parse_test(obj))
        except BadTest as err:
            raise ValueError(f"{source} line {n}: {err}") from None
    return tests


def load(root: str | Path) -> Dataset:
    """The benchmark folder at `root`; raises ValueError when it is not one (no pdfs/, no .jsonl, duplicate ids)."""
    root = Path(root)
    if not (root / "pdfs").is_dir():
        raise ValueError(f"{root}: no pdfs/ folder (expected olmOCR-Bench's layout: *.jsonl and pdfs/)")
    pdfs = tuple(sorted(p.relative_to(root / "pdfs").as_posix() for p in (root / "pdfs").rglob("*.pdf")))
    files = sorted(root.glob("*.jsonl"))
    if not files or not pdfs:
        raise ValueError(f"{root}: needs at least one .jsonl file and one PDF under pdfs/")
    tests: list[BenchTest] = []
    category: dict[str, str] = {}
    for path in files:
        for test in read_tests(path.read_text(encoding="utf-8").splitlines(), path.name):
            if test.id in category:
                raise ValueError(f"{path.name}: duplicate test id {test.id!r}")
            category[test.id] = path.stem
            tests.append(test)
    for pdf in pdfs:
        if not any(t.kind == BASELINE and t.pdf == pdf for t in tests):
            tests.append(BenchTest(f"{pdf}_baseline", pdf, 1, BASELINE))
            category[tests[-1].id] = BASELINE
    return Dataset(root, tuple(tests), category, pdfs)


def bootstrap_interval(by_category: Mapping[str, Sequence[float]], draws: int = BOOTSTRAP_DRAWS,
                       level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The benchmark's interval: resample each category's test results, average the category means."""
    import numpy as np

    groups = [np.asarray(v, dtype=float) for v in by_category.values() if len(v)]
    if not groups:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = [float(np.mean([rng.choice(g, size=len(g), replace=True).mean() for g in groups])) for _ in range(draws)]
    alpha = (1 - level) / 2
    return float(np.percentile(means, alpha * 100)), float(np.percentile(means, (1 - alpha) * 100))


def score(dataset: Dataset, pages: Mapping[tuple[str, int], str | None], draws: int = BOOTSTRAP_DRAWS,
          math: MathRule | None = None, math_note: str = "exact LaTeX match only") -> dict[str, Any]:
    """Scores of `pages` ((pdf, 1-based page) -> markdown, None or absent when the run has none); `math` is the
    reference's full math rule where it can run (pipelines/bench/olmocr_math.py), `math_note` says which rule."""
    verdicts: dict[str, bool] = {}
    failures, missing, unscored = [], 0, []
    for test in dataset.tests:
        markdown = pages.get((test.pdf, test.page))
        passed: bool | None
        if markdown is None:
            missing += 1
            passed, why = False, "no markdown for this page"
        else:
            passed, why = check(test, markdown, math)
        if passed is None:  # counted as failed: the score is then a lower bound, and says so
            unscored.append(test.id)
        verdicts[test.id] = bool(passed)
        if not passed:
            failures.append({"id": test.id, "pdf": test.pdf, "page": test.page, "type": test.kind, "why": why})
    by_category: dict[str, list[float]] = {}
    by_type: dict[str, list[float]] = {}
    for test in dataset.tests:
        by_category.setdefault(dataset.category[test.id], []).append(float(verdicts[test.id]))
        by_type.setdefault(test.kind, []).append(float(verdicts[test.id]))

    def share(values: Sequence[float]) -> dict[str, Any]:
        return {"passed": int(sum(values)), "tests": len(values), "score": sum(values) / len(values)}

    categories = {k: share(v) for k, v in sorted(by_category.items())}
    overall = sum(c["score"] for c in categories.values()) / len(categories) if categories else 0.0
    low, high = bootstrap_interval(by_category, draws)
    return {"benchmark": "olmocr-bench", "score": overall, "ci95": [low, high], "tests": len(dataset.tests),
            "passed": sum(verdicts.values()), "pages_missing_tests": missing, "categories": categories,
            "types": {k: share(v) for k, v in sorted(by_type.items())}, "verdicts": verdicts, "failures": failures,
            "exact_math_only": math is None, "math_rule": math_note, "unscored": unscored}


def render(result: Mapping[str, Any]) -> list[str]:
    low, high = result["ci95"]
    lines = [f"  olmOCR-Bench score {100 * result['score']:.1f}% (95% CI {100 * low:.1f}-{100 * high:.1f}%), "
             f"{result['passed']} of {result['tests']} tests passed; mean of {len(result['categories'])} categories"]
    lines += [f"    {name:<24} {100 * c['score']:5.1f}%  {c['passed']}/{c['tests']}"
              for name, c in result["categories"].items()]
    lines.append("  by test type: " + ", ".join(f"{k} {100 * v['score']:.1f}% ({v['tests']})"
                                                for k, v in result["types"].items()))
    if "math" in result["types"]:
        lines.append(f"  math: {result['math_rule']}")
    if result["unscored"]:
        lines.append(f"  unscored: {len(result['unscored'])} math tests (counted as failed: the layout comparison "
                     f"gave up), {', '.join(result['unscored'][:5])}")
    return lines
