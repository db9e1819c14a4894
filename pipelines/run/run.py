"""One run, after its command line is parsed (pipelines/cli.py): checks and pre-flight, the run id, the
listing window, resume or --force, the pipeline, compaction, the manifest, the summary and the exit code."""
from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Any

from schemas import layout

SINCE_LAST_RUN_OVERLAP_S = 3600


def run(options: Any, storage: Any) -> int:
    """Run the pipeline `options` describe (PipelineOptions holding PagemillOptions) over `storage`
    (pipelines/config/storage.py); the exit code (pipelines/run/exit_codes.py), 2 when an option or check fails."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    from pipelines.config.options import PagemillOptions, check_identifiers, new_run_id
    from pipelines.config.storage import configure
    from pipelines.run.exit_codes import exit_code
    from pipelines.run.local_workers import resolve_local_workers, small_run, usable_cores
    from pipelines.run.preflight import preflight
    from pipelines.run.progress import ProgressWatcher
    from pipelines.run.retries import settle
    from pipelines.run.settings import settings_from_options, with_resolved_engine
    from pipelines.run.waves import bound_listing, listing_for, run_waves
    from pipelines.tables.manifest import build_manifest, manifest_options, run_counts, write_manifest
    from transforms.store.compaction import clear_run
    from transforms.store.files import run_tenants
    from transforms.store.listing_file import ListingChanged, clear_listing

    o = options.view_as(PagemillOptions)
    job_name = options.view_as(GoogleCloudOptions).job_name
    # Identifiers become paths under the output root: checked before anything (even pre-flight) runs.
    problems = check_identifiers(o, job_name) + layout.root_problems(o.output)
    o.run_id = o.run_id or new_run_id()  # the machine engine's folder in the settings is named after it
    built: Any = problems
    if not problems:
        configure(storage)
        built = settings_from_options(o)  # checked, loaded and built in one pass: nothing is written if bad
        problems = built if isinstance(built, list) else preflight(o.input, o.output, storage)
    # A listing an earlier invocation left is reused only if it is this run's: same --input, files unchanged.
    found, refused = (None, []) if problems else bound_listing(o)
    problems = problems or refused
    if problems:
        for problem in problems:
            print(f"pagemill run: {problem}", file=sys.stderr)
        return 2
    since, until = listing_window(o, job_name, storage)
    commits = run_commits(o, storage)
    if o.force:
        clear_run(o.output, o.tenant, o.run_id)
        clear_listing(layout.listing_folder(o.output, o.tenant, o.run_id))
        if commits is not None:
            commits.cleared()  # the catalog must not point at the files just deleted
    # A run id is the tenant's own: only its own partitions make this a resume (docs/safety.md).
    resuming = o.tenant in run_tenants(o.output, o.run_id, o.tenant)
    before = run_counts(o.output, o.run_id, storage, o.tenant) if resuming else None
    started = dt.datetime.now(dt.UTC)
    run = {"run_id": o.run_id, "tenant": o.tenant, "created_at": started}
    verb = "resuming" if before else "reading"
    print(f"pagemill: run {o.run_id}: {verb} {', '.join(o.input)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    listing = listing_for(o, since, until, found)
    # The listing tells a small run before any worker starts; the engine's service follows the workers.
    resolve_local_workers(options, usable_cores(), listing is not None and small_run(listing.objects, listing.bytes))
    settings = with_resolved_engine(built, o)  # the `vllm` alias follows the resolved workers
    watcher = ProgressWatcher(o.output, o.tenant, o.run_id, o.progress_every_s, listing and listing.objects,
                              listing and listing.waves)
    try:
        with watcher:
            waves, metrics = run_waves(options, settings, run, listing, since, until, o.force,
                                       on_wave=lambda wave: setattr(watcher, "wave", wave), commits=commits)
    except ListingChanged as err:  # a wave file rewritten while the run went on: nothing of it was read
        print(f"pagemill run: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - one clear line; the runner has logged the traceback
        from pipelines.run.failure import run_failure

        # Not finished: no manifest (a `--since-last-run` nightly must not start after this run), and
        # the rows written so far stay for the resume.
        print(f"pagemill: run {o.run_id} failed: {run_failure(err)}; the rows written so far are kept: "
              f"fix the cause and run the same command with --run-id {o.run_id} to resume", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    counts, retried = settle(o.output, o.tenant, o.run_id, storage)
    if commits is not None:
        try:  # a run without waves commits once, here; with waves, only what the compaction changed
            commits.run_settled(counts["errors"], wave=0 if listing is None else None)
        except Exception as err:  # noqa: BLE001 - one clear line
            from pipelines.run.failure import run_failure

            print(f"pagemill: run {o.run_id}: the catalog commit failed: {run_failure(err)}; the rows are written: "
                  f"run the same command with --run-id {o.run_id} to commit them", file=sys.stderr)
            return 1
    manifest = build_manifest(o.run_id, manifest_options(options), counts, metrics, started, dt.datetime.now(dt.UTC))
    code, why = exit_code(counts, o.max_failed_fraction)  # rows are written: now judge them
    manifest.update(resumed=bool(before), exit_code=code, exit_reason=why, retried_rows=retried,
                    waves=waves.as_dict(), this_invocation=invocation(counts, before),
                    listing=listing and listing.record(), catalog=commits and commits.record())
    uri = write_manifest(o.output, o.tenant, o.run_id, manifest)
    print(summary(counts, wall, o.output, uri, manifest["this_invocation"], waves))
    if o.write_markdown:
        from pipelines.run.markdown_files import write_markdown

        written = write_markdown(o.output, o.tenant, o.run_id, storage)
        print(f"  markdown: {written} documents under {layout.markdown_folder(o.output, o.tenant)}/")
    for error in counts["errors"]:
        print(f"pagemill run: error: {error}", file=sys.stderr)
    print(f"pagemill: exit {code}: {why}", file=sys.stderr if code else sys.stdout)
    return code


def run_commits(o: Any, storage: Any) -> Any:
    """`--catalog`: the run's Iceberg commits (pipelines/run/commits.py), or None."""
    from transforms.store.iceberg import catalog_config

    config = catalog_config(o.catalog, o.catalog_namespace, o.catalog_property)
    if config is None:
        return None
    from pipelines.run.commits import Commits

    return Commits(config, o.output, storage, o.tenant, o.run_id)


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
            this: dict[str, int] | None = None, waves: Any = None) -> str:
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
    lines.append(f"  query:    pagemill sql --output {output} \"SELECT outcome, count(*) FROM documents GROUP BY 1\"")
    return "\n".join(lines)
