"""Tenants are apart in storage: partitions, resume, the result cache's listing, the SQL views, the named
queries and the report all key on (tenant, run id).

The query and report checks use hand-written rows (two tenants that hold the same run id, as an output root
written before tenant partitions, or by hand, can) so every expected figure is derived here, not by the code."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.tables import queries, report, sql
from schemas import tables
from schemas.layout import partition
from tests import docmaker
from tests.pipelines.raw import raw_rows
from transforms.output.run_root import tenant_files
from transforms.output.write import write_rows

EARLY = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LATE = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)


def _write(output: Path, tenant: str, run_id: str, created: dt.datetime,
           pages: list[tuple[str, int, str, float]], manifest: bool = True) -> None:
    """One run of one tenant: `pages` = (doc_sha256, page_index, route, cost_usd); one documents row per
    doc_sha256; an old-layout `runs/<run_id>.json` (before manifests had tenant folders) unless told not."""
    base = {"run_id": run_id, "tenant": tenant, "created_at": created}
    docs = sorted({p[0] for p in pages})
    documents = [{**base, "source_uri": f"s3://{tenant}/{d}.pdf", "doc_sha256": d, "outcome": "extracted",
                  "page_count": sum(p[0] == d for p in pages)} for d in docs]
    status = {"model": "ok", "duplicate": "duplicate", "cache": "cached"}
    page_rows = [{**base, "doc_sha256": d, "page_index": i, "source_uri": f"s3://{tenant}/{d}.pdf",
                  "status": status[route], "schema_id": "invoice", "model": "m"} for d, i, route, _ in pages]
    ledger = [{**base, "doc_sha256": d, "page_index": i, "source_uri": f"s3://{tenant}/{d}.pdf", "route": route,
               "cost_usd": cost, "api_equivalent_usd": 10 * cost, "gpu_seconds": cost, "image_tokens": 1,
               "text_tokens": 1, "output_tokens": 1, "attempts": 1} for d, i, route, cost in pages]
    for table, rows in (("documents", documents), ("pages", page_rows), ("ledger", ledger)):
        write_rows(partition(str(output), table, tenant, run_id), tables.SCHEMAS[table], rows)
    if manifest:
        (output / "runs").mkdir(parents=True, exist_ok=True)
        (output / "runs" / f"{run_id}.json").write_text(json.dumps(
            {"run_id": run_id, "started_at": created.isoformat(), "wall_seconds": 1.0, "tenant": tenant,
             "options": {"tenant": tenant}}))


@pytest.fixture
def shared_run_id(tmp_path: Path) -> Path:
    """Tenant `acme` extracted two pages at $0.01 each; tenant `globex`, under the same run id `r1` and
    later, extracted one page at $0.05 and reused one (a duplicate page); `globex` run `r2` only used the
    cache. A `sql.py` that keyed on run id alone would average r1's model pages over both tenants:
    (0.01 + 0.01 + 0.05) / 3."""
    out = tmp_path / "out"
    _write(out, "acme", "r1", EARLY, [("a1", 0, "model", 0.01), ("a1", 1, "model", 0.01)])
    # (one manifest per run id: the run id's first owner, acme, holds the old-layout runs/r1.json)
    _write(out, "globex", "r1", LATE, [("g1", 0, "model", 0.05), ("g1", 1, "duplicate", 0.0)], manifest=False)
    _write(out, "globex", "r2", LATE + dt.timedelta(hours=1), [("g2", 0, "cache", 0.0)])
    return out


def _named(output: Path, name: str, **kwargs: Any) -> list[dict[str, Any]]:
    columns, rows = queries.run(str(output), name, **kwargs)
    return [dict(zip(columns, r, strict=True)) for r in rows]


def test_cache_savings_never_prices_one_tenant_with_anothers_pages(shared_run_id: Path) -> None:
    rows = {(r["tenant"], r["run_id"]): r for r in _named(shared_run_id, "cache-savings")}
    assert set(rows) == {("globex", "r1"), ("globex", "r2")}  # acme reused nothing
    r1 = rows[("globex", "r1")]
    assert (r1["duplicate_pages"], r1["priced_from"], r1["usd_per_model_page"]) == (1, "this run", 0.05)
    assert r1["saved_usd"] == pytest.approx(0.05)
    # r2 has no model page: priced at globex's average model page (0.05), never acme's 0.01.
    r2 = rows[("globex", "r2")]
    assert (r2["cached_pages"], r2["priced_from"], r2["usd_per_model_page"]) == (1, "all runs", 0.05)
    cost = {(r["tenant"], r["run_id"]): (r["pages"], r["model_pages"]) for r in _named(shared_run_id, "cost-by-run")}
    assert cost == {("acme", "r1"): (2, 2), ("globex", "r1"): (2, 1), ("globex", "r2"): (1, 0)}


def test_sql_tenant_restricts_every_view(shared_run_id: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for view in ("documents", "documents_all", "pages", "pages_all", "ledger", "ledger_all", "runs"):
        capsys.readouterr()
        assert cli.main(["sql", "--output", str(shared_run_id), "--tenant", "acme", "--format", "json",
                         f"SELECT DISTINCT tenant FROM {view}"]) == 0
        assert json.loads(capsys.readouterr().out) == [{"tenant": "acme"}], view
    _, found = sql.query(str(shared_run_id), "SELECT tenant, count(*) FROM ledger GROUP BY 1 ORDER BY 1")
    assert found == [("acme", 2), ("globex", 3)]  # without --tenant: every tenant, never merged
    assert _named(shared_run_id, "cache-savings", tenant="acme") == []
    assert cli.main(["sql", "--output", str(shared_run_id), "--tenant", "../acme", "SELECT 1"]) == 2


def test_a_row_in_the_wrong_partition_stays_out_of_a_tenants_views(shared_run_id: Path) -> None:
    """The tenant filter is on the rows as well as the folders: a globex row written into acme's partition
    (a bug, or a hand-made file) is not shown to acme."""
    write_rows(partition(str(shared_run_id), "ledger", "acme", "r1"), tables.LEDGER,
               [{"run_id": "r1", "tenant": "globex", "doc_sha256": "g9", "page_index": 0, "route": "model"}])
    _, found = sql.query(str(shared_run_id), "SELECT tenant, count(*) FROM ledger_all GROUP BY 1", tenant="acme")
    assert found == [("acme", 2)]


def test_report_latest_run_and_run_id_stay_in_one_tenant(shared_run_id: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    latest = report.collect(str(shared_run_id))
    assert (latest["tenant"], latest["run_id"]) == ("globex", "r2")
    acme = report.collect(str(shared_run_id), tenant="acme")  # acme's latest run: r1, acme's rows only
    assert (acme["run_id"], acme["outcomes"]) == ("r1", {"extracted": 1})
    assert acme["cost"]["pages"] == 2 and acme["savings"] == []
    assert [r["run_id"] for r in acme["throughput"]["runs"]] == ["r1"]
    globex = report.collect(str(shared_run_id), run_id="r1", tenant="globex")
    assert globex["cost"]["model_pages"] == 1 and globex["cost"]["cost_usd"] == pytest.approx(0.05)
    # A run id two tenants hold is ambiguous without --tenant: an error, never a mix of both.
    assert cli.main(["report", "--output", str(shared_run_id), "--run-id", "r1", "--html",
                     str(tmp_path / "r.html")]) == 1
    assert "choose one with --tenant" in capsys.readouterr().err and not (tmp_path / "r.html").exists()


def _folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "a.pdf").write_bytes(docmaker.invoice_pdf())
    (root / "b.png").write_bytes(docmaker.tiny_png())
    return root


def _run(inputs: Path, output: Path, tenant: str, run_id: str) -> int:
    return cli.main(["run", "--input", str(inputs), "--output", str(output), "--extract", "false",
                     "--tenant", tenant, "--run-id", run_id, "--progress-every-s", "0", "--workers", "1"])


def test_another_tenants_run_id_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tenant given another tenant's run id neither resumes it, nor skips its own documents as done, nor
    reports (or overwrites) the other tenant's counts: the run is refused before anything is written."""
    inputs, output = _folder(tmp_path / "in"), tmp_path / "out"
    assert _run(inputs, output, "acme", "shared") == 0
    acme_rows = raw_rows(output, "documents", "shared")
    manifest = (output / "runs" / "tenant=acme" / "shared.json").read_text()
    assert {r["tenant"] for r in acme_rows} == {"acme"} and len(acme_rows) == 2
    assert (output / "documents" / "tenant=acme" / "run_id=shared").is_dir()
    capsys.readouterr()
    assert _run(inputs, output, "globex", "shared") == 2
    assert "belongs to another tenant" in capsys.readouterr().err
    assert raw_rows(output, "documents", "shared") == acme_rows
    assert (output / "runs" / "tenant=acme" / "shared.json").read_text() == manifest
    assert not any(p.name == "tenant=globex" for p in output.rglob("*"))
    # With a partition but no manifest yet (a killed run), the run id is still taken.
    (output / "runs" / "tenant=acme" / "shared.json").unlink()
    assert _run(inputs, output, "globex", "shared") == 2 and _run(inputs, output, "globex", "own") == 0
    globex = raw_rows(output, "documents", "own", tenant="globex")
    assert sorted(r["outcome"] for r in globex) == ["rendered", "rendered"]  # nothing skipped as acme's
    assert json.loads((output / "runs" / "tenant=globex" / "own.json").read_text())["documents"] == 2


def test_result_cache_lists_only_the_runs_own_tenant(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for tenant in ("acme", "globex"):
        write_rows(partition(str(out), "pages", tenant, "r1"), tables.PAGES, [{"run_id": "r1", "tenant": tenant}])
    (acme,) = tenant_files(str(out), "pages", "acme")
    assert "/tenant=acme/run_id=r1/" in acme
    assert tenant_files(str(out), "pages", "initech") == []


@pytest.mark.parametrize("flag, value", [("--run-id", "../../x"), ("--run-id", "a/b"), ("--run-id", ".hidden"),
                                         ("--run-id", "x" * 129), ("--tenant", "../t"), ("--tenant", "t\\u"),
                                         ("--job_name", "../nightly")])
def test_unsafe_identifiers_exit_2_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     flag: str, value: str) -> None:
    inputs, output = _folder(tmp_path / "in"), tmp_path / "deep" / "er" / "out"
    before = sorted(tmp_path.rglob("*"))
    assert cli.main(["run", "--input", str(inputs), "--output", str(output), "--extract", "false",
                     flag, value]) == 2
    err = capsys.readouterr().err
    assert "is not a valid identifier" in err and "letters, digits" in err
    assert sorted(tmp_path.rglob("*")) == before  # not the output root, not ../../x.json, nothing


def test_identifier_rule_accepts_the_generated_and_usual_ids() -> None:
    from pipelines.config.options import check_identifier, new_run_id

    for good in (new_run_id(), "nightly-2026.01.02", "acme_corp", "A1"):
        assert check_identifier("--run-id", good) is None, good


def test_a_tenant_folder_in_the_output_root_names_no_manifest(tmp_path: Path) -> None:
    """An old-layout `runs/<id>.json` under a root that itself holds `tenant=acme` speaks for no tenant: only
    the manifest's own folder names one."""
    import pyarrow.fs as pafs

    from pipelines.tables.sql import manifest_files

    root = tmp_path / "tenant=acme" / "out"
    (root / "runs" / "tenant=default").mkdir(parents=True)
    (root / "runs" / "tenant=default" / "r1.json").write_text("{}")
    (root / "runs" / "r0.json").write_text("{}")
    fs = pafs.LocalFileSystem()
    assert manifest_files(fs, str(root), "acme") == []
    assert manifest_files(fs, str(root), None) == [(str(root / "runs" / "tenant=default" / "r1.json"), "default"),
                                                   (str(root / "runs" / "r0.json"), None)]
