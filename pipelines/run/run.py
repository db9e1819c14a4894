"""One run, after its command line is parsed (pipelines/cli.py): checks and pre-flight, the run id, the
listing window, resume or --force, the pipeline, compaction, the manifest, the summary and the exit code."""
from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import replace
from functools import partial
from typing import Any

from schemas import layout
from schemas.run_place import RunPlace

SINCE_LAST_RUN_OVERLAP_S = 3600


def run(options: Any, storage: Any) -> int:
    """Run the pipeline `options` describe (PipelineOptions holding PagemillOptions) over `storage`
    (pipelines/config/storage.py); the exit code (pipelines/run/exit_codes.py), 2 when an option or check fails."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    from pipelines.config.options import PagemillOptions, check_identifiers, new_run_id
    from pipelines.config.storage import configure
    from pipelines.run.preflight import preflight
    from pipelines.run.run_log import log_file, run_log
    from pipelines.run.settings import settings_from_options
    from pipelines.run.waves import bound_listing

    o = options.view_as(PagemillOptions)
    job_name = options.view_as(GoogleCloudOptions).job_name
    # Identifiers become paths under the output root: checked before anything (even pre-flight) runs.
    problems = check_identifiers(o, job_name) + layout.root_problems(o.output)
    # Which run, made once (the machine engine's folder in the settings is named after its id); the options keep
    # what was given.
    place = RunPlace(o.output, o.tenant, o.run_id or new_run_id())
    built: Any = problems
    if not problems:
        configure(storage)
        built = settings_from_options(o, place=place)  # checked, loaded and built in one pass: nothing written if bad
        problems = built if isinstance(built, list) else preflight(o.input, o.output, storage)
    # A listing an earlier invocation left is reused only if it is this run's: same --input, files unchanged.
    found, refused = (None, []) if problems else bound_listing(o, place)
    problems = problems or refused
    if problems:
        for problem in problems:
            print(f"pagemill run: {problem}", file=sys.stderr)
        return 2
    log = log_file(place.output, place.tenant, place.run_id)  # the libraries' and engines' lines (run_log.py)
    with run_log(log, bool(o.verbose), f"run {place.run_id}") as screen:
        return _run(options, o, storage, built, found, job_name, screen.log or log, screen)


def _run(options: Any, o: Any, storage: Any, built: Any, found: Any, job_name: str | None, log: Any,
         screen: Any) -> int:
    """The run itself, once checked: pagemill's lines go to `screen`, everything else to the `log` file."""
    from pipelines.config.engine import with_log_file
    from pipelines.run.exit_codes import exit_code
    from pipelines.run.local_workers import decides_workers, resolve_local_workers, small_listing, usable_cores
    from pipelines.run.progress import ProgressWatcher
    from pipelines.run.retries import settle
    from pipelines.run.run_log import print_tail, publish
    from pipelines.run.settings import with_resolved_engine
    from pipelines.run.waves import listing_for, run_waves
    from pipelines.tables.manifest import build_manifest, manifest_options, run_counts, write_manifest
    from transforms.engines.vllm_machine.stats import engine_figures, pages_by_device
    from transforms.store.files import run_tenants
    from transforms.store.listing_file import ListingChanged

    place = built.place  # which run (schemas/run_place.py), made once by `run`
    since, until = listing_window(o, job_name, storage)
    tables = run_tables(o, place, storage)  # every change to the run's files and its catalog goes through it
    refused = tables.refusal()  # a catalog that names a class to run, a table not pagemill's
    if refused:
        print(f"pagemill run: --catalog: {refused}", file=screen.err)
        return 2
    if o.force:
        tables.clear()  # files, listing, and the catalog's hold on them
    # A run id is the tenant's own: only its own partitions make this a resume (docs/safety.md).
    resuming = place.tenant in run_tenants(place.output, place.run_id, place.tenant)
    before = run_counts(place.output, place.run_id, storage, place.tenant) if resuming else None
    started = dt.datetime.now(dt.UTC)
    run = {"run_id": place.run_id, "tenant": place.tenant, "created_at": started}
    verb = "resuming" if before else "reading"
    print(f"pagemill: run {place.run_id}: {verb} {', '.join(o.input)}", file=screen.err, flush=True)
    t0 = time.perf_counter()
    listing = listing_for(o, place, since, until, found)
    # The listing tells a small run before any worker starts; the engine's service follows the workers.
    # Its pages are counted only when the run chooses its workers and the listing is small by objects and bytes.
    cores = usable_cores()
    small = listing is not None and decides_workers(options) and cores > 1 and small_listing(listing, built)
    resolve_local_workers(options, cores, small)
    settings = with_resolved_engine(built, o)  # the `vllm` alias follows the resolved workers
    settings = replace(settings, engine=with_log_file(settings.engine, str(log)))  # its services' lines too
    service = getattr(settings.engine, "service_dir", None)  # the machine's engine service: its engines' figures
    from pipelines.config.engine import uses_batches

    batched = uses_batches(o)
    from pipelines.run.batches import TryLater, batch_waves, manifest_batches
    from pipelines.run.exit_codes import TRY_LATER
    watcher = ProgressWatcher(place.output, place.tenant, place.run_id, o.progress_every_s, listing and listing.objects,
                              listing and listing.waves, out=screen.err,
                              devices=service and partial(pages_by_device, service))
    try:
        with watcher:
            def ran() -> Any:
                return run_waves(options, settings, run, listing, since, until, o.force,
                                 on_wave=lambda wave: setattr(watcher, "wave", wave), tables=tables)
            # A hosted batch's run passes as often as its batches need (pipelines/run/batches.py).
            waves, metrics = (batch_waves(o, settings.engine, run, storage, listing, ran, place=place) if batched
                              else ran())
    except TryLater as later:  # batches working: exit 75, nothing lost
        print(later, file=screen.err)
        return TRY_LATER
    except ListingChanged as err:  # a wave file rewritten while the run went on: nothing of it was read
        print(f"pagemill run: {err}", file=screen.err)
        return 2
    except Exception as err:  # noqa: BLE001 - one clear line; the runner has logged the traceback
        from pipelines.run.failure import run_failure

        # Not finished: no manifest (a `--since-last-run` nightly must not start after this run), and
        # the rows written so far stay for the resume.
        print(f"pagemill: run {place.run_id} failed: {run_failure(err)}; the rows written so far are kept: "
              f"fix the cause and run the same command with --run-id {place.run_id} to resume", file=screen.err)
        print_tail(log, screen.err, "the run failed")
        return 1
    wall = time.perf_counter() - t0
    # With a catalog, the files a compaction replaced stay for the snapshots that name them (`pagemill expire`).
    counts, retried = settle(place.output, place.tenant, place.run_id, storage, keep_replaced=tables.mirrored)
    if tables.mirrored:
        try:  # a run without waves commits once, here; with waves, only what the compaction changed
            tables.run_settled(counts["errors"], wave=0 if listing is None else None)
        except Exception as err:  # noqa: BLE001 - one clear line
            from pipelines.run.failure import run_failure

            print(f"pagemill: run {place.run_id}: the catalog commit failed: {run_failure(err)}; the rows are written: "
                  f"run the same command with --run-id {place.run_id} to commit them", file=screen.err)
            return 1
    recorded = {**manifest_options(options), "run_id": place.run_id}  # the run's id, given or made
    manifest = build_manifest(place.run_id, recorded, counts, metrics, started, dt.datetime.now(dt.UTC))
    code, why = exit_code(counts, o.max_failed_fraction)  # rows are written: now judge them
    manifest.update(resumed=bool(before), exit_code=code, exit_reason=why, retried_rows=retried,
                    waves=waves.as_dict(), this_invocation=invocation(counts, before),
                    listing=listing and listing.record(), catalog=tables.catalog_record(),
                    engines=engine_figures(service) if service else [],
                    **({"batches": manifest_batches(settings.engine)} if batched else {}),
                    misfiled_files=tables.misfiled())
    for path, why in manifest["misfiled_files"].items():  # never read, committed or compacted (part_check.py)
        print(f"pagemill run: warning: {path} is not this run's: {why}", file=screen.err)
    uri = write_manifest(place.output, place.tenant, place.run_id, manifest)
    shown = publish(log, uri)  # an object store's copy beside the manifest, now that the run is finished
    print(summary(counts, wall, place.output, uri, manifest["this_invocation"], waves, shown), file=screen.out)
    if o.write_markdown:
        from pipelines.run.markdown_files import write_markdown

        written = write_markdown(place.output, place.tenant, place.run_id, storage)
        folder = layout.markdown_folder(place.output, place.tenant)
        print(f"  markdown: {written} documents under {folder}/", file=screen.out)
    for error in counts["errors"]:
        print(f"pagemill run: error: {error}", file=screen.err)
    if code == 3:  # the model could not be used: the engine's own words say why
        print_tail(log, screen.err, "the model could not be used")
    print(f"pagemill: exit {code}: {why}", file=screen.err if code else screen.out)
    return code


def run_tables(o: Any, place: RunPlace, storage: Any) -> Any:
    """The run's tables (transforms/store/run_tables.py), mirrored to the `--catalog` when one is named."""
    from transforms.store.iceberg import catalog_config
    from transforms.store.run_tables import RunTables

    return RunTables(place, storage, catalog_config(o.catalog, o.catalog_namespace, o.catalog_property))


def invocation(counts: dict[str, Any], before: dict[str, Any] | None) -> dict[str, int]:
    """Pure: what this invocation added to the run (a resume adds to what its killed attempts wrote)."""
    def figures(c: dict[str, Any] | None) -> dict[str, int]:
        if c is None:
            return {"documents": 0, "pages": 0, "model_calls": 0}
        return {"documents": int(c["documents"]), "pages": int(c["totals"]["pages"]),
                "model_calls": int(c["totals"]["model_calls"])}

    now, then = figures(counts), figures(before)
    return {k: max(0, now[k] - then[k]) for k in now}


def listing_window(o: Any, job_name: str | None, storage: Any) -> tuple[float | None, float | None]:
    """--modified-since/--modified-until, or --since-last-run: the start of the last finished run
    of this job name and tenant (objects modified after its listing began)."""
    from pipelines.run.option_checks import epoch

    since = epoch(o.modified_since)
    until = epoch(o.modified_until)
    if o.since_last_run:
        from pipelines.tables import sql

        query = ("SELECT max(started_at) FROM runs WHERE tenant = ? AND "
                 "coalesce(json_extract_string(manifest, '$.options.job_name'), '') = ?")
        con = sql.connect(o.output, storage, o.tenant, typed=False)  # this tenant's manifests only (sql.manifest_files)
        try:
            (last,) = con.execute(query, [o.tenant, job_name or ""]).fetchone()
        finally:
            con.close()
        if last:
            # An overlap, because an object can arrive with an older LastModified (a copy that keeps
            # times, a multipart upload begun before the last run, clock skew); the cache makes
            # listing it again cost nothing.
            start = dt.datetime.fromisoformat(last).timestamp() - SINCE_LAST_RUN_OVERLAP_S
            since = max(since or 0.0, start)
    return since, until


def summary(counts: dict[str, Any], wall: float, output: str, manifest_uri: str,
            this: dict[str, int] | None = None, waves: Any = None, log: Any = None) -> str:
    """The closing lines: what this invocation did (`this`, from `invocation`), then what the run holds."""
    pages = counts["totals"]["pages"]
    did = this or {"documents": counts["documents"], "pages": pages, "model_calls": counts["totals"]["model_calls"]}
    lines = [f"pagemill: {did['documents']} documents, {did['pages']} pages in {wall:.1f} s "
             f"({did['pages'] / max(wall, 1e-9):.2f} pages/s), model calls {did['model_calls']} by this invocation"
             + (f"; waves run {len(waves.ran)} of {waves.total} ({len(waves.skipped)} finished before)"
                if waves is not None and waves.total > 1 else "")]
    lines.append(f"  the run:  {counts['documents']} documents, {pages} pages in all")
    lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in counts["outcomes"].items()))
    if counts["reject_reasons"]:
        lines.append("  reasons:  " + ", ".join(f"{k} {v}" for k, v in counts["reject_reasons"].items()))
    if counts["pages"]:
        lines.append("  pages:    " + ", ".join(f"{k} {v}" for k, v in counts["pages"].items()))
    t = counts["totals"]
    lines.append(f"  model calls {t['model_calls']}, tokens in {t['image_tokens'] + t['text_tokens']}, "
                 f"out {t['output_tokens']}, cost ${t['cost_usd']:.6f} (hosted API ${t['api_equivalent_usd']:.6f})")
    if counts.get("errors"):
        lines.append(f"  ERRORS:   {len(counts['errors'])} (the run's tables break an invariant; see below)")
    lines.append(f"  tables:   {output.rstrip('/')}/{{documents,pages,ledger}}/tenant={counts.get('tenant')}/  "
                 f"manifest: {manifest_uri}")
    if log is not None:
        lines.append(f"  log:      {log}  (vLLM, torch, Beam and the other libraries' lines; --verbose shows them)")
    lines.append(f"  query:    pagemill sql --output {output} \"SELECT outcome, count(*) FROM documents GROUP BY 1\"")
    return "\n".join(lines)
