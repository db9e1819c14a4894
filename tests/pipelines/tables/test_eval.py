"""`pagemill eval`: the pure comparison functions, and the command on a real run of the tiny model."""
from __future__ import annotations

import copy
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.tables.eval import TruthRow, compare_fields, parse_truth, same, score, to_date, to_number
from schemas import tables
from schemas.layout import partition
from tests.conftest import CORPUS, vllm_available
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows
from transforms.store.write import write_rows

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("truth", "got"), [
    (12.5, 12.5), (12.5, "12.50"), (1234.5, "1,234.50"), (1234.5, "1.234,50"), (12.0, "$ 12"), (12.5, 12.504),
    ("2024-03-05", "2024-03-05"), ("2024-03-05", "05.03.2024"), ("2024-03-05", "March 5, 2024"),
    ("2024-03-05", "2024-03-05T10:00:00"), ("ACME  Corp", "acme corp"), ("Acme\nCorp ", " ACME CORP"),
    ("12.50", 12.5), (None, None), (None, ""), (True, True),
])
def test_same_after_normalisation(truth: object, got: object) -> None:
    assert same(truth, got)


@pytest.mark.parametrize(("truth", "got"), [
    (12.5, 12.52), (12.5, "twelve"), (12.5, None), ("2024-03-05", "2024-05-03"), ("2024-03-05", "soon"),
    ("ACME Corp", "ACME Corporation"), ("ACME", None), (None, "x"), (True, "true"), (1, True), ("A", 1),
])
def test_not_same(truth: object, got: object) -> None:
    assert not same(truth, got)


def test_number_and_date_parsers() -> None:
    assert to_number("EUR 1.234.567,89") == 1234567.89
    assert to_number("-3,5") == -3.5
    assert to_number("1,234") == 1234.0  # three digits after one comma: thousands
    assert to_number("INV-2024/7") is None
    assert to_date("5 March 2024").isoformat() == "2024-03-05"
    assert to_date("not a date") is None
    assert same(12.5, "12.5", tolerance=0.0) and not same(12.5, "12.51", tolerance=0.005)


def test_nested_fields_leaf_by_leaf() -> None:
    truth = {"vendor": {"name": "Acme", "address": {"city": "Paris"}},
             "line_items": [{"description": "Widget", "amount": 10}, {"description": "Bolt", "amount": 2.5}]}
    got = {"vendor": {"name": "ACME", "address": {"city": "Lyon"}},
           "line_items": [{"description": "widget", "amount": "10.00"}]}
    result = compare_fields(truth, got)
    # 2 vendor leaves (1 right) + 4 line-item leaves (the first item's 2 right, the second item missing).
    assert result.fields["vendor"].compared == 2 and result.fields["vendor"].correct == 1
    assert result.fields["line_items"].compared == 4 and result.fields["line_items"].correct == 2
    assert result.fields["line_items"].missing == 2
    assert sorted(result.wrong) == ["line_items[1].amount", "line_items[1].description", "vendor.address.city"]


def test_empty_truth_values_mean_nothing_there() -> None:
    result = compare_fields({"line_items": [], "due_date": None}, {"line_items": [], "due_date": None})
    assert result.total().correct == 2
    result = compare_fields({"line_items": [], "due_date": None}, {"line_items": [{"a": 1}], "due_date": "2024-01-01"})
    assert result.total().correct == 0 and result.total().missing == 0


def test_truth_rows_without_a_page_are_counted_and_listed() -> None:
    pages = {("/in/a.pdf", 0): {"status": "ok", "extraction": json.dumps({"total": 5, "currency": "EUR"})},
             ("/in/b.pdf", 0): {"status": "failed", "extraction": None}}
    truth = [TruthRow("a.pdf", 0, {"total": 5, "currency": "eur"}),
             TruthRow("a.pdf", 1, {"total": 7}),  # no such page
             TruthRow("zz.pdf", 0, {"total": 1}),  # no such document
             TruthRow("b.pdf", 0, {"total": 1}),  # a page without an extraction: matched, missing
             TruthRow("copy.pdf", 0, {"total": 5}),  # a duplicate document: its original's page
             TruthRow("bad.pdf", 0, {"total": 1})]  # a rejected document
    result = score(truth, pages, {"/in/copy.pdf": "/in/a.pdf"},
                   outcomes={"/in/a.pdf": "extracted", "/in/bad.pdf": "rejected unreadable"})
    assert result["truth_rows"] == 6 and result["matched"] == 3
    assert [(u["source"], u["page_index"], u["problem"]) for u in result["unmatched"]] == [
        ("a.pdf", 1, "no page 1 (document extracted)"), ("zz.pdf", 0, "no document"),
        ("bad.pdf", 0, "no page 0 (document rejected unreadable)")]
    assert result["overall"] == {"compared": 7, "correct": 3, "missing": 4, "accuracy": round(3 / 7, 6)}
    assert result["fields"]["total"]["compared"] == 6 and result["fields"]["total"]["correct"] == 2
    assert result["by_status"]["no page"]["compared"] == 3


def test_parse_truth_defaults_and_errors(tmp_path: Path) -> None:
    rows = parse_truth(['{"source": "a.pdf", "fields": {"total": 1}}', "", '# note',
                        '{"source": "b.pdf", "page_index": 2, "fields": {}}'])
    assert [(r.source, r.page_index) for r in rows] == [("a.pdf", 0), ("b.pdf", 2)]
    for bad in ('{"fields": {}}', '{"source": "a", "fields": 3}', '{"source": "a", "page_index": -1, "fields": {}}',
                "not json"):
        with pytest.raises(ValueError, match="truth line 1"):
            parse_truth([bad])
    (tmp_path / "t.jsonl").write_text("not json\n")
    assert cli.main(["eval", "--output", str(tmp_path), "--truth", str(tmp_path / "t.jsonl")]) == 2
    assert cli.main(["eval", "--output", str(tmp_path), "--truth", str(tmp_path / "t.jsonl"), "--tenant", "../x"]) == 2
    with pytest.raises(SystemExit) as stop:
        cli.main(["eval", "--output", str(tmp_path), "--truth", str(tmp_path / "t.jsonl"), "--no-such-flag"])
    assert stop.value.code == 2


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path) -> Path:
    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup_venv.sh)")
    inputs = tmp_path_factory.mktemp("inputs")
    (inputs / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (inputs / "zz-invoice-copy.pdf").write_bytes(docmaker.invoice_pdf())
    (inputs / "report.pdf").write_bytes(docmaker.multipage_pdf(2))
    output = tmp_path_factory.mktemp("out")
    code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "e1", "--schema", "invoice",
                     "--model", str(test_model_dir), "--max-tokens", "256", "--kv-cache-gib", "0.25",
                     "--max-side", "800", "--progress-every-s", "0", "--workers", "1"])
    assert code == 0
    return output


def _eval(output: Path, truth: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    path = tmp_path / "truth.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in truth))
    capsys.readouterr()
    assert cli.main(["eval", "--output", str(output), "--truth", str(path), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.vllm
def test_eval_of_the_runs_own_extractions(extracted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pages = [p for p in one_row_per(raw_rows(extracted, "pages", "e1"), "doc_sha256", "page_index").values()
             if p["status"] == "ok"]
    assert len(pages) == 3, pages  # invoice 1 page + report 2 pages; the copy is a duplicate document
    truth = [{"source": Path(p["source_uri"]).name, "page_index": p["page_index"],
              "fields": json.loads(p["extraction"])} for p in pages]
    invoice = next(t for t in truth if t["source"] == "invoice.pdf")
    # The duplicate document is scored on its original's page.
    truth.append({"source": "zz-invoice-copy.pdf", "fields": copy.deepcopy(invoice["fields"])})
    result = _eval(extracted, truth, tmp_path, capsys)
    assert result["run_id"] == "e1" and result["matched"] == 4 and result["unmatched"] == []
    assert result["overall"]["accuracy"] == 1.0 and result["overall"]["compared"] > 0
    assert all(f["accuracy"] == 1.0 for f in result["fields"].values())
    ledger = raw_rows(extracted, "ledger", "e1")
    cost = result["cost"]
    assert cost["pages"] == len(ledger)
    assert cost["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in ledger))
    assert cost["usd_per_correct_field"] == pytest.approx(cost["cost_usd"] / result["overall"]["correct"])
    assert cost["gpu_seconds_per_page"] == pytest.approx(sum(r["gpu_seconds"] for r in ledger) / len(ledger))

    # One field changed: the same fields compared, exactly one fewer correct.
    changed = copy.deepcopy(truth)
    fields = changed[0]["fields"]
    name = "invoice_number" if "invoice_number" in fields else next(iter(fields))
    fields[name] = "surely-not-this-value-42" if not isinstance(fields[name], str) or fields[name] != \
        "surely-not-this-value-42" else "other"
    after = _eval(extracted, changed, tmp_path, capsys)
    assert after["overall"]["compared"] == result["overall"]["compared"]
    assert after["overall"]["correct"] == result["overall"]["correct"] - 1
    assert after["fields"][name]["correct"] == result["fields"][name]["correct"] - 1

    # The table format says the same.
    path = tmp_path / "truth.jsonl"
    assert cli.main(["eval", "--output", str(extracted), "--truth", str(path)]) == 0
    assert f"{after['overall']['correct']:,} of {after['overall']['compared']:,} fields correct" in \
        capsys.readouterr().out


@pytest.mark.vllm
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus/ is absent")
def test_eval_of_a_corpus_run_with_invoice2data_truth(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path,
                                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not vllm_available():
        pytest.skip("vLLM is not installed (scripts/setup_venv.sh)")
    from tests.support import invoice2data_run

    truth = tmp_path / "truth.jsonl"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "truth_from_invoice2data.py"),
                           str(CORPUS / "extraction_gt"), "--output", str(truth)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in truth.read_text().splitlines()]
    pdfs = sorted(invoice2data_run.INVOICE2DATA.glob("*.pdf"))
    # One line per invoice2data PDF with an expected result; each maps issuer, number, date and currency.
    assert len(lines) == len(pdfs) == 11
    assert all({"vendor_name", "invoice_number", "issue_date", "currency"} <= set(t["fields"]) for t in lines)
    aws = next(t for t in lines if t["source"].endswith("/AmazonWebServices.pdf"))
    assert aws["fields"] == {"vendor_name": "Amazon Web Services", "invoice_number": "42183017",
                             "issue_date": "2014-08-03", "currency": "USD", "subtotal": 4.11, "total": 4.11}
    output = invoice2data_run.corpus_run(tmp_path_factory, test_model_dir)
    capsys.readouterr()
    assert cli.main(["eval", "--output", str(output), "--truth", str(truth), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # The random test model scores near zero: check the accounting, not the score.
    assert result["truth_rows"] == result["matched"] == 11 and result["unmatched"] == []
    assert result["overall"]["compared"] == sum(len(t["fields"]) for t in lines)
    assert sum(f["compared"] for f in result["fields"].values()) == result["overall"]["compared"]
    assert len(result["documents"]) == 11 and result["cost"]["pages"] == 13 and result["cost"]["cost_usd"] > 0
    with capsys.disabled():
        print(f"\ninvoice2data eval (random test model): {result['overall']}, cost {result['cost']}")


@pytest.mark.vllm
def test_saved_eval_becomes_the_reports_accuracy_section(extracted: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from tests.support.chromium import CHROMIUM, dump_dom

    pages = [p for p in one_row_per(raw_rows(extracted, "pages", "e1"), "doc_sha256", "page_index").values()
             if p["status"] == "ok"]
    truth = [{"source": Path(p["source_uri"]).name, "page_index": p["page_index"],
              "fields": json.loads(p["extraction"])} for p in pages]
    truth[0]["fields"]["currency"] = "XYZ-not-this"  # one wrong field
    truth.append({"source": "nowhere.pdf", "fields": {"total": 1}})  # one unmatched row
    path = tmp_path / "truth.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in truth))
    html = tmp_path / "report.html"
    assert cli.main(["report", "--output", str(extracted), "--html", str(html)]) == 0
    assert '"accuracy": null' in html.read_text()  # no saved eval yet: no section
    capsys.readouterr()
    assert cli.main(["eval", "--output", str(extracted), "--truth", str(path), "--save", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (extracted / "evals" / "tenant=default" / "run_id=e1.json").is_file()
    assert cli.main(["report", "--output", str(extracted), "--html", str(html)]) == 0
    text = html.read_text()
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', text, re.S).group(1))
    acc = data["accuracy"]
    assert acc["overall"] == result["overall"] and acc["unmatched"] == 1
    assert {f["label"] for f in acc["fields"]} == set(result["fields"])
    # Routes: the model pages, and the truth row without a page.
    routes = {r["label"]: r for r in acc["routes"]}
    assert set(routes) == {"model", "no page"} and routes["no page"]["value"] == 0
    assert routes["model"]["value"] == pytest.approx(100 * (result["overall"]["correct"])
                                                     / (result["overall"]["compared"] - 1))
    if CHROMIUM is not None:  # the chart draws (test_report checks the others)
        dom = dump_dom(html, tmp_path)
        charts = re.search(r'data-charts="([^"]*)"', dom).group(1).split()
        assert "accuracy" in charts and f'data-drawn="{len(charts)}"' in dom  # every chart drew, this one too
        bars = re.search(r'<div id="accuracy"><svg[^>]*data-marks="(\d+)"', dom)
        assert bars and int(bars.group(1)) == len(result["fields"])


@pytest.mark.parametrize(("tenant", "run_id"), [("x/../../../outside", "r"), ("default", "r/../../../../outside")])
def test_save_checks_the_run_id_and_tenant_the_tables_name(tmp_path: Path, tenant: str, run_id: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Fails before the fix: a part file whose rows name such a tenant or run id made `eval --save` write
    # tmp_path/outside/..., outside the output root.
    out = tmp_path / "out"
    write_rows(partition(str(out), "documents", "default", "r"), tables.DOCUMENTS,
               [{"run_id": run_id, "tenant": tenant, "source_uri": "/in/a.pdf", "outcome": "rejected",
                 "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)}])
    truth = tmp_path / "truth.jsonl"
    truth.write_text('{"source": "a.pdf", "fields": {"total": 1}}\n')
    assert cli.main(["eval", "--output", str(out), "--truth", str(truth), "--save"]) == 1
    # Since issue 42 the listing itself refuses a file whose rows are not its folder's (part_check.py): the
    # run is not found at all, before eval's own check of the names could be reached.
    assert "pagemill eval: no run under " in capsys.readouterr().err
    assert not (tmp_path / "outside").exists() and not (out / "evals").exists()
