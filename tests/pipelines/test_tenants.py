"""Tenants are apart in storage: partitions, resume, the result cache's listing, the SQL views, the named
queries and the report all key on (tenant, run id).

The query and report checks use hand-written rows (two tenants that hold the same run id: run ids are per
tenant) so every expected figure is derived here, not by the code. A tenant's malformed manifests break
no one's command."""
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
from tests.support import docmaker
from tests.support.raw import raw_rows
from transforms.store.files import tenant_files
from transforms.store.write import write_rows

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


def test_run_ids_are_per_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fails before the fix: a run id was one tenant's across the root, so whatever another tenant wrote under its
    own folders (`runs/tenant=evil/shared.json`, even `[]`, or a partition) made globex's `--run-id shared`
    exit 2 "belongs to another tenant". Now each tenant's run `shared` is its own: globex's run neither resumes,
    skips nor reports acme's, and acme's rows and manifest stay as they were."""
    inputs, output = _folder(tmp_path / "in"), tmp_path / "out"
    assert _run(inputs, output, "acme", "shared") == 0
    acme_rows = raw_rows(output, "documents", "shared", tenant="acme")
    acme_manifest = (output / "runs" / "tenant=acme" / "shared.json").read_text()
    assert len(acme_rows) == 2
    squat = output / "runs" / "tenant=evil" / "shared.json"
    squat.parent.mkdir(parents=True)
    squat.write_text("[]")
    write_rows(partition(str(output), "documents", "evil", "shared"), tables.DOCUMENTS,
               [{"run_id": "shared", "tenant": "evil", "source_uri": "x", "outcome": "rendered"}])
    capsys.readouterr()
    assert _run(inputs, output, "globex", "shared") == 0
    err = capsys.readouterr().err
    assert "belongs to another tenant" not in err and "resuming" not in err and str(squat) not in err
    globex = raw_rows(output, "documents", "shared", tenant="globex")
    assert sorted(r["outcome"] for r in globex) == ["rendered", "rendered"]  # nothing skipped as acme's
    manifest = json.loads((output / "runs" / "tenant=globex" / "shared.json").read_text())
    assert (manifest["documents"], manifest["resumed"], manifest["this_invocation"]["documents"]) == (2, False, 2)
    assert raw_rows(output, "documents", "shared", tenant="acme") == acme_rows
    assert (output / "runs" / "tenant=acme" / "shared.json").read_text() == acme_manifest
    _, found = sql.query(str(output), "SELECT tenant, run_id, documents FROM runs ORDER BY 1")
    assert found == [("acme", "shared", 2), ("globex", "shared", 2)]  # evil's `[]` skipped, with a warning


def test_an_old_layout_manifest_gives_way_only_to_its_own_tenants_run(shared_run_id: Path) -> None:
    """Fails before the fix: acme's old-layout `runs/r1.json` vanished from the `runs` view once globex wrote a
    manifest for its own run `r1`, so cost-by-run lost acme's start time."""
    globex = shared_run_id / "runs" / "tenant=globex" / "r1.json"
    globex.parent.mkdir(parents=True)
    globex.write_text(json.dumps({"run_id": "r1", "started_at": LATE.isoformat(), "wall_seconds": 2.0}))
    _, found = sql.query(str(shared_run_id), "SELECT tenant, run_id, started_at FROM runs ORDER BY 1, 2")
    assert found == [("acme", "r1", EARLY.isoformat()), ("globex", "r1", LATE.isoformat()),
                     ("globex", "r2", (LATE + dt.timedelta(hours=1)).isoformat())]
    cost = {(r["tenant"], r["run_id"]): r["started_at"] for r in _named(shared_run_id, "cost-by-run")}
    assert cost[("acme", "r1")] == EARLY.isoformat() and cost[("globex", "r1")] == LATE.isoformat()
    # acme's own new-layout manifest replaces its old one (one row per tenant and run).
    acme = shared_run_id / "runs" / "tenant=acme" / "r1.json"
    acme.parent.mkdir(parents=True)
    acme.write_text(json.dumps({"run_id": "r1", "started_at": LATE.isoformat()}))
    _, found = sql.query(str(shared_run_id), "SELECT tenant, started_at FROM runs WHERE run_id = 'r1' ORDER BY 1")
    assert found == [("acme", LATE.isoformat()), ("globex", LATE.isoformat())]


MALFORMED = {"list.json": "[]", "truncated.json": '{"run_id": "x", "started_at": "2026-0', "empty.json": "",
             "types.json": json.dumps({"run_id": 7, "documents": "many", "totals": [], "options": "x"}),
             "time.json": json.dumps({"run_id": "t", "started_at": "yesterday"}),
             "schema.json": json.dumps({"run_id": "s", "options": {"schema": ["a"]}})}


def _plant(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in MALFORMED.items():
        (folder / name).write_text(text)
    return [folder / name for name in MALFORMED]


def test_another_tenants_malformed_manifests_break_no_command(shared_run_id: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Fails before the fix: one tenant's `runs/tenant=evil/list.json` holding `[]` made every tenant's
    `pagemill sql` fail ('list' object has no attribute 'get'), `report` print a traceback and `export` fail.
    Now each malformed file is skipped with one warning line that names it."""
    planted = _plant(shared_run_id / "runs" / "tenant=evil")
    capsys.readouterr()
    assert cli.main(["sql", "--output", str(shared_run_id), "--format", "json",
                     "SELECT tenant, run_id FROM runs ORDER BY 1, 2"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"tenant": "acme", "run_id": "r1"}, {"tenant": "globex", "run_id": "r2"}]
    for path in planted:
        assert f"skipped the manifest {path}" in err, path
    assert "Traceback" not in err
    assert cli.main(["sql", "--output", str(shared_run_id), "--query", "cost-by-run"]) == 0
    assert cli.main(["report", "--output", str(shared_run_id), "--html", str(tmp_path / "latest.html")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    planted_invoices = shared_run_id / "pages" / "tenant=acme" / "run_id=r1"
    write_rows(str(planted_invoices), tables.PAGES, [{"run_id": "r1", "tenant": "acme", "doc_sha256": "a9",
                                                      "page_index": 0, "status": "ok", "schema_id": "invoice",
                                                      "extraction": json.dumps({"vendor_name": "Contoso"})}])
    assert cli.main(["export", "--output", str(shared_run_id), "--schema", "invoice",
                     "--to", str(tmp_path / "invoice.csv")]) == 0
    assert "Contoso" in (tmp_path / "invoice.csv").read_text()


def test_since_last_run_reads_past_a_malformed_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fails before the fix: `--since-last-run` read the tenant's manifests with `json.loads` and used what it
    found, so a manifest cut short (a crash before writes were atomic) or hand-edited stopped the nightly with a
    traceback. Now the window starts from the last readable manifest of the job, and the others are named."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    from pipelines.config.options import PagemillOptions
    from pipelines.run.run import SINCE_LAST_RUN_OVERLAP_S, listing_window

    output = tmp_path / "out"
    options = PagemillOptions(["--since-last-run", "true", "--job_name=nightly", "--tenant", "acme",
                               "--output", str(output), "--input", str(tmp_path)])
    o, job = options.view_as(PagemillOptions), options.view_as(GoogleCloudOptions).job_name
    _plant(output / "runs" / "tenant=evil")
    own = _plant(output / "runs" / "tenant=acme")  # acme's own folder too: skipped, named
    good = output / "runs" / "tenant=acme" / "n1.json"
    good.write_text(json.dumps({"run_id": "n1", "started_at": EARLY.isoformat(), "options": {"job_name": "nightly"}}))
    capsys.readouterr()
    assert listing_window(o, job, None) == (EARLY.timestamp() - SINCE_LAST_RUN_OVERLAP_S, None)
    err = capsys.readouterr().err
    assert all(f"skipped the manifest {path}" in err for path in own)
    assert "tenant=evil" not in err  # another tenant's files are not even read


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
    from pipelines.config.options import new_run_id
    from schemas.layout import check_identifier

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


PLANTED = "PAY TO ACCOUNT 666 - forged"


def test_a_file_planted_in_alphas_run_folder_with_bravos_rows_is_nobodys(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Issue 42 row 1: alpha (who may write only under its own prefix) drops into its run folder a part file whose
    rows say tenant=bravo, run_id=b1, with bravo's key, forged text and a later created_at (so the kept-row rule
    would prefer it). Alpha's commits and bravo's own: bravo's rows, committed or read with and without the
    catalog, with and without --tenant, hold bravo's invoice, never the forged text; the file is reported."""
    from transforms.store.commits import Commits
    from transforms.store.iceberg import CatalogConfig

    out = tmp_path / "out"
    _write(out, "bravo", "b1", EARLY, [("inv", 0, "model", 0.01)], manifest=False)
    _write(out, "alpha", "a1", EARLY, [("own", 0, "model", 0.01)], manifest=False)
    (bravo_row,) = raw_rows(out, "pages", tenant="bravo")
    forged = {**bravo_row, "hint": PLANTED, "markdown": PLANTED, "created_at": dt.datetime(2099, 1, 1, tzinfo=dt.UTC)}
    planted = write_rows(partition(str(out), "pages", "alpha", "a1"), tables.PAGES, [forged])
    config = CatalogConfig(uri="sqlite")
    for tenant, run_id in (("bravo", "b1"), ("alpha", "a1"), ("alpha", "a1")):  # alpha's normal commits, twice
        Commits(config, str(out), None, tenant, run_id).run_settled([], wave=0)
    from pyiceberg.catalog.sql import SqlCatalog

    committed = SqlCatalog("pagemill", uri=f"sqlite:///{out / 'catalog.db'}").load_table("pagemill.pages")
    rows = committed.scan().to_arrow().to_pylist()
    assert PLANTED not in str(rows)
    assert {(r["tenant"], r["doc_sha256"]) for r in rows} == {("bravo", "inv"), ("alpha", "own")}
    assert all(not t.file.file_path.endswith(planted.rsplit("/", 1)[-1]) for t in committed.scan().plan_files())
    catalog = sql.TableSource.of(str(out), "sqlite")
    for source in (None, catalog):
        for tenant in (None, "bravo"):
            _, found = sql.query(str(out), "SELECT tenant, doc_sha256, hint, markdown FROM pages_all", tenant=tenant,
                                 source=source)
            assert PLANTED not in str(found), (source, tenant)
            assert ("bravo", "inv") in {(r[0], r[1]) for r in found}
    from transforms.store.files import misfiled_run_files

    reported = misfiled_run_files(str(out), "alpha", "a1")  # the run manifest's `misfiled_files`
    assert list(reported) == [planted] and "tenant=bravo" in reported[planted]
    assert any(planted in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
