"""Scheduled runs: the shipped nightly and backfill job files, the LastModified window (pure and end to end,
`--since-last-run` scoped by Beam's --job_name), and the document-level result cache over a local output
with a model that does not exist (cached documents never need it; the others fail into rows)."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions

from pipelines import cli
from pipelines.config.options import PagemillOptions, merge_flags
from pipelines.run import option_checks
from pipelines.run.run import SINCE_LAST_RUN_OVERLAP_S, listing_window
from pipelines.run.settings import run_settings
from pipelines.tables import sql
from schemas import tables
from schemas.layout import partition
from schemas.records import ListedObject
from tests.support import docmaker
from transforms.intake.listing import in_window
from transforms.store.write import write_rows

REPO = Path(__file__).resolve().parents[2]
NIGHTLY = str(REPO / "jobs" / "nightly.yaml")
BACKFILL = str(REPO / "jobs" / "backfill.yaml")
UTC = dt.UTC


def _epoch(year: int, month: int, day: int) -> float:
    return dt.datetime(year, month, day, tzinfo=UTC).timestamp()


def _options(flags: list[str]) -> tuple[PagemillOptions, Any]:
    options = PagemillOptions(flags)
    return options.view_as(PagemillOptions), options


def rows(output: Path, query: str) -> list[dict[str, Any]]:
    columns, found = sql.query(str(output), query)
    return [dict(zip(columns, r, strict=True)) for r in found]


# (a) The shipped job files.

def test_nightly_job_parses() -> None:
    o, options = _options(merge_flags([], NIGHTLY))
    assert o.input == ["s3://my-bucket/incoming/"]
    assert o.output == "s3://my-bucket/pagemill/"
    assert (o.tenant, o.schema, o.model) == ("default", "invoice", "Qwen/Qwen2.5-VL-7B-Instruct")
    assert o.since_last_run is True
    assert (o.modified_since, o.modified_until, o.run_id) == (None, None, None)
    assert options.view_as(GoogleCloudOptions).job_name == "pagemill-nightly"
    assert option_checks.check_options(o) == []


def test_backfill_job_parses() -> None:
    o, options = _options(merge_flags([], BACKFILL))
    assert o.input == ["s3://my-bucket/archive/2024/"]
    assert o.output == "s3://my-bucket/pagemill/"
    assert o.since_last_run is False
    assert o.modified_since == "2024-01-01T00:00:00+00:00"
    assert o.modified_until == "2025-01-01T00:00:00+00:00"
    assert o.run_id == "backfill-2024"
    job_name = options.view_as(GoogleCloudOptions).job_name
    assert job_name == "pagemill-backfill-2024"
    assert option_checks.check_options(o) == []
    # Without --since-last-run the window is the file's two times; no store is consulted.
    assert listing_window(o, job_name, None) == (_epoch(2024, 1, 1), _epoch(2025, 1, 1))


def test_command_line_overrides_the_job_file() -> None:
    argv = ["--since-last-run", "false", "--job_name=nightly-manual", "--input", "/data/in", "--tenant", "acme"]
    o, options = _options(merge_flags(argv, NIGHTLY))
    assert o.since_last_run is False
    assert o.input == ["/data/in"]  # a command line that gives --input replaces the file's inputs
    assert o.tenant == "acme"
    assert options.view_as(GoogleCloudOptions).job_name == "nightly-manual"
    o, _ = _options(merge_flags(["--modified-until=2024-07-01T00:00:00"], BACKFILL))
    assert listing_window(o, None, None) == (_epoch(2024, 1, 1), _epoch(2024, 7, 1))  # naive = UTC


def test_a_bad_window_time_is_refused() -> None:
    o, _ = _options(["--modified-since", "yesterday", "--extract", "false"])
    assert option_checks.check_options(o) == ["--modified-since 'yesterday' is not an ISO time"]


# (b) in_window, pure.

@pytest.mark.parametrize(("modified", "since", "until", "taken"), [
    (None, _epoch(2024, 1, 1), _epoch(2025, 1, 1), True),  # an unknown time is always taken
    (_epoch(2024, 6, 1), None, None, True),
    (_epoch(2024, 6, 1), _epoch(2024, 1, 1), None, True),
    (_epoch(2023, 6, 1), _epoch(2024, 1, 1), None, False),
    (_epoch(2024, 1, 1), _epoch(2024, 1, 1), None, True),  # since is inclusive
    (_epoch(2024, 6, 1), None, _epoch(2025, 1, 1), True),
    (_epoch(2025, 6, 1), None, _epoch(2025, 1, 1), False),
    (_epoch(2025, 1, 1), None, _epoch(2025, 1, 1), False),  # until is exclusive
    (_epoch(2024, 6, 1), _epoch(2024, 1, 1), _epoch(2025, 1, 1), True),
    (_epoch(2023, 12, 31), _epoch(2024, 1, 1), _epoch(2025, 1, 1), False),
    (_epoch(2025, 1, 2), _epoch(2024, 1, 1), _epoch(2025, 1, 1), False),
    (_epoch(2024, 6, 1), _epoch(2025, 1, 1), _epoch(2024, 1, 1), False),  # an empty window takes nothing
])
def test_in_window(modified: float | None, since: float | None, until: float | None, taken: bool) -> None:
    assert in_window(ListedObject(uri="s3://b/k.pdf", size=10, last_modified=modified), since, until) is taken


# (c) End to end, render-only, local.

def _write(path: Path, data: bytes, mtime: float | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return str(path)


def _run(inputs: Path, output: Path, run_id: str, *extra: str) -> int:
    return cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", run_id,
                     "--extract", "false", "--max-side", "320", "--progress-every-s", "0", "--workers", "1", *extra])


def _documents(output: Path, run_id: str) -> set[str]:
    found = rows(output, f"SELECT source_uri FROM documents WHERE run_id = '{run_id}'")
    return {d["source_uri"] for d in found}


@pytest.mark.slow
def test_since_last_run_lists_only_what_changed(tmp_path: Path) -> None:
    inputs, output = tmp_path / "in", tmp_path / "out"
    past = time.time() - 3 * 86400
    old = {_write(inputs / f"old-{i}.pdf", docmaker.text_pdf([[f"Old document {i}", "Already here."]]), past + i)
           for i in range(3)}
    nightly = ["--since-last-run", "true", "--job_name=nightly-test"]
    assert _run(inputs, output, "night-1", *nightly) == 0
    assert _documents(output, "night-1") == old  # no earlier run of this job: everything
    manifest = json.loads((output / "runs" / "tenant=default" / "night-1.json").read_text())
    assert manifest["options"]["job_name"] == "nightly-test"
    assert manifest["options"]["since_last_run"] is True

    new = _write(inputs / "sub" / "new.pdf", docmaker.text_pdf([["New document", "Arrived after run 1."]]))
    assert os.stat(new).st_mtime >= dt.datetime.fromisoformat(manifest["started_at"]).timestamp()
    assert _run(inputs, output, "night-2", *nightly) == 0
    docs = rows(output, "SELECT source_uri, outcome FROM documents WHERE run_id = 'night-2'")
    assert docs == [{"source_uri": new, "outcome": "rendered"}]
    assert _documents(output, "night-1") == old  # run 1's rows are untouched

    # The window belongs to a job name (and tenant): another job starts from nothing.
    assert _run(inputs, output, "other-1", "--since-last-run", "true", "--job_name=other-job") == 0
    assert _documents(output, "other-1") == old | {new}
    assert _run(inputs, output, "tenant-1", *nightly, "--tenant", "acme") == 0
    assert _documents(output, "tenant-1") == old | {new}
    # The nightly job's next run lists again only what changed within the overlap before run 2's start
    # (here: the new file, minutes old), never the three-day-old ones.
    assert _run(inputs, output, "night-3", *nightly) == 0
    assert _documents(output, "night-3") == {new}
    second = json.loads((output / "runs" / "tenant=default" / "night-2.json").read_text())
    started = dt.datetime.fromisoformat(second["started_at"])
    assert os.stat(new).st_mtime >= started.timestamp() - SINCE_LAST_RUN_OVERLAP_S


@pytest.mark.slow
def test_modified_since_and_until_select_by_mtime(tmp_path: Path) -> None:
    inputs, output = tmp_path / "in", tmp_path / "out"
    times = {"2023-12.pdf": _epoch(2023, 12, 31), "2024-01-01.pdf": _epoch(2024, 1, 1),
             "2024-06.pdf": _epoch(2024, 6, 15), "2024-12.pdf": _epoch(2024, 12, 31),
             "2025-01-01.pdf": _epoch(2025, 1, 1), "2025-03.pdf": _epoch(2025, 3, 1)}
    paths = {name: _write(inputs / name, docmaker.text_pdf([[name, "Dated by its mtime."]]), t)
             for name, t in times.items()}
    window = ["--modified-since", "2024-01-01T00:00:00+00:00", "--modified-until", "2025-01-01T00:00:00"]
    assert _run(inputs, output, "backfill", *window) == 0
    assert _documents(output, "backfill") == {paths["2024-01-01.pdf"], paths["2024-06.pdf"], paths["2024-12.pdf"]}
    assert _run(inputs, output, "since", "--modified-since", "2024-12-01T00:00:00Z") == 0
    assert _documents(output, "since") == {paths[n] for n in ("2024-12.pdf", "2025-01-01.pdf", "2025-03.pdf")}
    assert _run(inputs, output, "until", "--modified-until", "2024-01-01T00:00:00+00:00") == 0
    assert _documents(output, "until") == {paths["2023-12.pdf"]}


# (d) The document-level cache over a local output, with a model that does not exist.

# Shaped like a hub id (org/name), so the CLI's pre-flight lets it through; it is in no cache and
# HF_HUB_OFFLINE=1 keeps the hub out of reach, so an engine start fails.
MISSING_MODEL = "pagemill-test/no-such-model"


def _seed_pages(output: Path, pages: dict[bytes, list[int]], decoys: dict[bytes, int], config: str,
                created: dt.datetime) -> None:
    """An earlier run's `ok` rows for the given pages of each document, and for each `decoys` document three
    rows of one page that must not be reused: not ok, another tenant, another cache configuration."""

    def row(data: bytes, index: int, **over: Any) -> dict[str, Any]:
        sha = hashlib.sha256(data).hexdigest()
        base = {"run_id": "seed", "tenant": "default", "doc_sha256": sha, "source_uri": f"seed://{sha}",
                "page_index": index, "page_hash": f"{sha}-{index}", "cache_key": f"seed-{sha}-{index}",
                "config_key": config, "status": "ok", "width": 100, "height": 140, "schema_id": "invoice",
                "schema_hash": "seed", "model": MISSING_MODEL, "model_revision": None,
                "extraction": json.dumps({"seeded_page": index}), "validation_errors": [], "flags": [],
                "hint_source": "text_layer", "flag_detail": [], "created_at": created}
        return {**base, **over}

    seeded = [row(data, i) for data, indexes in pages.items() for i in indexes]
    for data, i in decoys.items():
        seeded += [row(data, i, status="failed", extraction=None, reason_code="engine_error"),
                   row(data, i, tenant="acme"), row(data, i, config_key="another-config")]
    # The other tenant's decoys in a file of their own in this tenant's folder: a file must be all its folder's
    # (transforms/store/part_check.py), so one mixed file would be refused whole, its good rows with it.
    folder = partition(str(output), "pages", "default", "seed")
    write_rows(folder, tables.PAGES, [r for r in seeded if r["tenant"] == "default"], name="part-0.parquet")
    write_rows(folder, tables.PAGES, [r for r in seeded if r["tenant"] != "default"], name="part-1.parquet")


@pytest.mark.slow
def test_document_cache_without_the_engine(tmp_path: Path) -> None:
    inputs, output = tmp_path / "in", tmp_path / "out"
    complete = docmaker.multipage_pdf(3, title="Complete report")
    incomplete = docmaker.multipage_pdf(2)
    complete_uri = _write(inputs / "complete.pdf", complete)
    incomplete_uri = _write(inputs / "incomplete.pdf", incomplete)
    flags = ["--model", MISSING_MODEL, "--schema", "invoice"]
    config = run_settings(_options(flags)[0]).extract.config_key
    _seed_pages(output, {complete: [0, 1, 2], incomplete: [0]}, {incomplete: 1}, config,
                dt.datetime(2024, 1, 1, tzinfo=UTC))

    argv = [sys.executable, "-m", "pipelines.cli", "run", "--input", str(inputs), "--output", str(output),
            *flags, "--run-id", "cached", "--progress-every-s", "0", "--workers", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=540, check=False)
    # Every page that reached the model failed with engine_error: exit 3, after every row was written.
    assert proc.returncode == 3, proc.stderr[-4000:]
    assert "vLLM engine could not start" in proc.stderr  # logged, not raised

    docs = {d["source_uri"]: d for d in rows(output, "SELECT * FROM documents WHERE run_id = 'cached'")}
    assert set(docs) == {complete_uri, incomplete_uri}
    assert (docs[complete_uri]["outcome"], docs[complete_uri]["reason_code"]) == ("cached", None)
    assert docs[complete_uri]["page_count"] == 3
    assert (docs[incomplete_uri]["outcome"], docs[incomplete_uri]["reason_code"]) == ("failed", "engine_error")
    assert docs[incomplete_uri]["page_count"] == 2

    pages = rows(output, "SELECT p.source_uri, p.page_index, p.status, p.reason_code, p.message, p.extraction, "
                         "p.config_key, l.route, l.attempts, l.cost_usd, l.gpu_seconds, l.image_tokens "
                         "FROM pages p JOIN ledger l USING (run_id, doc_sha256, page_index) "
                         "WHERE run_id = 'cached' ORDER BY p.source_uri, p.page_index")
    cached = [p for p in pages if p["source_uri"] == complete_uri]
    assert [(p["page_index"], p["status"], p["route"]) for p in cached] == [(i, "cached", "cache") for i in range(3)]
    assert [json.loads(p["extraction"]) for p in cached] == [{"seeded_page": i} for i in range(3)]
    assert all(p["config_key"] == config and p["reason_code"] is None for p in cached)
    assert all(p["cost_usd"] == 0 and p["gpu_seconds"] == 0 and p["image_tokens"] == 0 for p in cached)

    # The incomplete document went to the engine (both pages: the seeded page 0 is not reused page by page,
    # since its seeded cache key is not the page's real one); the engine could not start, so each page is a
    # `failed` row with reason `engine_error`, no attempt and no cost.
    failed = [p for p in pages if p["source_uri"] == incomplete_uri]
    assert [(p["page_index"], p["status"], p["reason_code"], p["route"], p["attempts"]) for p in failed] == \
        [(i, "failed", "engine_error", "failed", 0) for i in range(2)]
    assert all(p["message"].startswith("engine could not start: ") for p in failed)
    assert all(p["extraction"] is None and p["cost_usd"] == 0 for p in failed)

    manifest = json.loads((output / "runs" / "tenant=default" / "cached.json").read_text())
    assert manifest["outcomes"] == {"cached": 1, "failed": 1}
    assert manifest["pages"] == {"cached": 3, "failed": 2}
    assert manifest["routes"] == {"cache": 3, "failed": 2}
    assert manifest["page_reasons"] == {"engine_error": 2}
    assert manifest["totals"]["model_calls"] == 0
    assert manifest["totals"]["cost_usd"] == 0


def test_a_manifest_planted_in_runs_does_not_move_another_tenants_window(tmp_path: Path) -> None:
    # Fails before the fix: every `runs/*.json` was read as the run of the tenant it names, so one planted by
    # whoever could write `runs/` made acme's --since-last-run start in 2099 and list nothing.
    output = tmp_path / "out"
    nightly = ["--since-last-run", "true", "--job_name=nightly-test", "--tenant", "acme", "--output", str(output)]
    o, options = _options(nightly)
    job = options.view_as(GoogleCloudOptions).job_name

    def manifest(path: Path, run_id: str, started: dt.datetime) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"run_id": run_id, "started_at": started.isoformat(), "tenant": "acme",
                                    "options": {"tenant": "acme", "job_name": "nightly-test"}}))

    future = dt.datetime(2099, 1, 1, tzinfo=UTC)
    manifest(output / "runs" / "planted.json", "planted", future)  # old layout, a run id acme never ran
    manifest(output / "runs" / "tenant=globex" / "g1.json", "g1", future)  # globex's folder, naming acme
    assert listing_window(o, job, None) == (None, None)  # acme has no finished run of this job yet
    # acme's own manifests: its folder, and an old-layout one whose run id acme's partitions hold.
    own, old = dt.datetime(2026, 3, 2, tzinfo=UTC), dt.datetime(2026, 3, 1, tzinfo=UTC)
    manifest(output / "runs" / "tenant=acme" / "n2.json", "n2", own)
    assert listing_window(o, job, None)[0] == own.timestamp() - SINCE_LAST_RUN_OVERLAP_S
    (output / "runs" / "tenant=acme" / "n2.json").unlink()
    write_rows(partition(str(output), "documents", "acme", "n1"), tables.DOCUMENTS,
               [{"run_id": "n1", "tenant": "acme", "source_uri": "a", "outcome": "rendered", "created_at": old}])
    manifest(output / "runs" / "n1.json", "n1", old)
    assert listing_window(o, job, None)[0] == old.timestamp() - SINCE_LAST_RUN_OVERLAP_S
    assert {r["run_id"] for r in rows(output, "SELECT run_id FROM runs")} == {"planted", "g1", "n1"}  # all tenants
