"""olmOCR-Bench scoring (pipelines/bench/olmocr_tests.py, olmocr_bench.py): every test kind's verdict on hand-made
pages, a hand-made benchmark folder scored with its oracle markdown (100%) and with pages taken away (the expected
share computed here from which pages were taken), and the benchmark's own sample from the shared corpus.
benchmarks/bench_scorer_agreement.py compares every verdict with the reference scorer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.bench import olmocr_bench
from pipelines.bench.olmocr_tests import BadTest, check, normalize, parse_test, repeats_at_end
from tests.conftest import CORPUS

SAMPLE = CORPUS / "extraction_gt" / "allenai__olmocr" / "olmocr" / "bench" / "sample_data"
TABLE_MD = "| Item | Qty | Amount |\n|---|---|---|\n| Tea | 2 | 4.00 |\n| Cake | 1 | 3.50 |\n| Total | | 7.50 |"
TABLE_HTML = ("<table><thead><tr><th>Item</th><th colspan=\"2\">Price</th></tr></thead>"
              "<tr><td rowspan=\"2\">Tea</td><td>small</td><td>2.00</td></tr>"
              "<tr><td>large</td><td>3.00</td></tr></table>")


def t(kind: str, **spec: object) -> dict[str, object]:
    return {"pdf": "a.pdf", "page": 1, "id": f"{kind}-{sorted(spec.items())}", "type": kind, **spec}


CASES = [  # (test, markdown, verdict): each verdict follows from the benchmark's definition by reading the page
    (t("present", text="Hello world"), "Say **Hello**   world!", True),  # bold dropped, spaces folded
    (t("present", text="Hello world"), "Hello there", False),
    (t("present", text="Hello world", max_diffs=1), "Hello worle", True),  # one edit allowed
    (t("present", text="hello WORLD", case_sensitive=False), "Hello world", True),
    (t("present", text="hello WORLD"), "Hello world", False),
    (t("present", text="“quoted” – dash"), "\"quoted\" - dash", True),  # typographic marks folded
    (t("present", text="end", last_n=5), "the end", True),
    (t("present", text="start", last_n=5), "start of a long page", False),  # only the last 5 characters
    (t("absent", text="Page 3"), "Body text", True),
    (t("absent", text="Page 3"), "Body text Page 3", False),
    (t("order", before="First", after="Second"), "First then Second", True),
    (t("order", before="First", after="Second"), "Second then First", False),
    (t("order", before="First", after="Second"), "First only", False),
    (t("table", cell="Tea", right="2", down="Cake"), TABLE_MD, True),
    (t("table", cell="Tea", left="2"), TABLE_MD, False),
    (t("table", cell="4.00", top_heading="Amount", left_heading="Item"), TABLE_MD, False),  # left heading: Tea
    (t("table", cell="4.00", top_heading="Amount", left_heading="Tea"), TABLE_MD, True),
    (t("table", cell="Tea"), "no table here", False),
    (t("table", cell="2.00", top_heading="Price", left="small"), TABLE_HTML, True),  # colspan heading above
    (t("table", cell="large", left="Tea"), TABLE_HTML, True),  # the rowspan reaches the second row
    (t("table", cell="large", up="Price"), TABLE_HTML, False),  # above "large" is "small"
    (t("table", cell="Tea", ignore_markdown_tables=True), TABLE_MD, False),
    (t("math", math="a^{2}+b^{2}=c^{2}"), "so $a^{2}+b^{2}=c^{2}$ holds", True),
    (t("math", math="a^{2}+b^{2}=c^{2}"), "\\[ a^{2}+b^{2}=c^{2} \\]", True),  # stripped inside delimiters
    (t("math", math="a^{2}+b^{2}=c^{2}"), "a^{2}+b^{2}=c^{2}", False),  # not delimited
    (t("math", math="x", ignore_dollar_delimited=True), "$x$", False),
    (t("baseline"), "Some text.", True),
    (t("baseline"), "   \n ", False),
    (t("baseline"), "text " + "ab" * 40, False),  # the 2-gram "ab" repeats 40 times at the end (> 30)
    (t("baseline"), "text 漢字", False),
    (t("baseline", max_length=5), "abc!!", True),
    (t("baseline", max_length=5), "abcdef", False),
    (t("baseline", max_length=3, max_length_skips_image_alt_tags=True), "![long alt text](a.png) ok", True),
    (t("format", format="heading", text="Intro"), "## Intro\nbody", True),
    (t("format", format="heading", text="Intro"), "Intro\nbody", False),
    (t("format", format="bold", text="Total"), "<b>Total</b>", True),
    (t("format", format="italic", text="Total"), "**Total**", False),
    (t("footnote", marker="1"), "text[^1]", True),
    (t("footnote", marker="1"), "text[^1]: a definition only", False),
    (t("footnote", marker="2", appears_before_marker="the claim"), "the claim²", True),
    (t("footnote", marker="2", appears_after_marker="the source"), "x<sup>2</sup> elsewhere", False),
]


@pytest.mark.parametrize(("obj", "markdown", "expected"), CASES,
                         ids=[f"{i}-{c[0]['type']}" for i, c in enumerate(CASES)])
def test_each_kind_on_hand_made_pages(obj: dict[str, object], markdown: str, expected: bool) -> None:
    passed, why = check(parse_test(obj), markdown)
    assert passed is expected, why
    assert passed or why  # a failure says why


def test_normalize_and_repeats() -> None:
    assert normalize("a<br/>b  __c__\t*d*") == "a b c d"
    assert repeats_at_end("xabab") == [1, 2, 1, 1, 1]  # "b" once, "ab" twice, "bab" once...


@pytest.mark.parametrize("obj", [{"type": "nope"}, t("present", text="  "),
                                 t("order", before="ab", after="cd", max_diffs=2), t("present", text="x", page="1")])
def test_bad_tests_are_refused(obj: dict[str, object]) -> None:
    with pytest.raises(BadTest):
        parse_test({"pdf": "a.pdf", "page": 1, "id": "x", **obj})


def make_bench(root: Path) -> dict[tuple[str, int], str]:
    """A benchmark folder in olmOCR-Bench's layout (two categories, three single-page PDFs) and its oracle."""
    (root / "pdfs" / "sub").mkdir(parents=True)
    for name in ("a.pdf", "b.pdf", "sub/c.pdf"):
        (root / "pdfs" / name).write_bytes(b"%PDF-1.4\n")  # the scorer never opens them
    text = [t("present", text="Alpha beta"), t("absent", text="Footer 9"), t("order", before="Alpha", after="gamma"),
            {**t("present", text="Second page"), "pdf": "b.pdf"}, {**t("math", math="E=mc^2"), "pdf": "b.pdf"}]
    tables = [{**t("table", cell="Tea", right="2"), "pdf": "sub/c.pdf"}, {**t("baseline"), "pdf": "sub/c.pdf"}]
    for name, tests in (("text.jsonl", text), ("tables.jsonl", tables)):
        (root / name).write_text("\n".join(json.dumps({**x, "id": f"{name}{i}"}) for i, x in enumerate(tests)) + "\n")
    return {("a.pdf", 1): "Alpha beta and gamma", ("b.pdf", 1): "Second page: $E=mc^2$", ("sub/c.pdf", 1): TABLE_MD}


def test_oracle_scores_100_and_missing_pages_score_the_expected_share(tmp_path: Path) -> None:
    oracle = make_bench(tmp_path)
    data = olmocr_bench.load(tmp_path)
    # 5 text tests, 2 table tests, and baselines for a.pdf and b.pdf (c.pdf has its own): 3 categories.
    assert {c: sum(data.category[x.id] == c for x in data.tests) for c in ("text", "tables", "baseline")} == \
        {"text": 5, "tables": 2, "baseline": 2}
    perfect = olmocr_bench.score(data, oracle, draws=50)
    assert perfect["score"] == 1.0 and perfect["passed"] == 9 and perfect["ci95"] == [1.0, 1.0]
    # Without b.pdf's page: its 2 text tests fail (3/5 left) and its baseline (1/2); tables keep 2/2. The absent
    # test on a.pdf still passes.
    lost = olmocr_bench.score(data, {k: v for k, v in oracle.items() if k[0] != "b.pdf"}, draws=50)
    assert lost["categories"]["text"]["score"] == 3 / 5 and lost["categories"]["baseline"]["score"] == 1 / 2
    assert lost["score"] == pytest.approx((3 / 5 + 1 / 2 + 1) / 3)
    assert lost["pages_missing_tests"] == 3 and {f["pdf"] for f in lost["failures"]} == {"b.pdf"}
    low, high = lost["ci95"]
    assert 0 <= low <= lost["score"] <= high <= 1


def test_a_folder_that_is_not_the_benchmark_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pdfs/"):
        olmocr_bench.load(tmp_path)
    make_bench(tmp_path)
    (tmp_path / "more.jsonl").write_text(json.dumps({**t("present", text="x"), "id": "text.jsonl0"}) + "\n")
    with pytest.raises(ValueError, match="duplicate test id"):
        olmocr_bench.load(tmp_path)


def test_the_benchmarks_own_sample_loads_and_scores() -> None:
    if not SAMPLE.is_dir():
        pytest.skip(f"shared corpus not found at {SAMPLE} (set PAGEMILL_CORPUS)")
    files = {p.stem: [json.loads(x) for x in p.read_text().splitlines() if x.strip()] for p in SAMPLE.glob("*.jsonl")}
    lines = [x for tests in files.values() for x in tests]
    pdfs = sorted(p.relative_to(SAMPLE / "pdfs").as_posix() for p in (SAMPLE / "pdfs").rglob("*.pdf"))
    data = olmocr_bench.load(SAMPLE)
    added = set(pdfs) - {x["pdf"] for x in lines if x["type"] == "baseline"}
    assert len(data.tests) == len(lines) + len(added)
    # Empty pages everywhere: exactly the `absent` tests and the blank-page baselines (max_length) pass; the
    # baselines added for PDFs without one fail (no text). The score is the mean of the files' shares.
    empty = olmocr_bench.score(data, {(p, n): "" for p in pdfs for n in range(1, 4)}, draws=20)
    shares = [sum(x["type"] == "absent" or "max_length" in x for x in tests) / len(tests)
              for tests in files.values() if tests] + ([0.0] if added else [])
    assert empty["score"] == pytest.approx(sum(shares) / len(shares))
    assert empty["passed"] == sum(x["type"] == "absent" or "max_length" in x for x in lines)
