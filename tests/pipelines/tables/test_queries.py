"""Named queries (`pagemill sql --query NAME`) and ledger completeness, on real runs: a render-only run and two
runs with the tiny model (failed, duplicate and, with the result cache, cached pages). Every expected figure
is recomputed here in Python from the Parquet files themselves, not through DuckDB or the views."""
from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipelines import cli
from pipelines.tables import queries
from tests.conftest import vllm_available
from tests.support import cost_runs

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
ROUTE_OF_STATUS = {"ok": {"model"}, "invalid": {"model"}, "failed": {"model", "failed"}, "duplicate": {"duplicate"},
                   "cached": {"cache"}, "rendered": {"none"}, "quarantined": {"quarantined"}}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cost_runs.render_run(tmp_path_factory)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path) -> Path:
    if not vllm_available():
        pytest.skip("vLLM is not installed")
    return cost_runs.extract_runs(tmp_path_factory, test_model_dir)


def raw(output: Path, table: str) -> list[dict[str, Any]]:
    """Every row of a table, read file by file with pyarrow (no DuckDB, no views)."""
    rows: list[dict[str, Any]] = []
    for path in sorted((output / table).rglob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def named(capsys: pytest.CaptureFixture[str], output: Path, name: str, fmt: str = "json") -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli.main(["sql", "--output", str(output), "--query", name, "--format", fmt]) == 0
    out = capsys.readouterr().out
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(out)))
    return json.loads(out)


def key(row: dict[str, Any]) -> tuple[str, str, int]:
    return row["run_id"], row["doc_sha256"], row["page_index"]


def test_list_queries(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sql", "--list-queries"]) == 0
    out = capsys.readouterr().out
    for name in ("cost-by-run", "reject-reasons", "cache-savings", "tokens-by-schema", "slowest-documents",
                 "spend-by-vendor", "unfit-values"):
        assert name in out and queries.get(name).sql.strip().startswith(("SELECT", "WITH"))
    with pytest.raises(SystemExit):
        cli.main(["sql", "--output", "x", "--query", "cost-by-run", "SELECT 1"])  # exactly one of them
    assert cli.main(["sql", "--output", "x", "--query", "no-such-query"]) == 1


def check_ledger_complete(output: Path) -> Counter[str]:
    pages, ledger = raw(output, "pages"), raw(output, "ledger")
    page_keys, ledger_keys = Counter(map(key, pages)), Counter(map(key, ledger))
    assert page_keys == ledger_keys and set(page_keys.values()) == {1}
    routes = {key(r): r["route"] for r in ledger}
    for p in pages:
        assert routes[key(p)] in ROUTE_OF_STATUS[p["status"]], p
    return Counter(p["status"] for p in pages)


def test_ledger_has_one_row_per_page_render_only(rendered: Path) -> None:
    statuses = check_ledger_complete(rendered)
    assert statuses["failed"] == 1 and statuses["rendered"] >= 8


@pytest.mark.vllm
@needs_vllm
def test_ledger_has_one_row_per_page_with_failed_duplicate_and_cached_pages(extracted: Path) -> None:
    statuses = check_ledger_complete(extracted)
    # page_too_large in each run, the terms page, the blocklisted page in each run, t2's cached pages
    assert statuses["failed"] >= 2 and statuses["duplicate"] >= 1 and statuses["quarantined"] == 2
    assert statuses["cached"] >= 4
    ledger = raw(extracted, "ledger")
    assert all(r["cost_usd"] == 0 for r in ledger if r["route"] != "model")
    assert all(r["cost_usd"] > 0 for r in ledger if r["route"] == "model")


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_every_query_runs_on_a_render_only_run(rendered: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    results = {name: named(capsys, rendered, name, fmt) for name in queries.QUERIES}
    (run,) = results["cost-by-run"]
    assert run["run_id"] == "r1" and int(run["pages"]) == len(raw(rendered, "ledger"))
    assert int(run["model_pages"]) == 0 and float(run["cost_usd"]) == 0
    assert results["cache-savings"] == [] and results["tokens-by-schema"] == []
    assert results["spend-by-vendor"] == [] and results["unfit-values"] == []  # no ok page: empty typed views
    assert len(results["slowest-documents"]) == len({r["source_uri"] for r in raw(rendered, "ledger")})
    reasons = {(r["level"], r["reason_code"]): int(r["n"]) for r in results["reject-reasons"]}
    assert reasons == {("document", "unreadable"): 1, ("document", "unsupported_format"): 2,
                       ("document", "page_too_large"): 1, ("page", "page_too_large"): 1}


@pytest.mark.vllm
@needs_vllm
def test_cost_by_run(extracted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = {r["run_id"]: r for r in named(capsys, extracted, "cost-by-run")}
    assert list(rows) == ["t1", "t2"]
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in raw(extracted, "ledger"):
        by_run[r["run_id"]].append(r)
    for run_id, ledger in by_run.items():
        got = rows[run_id]
        assert got["pages"] == len(ledger)
        assert got["model_pages"] == sum(r["route"] == "model" for r in ledger)
        assert got["reused_pages"] == sum(r["route"] in ("duplicate", "cache") for r in ledger)
        for column in ("image_tokens", "text_tokens", "output_tokens"):
            assert got[column] == sum(r[column] for r in ledger)
        cost = sum(r["cost_usd"] for r in ledger)
        assert got["cost_usd"] == pytest.approx(cost, abs=1e-6)
        assert got["usd_per_1k_pages"] == pytest.approx(1000 * cost / len(ledger), abs=1e-6)
        assert got["api_equivalent_usd"] == pytest.approx(sum(r["api_equivalent_usd"] for r in ledger), abs=1e-6)
    assert rows["t1"]["model_pages"] >= 7 and rows["t1"]["cost_usd"] > 0


@pytest.mark.vllm
@needs_vllm
def test_cache_savings(extracted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Expected by hand from the inputs of tests/support/cost_runs.py, not by re-running the rule:
    # - t1: report-b's terms page repeats report-a's (1 duplicate page), zz-invoice-copy.pdf repeats invoice.pdf
    #   (1 page of a duplicate document), nothing cached yet: 2 pages saved, priced at t1's own model pages.
    # - t2: invoice 1 + report-a 3 + report-b 2 + scan 1 pages come whole from t1's documents, plus wide.pdf's
    #   first page from the page cache (its other pages failed or were quarantined, so the document is
    #   rendered again): 8 cached; the copy's page again: 9 saved. t2 sent no page to the model, so it is
    #   priced at the average model page of every run, which is t1's.
    rows = {r["run_id"]: r for r in named(capsys, extracted, "cache-savings")}
    got = {run: (r["duplicate_pages"], r["duplicate_document_pages"], r["cached_pages"], r["pages_saved"],
                 r["priced_from"]) for run, r in rows.items()}
    assert got == {"t1": (1, 1, 0, 2, "this run"), "t2": (0, 1, 8, 9, "all runs")}
    # The price of a saved page, from another query: t1's cost (and hosted-API price) per model page.
    cost = {r["run_id"]: r for r in named(capsys, extracted, "cost-by-run")}["t1"]
    usd, api = cost["cost_usd"] / cost["model_pages"], cost["api_equivalent_usd"] / cost["model_pages"]
    assert usd > 0 and api > 0
    for run, saved in (("t1", 2), ("t2", 9)):
        assert rows[run]["saved_usd"] == pytest.approx(saved * usd, rel=1e-3, abs=1e-5), run
        assert rows[run]["saved_api_usd"] == pytest.approx(saved * api, rel=1e-3, abs=1e-5), run


@pytest.mark.vllm
@needs_vllm
def test_reject_reasons(extracted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = Counter((d["run_id"], "document", d["reason_code"]) for d in raw(extracted, "documents")
                       if d["reason_code"])
    expected += Counter((p["run_id"], "page", p["reason_code"]) for p in raw(extracted, "pages") if p["reason_code"])
    rows = named(capsys, extracted, "reject-reasons")
    got: Counter[tuple] = Counter()
    for r in rows:
        got[(r["run_id"], r["level"], r["reason_code"])] += r["n"]
        assert r["meaning"], r
    assert got == expected
    assert any(cost_runs.HTML_NAME in r["example"] for r in rows)


@pytest.mark.vllm
@needs_vllm
def test_tokens_by_schema_and_slowest_documents(extracted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pages = {key(p): p for p in raw(extracted, "pages")}
    ledger = raw(extracted, "ledger")
    model = [r for r in ledger if r["route"] == "model"]
    (row,) = named(capsys, extracted, "tokens-by-schema")
    assert (row["schema_id"], row["model_pages"], row["runs"]) == ("invoice", len(model),
                                                                  len({r["run_id"] for r in model}))
    assert row["output_per_page"] == pytest.approx(mean(r["output_tokens"] for r in model), abs=0.05)
    assert row["output_max"] == max(r["output_tokens"] for r in model)
    assert row["ok_share"] == pytest.approx(sum(pages[key(r)]["status"] == "ok" for r in model) / len(model), abs=1e-3)
    seconds: Counter[tuple] = Counter()
    for r in ledger:
        seconds[(r["run_id"], r["source_uri"])] += r["gpu_seconds"]
    rows = named(capsys, extracted, "slowest-documents")
    assert len(rows) == min(20, len(seconds))
    assert (rows[0]["run_id"], rows[0]["source_uri"]) == max(seconds, key=seconds.get)
    assert [r["gpu_seconds"] for r in rows] == sorted((r["gpu_seconds"] for r in rows), reverse=True)


@pytest.mark.vllm
@needs_vllm
def test_typed_invoice_view_over_a_real_run(extracted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The typed views over what the tiny model wrote: every ok invoice page once, each value as its JSON
    holds it (parsed here with json.loads from the Parquet files), a date that is no date NULL and counted."""
    from tests.support.typed_views import DESCRIBE_INVOICE

    capsys.readouterr()
    assert cli.main(["sql", "--output", str(extracted), "--format", "json", "DESCRIBE invoice"]) == 0
    assert [(r["column_name"], r["column_type"]) for r in json.loads(capsys.readouterr().out)] == DESCRIBE_INVOICE
    ok = {key(p): json.loads(p["extraction"]) for p in raw(extracted, "pages")
          if p["status"] == "ok" and p["schema_id"] == "invoice"}
    assert len(ok) >= 5
    assert cli.main(["sql", "--output", str(extracted), "--format", "json",
                     "SELECT run_id, doc_sha256, page_index, vendor_name, total, issue_date, unfit_columns FROM invoice"
                     ]) == 0
    rows = {key(r): r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(ok)
    for k, value in ok.items():
        date = value["issue_date"]
        try:
            expected_date = dt.date.fromisoformat(date).isoformat() if date else None
        except ValueError:  # the schema's pattern lets 2026-02-31 through
            expected_date = None
        assert rows[k]["vendor_name"] == value["vendor_name"] and rows[k]["total"] == value["total"], k
        assert rows[k]["issue_date"] == expected_date, k
        assert ("issue_date" in rows[k]["unfit_columns"]) == (date is not None and expected_date is None), k
    assert cli.main(["sql", "--output", str(extracted), "--format", "json",
                     "SELECT count(*) AS n FROM invoice_line_items"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": sum(len(v["line_items"]) for v in ok.values())}]
