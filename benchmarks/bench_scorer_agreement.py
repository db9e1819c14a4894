"""Do pagemill's benchmark scorers give the reference scorers' verdicts? Runs both on the same predictions and
prints the number of agreements (100% is required).

    python benchmarks/bench_scorer_agreement.py --olmocr CHECKOUT_OF_allenai/olmocr --donut CHECKOUT_OF_clovaai/donut

The reference code is read from the checkouts given (never shipped with pagemill):
- olmOCR-Bench: `olmocr/bench/tests.py`, `table_parsing.py`, `benchmark.py`'s `evaluate_candidate` (and
  `olmocr/repeatdetect.py`) run on the benchmark's sample (`olmocr/bench/sample_data`: its tests, and as
  predictions the sample's own olmOCR outputs plus deterministic perturbations of them: cut, shuffled, edited,
  empty, tables rewritten as HTML), together with extra hand-made tests of the kinds the sample lacks (format,
  footnote, blank-page baselines, headings) and pages whose equations are rewritten in LaTeX that renders alike
  (or not). `math` verdicts are compared under the full rule (exact LaTeX, or alike when rendered in KaTeX): the
  reference's own `katex/render.py` with its Chromium launch pointed at the system's Chromium (Playwright's own
  browser is never downloaded) against pagemill's pipelines/bench/olmocr_math.py. Where that cannot run (no
  `bench-math` extra or no Chromium), or with `--exact-math`, the reference's renderer is replaced by one that
  matches nothing and both use the exact-match rule alone; the summary line says which.
- CORD: clovaai/donut `donut/util.py` JSONParseEvaluator (needs `zss` and `nltk`), on hand-made CORD-like trees
  and perturbations of them; per receipt nTED accuracy and field F1, and the F1 over all receipts.
- SROIE: the ICDAR 2019 task 3 evaluation script is not public (the RRC site scores uploads; docs/benchmarks.md
  lists what was searched), so nothing is compared.
"""
from __future__ import annotations

import argparse
import ast
import json
import random
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipelines.bench import cord, olmocr_bench  # noqa: E402
from pipelines.bench.olmocr_math import CHROMIUM_FLAGS as FLAGS  # noqa: E402
from pipelines.bench.olmocr_math import chromium_path, math_rule  # noqa: E402
from pipelines.bench.olmocr_tests import MathRule, check, parse_test  # noqa: E402

EXTRA_TESTS = [  # kinds and options the sample's dataset.jsonl lacks
    {"type": "format", "format": "heading", "text": "Introduction"},
    {"type": "format", "format": "bold", "text": "Table 1"},
    {"type": "format", "format": "italic", "text": "et al", "case_sensitive": False},
    {"type": "footnote", "marker": "1"},
    {"type": "footnote", "marker": "2", "appears_after_marker": "See the appendix"},
    {"type": "baseline", "max_length": 10},
    {"type": "baseline", "max_length": 50, "max_length_skips_image_alt_tags": True},
    {"type": "baseline", "max_repeats": 3},
    {"type": "present", "text": "the", "first_n": 200, "last_n": 200},
    {"type": "absent", "text": "Page 1", "max_diffs": 1, "case_sensitive": False},
    {"type": "order", "before": "Abstract", "after": "Introduction", "max_diffs": 2},
    {"type": "table", "cell": "Total", "top_heading": "Amount", "left_heading": "Total", "max_diffs": 1},
    {"type": "math", "math": "a^{2}+b^{2}=c^{2}", "ignore_dollar_delimited": True},
    {"type": "math", "math": "x^{2}+y^{2}=z^{2}"},  # the hand-made page writes it x^2 + y^2 = z^2
    {"type": "math", "math": "\\frac{1}{2"},  # KaTeX cannot parse it: under the full rule any equation matches
]
HANDMADE_PAGES = [
    "# Introduction\n\n**Table 1** shows *et al* results.[^1]\n\n[^1]: A note.\n\nText² See the appendix",
    "<table><thead><tr><th>Item</th><th>Amount</th></tr></thead><tr><td>Total</td><td rowspan=\"2\">9</td></tr>"
    "<tr><td colspan=\"2\">x</td></tr></table>\n\n<sup>2</sup> See the appendix",
    "| Item | Amount |\n|---|---|\n| Total | 9 |\n| Tax | 1 |\n\nAbstract then Introducton",
    "", "ab ab ab ab ab ab", "![a long alt text of an image that is not text](x.png) ok",
    "\\[a^{2}+b^{2}=c^{2}\\] and $a^{2}+b^{2}=c^{2}$ 漢字",
    "\\(x^2 + y^2 = z^2\\) and \\[\\frac12\\]", "\\(x^{3}+y^{2}=z^{2}\\)",
]


def reference_olmocr(checkout: Path, into: Path, chromium: str | None) -> types.ModuleType:
    """The reference scorer as a package under `into`, its HTML report replaced; its KaTeX renderer launches
    `chromium` and caches under `into` (None: replaced by one that never matches)."""
    bench = checkout / "olmocr" / "bench"
    pkg = into / "olmocr"
    (pkg / "bench" / "katex").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(checkout / "olmocr" / "repeatdetect.py", pkg / "repeatdetect.py")
    for name in ("__init__.py", "tests.py", "table_parsing.py", "utils.py", "benchmark.py"):
        shutil.copy(bench / name, pkg / "bench" / name)
    (pkg / "bench" / "report.py").write_text("def generate_html_report(*a, **k):\n    pass\n")
    (pkg / "bench" / "katex" / "__init__.py").write_text("")
    if chromium is None:
        (pkg / "bench" / "katex" / "render.py").write_text(
            "def render_equation(latex):\n    return object()  # KaTeX not run: no rendering ever matches\n\n"
            "def compare_rendered_equations(a, b):\n    return False\n")
    else:
        for name in ("katex.min.js", "katex.min.css"):
            shutil.copy(bench / "katex" / name, pkg / "bench" / "katex" / name)
        source = (bench / "katex" / "render.py").read_text(encoding="utf-8")
        patches = {"p.chromium.launch()": f"p.chromium.launch(executable_path={chromium!r}, args={list(FLAGS)!r})",
                   "equation_cache = EquationCache()": f"equation_cache = EquationCache({str(into / 'eq.db')!r})"}
        for old, new in patches.items():
            if source.count(old) != 1:
                raise SystemExit(f"the reference's katex/render.py changed: {old!r} not found once")
            source = source.replace(old, new)
        (pkg / "bench" / "katex" / "render.py").write_text(source, encoding="utf-8")
    sys.path.insert(0, str(into))
    import olmocr.bench.benchmark as benchmark

    return benchmark


def relatex(text: str, alike: bool) -> str:
    """Every delimited equation rewritten: braces dropped around one-character scripts, spaces around operators
    (renders alike), or, with `alike` False, its first digit or letter script changed (renders differently)."""
    def rewrite(m: re.Match[str]) -> str:
        eq = m.group(2)
        if alike:
            eq = re.sub(r"([_^])\{(\w)\}", r"\1\2", eq).replace("=", " = ").replace("+", " + ")
        else:
            eq = re.sub(r"([_^])(\{?)(\w)", lambda s: s.group(1) + s.group(2) + ("4" if s.group(3) == "3" else "3"), eq,
                        count=1)
        return m.group(1) + eq + m.group(3)

    return re.sub(r"(\\\(|\\\[|\$\$?)(.+?)(\\\)|\\\]|\$\$?)", rewrite, text, flags=re.S)


def perturbations(text: str, rng: random.Random) -> dict[str, str]:
    lines = text.split("\n")
    shuffled = lines[:]
    rng.shuffle(shuffled)
    chars = list(text)
    for _ in range(max(1, len(chars) // 40)):
        if chars:
            chars[rng.randrange(len(chars))] = rng.choice("aeiou ,.|-*")
    html = re.sub(r"^\|(.*)\|$", lambda m: "<tr>" + "".join(f"<td>{c.strip()}</td>" for c in m.group(1).split("|"))
                  + "</tr>", text, flags=re.M)
    return {"asis": text, "half": text[: len(text) // 2], "shuffled": "\n".join(shuffled), "edited": "".join(chars),
            "empty": "", "html": f"<table>{html}</table>" if "<tr>" in html else html,
            "bold": re.sub(r"\b(\w{5,})\b", r"**\1**", text, count=20),
            "latex_alike": relatex(text, True), "latex_other": relatex(text, False)}


def olmocr_agreement(checkout: Path, work: Path, math: MathRule | None
                     ) -> tuple[int, int, dict[str, int], tuple[int, int]]:
    """(agreements, verdicts, disagreements by kind, (math verdicts compared, of them passed by rendering alone));
    `math` is pagemill's full math rule (None: both sides on exact LaTeX alone)."""
    benchmark = reference_olmocr(checkout, work / "ref", chromium_path() if math else None)
    from olmocr.bench.tests import load_single_test

    sample = checkout / "olmocr" / "bench" / "sample_data"
    data = olmocr_bench.load(sample)
    pdfs = list(data.pdfs)
    extra = [dict(t, pdf=pdfs[0], page=1, id=f"extra_{i}") for i, t in enumerate(EXTRA_TESTS)]
    ours = list(data.tests) + [parse_test(t) for t in extra]
    ref_tests = [load_single_test(json.dumps({"pdf": t.pdf, "page": t.page, "id": t.id, "type": t.kind,
                                              "max_diffs": t.max_diffs, **t.spec})) for t in ours]
    outputs = {p.relative_to(sample / "olmocr_pipeline").as_posix(): p.read_text(encoding="utf-8")
               for p in sorted((sample / "olmocr_pipeline").rglob("*.md"))}
    rng = random.Random(0)
    candidates: dict[str, dict[str, str]] = {}
    for name, text in outputs.items():
        for kind, variant in perturbations(text, rng).items():
            candidates.setdefault(kind, {})[name] = variant
    for i, page in enumerate(HANDMADE_PAGES):  # the hand-made pages stand in for the first PDF's page 1
        candidates[f"handmade{i}"] = {**outputs, f"{Path(pdfs[0]).with_suffix('')}_pg1_repeat1.md": page}
    agree = total = passes = maths = rendered = 0
    by_kind: dict[str, int] = {}
    for cname, files in candidates.items():
        folder = work / "candidates" / cname
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text, encoding="utf-8")
        *_, results = benchmark.evaluate_candidate(str(folder), ref_tests, pdfs, True)
        theirs = {t.id: passed for per_page in results.values() for rows in per_page.values() for t, passed, _ in rows}
        markdown = {}
        for rel, text in files.items():
            m = re.match(r"^(.*)_pg(\d+)_repeat\d+\.md$", rel)
            markdown[(m.group(1) + ".pdf", int(m.group(2)))] = text
        for test in ours:
            got = markdown.get((test.pdf, test.page))
            verdict = False if got is None else check(test, got, math)[0]
            if test.kind == "math":
                maths += 1
                rendered += bool(verdict) and not check(test, got or "")[0]  # passed by rendering alone
            total += 1
            passes += theirs[test.id]
            if verdict == theirs[test.id]:
                agree += 1
            else:
                by_kind[test.kind] = by_kind.get(test.kind, 0) + 1
                print(f"  disagree: {cname} {test.id} ({test.kind}): pagemill {verdict}, reference {theirs[test.id]}")
    print(f"  olmOCR-Bench: {len(candidates)} candidates, {len(ours)} tests each; the reference passed {passes}")
    return agree, total, by_kind, (maths, rendered)


def donut_reference(checkout: Path) -> Any:
    """JSONParseEvaluator's source from donut/util.py, executed without the rest of the module (torch, datasets)."""
    import zss
    from nltk import edit_distance

    tree = ast.parse((checkout / "donut" / "util.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "JSONParseEvaluator")
    namespace: dict[str, Any] = {"zss": zss, "Node": zss.Node, "edit_distance": edit_distance}
    exec("from typing import Any, Dict, List, Union\n" + ast.unparse(cls), namespace)
    return namespace["JSONParseEvaluator"]()


def cord_cases(rng: random.Random) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    truths = [
        {"menu": [{"nm": "ICE BLACKCOFFEE", "cnt": "2", "price": "82,000"}, {"nm": "AVOCADO COFFEE", "cnt": "1",
                                                                              "price": "61,000"}],
         "sub_total": {"subtotal_price": "143,000", "tax_price": "14,300"},
         "total": {"total_price": "157,300", "cashprice": "200,000", "changeprice": "42,700"}},
        {"menu": {"nm": "Nasi Goreng", "cnt": "1", "price": "25.000", "sub": [{"nm": "Egg", "price": "5.000"}]},
         "total": {"total_price": "30.000"}},
        {"menu": [{"nm": f"ITEM {i}", "cnt": str(i), "price": f"{i * 1000:,}"} for i in range(1, 6)],
         "total": {"total_price": "15,000", "menuqty_cnt": "15"}},
    ]
    cases = []
    for t in truths:
        cases.append((t, t))
        cases.append(({}, t))
        dropped = json.loads(json.dumps(t))
        dropped.pop("total", None)
        cases.append((dropped, t))
        edited = json.loads(json.dumps(t).replace("0", "O", 2))
        cases.append((edited, t))
        extra = json.loads(json.dumps(t))
        extra["void_menu"] = [{"nm": "X", "price": "1"}]
        cases.append((extra, t))
        with_nulls = json.loads(json.dumps(t))
        with_nulls.setdefault("sub_total", {})["etc"] = None
        cases.append((with_nulls, t))
        if isinstance(t["menu"], list):
            shuffled = json.loads(json.dumps(t))
            rng.shuffle(shuffled["menu"])
            cases.append((shuffled, t))
    return cases


def cord_agreement(checkout: Path) -> tuple[int, int]:
    evaluator = donut_reference(checkout)
    cases = cord_cases(random.Random(0))
    agree = total = 0
    for pred, truth in cases:
        checks = [(cord.ted_accuracy(pred, truth), evaluator.cal_acc(pred, truth))]
        if cord.field_counts(pred, truth) != (0, 0):
            checks.append((cord.field_f1([pred], [truth]), evaluator.cal_f1([pred], [truth])))
        for mine, theirs in checks:
            total += 1
            agree += abs(mine - theirs) < 1e-12
            if abs(mine - theirs) >= 1e-12:
                print(f"  disagree: CORD {mine} vs {theirs} on {json.dumps(pred)[:80]}")
    preds, truths = [p for p, _ in cases], [t for _, t in cases]
    total += 1
    agree += abs(cord.field_f1(preds, truths) - evaluator.cal_f1(preds, truths)) < 1e-12
    return agree, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--olmocr", type=Path, required=True, help="a checkout of allenai/olmocr")
    parser.add_argument("--donut", type=Path, required=True, help="a checkout of clovaai/donut")
    parser.add_argument("--exact-math", action="store_true", help="compare math tests on exact LaTeX alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, math_rule() as (rule, note):
        rule = None if args.exact_math else rule
        agree, total, by_kind, (maths, rendered) = olmocr_agreement(args.olmocr, Path(tmp), rule)
    how = (f"full rule: exact LaTeX or alike in KaTeX, both sides rendering; {rendered} passed by rendering "
           "alone") if rule else \
        ("exact-match rule only" + ("" if args.exact_math else f"; {note}"))
    print(f"olmOCR-Bench: {agree} of {total} test verdicts agree ({100 * agree / total:.2f}%)"
          + (f"; disagreements by kind {by_kind}" if by_kind else "") + f" [{maths} math verdicts; {how}]")
    c_agree, c_total = cord_agreement(args.donut)
    print(f"CORD: {c_agree} of {c_total} scores agree ({100 * c_agree / c_total:.2f}%) "
          "[per-receipt nTED accuracy and field F1, and F1 over all receipts]")
    print("SROIE: no reference evaluation script available here; nothing compared")
    return 0 if agree == total and c_agree == c_total else 1


if __name__ == "__main__":
    sys.exit(main())
