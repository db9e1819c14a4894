"""Named queries (`pagemill sql --query NAME`) and ledger completeness, on real runs: a render-only run and two
runs with the tiny model (failed, duplicate and, with the result cache, cached pages). Every expected figure
is recomputed here in Python from the Parquet files themselves, not through DuckDB or the views."""
from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipelines import cli, queries
from tests.conftest import vllm_available
from tests.pipelines import cost_runs

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
    for name in ("cost-by-run", "reject-reasons", "cache-savings", "tokens-by-schema", "slowest-documents"):
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
    pages = {key(p): p for p in raw(extracted, "pages")}
    ledger, documents = raw(extracted, "ledger"), raw(extracted, "documents")
    run_costs: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    all_costs: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    saved: dict[tuple, Counter[str]] = defaultdict(Counter)
    config: dict[str, tuple[str, str]] = {}
    for r in ledger:
        p = pages[key(r)]
        k = (r["run_id"], p["schema_id"], p["model"])
        if p["schema_id"]:
            config[r["run_id"]] = (p["schema_id"], p["model"])
        if r["route"] == "model":
            run_costs[k].append((r["cost_usd"], r["api_equivalent_usd"]))
            all_costs[k[1:]].append((r["cost_usd"], r["api_equivalent_usd"]))
        elif r["route"] in ("duplicate", "cache"):
            saved[k][r["route"]] += 1
    for d in documents:
        if d["outcome"] == "duplicate":
            saved[(d["run_id"], *config[d["run_id"]])]["duplicate_document"] += d["page_count"]
    rows = {(r["run_id"], r["schema_id"], r["model"]): r for r in named(capsys, extracted, "cache-savings")}
    assert set(rows) == set(saved) and ("t1", "invoice", config["t1"][1]) in rows
    for k, counts in saved.items():
        costs = run_costs.get(k) or all_costs[k[1:]]
        usd, api = mean(c[0] for c in costs), mean(c[1] for c in costs)
        got = rows[k]
        assert (got["duplicate_pages"], got["duplicate_document_pages"], got["cached_pages"]) == \
            (counts["duplicate"], counts["duplicate_document"], counts["cache"])
        assert got["priced_from"] == ("this run" if k in run_costs else "all runs")
        assert got["saved_usd"] == pytest.approx(sum(counts.values()) * usd, abs=1e-6)
        assert got["saved_api_usd"] == pytest.approx(sum(counts.values()) * api, abs=1e-6)
    t1 = rows[("t1", *config["t1"])]
    assert t1["duplicate_pages"] == 1 and t1["duplicate_document_pages"] == 1 and t1["saved_usd"] > 0


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
